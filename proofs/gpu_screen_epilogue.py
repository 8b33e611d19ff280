"""The GPU screen's fp32 epilogue stays inside the plan's screening allowance (docs/method.md §8;
dosa_cupy/csrc/kernels.cu ``screen_impl`` at MTS = 1 and ``screen_pair``, csrc/screen_wgt.cu
``u_hat`` of both builds; plan.py g_scr).

Statement.  Let x_0 … x_15 be one key's MMA outputs for a query's mts = 1 plan (fp32;
retained rows in slots 0..5 for the paired layout, any of rows 0..6, 8..14 otherwise, aux
rows 7 and 15), ω_j fp32 weights and σ ≥ 0 the aux scale, and

    Û(x) = Σ_{j ∉ {7, 15}} ω_j [x_j]_+ − σ [x_7 + x_15]_+ ,
    T(x) = Σ_{j ∉ {7, 15}} |ω_j| [x_j]_+ + σ [x_7 + x_15]_+ .

The kernels evaluate Û in fp32 with round-to-nearest: per lane g (rows g and g + 8) an aux
sum fmaf(1, x_15, x_7) on the aux lane, one or two fmaf products, then ``reduce8``'s fixed
pairing tree ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)) — unpaired (``screen_mt1``) or with
two queries per tile (``screen_pair``: rows 0..5 = a's retained rows, 6 = b's v0, 7 = a's
v0, 8..13 = b's, 14 = b's v1, 15 = a's v1; screen.PAIR_ROWS).  Then, for results in
fp32's normal range,

    |Û_fl − Û(x)| ≤ γ_5 · T(x) ≤ γ_{2·mts+6} · T(x)   (γ_n = n u / (1 − n u), u = 2^-24),

the second factor being the epilogue part of plan.py's g_scr, so the plan's C and ε cover
either layout.  Proof: every term passes through at most five roundings — the aux sum (RN
keeps its sign, so [fl(y)]_+ = [y]_+(1 + δ)), the product or fma, and three tree additions
(an fmaf(0, y, a) adds an exact zero); Higham's Lemma 3.1 gives the product of (1 + δ_i)
factors within 1 ± γ_5 per term, and the sum of the perturbed terms is the computed value.
Flush-to-zero (CuPy's -ftz=true) is outside this statement: each flushed result loses
< 2^-126, which ε_raw covers (plan.py docstring); the cases keep every nonzero
intermediate ≥ 2^-123.

``check`` evaluates both kernels' orders with an exact model of fp32 round-to-nearest-even
(rationals; the fma rounds the exact product-sum once) and compares with the exact Û.
No tightness is claimed (the bound is a worst case over all orders of 5 roundings).

The transposed screen (csrc/screen_wgt.cu ``u_hat``) evaluates one query's Û in one lane,
in other orders: ``screen_wgt_rows8`` (rows 0..5 retained, rows 6, 8..14 empty) a chain
ω_0[x_0]_+, then fmaf(ω_j, [x_j]_+, ·) for j = 1..5, then fmaf(−σ, [x_7 + x_15]_+, ·): at
most 7 roundings per term (``eval_wgt8``); ``screen_wgt_rows16`` four chains of a product
and three fmaf over rows (0..3), (4, 5, 6, 8), (9..12), (13, 14, then the aux fmaf),
added as (c_0 + c_1) + (c_2 + c_3): at most 6 (``eval_wgt16``); ``screen_wgt_rows32`` (an
mts = 2 plan: 32 rows, aux rows 23 and 31) eight such chains added as a tree of three
levels: at most 7 (``eval_wgt32``).  All are within γ_{2·mts+6} (γ_8 for mts = 1, γ_10 for
mts = 2) by the same argument (``check_wgt``).

The FP8 build of the transposed screen (csrc/screen_wgt.cu "The FP8 build") feeds the same
orders with dots x̂_j of e4m3 fresh steps (``dosa_ref.mma_model.fresh_dots``, the
probed wgmma model; proofs/wgmma_fresh_step.py's statement |x̂_j − x_j| ≤ g·Σ_d|q̄_jd||k̄_d|
+ a_j, g = 2^-13 + γ_3(1 + 2^-13), a_j = (1 + γ_3)Σ_s 2^(eq_s)).  Then, with A = Σ_j |ω_j|
Σ_d|q̄_jd||k̄_d| + σ Σ_d(|v̄_0d| + |v̄_1d|)|k̄_d| and a_rows = Σ_j |ω_j| a_j + σ(a_7 + a_15)
over the rows Û reads,

    |Û_fl(x̂) − Û(x)| ≤ (g + γ_n(1 + g))·A + (1 + γ_n)·a_rows,   n = 2·mts + 6,

plan.py's g_scr for screen="fp8_fresh" on A (through C) and plan.screen_row_constants on
ε_raw.  Proof: [·]_+ is 1-Lipschitz, so |Û(x̂) − Û(x)| ≤ Σ_j |ω_j||x̂_j − x_j| + σ(|x̂_7 − x_7|
+ |x̂_15 − x_15|) ≤ g·A + a_rows (the aux rows 16·mts − 9 and 16·mts − 1 in general);
T(x̂) ≤ (1 + g)·A + a_rows likewise; the epilogue adds γ_n·T(x̂).  ``check_wgt_fp8`` evaluates
it on e4m3 rows and keys with exact rationals (the exact dots from the codes' dyadic values,
the model's fp32 dots at their values) and checks that the float64 constants the plan uses
are at least the rational ones (g_scr after J's lift by 1 + MU, which covers the float64
roundings of the plan's constants).

The fp32 guard (csrc/epilogue.cuh ``guard_bound_ru32``, the FP8 build's ``_g32`` kernels):
U32 = RU(RU(α · RU(RU(Û + RU(ρ·C32)) + er32)) + eo32) in float32, every step rounded toward
+inf without flush to zero, C32, er32, eo32 the float64 C, ε_raw, ε_out rounded up.  For
ρ, α ≥ 0 each rounded value is at least its argument and the operations are monotone in the
rounded operand (a sum in both, a product by a non-negative factor), so
U32 ≥ α(Û + ρC + ε_raw) + ε_out exactly — the quantity the fp64 guard bounds from above
(numerical_dominance).  ``check_guard32`` evaluates every step with exact rationals on
adversarial inputs (subnormal, cancelling, past the float32 range, zeros), checks that
``dosa_cupy.emulate.guard_bound_ru32`` (the kernel's bit-for-bit model, held to it by
tests/test_gpu_screen_wgt.py) is that composition of exact upward roundings, and the
inequality.

The decode screen's order (``eval_dec``; docs/method.md §10 "The certificate in decode"; no
kernel evaluates it yet — it is the order a screen in ``decode_scan_tma``'s layout would
have, checked before the kernel is written): the plan's 16·mts rows are MMA columns, lane qd
holds rows 8b + 2qd and 8b + 2qd + 1 of each block b of eight, runs one fmaf chain over them
(the aux rows 16·mts − 9 and 16·mts − 1 are both lane 3's; its chain ends with the aux
fmaf), and two butterfly adds give (c_0 + c_1) + (c_2 + c_3) in every lane.  A term passes
through at most 4 + 2 = 6 roundings at mts = 1 and 8 + 2 = 10 at mts = 2 (lane 3's first
term: 7 + 2), within γ_{2·mts+6} by the same argument (``check_dec``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_cupy.plan import dot_allowance, screen_row_constants, step_exponents
from dosa_cupy.plan import gamma as gamma_f64
from dosa_cupy.screen import PAIR_ROWS  # the tile layout the kernel reads (no GPU needed)
from dosa_ref.fp8 import e4m3_bits, e4m3_values
from dosa_ref.mma_model import fresh_dots, window_rows

from ._audit import Audit, Result
from .wgmma_fresh_step import window_witness

NAME = "gpu_screen_epilogue"
STATEMENT = (
    "fp32 Û of screen_mt1 / screen_pair (γ_5 T), screen_wgt_rows16 (γ_6 T) and "
    "screen_wgt_rows8 (γ_7 T): |Û_fl − Û| ≤ γ_8 T (plan g_scr at mts = 1); "
    "screen_wgt_rows32 (γ_7 T) ≤ γ_10 T (g_scr at mts = 2); the FP8 build on fresh e4m3 "
    "dots: |Û_fl(x̂) − Û(x)| ≤ g_scr A + (1 + γ_{2mts+6}) a_rows (plan screen='fp8_fresh'); "
    "the fp32 guard: U32 ≥ α(Û + ρC + ε_raw) + ε_out; the decode screen's lane order "
    "(γ_6 T / γ_10 T at mts = 1 / 2)"
)

U = Fraction(1, 2**24)
DEPTH = 5  # roundings per term in both layouts at mts = 1
DEPTH_WGT = {32: 7, 16: 6, 8: 7}  # screen_wgt.cu u_hat, per build (plan rows per query)
DEPTH_DEC = {16: 6, 32: 10}  # the decode screen's lane order (eval_dec), per plan rows
PLAN_DEPTH = 2 * 1 + 6  # plan.py: gamma(2 * mts + 6)


_F32_MAX = Fraction(float(np.finfo(np.float32).max))


def round_f32(x, up: bool) -> float:
    """The fp32 value next to the exact rational ``x`` in the given direction (±inf
    beyond the range), as a Python float."""
    if x > _F32_MAX:
        return float("inf") if up else float(np.finfo(np.float32).max)
    if x < -_F32_MAX:
        return -float(np.finfo(np.float32).max) if up else float("-inf")
    f = np.float32(float(x))  # nearest-ish; adjusted exactly below
    if not np.isfinite(f):  # |x| rounded past FLT_MAX in the first rounding
        f = np.float32(np.finfo(np.float32).max) * np.float32(1 if x > 0 else -1)
    inf = np.float32(np.inf)
    if up:
        while Fraction(float(f)) < x:
            f = np.nextafter(f, inf)
        while True:
            g = np.nextafter(f, -inf)
            if np.isfinite(g) and Fraction(float(g)) >= x:
                f = g
            else:
                break
    else:
        while Fraction(float(f)) > x:
            f = np.nextafter(f, -inf)
        while True:
            g = np.nextafter(f, inf)
            if np.isfinite(g) and Fraction(float(g)) <= x:
                f = g
            else:
                break
    return float(f)


def gamma(n: int) -> Fraction:
    return n * U / (1 - n * U)


def rn(x: Fraction) -> Fraction:
    """fp32 round-to-nearest, ties to even, of an exact rational (finite range)."""
    lo, hi = Fraction(round_f32(x, False)), Fraction(round_f32(x, True))
    if lo == hi:
        return lo
    if x - lo != hi - x:
        return lo if x - lo < hi - x else hi
    # a tie: the even significand (the one whose last fp32 bit is 0)
    bits = np.array([float(lo)], dtype=np.float32).view(np.uint32)[0]
    return lo if bits % 2 == 0 else hi


def _relu(v: Fraction) -> Fraction:
    return v if v > 0 else Fraction(0)


def _tree(v: list[Fraction]) -> Fraction:
    """reduce8's pairing tree over the 8 lanes' values of one key."""
    a = rn(rn(v[0] + v[4]) + rn(v[2] + v[6]))
    b = rn(rn(v[1] + v[5]) + rn(v[3] + v[7]))
    return rn(a + b)


def eval_mt1(x, w, sig) -> Fraction:
    """screen_impl<1>'s epilogue: lane g weighs [fmaf(aux, x_{g+8}, x_g)]_+ by −σ (g = 7)
    or ω_g, then adds ω_{g+8}[x_{g+8}]_+ (0 on the aux lane) with a second fmaf."""
    v = []
    for g in range(8):
        lo, hi = x[g], x[g + 8]
        s = rn(lo + hi) if g == 7 else lo
        w_lo = -sig if g == 7 else w[g]
        w_hi = Fraction(0) if g == 7 else w[g + 8]
        a = rn(w_lo * _relu(s))  # fmaf(w, m, 0)
        a = rn(w_hi * _relu(hi) + a)  # fmaf(w, m, a): one rounding
        v.append(a)
    return _tree(v)


def eval_pair(xa, wa_, siga, xb, wb_, sigb) -> tuple[Fraction, Fraction]:
    """screen_pair's epilogue for the tile of queries a and b."""
    X = [(xa, xb)[q][j] for q, j in PAIR_ROWS]
    W = [(wa_, wb_)[q][j] if j < 6 else Fraction(0) for q, j in PAIR_ROWS]
    va, vb = [], []
    for g in range(8):
        lo, hi = X[g], X[g + 8]
        wa = W[g] if g < 6 else (-siga if g == 7 else Fraction(0))
        wb = W[g + 8] if g < 6 else (-sigb if g == 6 else Fraction(0))
        sa = rn(lo + hi) if g == 7 else lo
        sb = rn(lo + hi) if g == 6 else hi
        va.append(rn(wa * _relu(sa)))
        vb.append(rn(wb * _relu(sb)))
    return _tree(va), _tree(vb)


