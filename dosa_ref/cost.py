"""The cost model (docs/method.md §6 "Cost"): per query, the number of retained heads r and
whether screening pays at all.

With a fraction f of the visible keys scored fully as seeds, d_a auxiliary rows per bound
(2 in the base form: v0 + v1; 1 in the absolute-value form: V) and a survivor fraction m,
work_DoSA/work_dense ≈ f + (1 − f)((r + d_a)/H + m).  The seeds are scored either way, so
screening pays only if (r + d_a)/H + m < 1; otherwise the query is scored densely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .certificate import KeySummary, upper_bound
from .plan import PlanOptions, build_plan

__all__ = ["RChoice", "aux_rows", "bound_fraction", "choose_r", "work_estimate"]


def aux_rows(form: str) -> int:
    """d_a: auxiliary rows of one bound evaluation (base: v0 + v1; abs: V)."""
    return 2 if form == "base" else 1


def bound_fraction(r, H: int, form: str = "base"):
    """One bound evaluation's cost in full key scorings: (r + d_a)/H (r an int or an array)."""
    return (r + aux_rows(form)) / H


def work_estimate(f, r, H: int, m, form: str = "base"):
    """work_DoSA / work_dense ≈ f + (1 − f)((r + d_a)/H + m) (module doc)."""
    return f + (1.0 - f) * (bound_fraction(r, H, form) + m)


@dataclass(frozen=True)
class RChoice:
    """``choose_r``'s decision and its inputs.

    r: retained heads (the best screening plan even when dense); dense: screening would
    not pay (est_work ≥ 1); f: seed fraction |S|/|Ω|; est_survival: m at r on the key
    sample (nan: no estimate); est_work: f + (1 − f)((r + d_a)/H + m) (nan: no estimate);
    sample_work: the estimate's own cost in full key scorings (Σ_r n_sample (r + d_a)/H).
    """

    r: int
    dense: bool
    f: float
    est_survival: float
    est_work: float
    sample_work: float


def choose_r(
    q_t: np.ndarray,
    w_t: np.ndarray,
    p: np.ndarray,
    tau: float,
    k_sample: np.ndarray,
    plan_options: PlanOptions,
    form: str = "base",
    f: float = 0.0,
    survive=None,
) -> RChoice:
    """Per-query r from the cost model, or dense scoring when screening would not pay.

    q_t float64 [H, D], w_t float64 [H], p float64 [H] activation frequencies, tau the
    seed threshold, k_sample float64 [n, D] a stride sample of visible keys, f the seed
    fraction.  m(r) is the share of the sample with bound U ≥ τ for the plan with r heads
    (or, with ``survive(plan, U) -> bool [n]``, the share the screen's rule keeps: the
    tie-aware rule of docs/method.md §7 "Tie-aware rejection and zero plateaus");
    r runs over 1..H−1 (stride ⌈H/16⌉) and ties go to the smaller r.  Without a finite τ
    or a sample there is nothing to estimate: r = ⌊H/2⌋, screened, nan estimates.
    """
    H = q_t.shape[0]
    if not np.isfinite(tau) or k_sample.shape[0] == 0:
        return RChoice(max(1, H // 2), False, f, float("nan"), float("nan"), 0.0)
    best, best_cost, best_m, work = max(1, H // 2), np.inf, float("nan"), 0.0
    ksum = KeySummary(k_sample)
    for r in range(1, H, max(1, -(-H // 16))):
        plan = build_plan(q_t, w_t, p, r, plan_options)
        U = upper_bound(plan, k_sample, form, "up", q_t, w_t, ksum)
        m = float(np.mean(U >= tau if survive is None else survive(plan, U)))
        frac = bound_fraction(r, H, form)
        work += k_sample.shape[0] * frac
        cost = frac + m
        if cost < best_cost:
            best, best_cost, best_m = r, cost, m
    est = f + (1.0 - f) * best_cost
    return RChoice(best, bool(best_cost >= 1.0), f, best_m, est, work)
