"""Batched screening plans and the numerical certificate constants (docs/method.md §3–§6, §8).

Where it runs: entirely on the GPU, batched over the chunk's queries, as CuPy array
operations (float64 for every bound quantity) plus one small kernel for the e4m3 rounding
of the aux rows; nothing is copied to the host.  Choices (R, anchors, A) only affect
efficiency; the bound is valid for any of them (docs/method.md §3).

The plan stage (``plan_stage``) plans with ``build_plans_fused`` (one kernel per chunk,
csrc/plan.cu); ``build_plans`` is its specification (tests/test_plan_fused.py compares the
two plans field by field).  The fused planner: one block of 256 threads per query (kernels
``plan_mt1`` … ``plan_mt4`` for Hp = 16·MT heads) decodes the query's e4m3 rows into shared
memory once and computes norms, activation frequencies, R, the anchor projection and folded
weights, E, the negative aggregate with its two e4m3 aux rows, the envelope J and C there,
in float64 with the same outward allowances.  Its differences from ``build_plans``, all
legal (plan.cu header): float64 reductions in another order (covered by MU = 2^-30, below);
ties of the R priority key broken by head index (as ``_choose_R``'s stable sort); p_h in one
fixed fp32 summation order (or, with ``ACTIVATION_I8``, from the exact integer dots of the
activation images, as ``build_plans`` then computes them).  Why a kernel: ``build_plans``
costs 7–9 ms at Qn = 4096 in ~100 CuPy launches and 37–74 ms at Qn = 32K in float64
[Qn, H, 128] temporaries
(docs/records/notes.md); the kernel reads q once and writes only the plan.

The certificate the screening kernel evaluates, in payload units (multiply by α_i ≥ 0):

    s^ref_i/α_i ≤ Û_i + ρ_i·C + ε_raw ,   U^num_i = α_i(Û_i + ρ_i C + ε_raw) + ε_out (rounded up)
    Û_i = fl32( Σ_{j∈R} ω_j [x̂_j]_+ − σ_a [x̂_v0 + x̂_v1]_+ ),  x̂ = MMA dot products

C = √D·(E + ‖J‖₂), E ≥ min(E_P, E_P^joint) (Prop. 1, 3), and J the coordinate envelope
(§8): aux reconstruction |e_A|, folded-weight rounding Σ_j |w̃_j − ω_j||q̄_j|, the screening
arithmetic g_scr·(Σ_j|ω_j||q̄_j| + σ_a(|v0|+|v1|)) and the original scorer's arithmetic
g_ref·Σ_h |w'_h||q̄_h|.  Σ_d J_d|k̄_d| ≤ ‖J‖‖k̄‖ ≤ ‖J‖ ρ√D (Cauchy–Schwarz, ρ√D ≥ ‖k̄‖).

MMA error model (docs/numerics.md, dosa_ref.numeric.ErrorModel): the kernels run e4m3 values
exactly converted to f16 through mma.sync m16n8k16 (HMMA.16816, the same tensor-core path
that sm_90 uses for mma.sync e4m3: F2FP + HMMA, seen in the SASS).  Products are exact;
each step adds k = 16 products to the accumulator after aligning the 17 terms to the
largest and keeping ``mma_bits`` bits (truncation), then writes fp32.  Per step the error
is at most 17·2^-b·max|term| + u·|result| ≤ (17·2^-b + u)·Σ_{d≤step}|q_d k_d|(1+…), so
over the S = 8 chained steps of D = 128: |x̂ − x| ≤ γ_mma Σ_d |q_d||k_d| with
γ_mma = S·(17·2^-b + u)·(1 + 2^-4).  Default b = 17, the numeric reference's default
for mma.sync kernels (largest window consistent with the recorded H200 observations);
the GPU tests measure the observed error against this bound on crafted inputs.
fp32 epilogues: n round-to-nearest operations give γ_n = n·u/(1 − n·u), u = 2^-24.  The
float64 plan arithmetic (≤ 2^14 operations per quantity, u = 2^-53) is covered by the
relative allowance μ = 2^-30 of each quantity's magnitude sum.  CuPy compiles with
-ftz=true: every flushed fp32 result loses < 2^-126, covered by ε_raw (``flushed_results``:
every fp32 result of one key's Û and of the canonical scorer's head sum, in payload units)
and ε_out (the product by α).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dosa_ref.fp8 import e4m3_bits, e4m3_values

from ._build import KernelSpec, cupy_or_raise, kernel, raise_smem_limit
from .prepare import D
from .scorer import MMA_BITS, plan_scorer

__all__ = [
    "A_STEP", "PLAN_THREADS", "DevicePlan", "allowance_factors", "build_plans",
    "build_plans_fused", "flushed_results", "gamma", "gamma_mma", "dot_allowance", "plan_constants",
    "row_lift", "screen_row_constants",
    "plan_smem_bytes", "plan_stage",
    "row_slots", "scorer_allowance", "step_exponents",
]  # fmt: skip

U32 = 2.0**-24
MU = 2.0**-30
TINY = 2.0**-126


def gamma(n: int) -> float:
    return n * U32 / (1.0 - n * U32)


# a dot's per-row constant a = (Σ_s 2^(e_s))·A_STEP: the fp32 adds of its four steps' results
# (dot_allowance; the scorer's a_step of allowance_factors, the row-constants kernel's)
A_STEP = 1 + gamma(3)


def row_lift(mts: int) -> float:
    """1 + γ_{2·mts+6}: Û's roundings over a plan of 16·mts rows (screen_row_constants)."""
    return 1 + gamma(2 * mts + 6)


