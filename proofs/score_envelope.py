"""The scorer's finiteness envelope (docs/method.md §1 "The scorer's domain";
``dosa_ref.scorer.finite_envelope``, the GPU's ``dosa_cupy.prepare.envelope_queries``).

Statement (float64, the CPU scorer).  For a query (q_t [H, D], w_t [H]) and keys with
max |k_ij| ≤ M, let ω_h = max(1, |w_h|), E = (Σ_h ω_h ‖q_h‖_1) · M and Ê be E evaluated in
float64 as ``finite_envelope`` does (ω_h exact; D − 1 + H − 1 additions, H + 1
multiplications, round to nearest).  If D + H + 2 ≤ 2^40 and Ê ≤ 2^1022, then every
intermediate of ``score_keys`` (each partial sum of every dot q_h·k_i in any order, FMA or
not; each product w_h [x_h]_+; each partial head sum) is finite, for every such key.

Why ω_h and not |w_h|: every head's dot is computed whatever its weight, so a head of
weight 0 (or far below 1) with a huge ‖q_h‖_1 M overflows its dot to ∞ while Σ_h |w_h|
‖q_h‖_1 M stays small — and 0 · ∞ is NaN.  The floor at 1 bounds each dot by E; the
``zero weight`` cases below are that counterexample to the |w_h| form.

Proof.  With u = 2^-53 and γ_n = n u / (1 − n u), a computed sum of n terms and every
partial sum of it lies within (1 + γ_n) of the sum of the terms' magnitudes (Higham,
Lemma 3.1 and §3.1, for any order; an FMA rounds fewer times).  So each partial dot is at
most (1 + γ_D) Σ_j |q_hj||k_ij| ≤ (1 + γ_D) ‖q_h‖_1 M ≤ (1 + γ_D) E (ω_h ≥ 1), each product
at most (1 + u)(1 + γ_D) |w_h| ‖q_h‖_1 M, and each partial head sum at most
(1 + γ_H)(1 + u)(1 + γ_D) Σ_h |w_h| ‖q_h‖_1 M ≤ (1 + γ_{D+H+1}) E (|w_h| ≤ ω_h), as long
as no earlier step overflowed — by induction none does when that bound is below DBL_MAX,
since rounding a value below DBL_MAX to nearest gives a finite result.  The evaluation of Ê has
Ê ≥ (1 − γ_{D+H+1}) E.  Hence Ê ≤ 2^1022 gives every intermediate at most
2^1022 (1 + γ)/(1 − γ) with γ = γ_{D+H+1} ≤ 2^-12, which is below DBL_MAX = (2 − 2^-52) 2^1023.

GPU (fp32).  ``score_batch`` multiplies e4m3 payloads (|q̄|, |k̄| ≤ 448, D = 128, so each
dot is at most D·448² = 25,690,112 < 2^25 in magnitude), sums heads with ``fmaf`` and
multiplies by α once; the same argument with u = 2^-24 and n ≤ 128 + 64 + 2 shows that
Σ_h |w'_h| 2^25 max(1, α) ≤ 2^125 keeps every fp32 intermediate below 2^126 < FLT_MAX
(the factor max(1, α) covers the head sum before the product by α < 1).

``check`` verifies, in exact rational arithmetic: the claimed lower bound Ê ≥ (1 − γ) E on
the computed Ê; where Ê ≤ 2^1022, the margin DBL_MAX − (1 + γ) E ≥ 0; and on the keys of
the case, that each head's exact Σ_j |q_hj k_ij| (the bound of its partial dots), the
weighted sum of those and the exact Σ_h |w_h| [x_h]_+ are at most E, and that
``score_keys`` returns finite values whenever ``finite_envelope`` is true.  Tightness: a
single head with constant q and a constant key at M scores exactly E.  Cases are adversarial
at the threshold (Ê within a few ulps of 2^1022), huge, wide-range and near DBL_MAX, and
heads of weight 0 or far below 1 whose dots alone reach the threshold.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.scorer import ENVELOPE_MAX, envelope_weights, finite_envelope, key_amax, score_keys

from ._audit import Audit, Result
from ._exact import fr

NAME = "score_envelope"
STATEMENT = (
    "Ê = fl((Σ max(1,|w_h|)‖q_h‖₁)·max|k|) ≤ 2^1022 ⇒ every intermediate of score_keys is finite"
)

U64 = Fraction(1, 2**53)
DBL_MAX = fr(float(np.finfo(np.float64).max))


def _gamma(n: int) -> Fraction:
    return n * U64 / (1 - n * U64)


def check(q, w, k, context="") -> Result:
    """Verify the statement for one query q [H, D], w [H] and keys k [n, D] (float64)."""
    au = Audit(NAME, tightness=True, context=context)
    q, w, k = (np.asarray(a, dtype=np.float64) for a in (q, w, k))
    H, D = q.shape
    M = key_amax(k)
    om = envelope_weights(w)
    au.claim(
        all(fr(om[h]) == max(Fraction(1), abs(fr(w[h]))) for h in range(H)),
        "ω_h = max(1, |w_h|) exactly",
    )
    exact_E = sum(fr(om[h]) * sum(abs(fr(x)) for x in q[h]) for h in range(H)) * fr(M)
    with np.errstate(over="ignore", invalid="ignore"):
        e_hat = float(om @ np.abs(q).sum(axis=1)) * M
    g = _gamma(D + H + 1)
    if np.isfinite(e_hat):
        au.ge(fr(e_hat), (1 - g) * exact_E, "Ê ≥ (1 − γ_{D+H+1}) E")
    ok = finite_envelope(q, w, M)
    au.claim(ok == bool(e_hat <= ENVELOPE_MAX), "finite_envelope is the test Ê ≤ 2^1022")
    if not ok:
        return au.result()
    au.ge(DBL_MAX, (1 + g) * exact_E, "(1 + γ) E ≤ DBL_MAX")
    for i in range(k.shape[0]):
        dots = [sum(fr(a) * fr(b) for a, b in zip(q[h], k[i], strict=True)) for h in range(H)]
        l1 = [sum(abs(fr(a) * fr(b)) for a, b in zip(q[h], k[i], strict=True)) for h in range(H)]
        mag = sum(abs(fr(w[h])) * l1[h] for h in range(H))
        au.ge(exact_E, mag, "Σ_h |w_h| Σ_j |q_hj k_ij| ≤ E")
        au.ge(exact_E, max(l1), "max_h Σ_j |q_hj k_ij| ≤ E (every head's dot)")
        au.ge(exact_E, abs(sum(fr(w[h]) * max(dots[h], Fraction(0)) for h in range(H))), "|s| ≤ E")
        if H == 1 and mag == exact_E and mag > 0:
            au.tight(True)
    try:
        s = score_keys(q, w, k)
        au.claim(bool(np.isfinite(s).all()), "score_keys finite under the envelope")
    except ValueError as e:
        au.claim(False, f"score_keys raised under the envelope: {e}")
    return au.result()


def _at_threshold(rng, H: int, D: int, ulps: int):
    """A query and keys whose computed envelope is 2^1022 moved by ``ulps`` ulps."""
    q = np.ldexp(rng.random((H, D)) + 0.5, 0)
    w = rng.random(H) + 0.5
    base = float(np.abs(w) @ np.abs(q).sum(axis=1))
    M = ENVELOPE_MAX / base
    for _ in range(abs(ulps)):
        M = np.nextafter(M, np.inf if ulps > 0 else 0.0)
    k = rng.uniform(-M, M, size=(6, D))
    k[0, 0] = M
    k[1] = np.sign(q[0]) * M  # the largest dot of head 0
    return q, w, k


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(12):
        H, D = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        ulps = int(rng.integers(-3, 4))
        q, w, k = _at_threshold(rng, H, D, ulps)
        out.append(dict(q=q, w=w, k=k, context=f"threshold {t}: H={H} D={D} ulps={ulps}"))
    for t in range(8):  # huge and wide-range values, near DBL_MAX
        H, D = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        q = np.ldexp(rng.standard_normal((H, D)), rng.integers(-200, 500, size=(H, D)))
        w = np.ldexp(rng.standard_normal(H), rng.integers(-100, 300, size=H))
        k = np.ldexp(rng.standard_normal((5, D)), rng.integers(-200, 400, size=(5, D)))
        out.append(dict(q=q, w=w, k=k, context=f"wide {t}"))
    for t in range(6):  # weights 0 or far below 1: the dots alone reach the threshold
        H, D = int(rng.integers(2, 6)), int(rng.integers(1, 9))
        q = rng.random((H, D)) + 0.5
        w = rng.random(H) + 0.5
        w[0] = 0.0 if t % 2 == 0 else float(np.ldexp(1.0, -int(rng.integers(20, 200))))
        q[0] *= float(np.ldexp(1.0, int(rng.integers(400, 520))))
        e = (-1, 0, 3)[t % 3]  # the dot of head 0 near 2^(1022 + e): 2^1025 overflows
        M = float(np.ldexp(1.0, 1022 - int(np.ceil(np.log2(np.abs(q[0]).sum()))) + e))
        k = np.vstack([np.full((1, D), M), rng.uniform(-M, M, size=(3, D))])
        out.append(dict(q=q, w=w, k=k, context=f"zero weight {t}: w0={w[0]:.3g} H={H} D={D}"))
    for t in range(4):  # the tightness witness: one head, constant q, a constant key at M
        D = int(rng.integers(1, 9))
        c = float(np.ldexp(1.0, int(rng.integers(100, 500))))
        M = float(np.ldexp(1.0, 1021 - int(np.log2(c)) - int(np.ceil(np.log2(D)))))
        q, w, k = np.full((1, D), c), np.ones(1), np.full((2, D), M)
        out.append(dict(q=q, w=w, k=k, context=f"witness {t}: D={D}"))
    return out
