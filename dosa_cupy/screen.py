"""The screen stage (docs/method.md §8–§9): U^num of every visible non-seed key against τ,
written as a survivor bitmask (one uint32 word per 32 keys).

Screen kernels (``screen=``): "fp64" (screen_mt*), "pair" (screen_pair: two queries per
16-row MMA tile, r ≤ 6; the tile layout is ``pair_plan``); "wg" (the fp64
screen with its MMA as Hopper warpgroup MMA, screen_sm90a.cu via ``sm90a``: the same bounds
bit for bit, one build per plan width, r ≤ 14 or ≤ 30); "wgt" (the transposed Hopper
screen of csrc/screen_wgt.cu, keys as the wgmma M operand and the plan rows of a group of
queries as N — 32 rows of 4 queries for r ≤ 30, 16 rows of 8 queries for r ≤ 14, 8 rows of
16 queries for r ≤ 6 (``wgt_rows``); its bounds obey the same error model, not the same
bits; its FP8 build, ``WGT_FP8``, screens on e4m3 wgmma under its own error model);
"auto" (the default) chooses the kernel and r per chunk (``auto_screen``).  With
certificate seeds the screen also records (U, id) of every survivor (screen_cert_mt*).
Every kernel has a tie-aware variant, the same name with ``_tie`` (csrc/screen.cu "The keep
rule"), run by ``tie_screen_wanted`` chunks.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np

from dosa_ref.fp8 import e4m3_values

from . import sm90a
from ._build import KernelSpec, cupy_or_raise, device_const, kernel, read_back_async, tile
from .plan import MU, NO_EXPONENT, DevicePlan, gamma, gamma_mma, row_slots, step_exponents
from .prepare import Batch, D
from .scorer import MMA_BITS, QG, ROWB
from .seeds import Seeds
from .select import RecordBuffer

__all__ = [
    "AUTO_PAIR_SHARE",
    "PAIR_MAX_R",
    "PAIR_ROWS",
    "SCREENS",
    "WGT_MAX_R",
    "ScreenLaunch",
    "auto_pick",
    "auto_screen",
    "auto_wanted",
    "batch_plateau_rows",
    "pair_plan",
    "plateau_constants",
    "positive_heads_hist",
    "rule_and_arith",
    "screen_arith",
    "screen_stage",
    "wgt_image_bytes",
    "wgt_ring_smem_bytes",
    "wgt_rows",
]

SCREENS = ("fp64", "pair", "auto", "wg", "wgt")  # the values of the option screen
PAIR_MAX_R = 6  # screen="pair": retained rows per query in a paired 16-row tile (screen_pair)
# screen="auto" pairs a chunk when at least this share of its queries has |H+| ≤ PAIR_MAX_R
# positive heads (all of them retained at r = 6; docs/records/notes.md "Paired screen":
# calibrated H=32 has |H+| ≤ 4 and pairs at +0.2 pp survival, h64 has |H+| > 6 in a third
# of its queries)
AUTO_PAIR_SHARE = 0.95
# screen="auto" widens the plan to R_WIDE retained heads (two 16-row MMA tiles) when the
# median query has more than AUTO_WIDE_MEDIAN positive heads: at r = 14 the positive
# projection (docs/method.md §3) then omits so many heads that nearly every key survives.
# Set between the two trained-regime points measured so far (docs/records/benchmarks.md
# "Trained regime"): median |H+| = 15 (H = 32), r = 14 faster; median 26 (H = 64), r = 30
# 2.1× faster.  A cost model fitted to stage times is still to come.
R_WIDE = 30
AUTO_WIDE_MEDIAN = 20
SCREEN_THREADS = 256
# screen="wgt" (csrc/screen_wgt.cu): three warpgroups of 128 keys each per block, WGT_QG
# queries per block in groups of 128 / rows, and its dynamic shared memory (``wgt_smem_bytes``)
WGT_THREADS = 384
WGT_MAX_R = 30  # retained heads of an mts = 2 plan (plan.py: mts = 2 for 14 < r <= 30)
WGT_TILE = 128 * (WGT_THREADS // 128)
# Queries per block: one block per SM, so each block's prologue (its key tile from HBM,
# converted to f16) is exposed once per block — 384 queries amortize it over 24–96 groups and
# read the key array Qn / 384 times (at 96: a quarter of the groups, 4× the key traffic;
# docs/records/notes.md "Session 17").
WGT_QG = 384  # a multiple of every build's group (4, 8 and 16 queries)


def wgt_rows(r_max: int) -> int:
    """Plan rows per query of the "wgt" build for plans that retain at most ``r_max`` heads:
    8 (rows 0..5 and the aux rows 7, 15 — screen_wgt_rows8) for r_max ≤ PAIR_MAX_R, 16 (the
    whole mts = 1 plan — screen_wgt_rows16) for r_max ≤ 14, else 32 (the whole mts = 2 plan —
    screen_wgt_rows32)."""
    return 8 if r_max <= PAIR_MAX_R else 16 if r_max <= 14 else 32


def wgt_smem_bytes(rows: int = 16, tile: int | None = None) -> int:
    """Dynamic shared memory of screen_wgt_rows{rows} (csrc/screen_wgt.cu Rows<RQ>::kSmemBytes,
    which the kernel checks at its start): 1 KB alignment slack, the f16 key tile (two
    128-byte-swizzled panels), two buffers of a query group's 128 f16 rows, α and ρ as fp64,
    per buffer the lanes' weights and plateau coefficients (2 · Q · 4 vectors of rows / 4
    floats, Q = 128 / rows queries) and Q query records of 56 bytes, the tile's anchor-pool
    words; ``tile``: keys per block (default WGT_TILE; 128 per warpgroup of the build)."""
    T = WGT_TILE if tile is None else int(tile)
    q = 128 // rows
    meta = 2 * q * 4 * rows + q * 56
    return 1024 + 2 * T * 128 + 2 * 2 * 128 * 128 + 2 * T * 8 + 2 * meta + T // 32 * 4


WGT_SPEC = KernelSpec("screen_wgt.cu", (), sm90a=True)  # sm_90a build (NVRTC, else nvcc)

# The ring build of screen="wgt" (csrc/screen_wgt.cu "The ring build": each query group's image
# built once per call by screen_wgt_image_rows*, brought into WGT_RING_SLOTS shared-memory
# slots by bulk copies, no block barrier per group) — on the H200 0.2–2.3 ms faster per call
# than the build that stages each group in the block (docs/records/benchmarks.md, session 22);
# False: that build (the bench's comparison).
WGT_RING = True
WGT_RING_SLOTS = 3
# The FP8 build of screen="wgt" (csrc/screen_wgt.cu "The FP8 build": the ring build with the
# e4m3 codes as wgmma operands and fresh k32 steps; its plans carry the error model of those
# dots, plan.build_plans(..., screen="fp8_fresh")) on chunks screened by the plain rule
# (``screen_arith``): its survivors differ from the f16 chain's (another bound), its ids do
# not.  On the H200 the screen stage at 1M keys 19.8 ms against 23.0 (the f16 ring) and 24.6
# (calibrated, r 6), 56.5 against 71.3 (trained, r 30), with 7–35 % fewer survivors (session
# 22); False: the f16 builds (the bench's comparison).
WGT_FP8 = True
# The FP8 build's fp32 guard (csrc/screen_wgt.cu "The fp32 guard": U^num by four fp32
# operations rounded up instead of a conversion and four fp64 ones per (query, key) pair; a
# bound at least as large, docs/error_model.md "The fp32 guard").  −1.5 to −1.8 ms per call
# at 1M keys, −0.2 to −0.4 at 128K, on an H100 in two runs (docs/records/benchmarks.md "The
# fp32 guard and the seeds' side stream switched on"); bench builds=guard64 times the fp64
# guard.
WGT_GUARD32 = True
# The fp32 guard's kernels with the pipelined halves (csrc/screen_wgt.cu "The pipelined
# halves": one half's adds under the other half's step, the same values): the 8- and 16-row
# kernels 1.017–1.028× faster on captured launches with the same words, 1M and 128K keys, H 32
# and 64, on an H100 (docs/records/benchmarks.md "The raised extension and the pipelined
# halves"); bench builds=nopipe and ``dosa bench --screen-variants --fp8`` (variant g32) time
# the kernels without them.
WGT_PIPE = True


def screen_arith(screen: str, tie: bool | None) -> str:
    """The dot arithmetic of the screen kernel that will screen a chunk with ``screen`` (the
    route's pick) and the rule ``tie`` (True: tie-aware, False: plain, None: not yet decided
    — ``tie_screen_wanted``): "fp8_fresh" for the FP8 build of "wgt" (``WGT_FP8``, the plain
    rule), else "f16" — what ``plan_stage`` builds the plans for (``dot_allowance``)."""
    fp8 = WGT_FP8 and screen == "wgt" and tie is False
    return "fp8_fresh" if fp8 else "f16"


# A chunk whose rule the route stage did not decide (route="dosa", a memo's choice) planned
# and screened on the plain rule while its tie flag is read back by an event, and screened
# again on the tie-aware build in the rare chunk whose flag asks for it (``tie_prefetch``;
# both rules are exact): no synchronization between the seeds and the screen (the H100's
# timings: docs/records/benchmarks.md "The synchronization builds switched on"); bench
# builds=tiefirst reads the flag before planning.
SPECULATIVE_TIE = True


def tie_prefetch(seeds: Seeds, o: dict, tie: bool | None):
    """With ``SPECULATIVE_TIE``, for a chunk whose rule is not decided yet (``tie`` None)
    with ``tie_reject`` on: (host bool [1], event) of ``tie_screen_flag``, read back by an
    event; None otherwise (``rule_and_arith`` and ``screen_stage`` then read the flag as
    they need it)."""
    if not SPECULATIVE_TIE or tie is not None or not o["tie_reject"]:
        return None
    return read_back_async(tie_screen_flag(seeds, o, cupy_or_raise()).reshape(1))


def prefetched_tie(flag) -> bool:
    """The tie flag of ``tie_prefetch`` (waits for its event: the seeds' end)."""
    flag[1].synchronize()
    return bool(flag[0][0])


def rule_and_arith(seeds: Seeds, o: dict, tie: bool | None) -> tuple[bool | None, str]:
    """(tie, arith) for a chunk about to be planned with ``o["screen"]``: the rule ``tie``
    as decided so far (the route stage's, or None) — decided here (``tie_screen_wanted``,
    the synchronization ``screen_stage`` would make) where the FP8 build could take the
    chunk, since it has no tie-aware variant — and ``screen_arith`` of the two: the dots
    ``plan_stage`` must build the plans for."""
    if tie is None and screen_arith(o["screen"], False) != "f16":
        tie = tie_screen_wanted(seeds, o)
    return tie, screen_arith(o["screen"], tie)


def wgt_image_bytes(rows: int, fp8: bool = False) -> int:
    """Bytes of one query group's image (csrc/screen_wgt.cu Ring<RQ, FP8>::kImageBytes): the
    group's 128 N rows — f16 in two 128-byte-swizzled panels, ``fp8`` e4m3 in one — and its
    meta buffer (weights, plateau coefficients, Q = 128 / rows query records of 56 bytes)."""
    q = 128 // rows
    return (1 if fp8 else 2) * 128 * 128 + 2 * q * 4 * rows + q * 56


def wgt_ring_smem_bytes(rows: int, fp8: bool = False) -> int:
    """Dynamic shared memory of screen_wgt[_fp8]_ring_rows{rows} (Ring<RQ, FP8>::kSmemBytes,
    checked by the kernel): 1 KB alignment slack, the key tile (f16: two panels, ``fp8``: one),
    WGT_RING_SLOTS slots of one image each (rounded up to 1 KB: the swizzle's alignment), α
    and ρ as fp64, the tile's anchor-pool words, per slot an mbarrier and a reader count."""
    T, n = WGT_TILE, WGT_RING_SLOTS
    slot = -(-wgt_image_bytes(rows, fp8) // 1024) * 1024
    return 1024 + (1 if fp8 else 2) * T * 128 + n * slot + 2 * T * 8 + T // 32 * 4 + n * 8 + n * 4


# Paired screen tile (screen.cu screen_pair): row i of pair p ← row PAIR_ROWS[i][1] of
# query 2p + PAIR_ROWS[i][0], from mts = 1 plans (retained rows 0..5, aux rows 7 and 15).
PAIR_ROWS = (
    [(0, j) for j in range(6)]
    + [(1, 7), (0, 7)]
    + [(1, j) for j in range(6)]
    + [
        (1, 15),
        (0, 15),
    ]
)


PAIR_EMPTY = [6, 8, 9, 10, 11, 12, 13, 14]  # mts = 1 plan rows a plan with r ≤ 6 leaves empty


def pair_plan(rows, omega, valid, xp):
    """Plans of queries (2p, 2p+1) gathered into one 16-row tile per pair (screen_pair).

    rows uint8 [Qn, 16, 128], omega fp32 [Qn, 16] and valid bool [Qn] of an mts = 1 plan
    with r ≤ 6 → rows_p uint8 [P, 16, 128], omega_p fp32 [P, 16] (P = ⌈Qn/2⌉; an odd Qn's
    missing partner is a zero plan).  ω of the aux positions (6, 7, 14, 15) is 0: the
    kernel weighs them by −σ itself.  Invalid plans (recovered later, docs/method.md §7 C.3)
    become zero plans: they are the only plans whose rows can hold NaN codes, and a NaN
    row would erase its partner's terms in the kernel's fmaf(0, y, x).  A plan with a
    nonzero row outside slots 0..5 and the aux rows (r > 6) raises ValueError: the tile
    has no place for it.  xp: numpy or CuPy.
    """
    Qn = rows.shape[0]
    if rows.shape[1:] != (16, D) or omega.shape != (Qn, 16):
        raise ValueError(f"rows: expected an mts = 1 plan [Qn, 16, {D}], got {rows.shape}")
    ok = xp.asarray(valid, dtype=bool)
    rows = xp.where(ok[:, None, None], rows, 0).astype(xp.uint8)
    omega = xp.where(ok[:, None], omega, 0).astype(xp.float32)
    empty = device_const(xp, "pair_empty", lambda: np.array(PAIR_EMPTY))
    used = xp.any(rows[:, empty] != 0) | xp.any(omega[:, empty] != 0)
    if bool(used):  # one read-back
        raise ValueError(f"rows: a plan retains more than {PAIR_MAX_R} heads (slots > 5 used)")
    rows_p = pair_gather(rows, 0, xp)
    keep = device_const(xp, "pair_keep", lambda: _PAIR_ROW < 6)
    omega_p = xp.where(keep[None, :], pair_gather(omega, 0, xp), 0).astype(xp.float32)
    return rows_p, xp.ascontiguousarray(omega_p)


_PAIR_WHO = np.array([w for w, _ in PAIR_ROWS])  # which query of the pair (0: 2p, 1: 2p + 1)
_PAIR_ROW = np.array([j for _, j in PAIR_ROWS])  # its plan row


def pair_gather(x, fill: float, xp):
    """Per-row values x [Qn, 16, ...] of mts = 1 plans (rows, ω, plateau coefficients)
    gathered into the paired tiles: [P, 16, ...] with row i of pair p ←
    x[2p + PAIR_ROWS[i][0], PAIR_ROWS[i][1]]; an odd Qn's missing partner is ``fill``
    everywhere.  xp: numpy or CuPy."""
    Qn = x.shape[0]
    if x.ndim < 2 or x.shape[1] != 16:
        raise ValueError(
            f"x: expected per-row values of an mts = 1 plan [Qn, 16, ...], got {x.shape}"
        )
    if Qn % 2:
        x = xp.concatenate([x, xp.full((1, *x.shape[1:]), fill, dtype=x.dtype)])
    who = device_const(xp, "pair_who", lambda: _PAIR_WHO)
    row = device_const(xp, "pair_row", lambda: _PAIR_ROW)
    return xp.ascontiguousarray(x.reshape(-1, 2, *x.shape[1:])[:, who, row])


_QCHUNK = 2048  # queries per step of plateau_rows (a float64 [chunk, 16·mts, 128] temporary)


def _f32_up(x, xp):
    """float64 → the least fp32 ≥ x (NaN stays NaN)."""
    y = x.astype(xp.float32)
    return xp.where(y.astype(xp.float64) < x, xp.nextafter(y, xp.float32(np.inf)), y)


def plateau_constants(xp, mts: int):
    """(e4m3 value table float64 [256], retained-slot mask bool [16·mts]) as arrays of xp,
    copied to a device once and kept (``_build.device_const``): a captured step may launch
    kernels but not copy from the host (it loads them before it measures its allocations)."""

    def slots():
        slot = np.zeros(16 * mts, dtype=bool)
        slot[row_slots(mts)] = True
        return slot

    return (
        device_const(xp, "e4m3_values", lambda: e4m3_values(np.arange(256, dtype=np.uint8))),
        device_const(xp, f"slots_mt{mts}", slots),
    )


def plateau_rows(plan: DevicePlan, w, mma_bits: int, xp, scorer: str = "f16"):
    """Zero-plateau coefficients of the screen (docs/method.md §7 "Tie-aware rejection and
    zero plateaus", proofs/gpu_zero_plateau.py): fp32 [Qn, 16·mts].

    A query qualifies when its plan is valid and retains every positive head: no omitted
    positive head (P = ∅) and as many plan rows with ω_j > 0 as weights w [Qn, Hp] > 0.  With
    P = ∅ nothing is folded (ω_j = w_h of the head whose e4m3 row q̄_h is plan row j), so the
    rows with ω_j > 0 are exactly the positive heads.  Their coefficient z_j covers, in
    units of ρ, the screen's dot error and the canonical scorer's logit error together, so
    x̂_j + z_j·ρ ≤ 0 certifies the canonical logit ≤ 0 (csrc/common.cuh plateau_miss):

    * the screen's chain: |x̂_j − x| ≤ γ_mma·Σ_d|q̄_jd||k̄_d| ≤ γ_mma·‖q̄_j‖·ρ√D (plan.py's
      MMA model; ρ√D ≥ ‖k̄‖);
    * the canonical logit, ``scorer`` "f16": the same chain, γ_mma·‖q̄_j‖ρ√D again, so
      z_j = RU32(2·γ_mma·√D·‖q̄_j‖·(1 + MU));
    * ``scorer`` "fp8" (proofs/wgmma_fresh_step.py with the key's own exponents): step s of
      the fresh-step dot loses < 32·2^(eq_s + ek_s − 13) in its window, eq_s / ek_s the
      largest exponent fields of the step's nonzero codes of q̄_j / k̄ (subnormals −6), and
      2^(ek_s) ≤ 8·max_d|k̄_d| ≤ 8ρ√D (a nonzero e4m3 value is ≥ 2^e, or ≥ 2^-9 = 2^-6/8 for
      a subnormal), so < 2^(eq_s − 5)·ρ√D; plus (2^-13 + γ_3(1 + 2^-13))·Σ|q̄||k̄| of the
      write-back and the three fp32 adds, and 3·2^-126 of flushed adds (below MU·z·ρ for
      every key with a nonzero product: ρ > 2^-13, z > 2^-12) — z_j = RU32(√D·((γ_mma +
      2^-13 + γ_3(1 + 2^-13))·‖q̄_j‖ + (1 + γ_3)·Σ_s 2^(eq_s − 5))·(1 + MU)).

    Every other row is −1 (no condition: negative heads, empty slots, aux rows); a query
    that does not qualify is NaN in every row (row 0 NaN switches the plateau off in the
    kernels).  ‖q̄_j‖² is exact in float64 (≤ 128 squares of multiples of 2^-9 below 2^25);
    the few float64 roundings of the products are far below MU.  xp: numpy or CuPy; no host
    synchronization.
    """
    Qn, nrow = plan.omega.shape
    table, slot = plateau_constants(xp, plan.mts)
    sq = xp.empty((Qn, nrow), dtype=xp.float64)
    steps = xp.zeros((Qn, nrow), dtype=xp.float64)
    for a in range(0, Qn, _QCHUNK):
        codes = plan.rows[a : a + _QCHUNK]
        v = table[codes]
        sq[a : a + _QCHUNK] = xp.sum(v * v, axis=2)
        if scorer == "fp8":
            steps[a : a + _QCHUNK] = _step_exponent_sum(codes, xp)
    pos = slot[None, :] & (plan.omega > 0)
    npos = xp.sum(xp.asarray(w) > 0, axis=1)
    ok = (
        xp.asarray(plan.valid, dtype=bool)
        & (xp.asarray(plan.omitted_positive) == 0)
        & (xp.sum(pos, axis=1) == npos)
    )
    # in fp64 (a few roundings of 2^-53 each) lifted by one (1 + MU) = 1 + 2^-30, then
    # rounded up to fp32: z ≥ the exact coefficient (proofs/gpu_zero_plateau.py checks it)
    gm = gamma_mma(mma_bits, D)
    if scorer == "fp8":
        g8 = 2.0**-13 + gamma(3) * (1 + 2.0**-13)
        coef = np.sqrt(D) * ((gm + g8) * xp.sqrt(sq) + (1 + gamma(3)) * steps)
    else:
        coef = 2.0 * gm * np.sqrt(D) * xp.sqrt(sq)
    z = xp.where(pos, _f32_up(coef * (1.0 + MU), xp), xp.float32(-1.0))
    return xp.ascontiguousarray(xp.where(ok[:, None], z, xp.float32(np.nan)).astype(xp.float32))


def _step_exponent_sum(codes, xp):
    """Σ_s 2^(eq_s − 5) of e4m3 rows ``codes`` uint8 [..., 128] (``plan.step_exponents``;
    a step of zeros adds 0): float64 [...], exact powers of two."""
    e = step_exponents(codes, xp)
    return xp.sum(xp.where(e > NO_EXPONENT, xp.ldexp(xp.ones(e.shape), e - 5), 0.0), axis=-1)


def batch_plateau_rows(b, plan: DevicePlan, xp):
    """``plateau_rows`` for batch ``b``'s scorer (``prepare.Batch.scorer``)."""
    return plateau_rows(plan, b.w, MMA_BITS, xp, b.scorer)


def tie_screen_wanted(seeds: Seeds, o: dict) -> bool:
    """Whether this chunk is screened by the tie-aware kernels (the ``_tie`` variants: the rule
    against the K-th seed record (τ, j) and the zero-plateau bound, docs/method.md §7
    "Tie-aware rejection and zero plateaus"): with ``tie_reject`` when some query's τ is
    exactly 0 — zero plateaus, where the plain rule keeps every key at U ≥ 0 (one device
    reduction, one sync).  Those kernels cost 1.8–1.9× the plain screen's time
    (docs/records/benchmarks.md "A measured regression, reverted"), so the other chunks
    keep the plain kernels; a small τ > 0 could also gain from min(U, 0) (a plateau key
    whose allowances lift U above τ), which this choice forgoes — efficiency, not
    exactness."""
    return bool(tie_screen_flag(seeds, o, cupy_or_raise()))


def tie_screen_flag(seeds: Seeds, o: dict, xp):
    """``tie_screen_wanted`` as a 0-d device bool (no synchronization)."""
    if not o["tie_reject"]:
        return xp.zeros((), dtype=bool)
    return xp.any(seeds.tau == 0)


def positive_heads_hist(w, xp):
    """int64 [Hp + 1] on ``xp``: the number of queries with h positive weights, h = 0..Hp
    (w fp32 [Qn, Hp]); what ``auto_pick`` reads.  No synchronization: a comparison with
    every h and a column sum, not ``bincount`` (CuPy's reads the largest value back to size
    its output — a synchronization before the route stage's one read-back)."""
    n = xp.sum(w > 0, axis=1)
    return xp.sum(n[:, None] == xp.arange(w.shape[1] + 1)[None, :], axis=0)


def auto_pick(r: int, hist, hopper: bool | None = None) -> tuple[str, int]:
    """``screen="auto"``'s (screen kernel, r) for a chunk without certificate seeds, from
    ``positive_heads_hist`` read back (numpy [Hp + 1], Qn = its sum > 0):
    - r = min(r, 6) when at least AUTO_PAIR_SHARE of the queries have at most PAIR_MAX_R
      positive weights (docs/records/notes.md "Paired screen"), on the transposed Hopper
      screen "wgt" (its 8-row build) where it runs (``hopper``), otherwise on "pair"
      (docs/records/benchmarks.md "The transposed screen and segmented anchors on the
      H200": 25.0 ms against the paired screen's 38.5 ms at 1M keys, H = 64);
    - else r = R_WIDE when the median query has more than AUTO_WIDE_MEDIAN, r otherwise,
      on the Hopper screen "wg" where it runs (``hopper``; default: ``sm90a.available()``),
      otherwise on "fp64" (the 16- and 32-row f16 "wgt" builds are slower than "wg" there);
      on "wgt" where its FP8 build runs (``WGT_FP8``: trained regime at 1M, auto 95.9 /
      62.8 ms against 106.7 / 66.7 on "wg", H 64 / 32, session 22).
    Every choice is exact; this only picks the faster one."""
    hist = np.asarray(hist)
    Qn = int(hist.sum())
    if hopper is None:
        hopper = sm90a.available()
    if hist[: PAIR_MAX_R + 1].sum() >= AUTO_PAIR_SHARE * Qn:
        return ("wgt" if hopper else "pair"), min(r, PAIR_MAX_R)
    median = int(np.searchsorted(np.cumsum(hist), (Qn + 1) // 2))
    if median > AUTO_WIDE_MEDIAN and r < R_WIDE:
        r = R_WIDE
    return ("wgt" if WGT_FP8 else "wg") if hopper else "fp64", r


def auto_wanted(screen: str, cert_seeds: int, Qn: int) -> bool:
    """Whether ``auto_screen`` reads the positive heads (else its answer is fixed)."""
    return screen == "auto" and not cert_seeds and Qn > 0


def auto_screen(
    screen: str, r: int, cert_seeds: int, w, xp, hopper: bool | None = None
) -> tuple[str, int]:
    """(screen kernel, r) for a chunk (w fp32 [Qn, Hp] on ``xp``): ``auto_pick`` of its
    ``positive_heads_hist`` (one device histogram, one sync) when ``screen="auto"``
    without certificate seeds; "fp64" with r under "auto" with certificate seeds (or no
    query); any other screen passes through."""
    if not auto_wanted(screen, cert_seeds, w.shape[0]):
        return ("fp64" if screen == "auto" else screen), r
    hist = positive_heads_hist(w, xp)
    return auto_pick(r, hist.get() if hasattr(hist, "get") else hist, hopper)


@dataclass(frozen=True)
class ScreenLaunch:
    """One screening launch, built once per chunk (``of``): the kernel's name, grid, dynamic
    shared memory and its leading arguments in the kernel's parameter order (screen.cu
    screen_mt* / screen_cert_mt* / screen_pair and their ``_tie`` variants: rows, om, sig, Cq,
    eps_raw, eps_out, tau[, kj, zrow], kp, alpha, rho, ks, ke, sinks, window, poolmask, Qn, N,
    QG; kj and zrow only in the ``_tie`` variants); the call adds the outputs (surv, Uout[,
    tcnt][, ucnt, urec, ucap])."""

    name: str
    grid: tuple
    smem: int
    args: tuple
    _: KW_ONLY  # the build's flags by name: a new one cannot shift the others
    hopper: bool = False  # screen_sm90a.cu's kernel (screen="wg"), built by sm90a
    wgt: bool = False  # screen_wgt.cu's kernel (screen="wgt"), WGT_SPEC
    ring: int = 0  # the wgt ring build's plan rows per query (its image kernel's), 0: not it
    fp8: bool = False  # the wgt FP8 build (a ring build on e4m3 operands, WGT_FP8)
    mts: int = 1  # the Hopper build's head tiles per query (sm90a.BUILDS)
    tie: bool = False  # the tie-aware variant (name ends in _tie): kj, zrow in, tcnt out

    @classmethod
    def of(cls, b: Batch, plan: DevicePlan, seeds: Seeds, rho, screen: str, cert: bool,
           zrow=None):  # fmt: skip
        """The launch screening ``b``'s keys with ``plan`` (mts rows per query; for "pair"
        an mts = 1 plan with r ≤ 6) against τ = ``seeds.tau``; ρ fp32 [N]; ``cert``: the
        screen_cert variant (not with "pair"); ``zrow`` fp32 [Qn, 16·mts] (``plateau_rows``):
        the tie-aware variant against the K-th seed record (τ, ``seeds.kth_id``), None: the
        strict rule."""
        tie = zrow is not None
        suffix = "_tie" if tie else ""
        # a plan covers the dots of one screen arithmetic: f16 plans any kernel's f16 chain,
        # "fp8_fresh" plans the FP8 build's (plain rule); no kernel runs another
        if plan.screen != "f16" and (plan.screen != "fp8_fresh" or screen != "wgt" or tie):
            raise ValueError(
                f"plan: built for {plan.screen!r} dots (only the FP8 'wgt' build computes any "
                f"but 'f16': 'fp8_fresh', plain rule), screened with {screen!r}"
                f"{' tie-aware' if tie else ''}"
            )
        T = tile()
        grid = ((b.N + T - 1) // T, (b.Qn + QG - 1) // QG)
        rows, omega, name = plan.rows, plan.omega, f"screen{'_cert' if cert else ''}_mt{plan.mts}"
        if screen == "pair":  # two queries per 16-row tile (r <= 6 checked by the options)
            rows, omega = pair_plan(plan.rows, plan.omega, plan.valid, cupy_or_raise())
            zrow = pair_gather(zrow, np.nan, cupy_or_raise()) if tie else None
            grid, name = (grid[0], (rows.shape[0] + QG - 1) // QG), "screen_pair"
        qg = {"wg": sm90a.QG, "wgt": WGT_QG}.get(screen, QG)
        args = (
            rows, omega, plan.sigma, plan.C, plan.eps_raw, np.float64(plan.eps_out), seeds.tau,
            *((seeds.kth_id, zrow) if tie else ()), b.kp, b.ksc, rho, b.ks, b.ke,
        ) + seeds.default_args() + (np.int32(b.Qn), np.int64(b.N), np.int32(qg))  # fmt: skip
        if screen == "wg":  # screen_mt{mts}'s arguments and bounds (sm90a.BUILDS)
            grid = (grid[0], (b.Qn + qg - 1) // qg)
            name = f"screen_wg_mt{plan.mts}{suffix}"
            return cls(name, grid, sm90a.smem_bytes(T), args, hopper=True, mts=plan.mts, tie=tie)
        if screen == "wgt":  # screen_wg_mt{mts}'s arguments
            # the build of the plan's width: 32 rows for mts = 2, 16 for mts = 1 — or 8 (rows
            # 0..5, 7, 15 only) for plans that retain at most 6 heads
            r_max = plan.r_max if plan.r_max is not None else 16 * plan.mts - 2
            nrow = 32 if plan.mts == 2 else wgt_rows(min(r_max, 14))
            grid = ((b.N + WGT_TILE - 1) // WGT_TILE, (b.Qn + qg - 1) // qg)
            if plan.screen == "fp8_fresh":  # the FP8 build: a ring build (header of the file)
                name, smem = f"screen_wgt_fp8_ring_rows{nrow}", wgt_ring_smem_bytes(nrow, True)
                name += ("_g32p" if WGT_PIPE else "_g32") if WGT_GUARD32 else ""
                return cls(name, grid, smem, args, wgt=True, ring=nrow, fp8=True)
            if WGT_RING:  # whole groups per block: WGT_QG is a multiple of 128 / nrow
                name, smem = f"screen_wgt_ring_rows{nrow}{suffix}", wgt_ring_smem_bytes(nrow)
                return cls(name, grid, smem, args, tie=tie, wgt=True, ring=nrow)
            name, smem = f"screen_wgt_rows{nrow}{suffix}", wgt_smem_bytes(nrow)
            return cls(name, grid, smem, args, tie=tie, wgt=True)
        return cls(name + suffix, grid, T * ROWB + T * 8, args, tie=tie)

    def function(self):
        """The compiled kernel (built and loaded on first use)."""
        if self.hopper:
            return sm90a.kernel(self.name, self.mts)
        if self.wgt:
            return kernel(self.name, self.smem, WGT_SPEC)
        return kernel(self.name, self.smem)

    def image_function(self):
        """The ring build's image kernel screen_wgt[_fp8]_image_rows{ring}[_tie] (built and
        loaded on first use)."""
        fp8 = "_fp8" if self.fp8 else ""
        return kernel(f"screen_wgt{fp8}_image_rows{self.ring}{'_tie' if self.tie else ''}", 0,
                      WGT_SPEC)  # fmt: skip

    def load(self) -> None:
        """Build and load every kernel of the launch — the ring build's image kernel too — so
        that a timed launch times no build: route.route_stage times its samples, and a build
        inside one sends the decision dense (docs/records/benchmarks.md "A memo that samples
        where the early rule would go dense")."""
        self.function()
        if self.ring:
            self.image_function()

    def prime(self, surv, tcnt=None) -> None:
        """``load``, then — on this launch's first use in the process on this device — one
        untimed launch into ``surv`` (and ``tcnt``, zeroed again after it), so that a timed
        launch times no one-time work of a first launch: the function's lazy loading, its
        shared-memory attribute, the first allocation of the images' size (route.route_stage
        times its samples, and the memo keeps a decision for ``refresh`` chunks:
        docs/records/benchmarks.md "A cold process's first sample").  The outputs are
        written again by the caller's launch."""
        self.load()
        key = (cupy_or_raise().cuda.Device().id, self.name, self.hopper, self.wgt, self.ring,
               self.fp8, self.tie)  # fmt: skip
        if key in _PRIMED:
            return
        self(surv, None, None, tcnt)
        if tcnt is not None:
            tcnt.fill(0)  # the tie-aware variant adds to it
        _PRIMED.add(key)

    def images(self):
        """The ring build's query-group images (uint8 [groups · wgt_image_bytes]), written by
        ``image_function`` from this launch's arguments (one block per group)."""
        cp = cupy_or_raise()
        Qn = int(self.args[-3])
        groups = -(-Qn // (128 // self.ring))
        image = cp.empty(max(groups, 1) * wgt_image_bytes(self.ring, self.fp8), dtype=cp.uint8)
        null = np.uint64(0)
        tail = (null, null) + ((null,) if self.tie else ()) + (image,)  # surv, Uout[, tcnt]
        self.image_function()((max(groups, 1),), (WGT_THREADS,), self.args + tail)
        return image

    def __call__(self, surv, bounds=None, cert: RecordBuffer | None = None, tcnt=None) -> None:
        """Launch: surv uint32 [Qn, NW] (written), bounds fp64 [Qn, N] or None, cert: the
        (U, id) records of the survivors (screen_cert only), tcnt uint32 [Qn] (zeroed; the
        tie-aware variant adds the keys the strict rule keeps and it rejects) or None."""
        null = np.uint64(0)
        out = (surv, bounds if bounds is not None else null)
        if self.tie:
            out += (tcnt if tcnt is not None else null,)
        if self.ring:
            out += (self.images(),)
        self.function()(
            self.grid,
            (
                sm90a.threads(self.mts)
                if self.hopper
                else WGT_THREADS
                if self.wgt
                else SCREEN_THREADS,
            ),
            self.args + out + (cert.args() if cert is not None else ()),
            shared_mem=self.smem,
        )


# (device, kernel build) of every ScreenLaunch primed in this process (``ScreenLaunch.prime``)
_PRIMED: set = set()


@dataclass
class Screened:
    """The screen's output: surv uint32 [Qn, NW] (survivor bits), bounds fp64 [Qn, N] U^num
    (NaN where not screened) or None, cert: the survivors' (U, id) records or None."""

    surv: object
    bounds: object
    cert: RecordBuffer | None
    tie_rejected: object = None  # uint32 [Qn] where the tie-aware variant ran, else None


def screen_stage(b: Batch, plan: DevicePlan, seeds: Seeds, rho, o: dict,
                 tie: bool | None = None) -> Screened:  # fmt: skip
    """Screen every visible non-seed key (options ``o``: screen — already resolved by
    ``auto_screen`` —, cert_seeds, cert_cap, debug_bounds).  ``tie``: the tie-aware variant
    or the strict rule as given (both exact), None: ``tie_screen_wanted`` (one
    synchronization)."""
    cp = cupy_or_raise()
    surv = cp.empty((b.Qn, b.NW), dtype=cp.uint32)
    bounds = cp.full((b.Qn, b.N), np.nan) if o["debug_bounds"] else None
    cert = RecordBuffer(b.Qn, int(o["cert_cap"])) if o["cert_seeds"] else None
    zrow = tcnt = None
    if tie is None:
        tie = tie_screen_wanted(seeds, o)
    if tie:  # docs/method.md §7 "Tie-aware rejection and zero plateaus"
        zrow = batch_plateau_rows(b, plan, cp)
        tcnt = cp.zeros(b.Qn, dtype=cp.uint32)
    launch = ScreenLaunch.of(b, plan, seeds, rho, o["screen"], cert is not None, zrow)
    launch(surv, bounds, cert, tcnt)
    return Screened(surv, bounds, cert, tcnt)
