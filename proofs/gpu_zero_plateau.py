"""The zero-plateau bound and the tie-aware rule on the GPU (docs/method.md §7 "Tie-aware
rejection and zero plateaus", Proposition Z; kernels: dosa_cupy/csrc/common.cuh
``plateau_miss`` / ``below_kth``, coefficients ``dosa_cupy.screen.plateau_rows``).

Statement (Proposition Z).  Let a query's plan retain every head with w'_h > 0 (P = ∅), its
plan row j of such a head being the head's e4m3 row q̄_j, with the coefficient
z_j ≥ 2·γ_mma·√D·‖q̄_j‖ (``plateau_rows``), and let ρ_i·√D ≥ ‖k̄_i‖ (``key_rms``).
For the native FP8 canonical scorer (``plateau_rows(..., scorer="fp8")``) the coefficient is
z_j ≥ √D·((γ_mma + g_8)‖q̄_j‖ + (1 + γ_3)Σ_s 2^(eq_s − 5)), g_8 = 2^-13 + γ_3(1 + 2^-13),
eq_s the largest exponent field of q̄_j's nonzero codes in k32 step s.  Assume
the MMA model of docs/error_model.md ("The GPU planner's version"): every chained dot the
kernels compute — the screen's x̂_j and the canonical scorer's logit x^ref_h — lies within
γ_mma·M of the exact dot x = q̄·k̄, M = Σ_d |q̄_d||k̄_d|.  If for every such row the screen's
test RU(x̂_j + RU(z_j·ρ_i)) ≤ 0 holds, then the canonical score s_i = α_i·Σ_h w'_h[x^ref_h]_+
(common.cuh ``score_batch``: fmaf chains, ``reduce8``, one multiply by α_i ≥ 0) has
code(s_i) ≤ code(+0) (−0 folds onto +0, NaN is code 0), so min(U_i, 0) bounds it in the
record order; with τ = 0 the key is rejected iff i > j, the K-th seed record's id.

Proof.  M ≤ ‖q̄_j‖‖k̄_i‖ ≤ ‖q̄_j‖ρ_i√D (Cauchy–Schwarz), so z_j ρ_i ≥ 2γ_mma M and
x^ref ≤ x + γ_mma M ≤ x̂ + 2γ_mma M ≤ x̂ + z_j ρ_i ≤ 0 (upward rounding only raises the
tested value).  FP8: by proofs/wgmma_fresh_step.py step s loses less than
32·2^(eq_s + ek_s − 13) in its window (ek_s the largest exponent field of the key's nonzero
codes in the step), and 2^(ek_s) ≤ 8·max_d|k̄_d| ≤ 8ρ_i√D (a nonzero e4m3 value is at least
2^e, a subnormal at least 2^-9 = 2^-6/8), so x^ref ≤ x + (1 + γ_3)Σ_s 2^(eq_s − 5)ρ_i√D +
g_8 M + 3·2^-126 ≤ x̂ + z_j ρ_i (the flushed-add term is below the 2^-30 lift of z for any
key with a nonzero product; without one, x^ref = x = 0).  The FP8 head sum (scorer_fp8.cuh:
fmaf chains, adds, one multiply by α) keeps the sign the same way.
Then [x^ref]_+ is ±0 for every positive head, every term w'_h[x^ref_h]_+ is
≤ 0 (w'_h ≤ 0 for the other heads; fmaxf(NaN, 0) = 0), a round-to-nearest fmaf or add of
non-positive values is ≤ 0 (0 is representable, rounding is monotone; a flushed result is
±0), and α_i ≥ 0 keeps the sign (a product −inf·0 is NaN, code 0).  The record (s_i, i) is
therefore at or below (+0, i), strictly below (0, j) when i > j, and below every positive τ:
K distinct seed records sit at or above (τ, j) (Statement 1 of proofs/zero_plateau.py).  The
screen's x̂_j need not equal the scorer's logit bitwise (the row sits at another position
of another MMA tile); only the model's two-sided bound is used.

What is checked (exact rationals; every float below is an exact dyadic value):

* ``check``: plans of ``dosa_cupy.plan.build_plans`` (numpy) and the coefficients of
  ``plateau_rows`` on e4m3 queries and keys.  A key counts as certified when the most
  permissive admissible screen value passes, x − γM + z·ρ ≤ 0 for every row with z ≥ 0 —
  so every admissible x̂ is covered.  Claimed for each certified key: the largest admissible
  canonical logit x + γM of every head with w > 0 (taken from q and w, not from the plan:
  a positive head missing from the rows is caught) is ≤ 0; the canonical epilogue (fp32,
  round to nearest, head order and a reversed order) on the largest admissible logits gives
  a score ≤ 0; its code ≤ code(+0).  Queries with P ≠ ∅ must get NaN rows (no plateau).
  Tightness: a certified key whose exact score is 0 — the bound min(U, 0) = 0 is attained,
  and at τ = 0 its rejection is decided by its id alone.
* ``check_boundary``: a crafted key on which the test is just met — q̄ = ones, k̄ = 63 × (+1),
  64 × (−1) and one entry e; over the e4m3 values e the largest one certified is found,
  the next e4m3 value is not certified, and the certified one's canonical logit bound holds.
* ``check_records``: the GPU record order at τ = 0: code(−0) = code(+0), code(NaN) = 0,
  negative scores below; (s, i) with s ≤ 0, i > j is below (0, j), with i < j and s = 0
  it is above.
* Mutants: "no_allowance" (z = 0: certify x̂ ≤ 0) and "uncertified" (every key of a
  qualifying query is a plateau key) — each fails on a generated or crafted case.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_cupy.emulate import score_code
from dosa_cupy.plan import build_plans, gamma_mma
from dosa_cupy.screen import plateau_rows
from dosa_ref.fp8 import e4m3_bits, e4m3_values, key_rms
from dosa_ref.mma_model import e4m3_exponent, fp8_fresh_scores, fresh_dots

from ._audit import Audit, Result

NAME = "gpu_zero_plateau"
STATEMENT = (
    "P = ∅ and x̂_j + z_j ρ ≤ 0 for every positive row (z_j ≥ 2γ_mma√D‖q̄_j‖; FP8: "
    "√D((γ_mma + g8)‖q̄_j‖ + (1+γ3)Σ_s 2^(eq_s−5))) ⇒ the canonical GPU score has code ≤ "
    "code(+0): min(U, 0) bounds it; at τ = 0 rejected iff i > j"
)

MUTANTS = ("no_allowance", "uncertified")
D = 128
_E4M3 = e4m3_values(np.arange(256, dtype=np.uint8))


_G3 = 3 * Fraction(1, 2**24) / (1 - 3 * Fraction(1, 2**24))
_TINY = Fraction(1, 2**126)


def _fr(x) -> Fraction:
    return Fraction(float(x))


def _certified(X, M, z, rho, gam: Fraction, mutate: str | None) -> np.ndarray:
    """bool [n]: keys the kernel can certify for some admissible screen value x̂ of each row
    (X, M float64 [rows, n] exact dots and magnitudes, z fp32 [rows], ρ fp32 [n])."""
    n = X.shape[1]
    out = np.ones(n, dtype=bool)
    if mutate == "uncertified":
        return out
    for j in range(X.shape[0]):
        zj = float(z[j])
        if zj < 0:
            continue  # no condition (not a positive head)
        if mutate == "no_allowance":
            zj = 0.0
        for i in range(n):
            if out[i]:
                lo = _fr(X[j, i]) - gam * _fr(M[j, i])  # least admissible screen value
                out[i] = lo + _fr(zj) * _fr(rho[i]) <= 0
    return out


def _epilogue_sign(w, xmax) -> bool:
    """The canonical fp32 epilogue (round to nearest) on the largest admissible logits, in
    head order and reversed: both sums ≤ 0."""
    f = np.float32
    terms = [f(w[h]) * f(max(float(xmax[h]), 0.0)) for h in range(len(w))]
    ok = True
    for order in (terms, terms[::-1]):
        acc = f(0.0)
        for t in order:
            acc = f(acc + f(t))
        ok &= bool(acc <= 0)
    return ok


def _fp8_logit_bound(qv, qc, kv, kc) -> Fraction:
    """The largest canonical FP8 logit admissible for one head row (values qv, codes qc) and
    one key (kv, kc): q̄·k̄ + (1 + γ_3)Σ_s 32·2^(eq_s + ek_s − 13) + g_8·Σ|q̄||k̄| + 3·2^-126,
    eq_s / ek_s over the step's nonzero products (proofs/wgmma_fresh_step.py), exact."""
    x = sum(_fr(a) * _fr(b) for a, b in zip(qv, kv, strict=True))
    m = sum(abs(_fr(a) * _fr(b)) for a, b in zip(qv, kv, strict=True))
    qe, ke = e4m3_exponent(qc), e4m3_exponent(kc)
    win = Fraction(0)
    for st in range(4):
        sl = slice(32 * st, 32 * st + 32)
        nz = (qv[sl] != 0) & (kv[sl] != 0)
        if nz.any():
            win += 32 * Fraction(2) ** int((qe[sl][nz] + ke[sl][nz]).max() - 13)
    g8 = Fraction(1, 2**13) + _G3 * (1 + Fraction(1, 2**13))
    return x + (1 + _G3) * win + g8 * m + 3 * _TINY