def eval_wgt8(x, w, sig) -> Fraction:
    """screen_wgt_rows8's u_hat: the chain over rows 0..5, then the aux fmaf."""
    a = rn(w[0] * _relu(x[0]))
    for j in range(1, 6):
        a = rn(w[j] * _relu(x[j]) + a)  # fmaf: one rounding
    return rn(-sig * _relu(rn(x[7] + x[15])) + a)


def _eval_chains(x, w, sig, n_rows: int) -> Fraction:
    """screen_wgt.cu's u_hat for n_rows = 16 or 32 plan rows (aux rows n_rows − 9, n_rows −
    1): the retained rows in order, in fmaf chains of four (a product, then fmaf), the aux
    fmaf on the last chain, then the pairwise tree (c_0 + c_1) + (c_2 + c_3), …"""
    aux0 = n_rows - 9
    rows = [j for j in range(n_rows) if j not in (aux0, n_rows - 1)]
    c = []
    for p in range(0, len(rows), 4):
        a = rn(w[rows[p]] * _relu(x[rows[p]]))
        for j in rows[p + 1 : p + 4]:
            a = rn(w[j] * _relu(x[j]) + a)  # fmaf: one rounding
        c.append(a)
    c[-1] = rn(-sig * _relu(rn(x[aux0] + x[n_rows - 1])) + c[-1])
    st = 1
    while st < len(c):
        for p in range(0, len(c) - st, 2 * st):
            c[p] = rn(c[p] + c[p + st])
        st *= 2
    return c[0]