def flushed_results(mth: int, mts: int) -> int:
    """An upper bound on the fp32 results that -ftz=true may flush in one (query, key)'s
    bound (payload units, before α): each can lose < 2^-126, and whatever the evaluation
    tree, the losses add up (each enters the final sum with a factor ≤ 1 + γ_n).  The
    screen's Û over 16·mts plan rows — a product or fmaf per row, the aux sum, the additions
    that combine the rows — is at most 2·16·mts + 8 results in every screen kernel (the
    lane chains and trees of screen.cu, screen_sm90a.cu, screen_wgt.cu); the canonical
    scorer's head sum over 16·mth heads (csrc/scorer.cuh, scorer_fp8.cuh: a product or fmaf
    per head and the partial sums' additions) at most 2·16·mth + 16; 8 more to spare: in all
    32·(mts + mth + 1).  The product by α is ε_out's."""
    return 32 * (mts + mth + 1)


K_STEP = 16  # products per tensor-core step (mma m16n8k16, f16 inputs)


def gamma_mma(bits: int, D: int = 128) -> float:
    """|x̂ − x| ≤ γ Σ_d|q_d k_d| for one chained dot of length D (S = D/16 steps)."""
    S = -(-D // K_STEP)
    return S * ((K_STEP + 1) * 2.0**-bits + U32) * (1.0 + 2.0**-4)


def row_slots(mts: int) -> np.ndarray:
    """Plan-row slots of retained heads: every row except 7 and 15 of the last tile (the
    aux rows; lane g = 7 holds both, see screen_impl)."""
    rows = np.arange(16 * mts)
    last = 16 * (mts - 1)
    return rows[(rows != last + 7) & (rows != last + 15)]


@dataclass
class DevicePlan:
    """Per-query screening plan on the device (Qn queries, MTS row tiles)."""

    mts: int
    rows: object  # uint8 [Qn, 16·MTS, 128] e4m3 plan rows (retained heads + 2 aux rows)
    omega: object  # fp32 [Qn, 16·MTS] folded weights ω_j (0 for empty / aux rows)
    sigma: object  # fp32 [Qn] aux scale σ_a (power of two)
    C: object  # fp64 [Qn] RMS coefficient, rounded outward
    eps_raw: object  # fp64 [Qn]
    eps_out: float
    valid: object  # bool [Qn]: finite plan (else query-level recovery)
    r: object  # int [Qn] retained heads
    omitted_positive: object  # int [Qn] |P|
    aggregated: object  # int [Qn] |A|
    inR: object = None  # bool [Qn, Hp] retained heads (for tests against dosa_ref.plan)
    inA: object = None  # bool [Qn, Hp] aggregated negative heads
    w_fold: object = None  # float64 [Qn, Hp] w̃ (folded weights; = w outside R ∪ P)
    a_A: object = None  # float64 [Qn, D] negative aggregate
    E: object = None  # float64 [Qn] positive allowance (outward)
    r_max: int | None = None  # every plan retains at most r_max heads (the r it was built with)
    # the screen's dot arithmetic the bound covers (``dot_allowance``): "f16" for the f16
    # chains of every screen kernel, "fp8_fresh" for the FP8 build of "wgt" (screen.WGT_FP8)
    screen: str = "f16"
    # build_plans_fused's own buffers (its raw valid flags, counts and the FP8 screen's row
    # constants), kept so that a plan can be built again into the same arrays (``out``)
    scratch: tuple | None = None


def row_tiles(r: int) -> int:
    """The 16-row tiles (mts) of a plan with r retained heads: one for r ≤ 14 (14 retained
    rows and the two aux rows), two beyond (``row_slots``)."""
    return 1 if r <= 14 else 2


def plan_stage(b, pool, r: int, o: dict, pcount=None, screen: str = "f16") -> DevicePlan:
    """The plan stage: plans of batch ``b`` (``prepare.Batch``) with r retained heads
    (mts = 1 row tile for r ≤ 14, else 2), activation frequencies from ``o["p_sample"]``
    evenly spaced anchor-pool keys (pool int32 [P], sorted), by
    ``build_plans_fused`` (one kernel per chunk; its specification is ``build_plans``) with
    the allowance of the batch's scorer (``scorer.plan_scorer``; the screen's own f16
    arithmetic keeps ``MMA_BITS``).  ``pcount`` (0-d device int64, the
    pool's P when ``pool`` is padded to a capacity, ``seeds.anchor_pool``): min(p_sample, capacity)
    sample keys spaced over the first P entries on the device (repeats when P is smaller;
    key 0 when P = 0) — no synchronization.  The sample only steers which heads a plan
    retains (docs/method.md §4); every plan's bound holds for any sample.  ``screen``: the
    screen kernel's dot arithmetic (``screen.screen_arith`` of the chunk's screen)."""
    cp = cupy_or_raise()
    mts = row_tiles(r)
    ns = min(o["p_sample"], int(pool.size))
    if pcount is None:
        sample = pool[cp.linspace(0, pool.size - 1, ns).astype(cp.int64)] if ns else None
    elif POOL_SAMPLE_KERNEL and ns:  # csrc/seeds.cu pool_sample: one launch
        sample = cp.empty(ns, dtype=cp.int32)
        kernel("pool_sample")((-(-ns // 256),), (256,), (pool, pcount, np.int64(ns), sample))
    else:
        last = cp.maximum(pcount - 1, 0)
        sample = pool[cp.arange(ns, dtype=cp.int64) * last // max(ns - 1, 1)]
    return build_plans_fused(
        b.q, b.w, b.kp, sample, r, mts, MMA_BITS, plan_scorer(b.scorer), screen
    )


def _choose_R(xp, w, qn, p, r, neg_priority="activation"):
    """docs/method.md §3 rule, batched: returns (order [Qn, H] heads by priority, nR [Qn]).

    Class 2: positive heads (all of them when |H+| ≤ r, else by w_h‖q_h‖); class 1 (only
    when |H+| ≤ r): negative heads by |w_h|‖q_h‖·min(p_h, 1−p_h); class 0: never retained.
    The sort key is class + x/(1+x) (x = the in-class priority ≥ 0), ties by head index.
    Any R is valid; the rule only affects pruning (ties may resolve differently from
    dosa_ref.plan).
    """
    pos, neg = w > 0, w < 0
    npos = pos.sum(axis=1, keepdims=True)
    few = npos <= r
    prio = xp.abs(w) * qn
    if neg_priority == "activation":
        prio = prio * xp.minimum(p, 1.0 - p)
    prim = xp.where(pos, 2.0, xp.where(neg & few, 1.0, 0.0))
    sec = xp.where(pos, xp.where(few, 0.0, w * qn), xp.where(neg & few, prio, 0.0))
    key = prim + sec / (1.0 + sec)
    # Ties break by head index ascending (a stable sort), as plan.cu's rank does, so the
    # two planners pick the same R wherever their priority keys are equal.
    order = xp.argsort(-key, axis=1, kind="stable")
    nR = xp.minimum((prim > 0).sum(axis=1), r)
    return order, nR


SCORERS = ("f16", "fp8_fresh", "fp8_k64", "fp8_3fresh", "fp8_chained")


def scorer_allowance(scorer: str, q, mth: int, mma_bits: int, xp):
    """(g_ref, a) of the canonical scorer's arithmetic: |computed − exact| of the payload-unit
    score ≤ g_ref·Σ_h|w'_h| Σ_d|q̄_hd||k̄_d| + Σ_h|w'_h|·a_h for every key (a float64
    [Qn, Hp], 0 for the f16 chain), q uint8 [Qn, Hp, 128] the queries' e4m3 codes (an
    ``xp`` array).  ``scorer``:

    * "f16": the m16n8k16 chain keeping ``mma_bits`` bits per step (``gamma_mma``), the
      epilogue of csrc/scorer.cuh (γ_{2·mth+5});
    * "fp8_fresh": e4m3 wgmma k32 steps from fresh accumulators (csrc/dense_fp8.cu), the
      model ``dosa_ref.mma_model.WGMMA_E4M3`` (docs/numerics.md "The e4m3 wgmma
      accumulator"): step s loses < 32·2^(E_s − 13) ≤ 2^(eq_s) in its window (E_s ≤ eq_s + 8,
      eq_s the largest exponent field of the head's dims in the step, 8 the largest of any
      e4m3 key) plus 2^-13 of its kept sum in the 14-bit write-back; three fp32 adds (γ_3);
      the epilogue's fmaf chain of H/4 terms, two butterfly adds and × α (γ_{H/4+3});
    * "fp8_k64": two fresh chains of two steps (k64), added in fp32: the second step of a
      chain aligns to the first one's result x0 as well, 2^E ≤ 2^(eq + 8) + |x0|, so its 33
      terms lose < 33/32·2^(eq) + 33·2^-13·|x0|: the dims of steps 0 and 2 carry
      35·2^-13 (with both write-backs), those of steps 1 and 3 2^-13 — ``g_ref`` per dim
      (float64 [128]);
    * "fp8_3fresh": steps 0 and 1 fresh, steps 2 → 3 one chain (two fp32 adds): only the
      dims of step 2 carry the chained step's 35·2^-13;
    * "fp8_chained": the same steps chained on the tensor core: step s aligns to the running
      sum too, 2^E_s ≤ 2^(eq_s + 8) + |c_s| with |c_s| ≤ Σ_{d<32s}|q̄_d k̄_d|(1 + …), so
      each step adds 2^-8 of the partial dot's magnitudes: g ≈ 3·2^-8 + 4·2^-13.
    """
    if scorer not in SCORERS:
        raise ValueError(f"scorer: expected one of {SCORERS}, got {scorer!r}")
    if scorer == "f16":
        gm = gamma_mma(mma_bits)
        return gm + gamma(2 * mth + 5) * (1 + gm), xp.zeros(q.shape[:2])
    ge = gamma(16 * mth // 4 + 3)
    gm, a = dot_allowance(scorer, q, mma_bits, xp)
    return gm + ge * (1 + gm), a * (1 + ge) * (1 + MU)


NO_EXPONENT = -1000  # step_exponents of a k32 step whose codes are all ±0


def step_exponents(codes, xp):
    """int32 [..., 4]: per k32 step of e4m3 rows ``codes`` uint8 [..., 128], the largest
    exponent e (``dosa_ref.mma_model.e4m3_exponent``: value = m·2^e, subnormals −6) of its
    nonzero codes, ``NO_EXPONENT`` for a step of zeros.  On the codes' bytes (the exponent
    field is monotone in e), one byte per code in the temporaries."""
    c = codes.reshape(*codes.shape[:-1], 4, 32)
    f = xp.where((c & 0x7F) != 0, xp.maximum((c >> 3) & 0xF, 1), 0).astype(xp.uint8)
    fmax = xp.max(f, axis=-1).astype(xp.int32)
    return xp.where(fmax > 0, fmax - 7, NO_EXPONENT).astype(xp.int32)


def dot_allowance(arith: str, codes, mma_bits: int, xp):
    """(g, a) of one dot's arithmetic ``arith`` (``SCORERS``; ``scorer_allowance`` says what
    each is): |x̂ − q̄·k̄| ≤ g·Σ_d|q̄_d||k̄_d| + a for every e4m3 key, ``codes`` uint8 [..., 128]
    the rows' e4m3 codes (``g`` float, or float64 [128] per dim for the k64 / 3fresh chains;
    a float64 [...], 0 for the f16 chain)."""
    if arith == "f16":
        return gamma_mma(mma_bits), xp.zeros(codes.shape[:-1])
    if arith == "fp8_fresh":
        gm = 2.0**-13 + gamma(3) * (1 + 2.0**-13)
    elif arith in ("fp8_k64", "fp8_3fresh"):
        chained_into = [1.0, 0.0, 1.0, 0.0] if arith == "fp8_k64" else [0.0, 0.0, 1.0, 0.0]
        first = xp.asarray(np.repeat(np.array(chained_into), 32))
        adds = 1 if arith == "fp8_k64" else 2  # fp32 additions of the chains' results
        gm = ((2.0**-13 + 34 * 2.0**-13 * first) * (1 + 2.0**-10)) + gamma(adds)
    else:
        gm = (3 * 2.0**-8 + 4 * 2.0**-13) * (1 + 2.0**-4) + gamma(3)
    # 2^(eq_s): the largest exponent field of the row's nonzero codes in the step (a
    # subnormal's field counts as −6, above its magnitude); 0 for a step of zeros
    emax = step_exponents(codes, xp)
    step_abs = xp.where(emax > NO_EXPONENT, xp.ldexp(xp.ones(emax.shape), emax), 0.0)
    if arith == "fp8_k64":  # the chained second step of each pair: 33 terms, not 32
        step_abs = step_abs * xp.asarray([1.0, 33 / 32, 1.0, 33 / 32])
    elif arith == "fp8_3fresh":  # steps 0, 1 fresh, step 3 chained on step 2
        step_abs = step_abs * xp.asarray([1.0, 1.0, 1.0, 33 / 32])
    return gm, xp.sum(step_abs, axis=-1) * A_STEP


def build_plans(q, w, k_payload, sample_ids, r, mts, mma_bits=17, xp=None, scorer="f16",
                screen="f16"):  # fmt: skip
    """Batched plans for all queries, on the device.

    q: uint8 [Qn, Hp, 128] (heads padded to 16·MT_H), w: fp32 [Qn, Hp]; sample_ids: key ids
    (device int) for activation frequencies; r ≤ 16·mts − 2 retained heads.
    xp: array module (default CuPy); ``numpy`` runs the same code on the host (CPU tests
    and ``emulate.screen_survival``), with ``dosa_ref.fp8.e4m3_bits`` for the aux rows.
    ``scorer``: the canonical scorer's arithmetic whose error the bound covers
    (``scorer_allowance``; a call's routes run ``scorer.plan_scorer`` of its scorer).
    ``screen``: the screen's dot arithmetic (``dot_allowance``: "f16", the kernels' chain;
    an FP8 one states the bound a screen on e4m3 ``wgmma`` needs — its relative part in J,
    its per-row constant in ε_raw (``screen_row_constants``): "fp8_fresh" for the FP8 build
    of "wgt" (screen.WGT_FP8), the others for the survival emulation of
    ``emulate.screen_survival``).
    """
    cp = cupy_or_raise() if xp is None else xp

    Qn, Hp, _ = q.shape
    mth = Hp // 16
    nslot = 16 * mts - 2
    r = int(min(r, nslot, Hp))
    table = cp.asarray(e4m3_values(np.arange(256, dtype=np.uint8)))
    qf = table[q]  # float64 [Qn, Hp, D] exact payload values
    wf = w.astype(cp.float64)
    qn = cp.sqrt(cp.sum(qf * qf, axis=2))
    if sample_ids is not None and int(sample_ids.size) > 0 and ACTIVATION_I8:
        p = activation_frequency_i8(q, k_payload[sample_ids], cp)
    elif sample_ids is not None and int(sample_ids.size) > 0:
        ksmp = table[k_payload[sample_ids]].astype(cp.float32)
        x = cp.einsum("thd,sd->ths", qf.astype(cp.float32), ksmp)
        p = cp.mean(x > 0, axis=2)
        del x
    else:
        p = cp.full((Qn, Hp), 0.5)
    order, nR = _choose_R(cp, wf, qn, p, r)
    ar = cp.arange(Hp)
    rank = cp.argsort(order, axis=1)  # inverse permutation: position of head h in order
    inR = rank < nR[:, None]
    P = (wf > 0) & ~inR
    Nn = (wf < 0) & ~inR
    A = Nn & (p >= 0.5)

    # Anchor projection (Prop. 1): j* = argmax_{j∈R} [q_h·q_j]_+/‖q_j‖, β = [q_h·q_j*]_+/‖q_j*‖².
    G = cp.einsum("thd,tjd->thj", qf, qf)
    Gp = cp.maximum(G, 0.0)
    safe = cp.where(qn > 0, qn, 1.0)
    ratio = cp.where(inR[:, None, :] & (qn[:, None, :] > 0), Gp / safe[:, None, :], -1.0)
    jstar = cp.argmax(ratio, axis=2)  # [Qn, Hp]
    rmax = cp.take_along_axis(ratio, jstar[:, :, None], axis=2)[:, :, 0]
    use = P & (rmax > 0)
    qj = cp.take_along_axis(qn, jstar, axis=1)
    gj = cp.take_along_axis(Gp, jstar[:, :, None], axis=2)[:, :, 0]
    beta = cp.where(use, gj / (cp.where(qj > 0, qj, 1.0) ** 2), 0.0)
    qjs = cp.take_along_axis(qf, cp.broadcast_to(jstar[:, :, None], qf.shape), axis=1)
    d = cp.where(P[:, :, None], qf - beta[:, :, None] * qjs, 0.0)
    del qjs
    wp = cp.where(P, wf, 0.0)
    onehot = (jstar[:, :, None] == ar[None, None, :]) & use[:, :, None]
    fold = cp.einsum("th,thj->tj", wp * beta, onehot.astype(cp.float64))
    del onehot
    wt = wf + fold  # w̃ (float64)
    dn = cp.sqrt(cp.sum(d * d, axis=2))
    E_tri = cp.sum(wp * dn, axis=1)
    u = wp[:, :, None] * d
    del d
    usum = cp.sqrt(cp.sum(cp.sum(u, axis=1) ** 2, axis=1))
    ugram = cp.sum(cp.abs(cp.einsum("thd,tld->thl", u, u)), axis=(1, 2))
    del u
    E_joint = 0.5 * (usum + cp.sqrt(ugram))
    mplan = cp.sum(wp * (qn + beta * qj), axis=1)
    E = cp.minimum(E_tri, E_joint) * (1 + MU) + MU * mplan

    # Negative aggregate (Prop. 2) and its two FP8 aux rows (docs/method.md §8).  σ is a power
    # of two, so z = a/σ, z − v0, (z − v0) − v1 and σ·e are exact in float64 (Sterbenz /
    # common grid): e_A is the exact reconstruction error of the computed a_A.
    wa = cp.where(A, cp.abs(wf), 0.0)
    aA = cp.einsum("th,thd->td", wa, qf)
    amag = cp.einsum("th,thd->td", wa, cp.abs(qf))
    amax = cp.max(cp.abs(aA), axis=1)
    m, e = cp.frexp(cp.where(amax > 0, amax / 448.0, 1.0))
    sig = cp.ldexp(cp.ones(Qn), cp.where(m == 0.5, e - 1, e).astype(cp.int32))
    z = aA / sig[:, None]

    def e4m3(x):
        if cp is np:
            return e4m3_bits(x.astype(np.float32))
        from ._build import kernel

        x = cp.ascontiguousarray(x)
        out = cp.empty(x.shape, dtype=cp.uint8)
        n = x.size
        kernel("e4m3_round_f64")(((n + 255) // 256,), (256,), (x, np.int64(n), out))
        return out

    v0 = e4m3(z)
    r1 = z - table[v0]
    v1 = e4m3(r1)
    eA = (r1 - table[v1]) * sig[:, None]
    v0f, v1f = table[v0], table[v1]

    # Plan rows and folded weights (slot s ← the s-th head of the priority order).
    slots = cp.asarray(row_slots(mts))
    hsel = order[:, :nslot]
    have = cp.arange(nslot)[None, :] < nR[:, None]
    qsel = cp.take_along_axis(q, cp.broadcast_to(hsel[:, :, None], (Qn, nslot, D)), axis=1)
    rows = cp.zeros((Qn, 16 * mts, D), dtype=cp.uint8)
    rows[:, slots] = cp.where(have[:, :, None], qsel, 0).astype(cp.uint8)
    omega = cp.zeros((Qn, 16 * mts), dtype=cp.float32)
    omega[:, slots] = cp.where(have, cp.take_along_axis(wt, hsel, axis=1), 0.0).astype(cp.float32)
    last = 16 * (mts - 1)
    rows[:, last + 7] = v0
    rows[:, last + 15] = v1

    # Coordinate envelope J (payload units) and C.
    om_d = cp.where(inR, wt.astype(cp.float32).astype(cp.float64), 0.0)
    dom = cp.abs(wt - om_d) + MU * (cp.abs(wf) + fold)
    absq = cp.abs(qf)
    Rm = inR.astype(cp.float64)
    J = cp.abs(eA) + MU * amag
    J += cp.einsum("th,thd->td", dom * Rm, absq)
    g_dot, a_scr = dot_allowance(screen, rows, mma_bits, cp)
    g_scr = g_dot + gamma(2 * mts + 6) * (1 + g_dot)
    g_ref, a_ref = scorer_allowance(scorer, q, mth, mma_bits, cp)
    J += g_scr * (
        cp.einsum("th,thd->td", cp.abs(om_d) * Rm, absq)
        + sig[:, None] * (cp.abs(v0f) + cp.abs(v1f))
    )
    J += g_ref * cp.einsum("th,thd->td", cp.abs(wf), absq)
    Jn = cp.sqrt(cp.sum(J * J, axis=1)) * (1 + MU)
    C = np.sqrt(D) * (E + Jn) * (1 + MU)
    eps_raw = flushed_results(mth, mts) * TINY + cp.sum(cp.abs(wf) * a_ref, axis=1) * (1 + MU)
    if screen != "f16":
        eps_raw = eps_raw + screen_row_constants(rows, omega, sig, mts, screen, mma_bits, cp)
    # σ is stored as fp32: it must be finite there too, else the screen would weigh the aux
    # rows by −inf and could reject on a bound that is not one (recover such queries)
    valid = cp.isfinite(C) & cp.isfinite(sig) & cp.isfinite(sig.astype(cp.float32))
    return DevicePlan(
        mts=mts,
        rows=rows,
        omega=omega,
        sigma=sig.astype(cp.float32),
        screen=screen,
        C=cp.ascontiguousarray(C),
        eps_raw=eps_raw,
        eps_out=TINY,
        valid=valid,
        r=nR,
        omitted_positive=P.sum(axis=1),
        aggregated=A.sum(axis=1),
        inR=inR,
        inA=A,
        w_fold=wt,
        a_A=aA,
        E=E,
        r_max=r,
    )


# screen_row_constants on the device by one kernel (csrc/plan.cu screen_row_constants_fresh)
# instead of ~25 array operations, which made the FP8 screen's plan 0.6–0.7 ms dearer than
# the f16 one's (docs/records/benchmarks.md "the per-row constants' kernel, on an H100");
# False: the array path (bench builds=rowarrays).
ROW_CONSTANTS_KERNEL = True


def screen_row_constants(rows, omega, sigma, mts: int, screen: str, mma_bits: int, xp,
                         out=None):  # fmt: skip
    """float64 [Qn]: what an FP8 screen's dots add to ε_raw (``dot_allowance``'s per-row
    constant a_j of plan rows ``rows`` uint8 [Qn, 16·mts, 128], weighted as Û weighs them —
    |ω_j| for every row, σ for the two aux rows — and lifted through Û's 2·mts + 6 roundings
    and one MU); omega fp32 [Qn, 16·mts], sigma [Qn] (a power of two, fp32 or fp64: the
    same value).  ``build_plans`` and ``build_plans_fused`` add it in the same order.
    ``out`` (float64 [Qn]): the kernel's result array, where the kernel computes it."""
    if ROW_CONSTANTS_KERNEL and screen == "fp8_fresh" and xp is not np:
        return _row_constants_kernel(rows, omega, sigma, mts, xp, out=out)
    _, a_scr = dot_allowance(screen, rows, mma_bits, xp)
    last = 16 * (mts - 1)
    a_rows = xp.sum(xp.abs(omega.astype(xp.float64)) * a_scr, axis=1)
    a_rows += sigma.astype(xp.float64) * (a_scr[:, last + 7] + a_scr[:, last + 15])
    return a_rows * row_lift(mts) * (1 + MU)


def _row_constants_kernel(rows, omega, sigma, mts: int, xp, out=None):
    """``screen_row_constants(..., "fp8_fresh")`` by csrc/plan.cu screen_row_constants_fresh
    (one warp per query; the same operations, the sum over rows in a warp tree), into
    ``out`` (float64 [Qn]) when given."""
    Qn, nrow = int(rows.shape[0]), 16 * mts
    if rows.shape[1:] != (nrow, D) or omega.shape != (Qn, nrow) or sigma.shape != (Qn,):
        raise ValueError(f"rows: expected [Qn, {nrow}, {D}] with omega [Qn, {nrow}], sigma [Qn]")
    out = xp.empty(Qn, dtype=xp.float64) if out is None else out
    if Qn:
        _kernel("screen_row_constants_fresh", 0)(
            (-(-Qn // PLAN_WARPS),), (PLAN_THREADS,),
            (xp.ascontiguousarray(rows), xp.ascontiguousarray(omega, dtype=xp.float32),
             xp.ascontiguousarray(sigma, dtype=xp.float64), np.int32(Qn), np.int32(nrow),
             np.float64(A_STEP), np.float64(row_lift(mts)), out),
        )  # fmt: skip
    return out


PLAN = KernelSpec("plan.cu")

# The activation frequencies p_h from the activation images' dots (``activation_image_trunc``: e4m3
# codes scaled per row by a power of two and truncated toward zero to int8) on the s8 tensor cores —
# exact integers, so the same in every order — instead of 32 fp32 FMAs per head and key in one
# order; the planner then keeps no u_h rows (recomputed where read), for three blocks per SM instead
# of two (docs/method.md §2 "activation frequency").  p_h only steers R and A (§3, §5): every plan's
# bound holds for any p.  0.65 ms against 1.09 ms at H 64 on an H100 (docs/records/benchmarks.md
# "Four builds on by default; the decode step's selection by rank"); bench builds=planf32 keeps
# plan_mt*.
ACTIVATION_I8 = True
# The activation sample's ids of a pool at its capacity by one kernel (csrc/seeds.cu
# pool_sample) instead of six array operations: host time in front of every plan, three plans
# a sampled call (docs/records/benchmarks.md "The sampled decision's host work"); the same
# ids.  bench builds=samplearrays takes the array operations.
POOL_SAMPLE_KERNEL = True

ACT_STRIDE = 160  # csrc/plan.cu PLAN_ACT_STRIDE (bytes per row of an activation image)
PLAN_THREADS = 256  # csrc/plan.cu PLAN_THREADS
PLAN_KC = 64  # csrc/plan.cu PLAN_KC (sample keys per chunk)
PLAN_WARPS = 8  # csrc/plan.cu PLAN_WARPS (screen_row_constants_fresh: one query per warp)


def _kernel(name: str, smem: int):
    """Kernel ``name`` of plan.cu with its dynamic shared-memory limit raised to ``smem``.

    Always (not only above 48 KB): plan.cu also has 7–11 KB of static shared memory, and
    the default limit is 48 KB for static + dynamic together — plan_mt2 asks for exactly
    48 KB of dynamic memory and would fail to launch otherwise."""
    return raise_smem_limit(kernel(name, spec=PLAN), smem, PLAN, name)


def plan_smem_bytes(Hp: int, i8: bool = False) -> int:
    """Dynamic shared memory of plan_mt{Hp/16}: q as fp32 [Hp, 128] + max(u_h float64
    [Hp, 128], one chunk of sample keys fp32 [128, PLAN_KC]); of plan_i8_mt{Hp/16} (``i8``):
    q as fp32 + the activation images of q and of one chunk, int8 [Hp + PLAN_KC, ACT_STRIDE]."""
    if i8:
        return Hp * D * 4 + (Hp + PLAN_KC) * ACT_STRIDE
    return Hp * D * 4 + max(Hp * D * 8, D * PLAN_KC * 4)


def activation_image_trunc(codes, xp=np):
    """The activation image of e4m3 rows (csrc/plan.cu ``activation_image_quarter``): int8
    [..., 128] of uint8 codes [..., 128].  With e' = max(e, 1) the exponent field of a nonzero
    finite code, S its significand (8 + m, or m for a subnormal) and F the row's largest e',
    the code's magnitude S·2^(e'−10)·2^(13−F) truncated toward zero, (S·8) >> (F − e') ∈
    [0, 120], with the code's sign; zero and NaN codes give 0.  The image is the row times
    2^(13−F) to within one unit per coordinate (toward zero), so the sign of an image dot is
    that of the exact dot except near 0."""
    c = codes.astype(xp.int32)
    a = c & 0x7F
    e = a >> 3
    ok = (a != 0) & (a != 0x7F)
    ef = xp.maximum(e, 1)
    F = xp.max(xp.where(ok, ef, 0), axis=-1, keepdims=True)
    S = xp.where(e > 0, 8 + (a & 7), a & 7)
    mag = xp.where(ok, (S << 3) >> xp.where(ok, F - ef, 0), 0)
    return xp.where(c & 0x80, -mag, mag).astype(xp.int8)


def activation_frequency_i8(q, k_sample, xp=np):
    """p_h of ``ACTIVATION_I8``: the fraction of sample keys whose activation image's dot with
    head h's is > 0 — float64 [Qn, Hp] of q uint8 [Qn, Hp, 128] and k_sample uint8 [ns, 128]
    e4m3 codes (ns ≥ 1); the dots are exact integers (|dot| ≤ 128·120² < 2^31)."""
    qi = activation_image_trunc(q, xp).astype(xp.int32)
    ki = activation_image_trunc(k_sample, xp).astype(xp.int32)
    x = xp.einsum("thd,sd->ths", qi, ki)
    return (x > 0).sum(axis=2).astype(xp.float64) / xp.float64(k_sample.shape[0])


def allowance_factors(scorer: str, mth: int) -> tuple[float, float]:
    """(a_step, a_epi) of the canonical scorer's per-head constant as ``scorer_allowance``
    computes it, a_h = ((Σ_s 2^(eq_s))·a_step·a_epi)·(1 + MU) — the factors the fused planner
    (csrc/plan.cu) applies in the same order: "fp8_fresh" and "fp8_chained" (plain powers of
    two per step: (1 + γ_3, 1 + γ_{16·mth/4+3})), "f16" (no constant: a_step = 0).  The k64
    and 3fresh arithmetics weigh their steps unequally and are not fused."""
    if scorer == "f16":
        return 0.0, 1.0
    if scorer not in ("fp8_fresh", "fp8_chained"):
        raise ValueError(f"scorer: the fused planner takes one g_ref, {scorer!r} has one per dim")
    return A_STEP, 1 + gamma(16 * mth // 4 + 3)


@functools.cache  # ~0.1 ms of host arithmetic in front of every plan kernel otherwise
def plan_constants(Hp: int, mts: int, mma_bits: int, scorer: str = "f16", screen: str = "f16"):
    """(g_scr, g_ref, eps_raw) exactly as ``build_plans`` computes them, eps_raw without the
    scorer's per-query part (``scorer_allowance``'s a; 0 for the f16 chain) and without the
    screen's (``screen_row_constants``).  Made once per argument tuple."""
    mth = Hp // 16
    gm, _ = dot_allowance(screen, np.zeros((0, D), np.uint8), mma_bits, np)
    if np.ndim(gm):
        raise ValueError(f"screen: the fused planner takes one g_scr, {screen!r} has one per dim")
    g_scr = gm + gamma(2 * mts + 6) * (1 + gm)
    g_ref, _ = scorer_allowance(scorer, np.zeros((0, Hp, D), np.uint8), mth, mma_bits, np)
    if np.ndim(g_ref):
        raise ValueError(f"scorer: the fused planner takes one g_ref, {scorer!r} has one per dim")
    return g_scr, float(g_ref), flushed_results(mth, mts) * TINY


def build_plans_fused(q, w, k_payload, sample_ids, r, mts, mma_bits=17, scorer="f16",
                      screen="f16", out: DevicePlan | None = None):  # fmt: skip
    """Batched plans for all queries, one fused kernel launch (same contract and fields as
    ``build_plans``; q uint8 [Qn, Hp, 128] with Hp = 16·MT ≤ 64, w fp32 [Qn, Hp],
    k_payload uint8 [N, 128], sample_ids: device key ids in [0, N) or None, r ≤ 16·mts − 2;
    ``scorer`` as in ``build_plans``, one with a single g_ref: "f16", "fp8_fresh",
    "fp8_chained"; ``screen`` likewise one with a single g: "f16", "fp8_fresh",
    "fp8_chained" — an FP8 one's per-row constants added to ε_raw after the kernel by
    ``screen_row_constants``, as ``build_plans`` adds them).  ``out``: a plan this function
    returned for the same Qn, Hp and mts, whose arrays are written again (a decode step's
    plans: no allocation with int32 sample ids; the returned plan holds those arrays).
    """
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    if Hp % 16 or not 16 <= Hp <= 64:
        raise ValueError(f"q: expected Hp = 16, 32, 48 or 64 padded heads, got {Hp}")
    if mts not in (1, 2):
        raise ValueError(f"mts: expected 1 or 2, got {mts!r}")
    nslot = 16 * mts - 2
    r = int(min(r, nslot, Hp))
    g_scr, g_ref, eps = plan_constants(Hp, mts, mma_bits, scorer, screen)
    a_step, a_epi = allowance_factors(scorer, Hp // 16)
    if sample_ids is not None and int(sample_ids.size) > 0:
        sample = cp.ascontiguousarray(sample_ids.astype(cp.int32, copy=False))  # ids < N < 2^31
        ns = int(sample.size)
    else:
        sample = cp.zeros(1, dtype=cp.int32)
        ns = 0
    q = cp.ascontiguousarray(q)
    w = cp.ascontiguousarray(w.astype(cp.float32, copy=False))
    kp = cp.ascontiguousarray(k_payload)
    nrow = 16 * mts
    if out is not None:
        if out.mts != mts or tuple(out.rows.shape) != (Qn, nrow, D) or out.inR.shape[1] != Hp:
            raise ValueError(f"out: a plan of {Qn} queries, {Hp} heads and mts {mts} expected")
        rows, omega, sigma, C, eps_raw = out.rows, out.omega, out.sigma, out.C, out.eps_raw
        valid, counts, rowc = out.scratch
        inR, inA = out.inR.view(cp.uint8), out.inA.view(cp.uint8)
        w_fold, a_A, E = out.w_fold, out.a_A, out.E
    else:
        rows = cp.empty((Qn, nrow, D), dtype=cp.uint8)
        omega = cp.empty((Qn, nrow), dtype=cp.float32)
        sigma = cp.empty(Qn, dtype=cp.float32)
        C = cp.empty(Qn, dtype=cp.float64)
        valid = cp.empty(Qn, dtype=cp.uint8)
        counts = cp.empty((Qn, 3), dtype=cp.int32)
        inR = cp.empty((Qn, Hp), dtype=cp.uint8)
        inA = cp.empty((Qn, Hp), dtype=cp.uint8)
        w_fold = cp.empty((Qn, Hp), dtype=cp.float64)
        a_A = cp.empty((Qn, D), dtype=cp.float64)
        E = cp.empty(Qn, dtype=cp.float64)
        eps_raw = cp.empty(Qn, dtype=cp.float64)
        rowc = cp.empty(Qn, dtype=cp.float64) if screen != "f16" else None
    if Qn:
        i8 = ACTIVATION_I8
        smem = plan_smem_bytes(Hp, i8)
        _kernel(f"plan_i8_mt{Hp // 16}" if i8 else f"plan_mt{Hp // 16}", smem)(
            (Qn,),
            (PLAN_THREADS,),
            (
                q, w, kp, sample, np.int32(ns), np.int32(r), np.int32(mts), np.float64(g_scr),
                np.float64(g_ref), rows, omega, sigma, C, valid, counts, inR, inA, w_fold, a_A, E,
                np.float64(eps), np.float64(a_step), np.float64(a_epi), eps_raw,
            ),
            shared_mem=smem,
        )  # fmt: skip
        if screen != "f16":
            eps_raw += screen_row_constants(rows, omega, sigma, mts, screen, mma_bits, cp,
                                            out=rowc)  # fmt: skip
    return DevicePlan(
        mts=mts,
        rows=rows,
        omega=omega,
        sigma=sigma,
        screen=screen,
        C=C,
        eps_raw=eps_raw,
        eps_out=TINY,
        valid=valid.view(cp.bool_),
        r=counts[:, 0],
        omitted_positive=counts[:, 1],
        aggregated=counts[:, 2],
        inR=inR.view(cp.bool_),
        inA=inA.view(cp.bool_),
        w_fold=w_fold,
        a_A=a_A,
        E=E,
        r_max=r,
        scratch=(valid, counts, rowc),
    )