def check(q, w, kp, r=14, mma_bits=17, mutate=None, context="", scorer="f16") -> Result:
    """Proposition Z on e4m3 queries q uint8 [Qn, Hp, 128] (Hp = 16·MT), weights w fp32
    [Qn, Hp] and keys kp uint8 [N, 128], for the canonical ``scorer`` "f16" or "fp8" (then
    also the bit-exact FP8 logits and head sum of ``dosa_ref.mma_model`` on certified keys)."""
    au = Audit(NAME, tightness=True, context=context)
    q, w, kp = np.asarray(q, np.uint8), np.asarray(w, np.float32), np.asarray(kp, np.uint8)
    mts = 1 if r <= 14 else 2
    allowance = "fp8_fresh" if scorer == "fp8" else "f16"
    plan = build_plans(q, w, kp, None, r, mts, mma_bits, xp=np, scorer=allowance)
    z = plateau_rows(plan, w, mma_bits, np, scorer)
    rho = key_rms(kp)
    kv = _E4M3[kp]
    gam = Fraction(gamma_mma(mma_bits, D))
    for t in range(q.shape[0]):
        pos = w[t] > 0
        if np.isnan(z[t, 0]):
            au.claim(
                not bool(plan.valid[t]) or int(plan.omitted_positive[t]) > 0 or mutate is not None,
                f"query {t}: P = ∅ and a valid plan, but no plateau rows",
            )
            continue
        au.claim(int(plan.omitted_positive[t]) == 0, f"query {t}: plateau rows with P ≠ ∅")
        rows = _E4M3[plan.rows[t]]
        X, M = rows @ kv.T, np.abs(rows) @ np.abs(kv).T  # exact (43-bit sums)
        cert = _certified(X, M, z[t], rho, gam, mutate)
        qv = _E4M3[q[t]]
        Xh, Mh = qv @ kv.T, np.abs(qv) @ np.abs(kv).T
        fp8 = None
        if scorer == "fp8" and cert.any():  # the bit-exact FP8 dots and score of every key
            fp8 = (fresh_dots(q[t], kp), fp8_fresh_scores(q[t], w[t], kp, np.ones(len(kp))))
        for i in np.flatnonzero(cert):
            if scorer == "fp8":
                xmax = [_fp8_logit_bound(qv[h], q[t, h], kv[i], kp[i]) for h in range(q.shape[1])]
                for h in np.flatnonzero(pos):
                    au.ge(Fraction(0), _fr(fp8[0][i, h]), f"query {t} key {i} head {h}: FP8 dot")
                au.claim(int(score_code(fp8[1][i : i + 1])[0]) <= int(score_code(np.float32(0))),
                         f"query {t} key {i}: FP8 score above +0")  # fmt: skip
            else:
                xmax = [_fr(Xh[h, i]) + gam * _fr(Mh[h, i]) for h in range(q.shape[1])]
            for h in np.flatnonzero(pos):
                au.ge(Fraction(0), xmax[h], f"query {t} key {i} head {h}: canonical logit ≤ 0")
            au.claim(_epilogue_sign(w[t], xmax), f"query {t} key {i}: canonical epilogue > 0")
            exact = sum(_fr(w[t, h]) * max(_fr(Xh[h, i]), Fraction(0)) for h in range(len(pos)))
            au.tight(exact == 0)  # min(U, 0) = 0 = s: the bound attained
    return au.result()


