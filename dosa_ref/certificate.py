"""The DoSA certificate (docs/method.md §6): U_i with s_i ≤ U_i, its absolute-value form, and
the slack decomposition of Prop. 6.

``upper_bound(..., rounding="up")`` adds a float64 rounding allowance so that the bound
dominates the *computed* original score (``scorer.score_keys``), not only the exact one;
this is what lets the reference reject on ``U < τ`` with τ taken from computed scores.
"""

from __future__ import annotations

import numpy as np

from .plan import Plan, safe_norm

__all__ = [
    "FORMS",
    "KeySummary",
    "positive_allowance",
    "rounding_allowance",
    "slack",
    "upper_bound",
]

FORMS = ("base", "abs")
_U64 = 2.0**-53  # unit roundoff of float64, round-to-nearest


class KeySummary:
    """Query-independent key quantities, computed once per key set and reused by every
    query: |k|, ‖k‖, ‖k‖_1 and per-group norms ‖k^(g)‖ (all float64, rows of ``k``)."""

    def __init__(self, k: np.ndarray):
        self.k = k
        self.absk = np.abs(k)
        self.norm = safe_norm(k, axis=1)
        self.l1 = self.absk.sum(axis=1)
        self._groups: dict[tuple, np.ndarray] = {}
        self._parent: tuple[KeySummary, int, int] | None = None

    def slice(self, a: int, b: int) -> KeySummary:
        """Summary of rows a:b (views; group norms come from the parent's cache)."""
        out = KeySummary.__new__(KeySummary)
        out.k, out.absk, out.norm, out.l1 = (
            self.k[a:b],
            self.absk[a:b],
            self.norm[a:b],
            self.l1[a:b],
        )
        out._groups, out._parent = {}, (self, a, b)
        return out

    def group_norms(self, gb: np.ndarray) -> np.ndarray:
        """[n, G] norms of the coordinate groups cut at ``gb``."""
        if self._parent is not None:
            parent, a, b = self._parent
            return parent.group_norms(gb)[a:b]
        key = tuple(int(x) for x in gb)
        if key not in self._groups:
            if key == (0, self.k.shape[1]):
                self._groups[key] = self.norm[:, None]
            else:
                cuts = zip(key[:-1], key[1:], strict=True)
                self._groups[key] = np.stack(
                    [safe_norm(self.k[:, a:b], axis=1) for a, b in cuts], axis=1
                )
        return self._groups[key]


def _summary(k: np.ndarray, ksum: KeySummary | None) -> KeySummary:
    if ksum is None:
        return KeySummary(k)
    if ksum.k.shape != k.shape:
        raise ValueError("ksum: summary rows do not match k")
    return ksum


def positive_allowance(plan: Plan, k: np.ndarray, ksum: KeySummary | None = None) -> np.ndarray:
    """Σ_g c_g ‖k^(g)‖ (E_P‖k‖, E_P^joint‖k‖ or the grouped form); float64 [n]."""
    c = plan.positive_coefficients()
    if not np.any(c):
        return np.zeros(k.shape[0])
    return _summary(k, ksum).group_norms(plan.allowance_groups()) @ c


