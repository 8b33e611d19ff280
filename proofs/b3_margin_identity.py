"""B.3 — selection margin identity (docs/method.md §6 "Margins"; paper appendix B.3).

Statement.  Let τ* be the true K-th score, Δ_i = τ* − s_i the selection margin,
b = τ* − τ ≥ 0 the threshold deficit of the seed threshold τ (Prop. 4), and
δ_i = U_i − s_i ≥ 0 the bound slack.  Then

    τ − U_i = Δ_i − δ_i − b     (an identity),   hence   U_i < τ  ⇔  Δ_i > δ_i + b.

Proof: substitute the definitions (τ − U_i = (τ* − b) − (s_i + δ_i)).

``check`` verifies on exact rationals: b ≥ 0 and δ_i ≥ 0 (the preconditions: τ from seeds,
U a valid bound), the identity for every key, and the equivalence with strict inequalities.
Inputs are synthetic integer / float scores and, for realism, the float scores and float
bounds ``upper_bound(..., rounding="up")`` of plans built by ``dosa_ref`` (taken at their
exact rational values).  Tightness witness: a key with U_i = τ exactly — both sides false
(equality is not rejected).  With ``strict=False`` (reject U_i ≤ τ) the equivalence breaks
at that witness, which the check reports.
"""

from __future__ import annotations

import numpy as np

from dosa_ref.certificate import upper_bound
from dosa_ref.plan import PlanOptions, activation_frequency, build_plan
from dosa_ref.scorer import score_keys
from dosa_ref.seeds import kth_score

from . import _gen
from ._audit import Audit, Result
from ._exact import fr

NAME = "b3_margin_identity"
STATEMENT = "τ − U_i = Δ_i − δ_i − b, so U_i < τ ⇔ Δ_i > δ_i + b"


def check(scores, U, tau, K, strict=True, context="") -> Result:
    """Verify B.3 for scores [n], bounds U [n], a seed threshold τ and K (exact)."""
    au = Audit(NAME, tightness=True, context=context)
    s = [fr(v) for v in np.asarray(scores).ravel()]
    Ub = [fr(v) for v in np.asarray(U).ravel()]
    tau = fr(tau)
    tstar = sorted(s, reverse=True)[K - 1]
    b = tstar - tau
    au.margin(b, "precondition b = τ* − τ ≥ 0")
    for i, (si, ui) in enumerate(zip(s, Ub, strict=True)):
        delta = ui - si
        margin = tstar - si
        au.margin(delta, f"key {i}: precondition δ_i = U_i − s_i ≥ 0")
        au.eq(tau - ui, margin - delta - b, f"key {i}: τ − U_i = Δ_i − δ_i − b")
        rejected = ui < tau if strict else ui <= tau
        au.claim(rejected == (margin > delta + b), f"key {i}: (U_i < τ) ⇔ (Δ_i > δ_i + b) fails")
        if ui == tau:
            au.tight(True)
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(40):
        n = int(rng.choice([1, 4, 16, 50]))
        K = int(rng.integers(1, n + 1))
        if t % 2 == 0:
            s = rng.integers(-3, 4, size=n).astype(np.float64)
            U = s + rng.integers(0, 3, size=n)
        else:
            s = _gen.array(rng, n, ["unit", "huge", "tiny", "wide"][t % 4])
            U = s + np.abs(s) * rng.choice([0.0, 0.5, 2.0], size=n)
        S = rng.choice(n, size=int(rng.integers(K, n + 1)), replace=False)
        tau = kth_score(s[S], K)
        if t % 4 == 0:
            U[int(np.argmin(s))] = tau  # boundary witness U_i = τ (valid: min score ≤ τ)
        out.append(dict(scores=s, U=U, tau=tau, K=K, context=f"synthetic {t}"))
    # real certificates: float scores and float upper bounds (rounding="up") of dosa_ref
    for t in range(10):
        H, D, n = int(rng.choice([2, 4, 8])), int(rng.choice([2, 4, 8])), 64
        kind = ["int", "unit"][t % 2]
        q = _gen.heads(rng, H, D, kind)
        w = _gen.weights(rng, H, "mixed", kind)
        k = _gen.array(rng, (n, D), kind)
        plan = build_plan(q, w, activation_frequency(q, k), int(rng.integers(1, H)), PlanOptions())
        s = score_keys(q, w, k)
        U = upper_bound(plan, k, ["base", "abs"][t % 2], "up", q, w)
        K = int(rng.integers(1, 9))
        S = rng.choice(n, size=int(rng.integers(K, n + 1)), replace=False)
        out.append(dict(scores=s, U=U, tau=kth_score(s[S], K), K=K, context=f"dosa_ref plan {t}"))
    return out