def boundary_key(e: int) -> np.ndarray:
    """k̄ uint8 [1, 128]: 63 × (+1), 64 × (−1) and the e4m3 code e last (q̄ = ones: x = e − 1,
    M = 127 + |e|)."""
    k = np.concatenate([np.full(63, 1.0), np.full(64, -1.0)]).astype(np.float32)
    return np.concatenate([e4m3_bits(k), np.array([e], np.uint8)])[None, :]


def check_boundary(mma_bits=17, context="boundary witness") -> Result:
    """The test just met: the largest e4m3 e ∈ (0, 1) certified, its successor not."""
    au = Audit(NAME, tightness=False, context=context)
    Hp = 16
    q = np.zeros((1, Hp, D), np.uint8)
    q[0, 0] = e4m3_bits(np.ones(D, np.float32))
    w = np.zeros((1, Hp), np.float32)
    w[0, 0] = 1.0
    gam = Fraction(gamma_mma(mma_bits, D))
    codes = [c for c in range(1, 0x38) if 0 < _E4M3[c] < 1]  # positive e4m3 values below 1
    codes.sort(key=lambda c: _E4M3[c])
    last_ok = None
    for c in codes:
        kp = boundary_key(c)
        plan = build_plans(q, w, kp, None, 1, 1, mma_bits, xp=np)
        z = plateau_rows(plan, w, mma_bits, np)
        rho = key_rms(kp)
        rows = _E4M3[plan.rows[0]]
        X, M = rows @ _E4M3[kp].T, np.abs(rows) @ np.abs(_E4M3[kp]).T
        if _certified(X, M, z[0], rho, gam, None)[0]:
            last_ok = (c, X[0, 0], M[0, 0])
    au.claim(last_ok is not None, "no boundary key certified")
    if last_ok is None:
        return au.result()
    c, x, m = last_ok
    nxt = [d for d in codes if _E4M3[d] > _E4M3[c]]
    au.claim(bool(nxt), "the certified e is the largest e4m3 value below 1")
    au.ge(Fraction(0), _fr(x) + gam * _fr(m), "boundary key: canonical logit bound ≤ 0")
    au.note(f"boundary: e = {_E4M3[c]} certified (x = {x}), e = {_E4M3[nxt[0]]} not")
    return au.result()


