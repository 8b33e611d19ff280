"""Screen (docs/method.md §7 step 4, §9): the bound U of every visible key and the survivors
V = {i ∉ S : U_i ≥ τ} (strict rejection U < τ; equality survives).  With the tie-aware
rule (docs/method.md §7 "Tie-aware rejection and zero plateaus") a key at U_i = τ is also
rejected when its id is above j, the id of the K-th seed record (τ, j), and a key whose
positive-weight heads are all certified inactive is bounded by min(U_i, 0).

Two bounds share Algorithm 1's per-query loop (``pipeline``):
  ``Float64Bound`` — the certificate of docs/method.md §6 in float64 with its rounding
      allowance (U ≥ the computed score of ``scorer.score_keys``);
  ``FP8Bound`` — the numerical certificate U^num of docs/method.md §8 on FP8 keys
      (``numeric.build_fp8_plan`` + ``numeric.screen_bound``), valid for the arithmetic
      of an ``ErrorModel``.
``evaluate`` returns None when the bound proves nothing for the query (a non-finite
float64 bound, an invalid FP8 plan): the caller recovers over the full domain (C.3).
"""

from __future__ import annotations

import numpy as np

from .certificate import upper_bound
from .error_model import ErrorModel
from .numeric import build_fp8_plan, screen_bound
from .plan import Plan
from .prepare import FP8Keys, QueryContext
from .rounding import INF, add_up, gamma_up, matmul_abs_up, mul_up
from .seeds import SeedSet

__all__ = ["FP8Bound", "Float64Bound", "ScreenRule", "screen", "zero_plateau"]

_U64 = 2.0**-53  # unit roundoff of float64, round-to-nearest
_NO_ID = np.iinfo(np.int64).max  # "no K-th record": no key id lies above it


class Float64Bound:
    """The float64 certificate U (``certificate.upper_bound``, rounding "up")."""

    def __init__(self, form: str):
        self.form = form

    def evaluate(self, ctx: QueryContext, plan: Plan) -> np.ndarray | None:
        """U float64 [b − a] for the query's visible keys, or None if not all finite."""
        c, a, b = ctx.chunk, ctx.a, ctx.b
        U = upper_bound(plan, c.k[a:b], self.form, "up", ctx.q_t, ctx.w_t, c.ksum().slice(a, b))
        return U if np.all(np.isfinite(U)) else None

    def screened(self, ctx: QueryContext, plan: Plan, seeds: SeedSet, rule: ScreenRule) -> None:
        """Called once the query is screened with ``rule`` (nothing to record here)."""


class FP8Bound:
    """U^num of FP8 keys for plans built under ``model``; keeps each query's
    ``FP8ScreenPlan`` in ``plans`` and, with ``guard_stats``, counts the survivors of the
    exact-arithmetic certificate at the same plan and τ (the guard's cost)."""

    def __init__(self, keys: FP8Keys, model: ErrorModel, form: str, guard_stats: bool, Qn: int):
        self.keys, self.model, self.form, self.guard_stats = keys, model, form, guard_stats
        self.plans: list = [None] * Qn

    def evaluate(self, ctx: QueryContext, plan: Plan) -> np.ndarray | None:
        """U^num float64 [b − a] (+inf for keys with an invalid scale or summary), or
        None when the FP8 plan is invalid."""
        a, b = ctx.a, ctx.b
        fplan = build_fp8_plan(plan, ctx.q_t, ctx.w_t, self.model, self.form)
        self.plans[ctx.t] = fplan
        if not fplan.valid:
            return None
        kk = self.keys
        U = screen_bound(fplan, kk.kbar[a:b], kk.scale[a:b], kk.rho[a:b])
        ctx.st.invalid_keys[ctx.t] = int(np.sum(U == INF))
        return U

    def screened(self, ctx: QueryContext, plan: Plan, seeds: SeedSet, rule: ScreenRule) -> None:
        """Guard cost: survivors of the exact-arithmetic certificate under the same rule."""
        if not self.guard_stats:
            return
        c, a, b = ctx.chunk, ctx.a, ctx.b
        Ue = upper_bound(plan, c.k[a:b], self.form, "none", ksum=c.ksum().slice(a, b))
        ctx.st.survivors_exact[ctx.t] = int(rule.survivors(Ue).size)