def rounding_allowance(
    plan: Plan, q_t: np.ndarray, w_t: np.ndarray, k: np.ndarray, ksum: KeySummary | None = None
) -> np.ndarray:
    """Upper bound on |fl(U) − U| + |fl(s) − s| + plan rounding, float64 [n].

    Every quantity entering U or s is a sum of at most n_op = D + H + G + 8 correctly
    rounded operations whose terms are bounded in magnitude by
    M(k) = (Σ_h|w_h||q_h| + Σ_j|w̃_j||q_j| + |a_A| + |V|)·|k| + (Σ_h|w_h|‖q_h‖ + Σ_g c_g)‖k‖
    (anchor terms obey β_h‖q_j*‖ ≤ ‖q_h‖, so folding and projection errors are bounded by
    the second part).  The standard bound γ_n ≤ 1.01·n·u per sum, applied to U, to s, and
    to the plan's quantities (β, d_h, w̃, E), gives the factor 4·n_op·u.  Norms are taken
    with ``safe_norm`` so squares never underflow; the last term covers results that are
    subnormal (≤ 2^-1075 each).  Deliberately generous: it costs nothing measurable in
    pruning.
    """
    H, D = q_t.shape
    G = plan.positive_coefficients().size
    n_op = D + H + G + 8
    env = (
        np.abs(w_t) @ np.abs(q_t)
        + np.abs(plan.w_fold) @ np.abs(plan.q_R)
        + np.abs(plan.a_A)
        + np.abs(plan.V)
    )
    mag = float(np.abs(w_t) @ safe_norm(q_t, axis=1) + plan.positive_coefficients().sum())
    ks_ = _summary(k, ksum)
    l1 = ks_.l1
    M = ks_.absk @ env + mag * ks_.norm
    # Absolute term for results that fall into the subnormal range (each such rounding
    # errs by ≤ 2^-1075, scaled by at most (1 + Σ|w| + Σ|w̃|)(1 + ‖k‖_1) per quantity).
    wsum = 1.0 + np.abs(w_t).sum() + np.abs(plan.w_fold).sum()
    underflow = (D + 4) * (H + G + 4) * wsum * (1.0 + l1) * 2.0**-1070
    return 4.0 * n_op * _U64 * M * (1.0 + 8.0 * n_op * _U64) + underflow


def upper_bound(
    plan: Plan,
    k: np.ndarray,
    form: str = "base",
    rounding: str = "up",
    q_t: np.ndarray | None = None,
    w_t: np.ndarray | None = None,
    ksum: KeySummary | None = None,
) -> np.ndarray:
    """Certificate U for keys ``k`` [n, D]; float64 [n].

    form="base" is eq. (9): Σ_R w̃_j[q_j·k]_+ + allowance(k) − [a_A·k]_+.
    form="abs" is the absolute-value form ½Σ_R w̃_j|q_j·k| − V·k + allowance(k) with
    V = a_A − ½Σ_R w̃_j q_j (valid for any P: [x]_+ = (x+|x|)/2 and −[z]_+ ≤ −z).
    rounding="up" adds ``rounding_allowance`` (needs q_t, w_t), so U ≥ computed s;
    rounding="none" is the formula in float64 (for exact-arithmetic audits).
    ksum: optional ``KeySummary`` of exactly these rows (saves per-query key passes).
    """
    if form not in FORMS:
        raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
    if rounding not in ("up", "none"):
        raise ValueError(f"rounding: expected 'up' or 'none', got {rounding!r}")
    x = k @ plan.q_R.T  # [n, r]
    if form == "base":
        U = np.maximum(x, 0.0) @ plan.w_fold - np.maximum(k @ plan.a_A, 0.0)
    else:
        U = 0.5 * (np.abs(x) @ plan.w_fold) - k @ plan.V
    U = U + positive_allowance(plan, k, ksum)
    if rounding == "up":
        if q_t is None or w_t is None:
            raise ValueError("q_t: rounding='up' needs the query heads q_t and weights w_t")
        U = U + rounding_allowance(plan, q_t, w_t, k, ksum)
    return U


def slack(plan: Plan, q_t: np.ndarray, w_t: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    """Prop. 6: U − s split per key into its three nonnegative parts (float64 [n] each).

    positive: δ_P, the projection + allowance slack of the omitted positive heads;
    missed_negative: Σ_{h∈N\\A} |w_h|[q_h·k]_+; cancellation: Σ_{h∈A}|w_h|[q_h·k]_+ −
    [a_A·k]_+ = min(Z_A^+, Z_A^-).  ``total`` = U_base − s (no rounding allowance).
    """
    x = np.maximum(k @ q_t.T, 0.0)  # [n, H]
    R, P, A = plan.R, plan.P, plan.A
    notA = np.setdiff1d(plan.Nn, A)
    retained_exact = x[:, R] @ w_t[R] + x[:, P] @ w_t[P]
    retained_bound = x[:, R] @ plan.w_fold + positive_allowance(plan, k)
    positive = retained_bound - retained_exact
    missed = x[:, notA] @ np.abs(w_t[notA])
    cancel = x[:, A] @ np.abs(w_t[A]) - np.maximum(k @ plan.a_A, 0.0)
    s = x @ w_t
    U = upper_bound(plan, k, "base", "none")
    return {
        "positive": positive,
        "missed_negative": missed,
        "cancellation": cancel,
        "total": U - s,
    }
