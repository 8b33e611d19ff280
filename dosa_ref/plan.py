"""Per-query screening plan (docs/method.md §3–§5): retained heads R, anchor projection of the
omitted positive heads (Prop. 1), the positive allowances E_P / E_P^joint / grouped
(Prop. 3), and the negative aggregate a_A over the majority support A (Prop. 2).

Every choice in this module (R, A, anchors, r) affects only efficiency: the certificate
(`certificate.upper_bound`) is valid for ANY R, any anchors and any A ⊆ N.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Plan",
    "PlanOptions",
    "activation_frequency",
    "build_plan",
    "choose_retained",
    "coordinate_groups",
    "joint_allowance",
]

NEG_AGGREGATES = ("majority", "all", "none")
NEG_PRIORITIES = ("activation", "strength")
ALLOWANCES = ("triangle", "joint", "grouped")


@dataclass(frozen=True)
class PlanOptions:
    """Ablation switches of the certificate (paper §certificate ablation).

    neg_aggregate: which omitted negative heads enter a_A — ``majority`` (p_h ≥ 1/2),
        ``all`` (A = N) or ``none`` (A = ∅).
    neg_priority: order in which negative heads fill R — ``activation``
        (|w_h|‖q_h‖ min(p_h, 1−p_h)) or ``strength`` (|w_h|‖q_h‖).
    pos_projection: project omitted positive heads on an anchor (Prop. 1); off means
        β = 0 and d_h = q_h (the plain Cauchy–Schwarz allowance).
    allowance: positive residual allowance — ``triangle`` (E_P), ``joint`` (E_P^joint,
        Prop. 3) or ``grouped`` (per coordinate group, the smaller of triangle and joint).
    groups: number G of contiguous coordinate groups for ``grouped``.
    """

    neg_aggregate: str = "majority"
    neg_priority: str = "activation"
    pos_projection: bool = True
    allowance: str = "grouped"
    groups: int = 4

    def __post_init__(self):
        if self.neg_aggregate not in NEG_AGGREGATES:
            raise ValueError(f"neg_aggregate: expected one of {NEG_AGGREGATES}")
        if self.neg_priority not in NEG_PRIORITIES:
            raise ValueError(f"neg_priority: expected one of {NEG_PRIORITIES}")
        if self.allowance not in ALLOWANCES:
            raise ValueError(f"allowance: expected one of {ALLOWANCES}")
        if not isinstance(self.groups, (int, np.integer)) or self.groups < 1:
            raise ValueError(f"groups: expected a positive integer, got {self.groups!r}")


@dataclass
class Plan:
    """Screening plan of one query (all float64; D = head dim, r = |R|).

    R: int [r] retained heads, evaluated exactly with folded weights ``w_fold`` [r].
    P, Nn: omitted positive / negative heads; A ⊆ Nn the aggregated negative heads.
    anchor: int [|P|] anchor head index (into the full head list, -1 when β = 0);
    beta: [|P|] projection coefficients; d: [|P|, D] residual directions d_h.
    E_P: Σ_h w_h ‖d_h‖ (triangle); E_P_joint: Prop. 3; E_groups / E_groups_joint: [G]
    per-group triangle / joint allowances; group_bounds: int [G+1] coordinate cuts.
    a_A: [D] negative aggregate Σ_{h∈A} |w_h| q_h.  V: [D] absolute-value-form aux row.
    """

    H: int
    R: np.ndarray
    P: np.ndarray
    Nn: np.ndarray
    A: np.ndarray
    q_R: np.ndarray
    w_R: np.ndarray
    w_fold: np.ndarray
    anchor: np.ndarray
    beta: np.ndarray
    d: np.ndarray
    E_P: float
    E_P_joint: float
    E_groups: np.ndarray
    E_groups_joint: np.ndarray
    group_bounds: np.ndarray
    a_A: np.ndarray
    V: np.ndarray
    options: PlanOptions = field(default_factory=PlanOptions)

    @property
    def r(self) -> int:
        return int(self.R.shape[0])

    @property
    def screens(self) -> bool:
        """False when every nonzero head is retained (the bound is the score itself)."""
        return self.P.size + self.Nn.size > 0

    def positive_coefficients(self) -> np.ndarray:
        """Per-group coefficients c_g with positive allowance Σ_g c_g ‖k^(g)‖.

        triangle and joint are single-group (c = [E]) forms on the whole vector; grouped
        takes per group the smaller valid enclosure (each group's bound is valid alone).
        """
        opt = self.options.allowance
        if opt == "triangle":
            return np.array([self.E_P])
        if opt == "joint":
            return np.array([min(self.E_P, self.E_P_joint)])
        return np.minimum(self.E_groups, self.E_groups_joint)

    def allowance_groups(self) -> np.ndarray:
        """Coordinate cuts matching ``positive_coefficients``."""
        if self.options.allowance == "grouped":
            return self.group_bounds
        return np.array([0, self.a_A.shape[0]])


def pow2_exponent(x: np.ndarray, axis=None) -> np.ndarray:
    """Exponent e with max|x|·2^-e in [0.5, 1) (0 where x is all zero); int array."""
    m = np.max(np.abs(x), axis=axis) if x.size else np.zeros(())
    return np.frexp(m)[1]


def safe_norm(x: np.ndarray, axis=-1) -> np.ndarray:
    """Euclidean norm without intermediate underflow or overflow.

    Each row is scaled by an exact power of two before squaring (np.linalg.norm squares
    directly: for |x| ~ 1e-160 the squares are subnormal and the norm loses most of its
    bits, which once made E_P‖k‖ fall below a key's true score).  float64.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[axis] == 0:
        return np.zeros(np.delete(x.shape, axis % x.ndim)) if x.ndim > 1 else np.float64(0.0)
    e = np.expand_dims(pow2_exponent(x, axis=axis), axis)
    return np.ldexp(np.linalg.norm(np.ldexp(x, -e), axis=axis), np.squeeze(e, axis))


def coordinate_groups(D: int, G: int) -> np.ndarray:
    """Cuts int [G'+1] splitting D coordinates into G' = min(G, D) contiguous groups."""
    G = max(1, min(int(G), D))
    return np.linspace(0, D, G + 1).round().astype(np.int64)


def activation_frequency(q_t: np.ndarray, k_sample: np.ndarray) -> np.ndarray:
    """p_h: fraction of sample keys with q_h·k > 0; float64 [H] (0.5 for an empty sample)."""
    if k_sample.shape[0] == 0:
        return np.full(q_t.shape[0], 0.5)
    return np.mean((k_sample @ q_t.T) > 0.0, axis=0)


def joint_allowance(u: np.ndarray) -> float:
    """Prop. 3: ½(‖Σ_h u_h‖ + sqrt(Σ_{h,l} |u_h·u_l|)) for rows u [m, D] (0 when m = 0)."""
    if u.shape[0] == 0 or not np.any(u):
        return 0.0
    # Homogeneous of degree 1: evaluate on u·2^-e (exact) so u_h·u_l cannot underflow.
    e = int(pow2_exponent(u))
    us = np.ldexp(u, -e)
    s = np.linalg.norm(us.sum(axis=0))
    g = np.abs(us @ us.T).sum()
    return float(np.ldexp(0.5 * (s + np.sqrt(g)), e))


def choose_retained(
    q_t: np.ndarray, w_t: np.ndarray, p: np.ndarray, r: int, neg_priority: str = "activation"
) -> np.ndarray:
    """The paper's rule for R (docs/method.md §3); returns sorted int [≤ r] head indices.

    If |H+| ≤ r keep all positive heads, then negative heads by priority
    |w_h|‖q_h‖ min(p_h, 1−p_h) (activation-aware) or |w_h|‖q_h‖ (strength-only);
    else keep the r strongest positive heads by w_h‖q_h‖.  Ties go to the lower index.
    """
    qn = safe_norm(q_t, axis=1)
    pos = np.flatnonzero(w_t > 0)
    neg = np.flatnonzero(w_t < 0)
    if pos.size <= r:
        prio = np.abs(w_t[neg]) * qn[neg]
        if neg_priority == "activation":
            prio = prio * np.minimum(p[neg], 1.0 - p[neg])
        order = np.lexsort((neg, -prio))
        R = np.concatenate([pos, neg[order[: r - pos.size]]])
    else:
        strength = w_t[pos] * qn[pos]
        R = pos[np.lexsort((pos, -strength))[:r]]
    return np.sort(R).astype(np.int64)


def build_plan(
    q_t: np.ndarray,
    w_t: np.ndarray,
    p: np.ndarray,
    r: int,
    options: PlanOptions | None = None,
    R: np.ndarray | None = None,
    A: np.ndarray | None = None,
) -> Plan:
    """Build the plan of one query.

    Args:
        q_t: float64 [H, D]; w_t: float64 [H]; p: float64 [H] activation frequencies.
        r: retained-head budget (ignored when ``R`` is given).
        options: ablation switches.
        R, A: optional explicit retained set / aggregated set (the proof holds for any
            R and any A ⊆ N; tests use this to check every choice).
    """
    options = options or PlanOptions()
    H, D = q_t.shape
    if R is None:
        R = choose_retained(q_t, w_t, p, r, options.neg_priority)
    R = np.unique(np.asarray(R, dtype=np.int64))
    inR = np.zeros(H, dtype=bool)
    inR[R] = True
    P = np.flatnonzero((w_t > 0) & ~inR)
    Nn = np.flatnonzero((w_t < 0) & ~inR)
    if A is None:
        if options.neg_aggregate == "majority":
            A = Nn[p[Nn] >= 0.5]
        elif options.neg_aggregate == "all":
            A = Nn
        else:
            A = Nn[:0]
    A = np.intersect1d(np.asarray(A, dtype=np.int64), Nn)

    q_R = q_t[R]
    w_R = w_t[R]
    w_fold = w_R.copy()
    anchor = np.full(P.size, -1, dtype=np.int64)
    beta = np.zeros(P.size)
    # Each head is handled at its own power-of-two scale (exact): q_h = 2^{e_h} q̃_h with
    # max|q̃_h| in [0.5, 1).  Squares and dot products of q̃ never underflow, whatever the
    # heads' relative magnitudes (a single shared scale once lost a head 2^-560 below the
    # largest one: its ‖d_h‖ became 0).  β, w̃ are scale-free; d_h = 2^{e_h} d̃_h.
    eh = pow2_exponent(q_t, axis=1)  # [H]
    qs = np.ldexp(q_t, -eh[:, None])
    d_s = qs[P].copy()  # d̃_h, in units of 2^{e_h}
    if options.pos_projection and R.size > 0 and P.size > 0:
        qs_R = qs[R]
        nR = np.linalg.norm(qs_R, axis=1)
        dots = np.maximum(qs[P] @ qs_R.T, 0.0)  # [|P|, r], scaled units
        # Prop. 1 / Prop. 5: anchor maximises [q_h·q_j]_+ / ‖q_j‖ (scale-free up to 2^{e_h},
        # common to the row); zero-norm anchors score 0 and give β = 0.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(nR > 0, dots / np.where(nR > 0, nR, 1.0), 0.0)
        jstar = np.argmax(ratio, axis=1)
        for i in range(P.size):
            j = jstar[i]
            if ratio[i, j] <= 0.0:
                continue
            b_s = dots[i, j] / (nR[j] * nR[j])  # β in units 2^{e_h − e_j}
            b = float(np.ldexp(b_s, int(eh[P[i]] - eh[R[j]])))
            # Prop. 1 holds for any β ≥ 0 with d = q_h − βq_j: keep β only where it is a
            # normal number, so that β and d̃ describe the same projection exactly.
            if not (np.isfinite(b) and b >= np.finfo(np.float64).tiny):
                continue
            anchor[i], beta[i] = R[j], b
            d_s[i] = qs[P[i]] - b_s * qs_R[j]
            w_fold[j] += w_t[P[i]] * b
    eP = eh[P]
    d = np.ldexp(d_s, eP[:, None])
    u = w_t[P][:, None] * d  # u_h = w_h d_h, w_h > 0 (joint_allowance rescales itself)
    E_P = float(np.sum(w_t[P] * np.ldexp(np.linalg.norm(d_s, axis=1), eP)))
    E_P_joint = float(joint_allowance(u))
    gb = coordinate_groups(D, options.groups)
    G = gb.size - 1
    E_groups = np.zeros(G)
    E_groups_joint = np.zeros(G)
    for g in range(G):
        sl = slice(gb[g], gb[g + 1])
        E_groups[g] = np.sum(w_t[P] * np.ldexp(np.linalg.norm(d_s[:, sl], axis=1), eP))
        E_groups_joint[g] = joint_allowance(u[:, sl])
    # In the caller's scale: products that underflow err by ≤ 2^-1075 each, which the
    # certificate's absolute underflow term covers.
    a_A = (np.abs(w_t[A])[:, None] * q_t[A]).sum(axis=0) if A.size else np.zeros(D)
    V = a_A - 0.5 * (w_fold[:, None] * q_R).sum(axis=0)
    return Plan(
        H=H,
        R=R,
        P=P,
        Nn=Nn,
        A=A,
        q_R=q_R,
        w_R=w_R,
        w_fold=w_fold,
        anchor=anchor,
        beta=beta,
        d=d,
        E_P=E_P,
        E_P_joint=E_P_joint,
        E_groups=E_groups,
        E_groups_joint=E_groups_joint,
        group_bounds=gb,
        a_A=a_A,
        V=V,
        options=options,
    )