class ScreenRule:
    """The rejection rule of one query (docs/method.md §7 step 4).

    tau: the K-th seed score; seed_ids int64: the seeds (never screened); a: the first
    visible key (U[n] belongs to keys a, a+1, …).  Plain rule: key i survives iff U_i ≥ τ.
    Tie-aware rule (``kth_id`` given: j, the id of the K-th seed record (τ, j) in the
    order (score desc, id asc)): i survives iff U_i > τ or (U_i = τ and i < j); with
    ``plateau`` (bool [n], keys certified by ``zero_plateau``) the bound of those keys
    is min(U_i, 0) first.  Both are exact (docs/method.md §7 "Tie-aware rejection and zero
    plateaus"; proofs/zero_plateau.py).
    """

    def __init__(
        self,
        tau: float,
        seed_ids: np.ndarray,
        a: int,
        kth_id: int | None = None,
        plateau: np.ndarray | None = None,
    ):
        self.tau, self.seed_ids, self.a = tau, seed_ids, a
        self.kth_id, self.plateau = kth_id, plateau

    def alive(self, U: np.ndarray, ids: np.ndarray, plateau: np.ndarray | None) -> np.ndarray:
        """bool [n]: keys ``ids`` int64 [n] with bounds ``U`` float64 [n] that the rule
        keeps (seeds not excluded); ``plateau`` bool [n] or None as in the class."""
        if plateau is not None:
            U = np.where(plateau, np.minimum(U, 0.0), U)
        if self.kth_id is None:
            return U >= self.tau
        return (U > self.tau) | ((U == self.tau) & (ids < self.kth_id))

    def survivors(self, U: np.ndarray) -> np.ndarray:
        """Survivors int64 (sorted) of keys a, a+1, … with bounds ``U`` float64 [n]."""
        alive = self.alive(U, self.a + np.arange(U.size, dtype=np.int64), self.plateau)
        alive[self.seed_ids - self.a] = False
        return self.a + np.flatnonzero(alive)


def screen(U: np.ndarray, tau: float, seed_ids: np.ndarray, a: int) -> np.ndarray:
    """Survivors int64 (sorted) of keys a, a+1, … with bounds ``U`` float64 [n]: U ≥ τ and
    not a seed (the plain rule: strict rejection U < τ, docs/method.md §7 step 4)."""
    return ScreenRule(tau, seed_ids, a).survivors(U)


def zero_plateau(q_t: np.ndarray, w_t: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Keys whose canonical score is certified ≤ 0: bool [n] for ``k`` float64 [n, D].

    A key qualifies when every head with w_h > 0 has a certified non-positive logit as
    ``scorer.score_keys`` computes it (float64 dot of length D, any order, FMA or not):
    with x̂ the dot evaluated here and m ≥ Σ_j |q_hj k_j|, both computed dots lie within
    γ_D·m + D·2^-1074 of the exact one (Higham, Lemma 3.1 plus one underflow error per
    product), so x̂ + 2(γ_D·m + D·2^-1074) ≤ 0 bounds the canonical logit by 0.  Then every
    term w_h[x_h]_+ of the canonical sum is ≤ 0 (w_h ≤ 0, or [x_h]_+ = 0), and a sum of
    non-positive terms rounded to nearest is ≤ 0: U = 0 is a valid bound
    (docs/method.md §7 "Tie-aware rejection and zero plateaus").  m ≤ 2^1000 keeps every
    partial sum finite.  No positive head: every key qualifies.
    """
    n, D = k.shape
    pos = w_t > 0
    if not np.any(pos):
        return np.ones(n, dtype=bool)
    qp = q_t[pos]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        x = k @ qp.T  # [n, |H+|]
        m = matmul_abs_up(np.abs(k), np.abs(qp).T)
        err = add_up(mul_up(m, 2.0 * gamma_up(max(D, 1), _U64)), 2.0 * D * 2.0**-1074)
        hi = add_up(x, err)
        ok = (hi <= 0.0) & (m <= 2.0**1000)
    return np.all(ok, axis=1)