def eval_wgt16(x, w, sig) -> Fraction:
    """screen_wgt_rows16's u_hat: chains (0..3), (4, 5, 6, 8), (9..12), (13, 14) + aux,
    then (c_0 + c_1) + (c_2 + c_3)."""
    return _eval_chains(x, w, sig, 16)


def eval_wgt32(x, w, sig) -> Fraction:
    """screen_wgt_rows32's u_hat: eight chains over rows 0..22, 24..30, the aux fmaf (rows
    23, 31) on the last, then a tree of three levels."""
    return _eval_chains(x, w, sig, 32)


def eval_dec(x, w, sig, n_rows: int) -> Fraction:
    """The order a decode screen over ``decode_scan_tma``'s layout would evaluate Û in
    (docs/records/notes.md "Session 36"; no kernel evaluates it yet): the plan's n_rows = 16·mts
    rows are MMA columns, lane qd holds rows 8b + 2qd and 8b + 2qd + 1 of every block b of 8,
    so each lane runs one chain over its rows in order (a product, then fmaf; the aux rows
    n_rows − 9 and n_rows − 1 both fall in lane 3, whose chain ends with the aux fmaf), and
    two butterfly adds (xor 1, then xor 2) give every lane (c_0 + c_1) + (c_2 + c_3)."""
    aux = (n_rows - 9, n_rows - 1)
    c = []
    for qd in range(4):
        mine = [8 * b + 2 * qd + h for b in range(n_rows // 8) for h in (0, 1)]
        ret = [j for j in mine if j not in aux]
        a = rn(w[ret[0]] * _relu(x[ret[0]]))
        for j in ret[1:]:
            a = rn(w[j] * _relu(x[j]) + a)  # fmaf: one rounding
        if qd == 3:
            a = rn(-sig * _relu(rn(x[aux[0]] + x[aux[1]])) + a)
        c.append(a)
    return rn(rn(c[0] + c[1]) + rn(c[2] + c[3]))


def exact(x, w, sig, rows, aux=(7, 15)) -> tuple[Fraction, Fraction]:
    """(Û, T) of one query: retained rows ``rows``, aux rows ``aux``."""
    ret = sum((w[j] * _relu(x[j]) for j in rows), Fraction(0))
    mag = sum((abs(w[j]) * _relu(x[j]) for j in rows), Fraction(0))
    a = sig * _relu(x[aux[0]] + x[aux[1]])
    return ret - a, mag + a


def check(x, w, sig, xb=None, wb=None, sigb=None, context="") -> Result:
    """x, w: 16 fp32 values each; sig fp32 ≥ 0.  Without (xb, wb, sigb): screen_mt1 on
    rows 0..6, 8..14; with them: screen_pair on a = (x, w, sig), b = (xb, wb, sigb), whose
    retained rows are 0..5 (rows 6, 8..14 are zero, so their MMA outputs are 0)."""
    au = Audit(NAME, tightness=False, context=context)
    F = [Fraction(float(np.float32(v))) for v in x]
    Wt = [Fraction(float(np.float32(v))) for v in w]
    S = Fraction(float(np.float32(sig)))
    if xb is None:
        got = [eval_mt1(F, Wt, S)]
        want = [exact(F, Wt, S, [j for j in range(16) if j not in (7, 15)])]
    else:
        Fb = [Fraction(float(np.float32(v))) for v in xb]
        Wb = [Fraction(float(np.float32(v))) for v in wb]
        Sb = Fraction(float(np.float32(sigb)))
        for arr in (F, Fb, Wt, Wb):
            for j in (6, 8, 9, 10, 11, 12, 13, 14):
                arr[j] = Fraction(0)
        got = list(eval_pair(F, Wt, S, Fb, Wb, Sb))
        want = [exact(F, Wt, S, range(6)), exact(Fb, Wb, Sb, range(6))]
    for u_fl, (u_ex, T) in zip(got, want, strict=True):
        err = abs(u_fl - u_ex)
        au.ge(gamma(DEPTH) * T, err, "|Û_fl − Û| ≤ γ_5 T")
        au.ge(gamma(PLAN_DEPTH) * T, gamma(DEPTH) * T, "γ_5 T ≤ γ_{2mts+6} T")
        if T > 0:
            au.track("err / (u T)", float(err / (U * T)))
    return au.result()


def check_wgt(x, w, sig, rows: int, context="") -> Result:
    """screen_wgt_rows{rows}'s u_hat on one query (x, w: 16 fp32 values — 32 for rows = 32,
    an mts = 2 plan —, sig ≥ 0; rows = 8: rows 6, 8..14 are empty, as the host guarantees by
    launching it for r ≤ 6 only)."""
    au = Audit(NAME, tightness=False, context=context)
    F = [Fraction(float(np.float32(v))) for v in x]
    Wt = [Fraction(float(np.float32(v))) for v in w]
    S = Fraction(float(np.float32(sig)))
    aux, plan_depth = (7, 15), PLAN_DEPTH
    if rows == 8:
        for arr in (F, Wt):
            for j in (6, 8, 9, 10, 11, 12, 13, 14):
                arr[j] = Fraction(0)
        got, kept = eval_wgt8(F, Wt, S), range(6)
    elif rows == 16:
        got, kept = eval_wgt16(F, Wt, S), [j for j in range(16) if j not in (7, 15)]
    else:
        aux, plan_depth = (23, 31), 2 * 2 + 6  # mts = 2
        got, kept = eval_wgt32(F, Wt, S), [j for j in range(32) if j not in aux]
    u_ex, T = exact(F, Wt, S, kept, aux)
    err, depth = abs(got - u_ex), DEPTH_WGT[rows]
    au.ge(gamma(depth) * T, err, f"|Û_fl − Û| ≤ γ_{depth} T")
    au.ge(gamma(plan_depth) * T, gamma(depth) * T, f"γ_{depth} T ≤ γ_{{2mts+6}} T")
    if T > 0:
        au.track("err / (u T)", float(err / (U * T)))
    return au.result()


def check_dec(x, w, sig, rows: int, context="") -> Result:
    """``eval_dec`` on one query's plan of ``rows`` = 16 or 32 rows (x, w: that many fp32
    values, sig ≥ 0): within γ_{DEPTH_DEC[rows]} T, and DEPTH_DEC[rows] ≤ 2·mts + 6."""
    au = Audit(NAME, tightness=False, context=context)
    F = [Fraction(float(np.float32(v))) for v in x]
    Wt = [Fraction(float(np.float32(v))) for v in w]
    S = Fraction(float(np.float32(sig)))
    aux = (rows - 9, rows - 1)
    u_ex, T = exact(F, Wt, S, [j for j in range(rows) if j not in aux], aux)
    err, depth, plan_depth = abs(eval_dec(F, Wt, S, rows) - u_ex), DEPTH_DEC[rows], rows // 8 + 6
    au.ge(gamma(depth) * T, err, f"|Û_fl − Û| ≤ γ_{depth} T")
    au.ge(gamma(plan_depth) * T, gamma(depth) * T, f"γ_{depth} T ≤ γ_{{2mts+6}} T")
    if T > 0:
        au.track("err / (u T)", float(err / (U * T)))
    return au.result()


def check_wgt_fp8(q, k, w, sig, rows: int, context="") -> Result:
    """The FP8 build's Û (module docstring, last part) for one query: q uint8 [16·mts, 128]
    its plan rows' e4m3 codes (aux rows 16·mts − 9 and 16·mts − 1; mts = 2 for rows = 32),
    k uint8 [n, 128] keys, w fp32 [16·mts] (ω of the rows; 0 is used at the aux rows), sig
    fp32 ≥ 0; rows = 8: rows 6, 8..14 empty (zero codes, ω = 0), as the host launches that
    build for r ≤ 6 only."""
    au = Audit(NAME, tightness=False, context=context)
    q, w = np.array(q, dtype=np.uint8), np.array(w, dtype=np.float32)
    n_rows = q.shape[0]
    mts, aux = n_rows // 16, (n_rows - 9, n_rows - 1)
    depth = 2 * mts + 6  # plan.py's gamma(2·mts + 6)
    if rows == 8:
        q[[6, 8, 9, 10, 11, 12, 13, 14]] = 0
        w[[6, 8, 9, 10, 11, 12, 13, 14]] = 0
    w[list(aux)] = 0
    kept = range(6) if rows == 8 else [j for j in range(n_rows) if j not in aux]
    ev = {8: eval_wgt8, 16: eval_wgt16, 32: eval_wgt32}[rows]
    Wt = [Fraction(float(v)) for v in w]
    S = Fraction(float(np.float32(sig)))
    # exact dots: e4m3 values are multiples of 2^-9, so 2^18·q̄·k̄ is an integer (< 2^43)
    qi = (e4m3_values(q) * 512).astype(np.int64)
    ki = (e4m3_values(k) * 512).astype(np.int64)
    dots, mags = qi @ ki.T, np.abs(qi) @ np.abs(ki).T  # [16, n]
    xhat = fresh_dots(q, k)  # float32 [n, 16]: the kernel's dots
    g = Fraction(1, 2**13) + gamma(3) * (1 + Fraction(1, 2**13))
    g_scr = g + gamma(depth) * (1 + g)
    e = step_exponents(q, np)  # [16·mts, 4]
    a = [(1 + gamma(3)) * sum((Fraction(2) ** int(x) for x in e[j] if x > -1000), Fraction(0))
         for j in range(n_rows)]  # fmt: skip
    a_rows = sum((abs(Wt[j]) * a[j] for j in kept), Fraction(0)) + S * (a[aux[0]] + a[aux[1]])
    for n in range(k.shape[0]):
        X = [Fraction(int(v), 2**18) for v in dots[:, n]]
        M = [Fraction(int(v), 2**18) for v in mags[:, n]]
        u_ex, _ = exact(X, Wt, S, kept, aux)
        A = sum((abs(Wt[j]) * M[j] for j in kept), Fraction(0)) + S * (M[aux[0]] + M[aux[1]])
        got = ev([Fraction(float(v)) for v in xhat[n]], Wt, S)
        err, bound = abs(got - u_ex), g_scr * A + (1 + gamma(depth)) * a_rows
        au.ge(bound, err, "|Û_fl(x̂) − Û(x)| ≤ g_scr A + (1 + γ_{2mts+6}) a_rows")
        if bound > 0:
            au.track("err / bound", float(err / bound))
    # the plan's float64 constants: g_scr (build_plans: float64, within a few roundings of
    # 2^-53 of the rational one, which the (1 + MU) lift of J covers) and the ε_raw term
    # (screen_row_constants, lifted by its own 1 + MU)
    g64, _ = dot_allowance("fp8_fresh", q, 17, np)
    g64_scr = Fraction(g64 + gamma_f64(depth) * (1 + g64))
    au.ge(g64_scr * (1 + Fraction(1, 2**30)), g_scr, "plan g_scr (1 + MU) ≥ g_scr")
    sig1 = np.array([sig], np.float32)
    r64 = screen_row_constants(q[None], w[None], sig1, mts, "fp8_fresh", 17, np)
    au.ge(Fraction(float(r64[0])), (1 + gamma(depth)) * a_rows, "ε_raw term ≥ (1+γ) a_rows")
    return au.result()


def check_guard32(uh, rho, alpha, C, er, eo, context="") -> Result:
    """The FP8 screen's fp32 guard (csrc/epilogue.cuh guard_bound_ru32, modelled bit for bit
    by ``dosa_cupy.emulate.guard_bound_ru32`` — the GPU test holds the kernel to that model):
    on float32 Û, ρ ≥ 0, α ≥ 0 and float64 C, ε_raw, ε_out, each of its seven roundings is
    the exact rational rounded up to float32 (subnormals kept, ±inf beyond the range), and
    U32 ≥ α(Û + ρC + ε_raw) + ε_out exactly — the value the fp64 guard bounds, hence every
    score the dominance statement covers."""
    from dosa_cupy.emulate import guard_bound_ru32

    au = Audit(NAME, tightness=False, context=context)
    got = guard_bound_ru32(np.float32(uh), np.float32(rho), np.float32(alpha), np.float64(C),
                           np.float64(er), np.float64(eo))  # fmt: skip
    Fu, Fr, Fa = (Fraction(float(np.float32(v))) for v in (uh, rho, alpha))
    Fc, Fe, Fo = (Fraction(float(v)) for v in (C, er, eo))

    def up(x):
        return Fraction(round_f32(x, True)) if abs(x) <= _F32_MAX else x  # inf stays ≥

    c32, e32, o32 = up(Fc), up(Fe), up(Fo)
    u = up(up(Fu + up(Fr * c32)) + e32)
    want = up(up(Fa * u) + o32)
    au.claim(np.isfinite(got) == (abs(want) <= _F32_MAX), "finite exactly where RU is")
    if np.isfinite(got):
        au.eq(Fraction(float(got)), want, "the model = the exact roundings up, step by step")
        au.ge(
            Fraction(float(got)), Fa * (Fu + Fr * Fc + Fe) + Fo, "U32 ≥ α(Û + ρC + ε_raw) + ε_out"
        )
    else:
        au.claim(got > 0, "U32 = +inf only above the float32 range")
    return au.result()


def _guard32_cases(rng) -> list[dict]:
    """Inputs of ``check_guard32``: moderate, wide-range (2^±100), subnormal (Û, ρ, α, C, ε
    down to 2^-149 and below), cancelling (Û ≈ −ρC − ε_raw), huge α (results past the
    float32 range), and zero ρ / C / ε."""
    out = []
    for trial in range(240):
        kind = trial % 6
        if kind == 0:
            uh, rho, alpha = (
                _fp32(rng, 1, -8, 8)[0],
                abs(_fp32(rng, 1, -4, 4)[0]),
                abs(_fp32(rng, 1, -6, 6)[0]),
            )
            C, er, eo = float(abs(_fp32(rng, 1, -8, 2)[0])) * (1 + 2.0**-40), 2.0**-20, 2.0**-126
        elif kind == 1:
            uh, rho, alpha = (
                _fp32(rng, 1, -100, 100)[0],
                abs(_fp32(rng, 1, -60, 60)[0]),
                abs(_fp32(rng, 1, -60, 60)[0]),
            )
            C, er, eo = (
                float(2.0 ** rng.integers(-90, 40)) * (1 + rng.random()),
                2.0**-90,
                2.0**-126,
            )
        elif kind == 2:  # the subnormal range of every input and result
            uh = np.float32(rng.choice([-1, 1]) * rng.integers(0, 50) * 2.0**-149)
            rho, alpha = (
                np.float32(rng.integers(0, 9) * 2.0**-140),
                np.float32(2.0 ** rng.integers(-30, 3)),
            )
            C, er, eo = float(rng.random()) * 2.0**-130, float(rng.random()) * 2.0**-150, 2.0**-149
        elif kind == 3:  # cancellation: Û close to −(ρC + ε_raw)
            rho, alpha = abs(_fp32(rng, 1, -3, 3)[0]), abs(_fp32(rng, 1, -3, 3)[0])
            C, er = float(rng.random()), 2.0**-24
            uh = np.float32(-(float(rho) * C + er) * (1 + rng.choice([-1, 1]) * 2.0**-23))
            eo = 2.0**-126
        elif kind == 4:  # huge α: α(·) past the float32 range
            uh, rho, alpha = abs(_fp32(rng, 1, 60, 100)[0]), np.float32(1.0), np.float32(2.0**100)
            C, er, eo = 1.0, 0.0, 2.0**-126
        else:  # zeros: ρ, C, ε_raw, ε_out
            uh, rho, alpha = (
                _fp32(rng, 1, -20, 20)[0],
                np.float32(0.0),
                abs(_fp32(rng, 1, -3, 3)[0]),
            )
            C, er, eo = 0.0, 0.0, 0.0
        out.append(dict(_check="check_guard32", uh=uh, rho=rho, alpha=alpha, C=C, er=er, eo=eo,
                        context=f"guard32 kind {kind} #{trial}"))  # fmt: skip
    return out


def _fp8_cases(rng) -> list[dict]:
    """e4m3 plan rows and keys for ``check_wgt_fp8``: uniform codes, quantized gaussians,
    rows and keys whose steps lose the most in the window (one ±448 and many small values),
    subnormal rows; σ balancing the aux rows' dot against the retained sum (cancellation)."""
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    out = []
    for trial in range(12):
        kind = trial % 4
        if kind == 0:
            q, k = rng.choice(finite, (16, 128)), rng.choice(finite, (6, 128))
        elif kind == 1:
            g = rng.standard_normal((22, 128))
            v = e4m3_bits((g / np.abs(g).max(1, keepdims=True) * 448).astype(np.float32))
            q, k = v[:16], v[16:]
        elif kind == 2:
            q, k = window_rows(rng, 16), window_rows(rng, 6)
        else:
            q = rng.integers(0, 8, (16, 128)).astype(np.uint8)  # subnormals and zeros
            k = rng.choice(finite, (6, 128))
        w = _fp32(rng, 16, -6, 2, signed=bool(kind % 2))
        xs = fresh_dots(q, k).astype(np.float64)  # σ against the first key's dots
        ret = float(np.sum(np.abs(w[:7]) * np.maximum(xs[0, :7], 0)))
        aux = max(xs[0, 7] + xs[0, 15], 0.0)
        sig = np.float32(min(max(ret / aux if aux > 0 and ret > 0 else 0.5, 2.0**-40), 2.0**40))
        for rows in (16, 8):
            out.append(dict(_check="check_wgt_fp8", q=q, k=k, w=w, sig=sig, rows=rows,
                            context=f"wgt{rows} fp8 kind {kind} #{trial}"))  # fmt: skip
        # an mts = 2 plan (the 32-row build): the rows twice over, the second tile reversed
        q2, w2 = np.concatenate([q, q[::-1]]), np.concatenate([w, w])
        out.append(dict(_check="check_wgt_fp8", q=q2, k=k, w=w2, sig=sig, rows=32,
                        context=f"wgt32 fp8 kind {kind} #{trial}"))  # fmt: skip
    # wgmma_fresh_step's window witness on every row (q = 1; each key step one 448 and 31
    # small values): every row's dot loses most of its quantum per small product, one sign
    c = window_witness()
    q = np.repeat(c["q"], 16, axis=0)
    q[15] = 0
    w = np.full(16, 0.5, np.float32)
    for rows in (16, 8):
        out.append(dict(_check="check_wgt_fp8", q=q, k=c["k"], w=w, sig=np.float32(0.25),
                        rows=rows, context=f"wgt{rows} fp8 witness"))  # fmt: skip
    q2 = np.repeat(c["q"], 32, axis=0)
    q2[31] = 0
    out.append(dict(_check="check_wgt_fp8", q=q2, k=c["k"], w=np.full(32, 0.5, np.float32),
                    sig=np.float32(0.25), rows=32, context="wgt32 fp8 witness"))  # fmt: skip
    return out


def _fp32(rng, n, lo_exp, hi_exp, signed=True):
    e = rng.integers(lo_exp, hi_exp + 1, n)
    m = 1 + rng.random(n)
    s = rng.choice([-1.0, 1.0], n) if signed else np.ones(n)
    return (s * m * np.exp2(e)).astype(np.float32)


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for layout in ("mt1", "pair", "wgt16", "wgt8", "wgt32", "dec16", "dec32"):
        for trial in range(60):
            kind = trial % 5
            q = []
            for _ in range(2 if layout == "pair" else 1):
                if kind == 0:  # moderate, mixed signs
                    x = _fp32(rng, 16, -10, 10)
                    w = _fp32(rng, 16, -4, 2, signed=False)
                elif kind == 1:  # wide exponent range (≥ 2^-100: no flush anywhere)
                    x = _fp32(rng, 16, -100, 60)
                    w = _fp32(rng, 16, -20, 20, signed=False)
                elif kind == 2:  # integers: exact ties and zeros
                    x = rng.integers(-8, 9, 16).astype(np.float32)
                    w = rng.integers(1, 4, 16).astype(np.float32)
                elif kind == 3:  # all positive rows, negative weights allowed
                    x = np.abs(_fp32(rng, 16, -8, 8))
                    w = _fp32(rng, 16, -3, 3)
                else:  # near-cancelling: values close to each other
                    base = np.float32(2.0 ** rng.integers(-6, 6))
                    x = (base * (1 + _fp32(rng, 16, -24, -12))).astype(np.float32)
                    w = np.full(16, 1.0, np.float32)
                # σ balances the aux term against the retained sum (cancellation in Û)
                ret = np.sum(np.abs(w[:7].astype(np.float64)) * np.maximum(x[:7], 0))
                aux = max(float(x[7]) + float(x[15]), 0.0)
                ratio = ret / aux if aux > 0 and ret > 0 else 0.5
                sig = np.float32(min(max(ratio, 2.0**-60), 2.0**60))  # finite fp32
                q.append((x, w, sig))
            if layout == "pair":
                (x, w, s), (xb, wb, sb) = q
                out.append(dict(x=x, w=w, sig=s, xb=xb, wb=wb, sigb=sb,
                                context=f"pair kind {kind} #{trial}"))  # fmt: skip
            elif layout.startswith(("wgt", "dec")):
                x, w, s = q[0]
                if layout.endswith("32"):  # an mts = 2 plan: the same kinds of rows twice over
                    x, w = np.concatenate([x, x[::-1]]), np.concatenate([w, w])
                fn = "check_wgt" if layout.startswith("wgt") else "check_dec"
                out.append(dict(_check=fn, x=x, w=w, sig=s, rows=int(layout[3:]),
                                context=f"{layout} kind {kind} #{trial}"))  # fmt: skip
            else:
                x, w, s = q[0]
                out.append(dict(x=x, w=w, sig=s, context=f"mt1 kind {kind} #{trial}"))
    return out + _fp8_cases(rng) + _guard32_cases(rng)
