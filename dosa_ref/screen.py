"""Screen (docs/method.md §7 step 4, §9): the bound U of every visible key and the survivors
V = {i ∉ S : U_i ≥ τ} (strict rejection U < τ; equality survives).

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
from .rounding import INF
from .seeds import SeedSet

__all__ = ["FP8Bound", "Float64Bound", "screen"]


class Float64Bound:
    """The float64 certificate U (``certificate.upper_bound``, rounding "up")."""

    def __init__(self, form: str):
        self.form = form

    def evaluate(self, ctx: QueryContext, plan: Plan) -> np.ndarray | None:
        """U float64 [b − a] for the query's visible keys, or None if not all finite."""
        c, a, b = ctx.chunk, ctx.a, ctx.b
        U = upper_bound(plan, c.k[a:b], self.form, "up", ctx.q_t, ctx.w_t, c.ksum().slice(a, b))
        return U if np.all(np.isfinite(U)) else None

    def screened(self, ctx: QueryContext, plan: Plan, seeds: SeedSet, tau: float) -> None:
        """Called once the query is screened at τ (nothing to record here)."""


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

    def screened(self, ctx: QueryContext, plan: Plan, seeds: SeedSet, tau: float) -> None:
        """Guard cost: survivors of the exact-arithmetic certificate at the same τ."""
        if not self.guard_stats:
            return
        c, a, b = ctx.chunk, ctx.a, ctx.b
        Ue = upper_bound(plan, c.k[a:b], self.form, "none", ksum=c.ksum().slice(a, b))
        ctx.st.survivors_exact[ctx.t] = int(screen(Ue, tau, seeds.ids, a).size)


def screen(U: np.ndarray, tau: float, seed_ids: np.ndarray, a: int) -> np.ndarray:
    """Survivors int64 (sorted) of keys a, a+1, … with bounds ``U`` float64 [n]: U ≥ τ and
    not a seed (strict rejection U < τ, docs/method.md §7 step 4)."""
    alive = U >= tau
    alive[seed_ids - a] = False
    return a + np.flatnonzero(alive)