def zero_dot_witness() -> dict:
    """One positive head q̄ = ones and the boundary key with e = 1: x = 0 exactly, so the
    canonical logit may be as large as γM > 0 — certified only without the allowance."""
    Hp = 16
    q = np.zeros((1, Hp, D), np.uint8)
    q[0, 0] = e4m3_bits(np.ones(D, np.float32))
    w = np.zeros((1, Hp), np.float32)
    w[0, 0] = 1.0
    one = int(e4m3_bits(np.array([1.0], np.float32))[0])
    return dict(q=q, w=w, kp=np.concatenate([boundary_key(one), boundary_key(0)]), r=1)


def check_records(context="record order at tau 0") -> Result:
    """The compact record order (common.cuh score_code) at τ = 0 and the tie rule."""
    au = Audit(NAME, tightness=False, context=context)
    f = np.float32
    zero = int(score_code(f(0.0))[()])
    au.claim(int(score_code(f(-0.0))[()]) == zero, "code(−0) = code(+0)")
    au.claim(int(score_code(f(np.nan))[()]) == 0, "code(NaN) = 0")
    for s in (f(-1e-30), f(-1.0), f(-np.inf)):
        au.claim(int(score_code(s)[()]) < zero, f"code({s}) < code(+0)")

    def record(s, i):
        return (int(score_code(f(s))[()]) << 32) | ((~i) & 0xFFFFFFFF)

    j = 7
    for s in (0.0, -0.0, -2.0, np.nan):
        au.claim(record(s, j + 1) < record(0.0, j), f"({s}, j + 1) below (0, j)")
    au.claim(record(0.0, j - 1) > record(0.0, j), "(0, j − 1) above (0, j): must survive")
    return au.result()


def plateau_problem(rng: np.random.Generator, Qn: int, Hp: int, N: int, n_pos: int, hot: float):
    """e4m3 (q [Qn, Hp, 128], w [Qn, Hp], kp [N, 128]) where most keys score 0: positive heads
    point along +e_0 (plus noise), keys along −e_0 except a ``hot`` share; negative heads
    random."""
    kf = 0.3 * rng.standard_normal((N, D))
    kf[:, 0] = -rng.uniform(1.0, 3.0, N)
    kf[rng.random(N) < hot, 0] = 2.0
    qf = 0.3 * rng.standard_normal((Qn, Hp, D))
    qf[:, :n_pos, 0] = rng.uniform(1.0, 3.0, (Qn, n_pos))
    w = np.zeros((Qn, Hp), np.float32)
    w[:, :n_pos] = rng.uniform(0.2, 1.0, (Qn, n_pos))
    nneg = min(Hp - n_pos, 3)
    w[:, n_pos : n_pos + nneg] = -rng.uniform(0.2, 1.0, (Qn, nneg))
    return e4m3_bits(qf.astype(np.float32)), w, e4m3_bits(kf.astype(np.float32))


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(6):
        n_pos = [1, 2, 4, 6, 9, 0][t]
        q, w, kp = plateau_problem(rng, 2, 16, 24, n_pos, [0.0, 0.1, 0.3][t % 3])
        r = [14, 6, 4, 6, 3, 14][t]  # t = 4: |H+| = 9 > r, so P ≠ ∅ (no plateau rows)
        out.append(dict(q=q, w=w, kp=kp, r=r, context=f"plateau {t}, |H+| = {n_pos}, r = {r}"))
    for t in range(4):  # the FP8 canonical scorer: its heads padded to 32 (scorer.py)
        n_pos = [1, 3, 6, 0][t]
        q, w, kp = plateau_problem(rng, 2, 32, 24, n_pos, [0.0, 0.2][t % 2])
        r = [14, 6, 14, 14][t]
        out.append(dict(q=q, w=w, kp=kp, r=r, scorer="fp8",
                        context=f"FP8 plateau {t}, |H+| = {n_pos}, r = {r}"))  # fmt: skip
    out.append(dict(_check="check_boundary"))
    out.append(dict(**zero_dot_witness(), context="zero dot witness"))
    out.append(dict(_check="check_records"))
    return out
