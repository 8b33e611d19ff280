"""Exact images of a ``dosa_ref.plan.Plan`` and of the scorer (shared by the modules).

``ExactPlan`` keeps the plan's *structure* (R, P, N, A, anchors) and its float β_h (any
β ≥ 0 is valid in Prop. 1, so the float β is taken at its exact rational value); the
derived quantities d_h = q_h − β_h q_{j*}, w̃, a_A and V are recomputed exactly from the
rational values of the float inputs.  The allowance of every form is an exact ``Surd``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._exact import Dy, Surd, fr, smin

__all__ = ["ExactPlan", "exact_scores", "fp_allowance"]


def exact_scores(q: np.ndarray, w: np.ndarray, keys: np.ndarray) -> tuple[Dy, list]:
    """Logits X = K Qᵀ (exact, Dy [n, H]) and the exact scores s_i = Σ_h w_h [x_ih]_+."""
    X = Dy.of(keys) @ Dy.of(q).T
    s = X.relu() @ Dy.of(w)
    return X, s.fracs()


class ExactPlan:
    """Exact counterpart of a float plan built by ``dosa_ref.plan.build_plan``."""

    def __init__(self, plan, q: np.ndarray, w: np.ndarray, scale=1):
        self.plan = plan
        self.H, self.D = q.shape
        self.R = [int(j) for j in plan.R]
        self.P = [int(h) for h in plan.P]
        self.N = [int(h) for h in plan.Nn]
        self.A = [int(h) for h in plan.A]
        self.kind = plan.options.allowance
        self.cuts = [int(c) for c in plan.group_bounds]
        self.scale = fr(scale)  # multiplies the allowance (mutation tests use 1/2)
        Q = Dy.of(q)
        W = Dy.of(w)
        self.Q, self.W = Q, W
        self.w = W.fracs()
        beta = Dy.of(plan.beta)
        self.beta = beta.fracs()
        anchor = np.asarray(plan.anchor, dtype=np.int64)
        if np.any(beta.m < 0):
            raise AssertionError("plan β must be ≥ 0")
        # d_h = q_h − β_h q_{anchor} (β = 0 where there is no anchor)
        P = np.asarray(self.P, dtype=np.int64)
        if P.size:
            anc = np.where(anchor >= 0, anchor, 0)
            Bm = Dy(beta.m.reshape(-1, 1), beta.e)
            self.d = Q[P] - Bm * Q[anc]
            self.u = Dy(W.m[P].reshape(-1, 1), W.e) * self.d  # u_h = w_h d_h
        else:
            self.d = Dy(np.zeros((0, self.D), dtype=object), 0)
            self.u = self.d
        # w̃_j = w_j + Σ_{h: j*_h = j} w_h β_h
        fold = [Fraction(0)] * self.H
        for i, h in enumerate(self.P):
            if anchor[i] >= 0:
                fold[int(anchor[i])] += self.w[h] * self.beta[i]
        self.w_fold = {j: self.w[j] + fold[j] for j in self.R}
        self.anchor = [int(a) for a in anchor]
        # a_A = Σ_{h∈A} |w_h| q_h ;  V = a_A − ½ Σ_R w̃_j q_j  (exact vectors as Fractions)
        qf = [[fr(x) for x in row] for row in q]
        self.a_A = [
            sum((abs(self.w[h]) * qf[h][c] for h in self.A), Fraction(0)) for c in range(self.D)
        ]
        self.V = [
            self.a_A[c]
            - Fraction(1, 2) * sum((self.w_fold[j] * qf[j][c] for j in self.R), Fraction(0))
            for c in range(self.D)
        ]
        # per-group squared norms of d_h and the joint quantities of u
        self.dsq = [
            [self.d[i, a:b].sq().frac() for a, b in self.groups()] for i in range(len(self.P))
        ]
        self.dsq_full = [self.d[i].sq().frac() for i in range(len(self.P))]
        self.usum_sq, self.ugram = [], []
        for a, b in self.groups() + [(0, self.D)]:
            ug = self.u[:, a:b]
            self.usum_sq.append(ug.sum(axis=0).sq().frac() if self.P else Fraction(0))
            self.ugram.append((ug @ ug.T).abs().sum().frac() if self.P else Fraction(0))

    def groups(self) -> list[tuple[int, int]]:
        return [(self.cuts[g], self.cuts[g + 1]) for g in range(len(self.cuts) - 1)]

    # allowances ---------------------------------------------------------------------------
    def triangle(self, ksq: Fraction, g: int | None = None) -> Surd:
        """Σ_{h∈P} w_h ‖d_h^(g)‖ ‖k^(g)‖ (g=None: whole vector) — E_P‖k‖ or E_{P,g}‖k^(g)‖."""
        out = Surd(0)
        for i, h in enumerate(self.P):
            dsq = self.dsq_full[i] if g is None else self.dsq[i][g]
            out = out + Surd.sqrt(dsq * ksq) * self.w[h]
        return out

    def joint(self, ksq: Fraction, g: int | None = None) -> Surd:
        """½(‖Σ u_h‖ + sqrt(Σ|u_h·u_l|))·‖k‖ on group g (None: whole vector), Prop. 3."""
        i = len(self.cuts) - 1 if g is None else g
        return (Surd.sqrt(self.usum_sq[i] * ksq) + Surd.sqrt(self.ugram[i] * ksq)) * Fraction(1, 2)

    def allowance(self, k_row: Dy) -> Surd:
        """The plan's positive allowance at key k, exactly (times ``scale``)."""
        if not self.P:
            return Surd(0)
        if self.kind == "triangle":
            a = self.triangle(k_row.sq().frac())
        elif self.kind == "joint":
            ksq = k_row.sq().frac()
            a = smin(self.triangle(ksq), self.joint(ksq))
        else:
            a = Surd(0)
            for g, (lo, hi) in enumerate(self.groups()):
                ksq = k_row[lo:hi].sq().frac()
                a = a + smin(self.triangle(ksq, g), self.joint(ksq, g))
        return a * self.scale

    # the certificate ---------------------------------------------------------------------
    def parts(self, x_row: list, k_row: Dy, k_frac: list) -> dict:
        """Exact pieces of eq. (9) and of Prop. 6 for one key (x_row: exact logits [H])."""
        relu = [max(v, Fraction(0)) for v in x_row]
        retained = sum((self.w_fold[j] * relu[j] for j in self.R), Fraction(0))
        retained_abs = sum((self.w_fold[j] * abs(x_row[j]) for j in self.R), Fraction(0)) / 2
        aak = sum((a * b for a, b in zip(self.a_A, k_frac, strict=True)), Fraction(0))
        vk = sum((a * b for a, b in zip(self.V, k_frac, strict=True)), Fraction(0))
        allow = self.allowance(k_row)
        return {
            "relu": relu,
            "retained": retained,
            "retained_abs": retained_abs,
            "aAk": aak,
            "Vk": vk,
            "allow": allow,
            "U": allow + (retained - max(aak, Fraction(0))),
            "U_abs": allow + (retained_abs - vk),
        }


def fp_allowance(plan, k_row: np.ndarray) -> Surd:
    """The float plan's allowance Σ_g c_g ‖k^(g)‖ with c_g its float coefficients (exact)."""
    c = plan.positive_coefficients()
    gb = plan.allowance_groups()
    out = Surd(0)
    for g in range(c.size):
        if c[g] != 0.0:
            out = out + Surd.sqrt(Dy.of(k_row[gb[g] : gb[g + 1]]).sq().frac()) * fr(c[g])
    return out
