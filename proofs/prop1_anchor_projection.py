"""Prop. 1 — positive-head projection bound (docs/method.md §4; paper appendix A.1, Prop. 1).

Statement.  For any β ≥ 0 and any decomposition q_h = β q_j + d_h,

    [q_h·k]_+ ≤ β [q_j·k]_+ + ‖d_h‖ ‖k‖                       for every k ∈ R^D.

Multiplying by w_h > 0 and summing over the omitted positive heads P (anchors j*_h ∈ R):

    Σ_{j∈R} w_j[q_j·k]_+ + Σ_{h∈P} w_h[q_h·k]_+ ≤ Σ_{j∈R} w̃_j[q_j·k]_+ + E_P ‖k‖,
    w̃_j = w_j + Σ_{h∈P, j*_h=j} w_h β_h ,     E_P = Σ_{h∈P} w_h ‖d_h‖.

Proof (paper A.1): [a+b]_+ ≤ [a]_+ + [b]_+ and [ca]_+ = c[a]_+ (c ≥ 0) give
[q_h·k]_+ ≤ β[q_j·k]_+ + [d_h·k]_+, and Cauchy–Schwarz gives [d_h·k]_+ ≤ ‖d_h‖‖k‖.

What ``check`` verifies exactly (rationals + exact ``Surd`` square roots): both
inequalities for the anchors/R chosen by ``dosa_ref.plan.build_plan`` with β = the plan's
float β (at its exact value), or the exact optimal β* = [q_h·q_j]_+/‖q_j‖², or any given
β ≥ 0; on every given key and on the witness k = d_h.  Tightness: with β = β*, the witness
k = d_h attains equality ([q_h·d_h]_+ = ‖d_h‖² and q_j·d_h ≤ 0), see Prop. 5.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.plan import PlanOptions, build_plan

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy, Surd

NAME = "prop1_anchor_projection"
STATEMENT = "[q_h·k]+ ≤ β[q_j·k]+ + ‖d_h‖‖k‖; folded sum ≤ Σ_R w̃[q_j·k]+ + E_P‖k‖"


def check(q, w, keys, r=1, R=None, beta="plan", scale=1, context="") -> Result:
    """Verify Prop. 1 for the plan of (q [H, D], w [H]) on keys [n, D].

    beta: "plan" (the plan's float β, exactly), "optimal" (exact β* to the plan's anchor)
    or a float array [|P|] of any β ≥ 0 (applied to the plan's anchor, or to R[0] when the
    plan has none).  scale multiplies the ‖d_h‖‖k‖ terms (mutation tests use 1/2).
    """
    q = np.asarray(q, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    au = Audit(NAME, tightness=True, context=context)
    scale = Fraction(scale)
    plan = build_plan(q, w, np.full(q.shape[0], 0.5), r, PlanOptions(allowance="triangle"), R=R)
    Q = Dy.of(q)
    G = Q @ Q.T  # exact Gram matrix
    gram = lambda a, b: G.frac((a, b))
    W = Dy.of(w).fracs()
    R, P = [int(j) for j in plan.R], [int(h) for h in plan.P]
    anchors, betas = [], []
    for i, h in enumerate(P):
        j = int(plan.anchor[i])
        if isinstance(beta, str) and beta == "plan":
            b = Fraction(float(plan.beta[i]))
        elif isinstance(beta, str) and beta == "optimal":
            b = Fraction(0)
            if j >= 0 and gram(j, j) > 0:
                b = max(gram(h, j), Fraction(0)) / gram(j, j)
        else:
            b = Fraction(float(np.asarray(beta, dtype=np.float64)[i]))
            if j < 0:
                j = R[0] if R else -1
            if j < 0:
                b = Fraction(0)
        au.claim(b >= 0, f"β_{h} = {float(b)} < 0")
        anchors.append(j)
        betas.append(b)
    # ‖d_h‖² = ‖q_h‖² − 2β q_h·q_j + β²‖q_j‖²  (exact)
    dsq = []
    for h, j, b in zip(P, anchors, betas, strict=True):
        dsq.append(gram(h, h) if j < 0 else gram(h, h) - 2 * b * gram(h, j) + b * b * gram(j, j))
    w_fold = {j: W[j] for j in R}
    for h, j, b in zip(P, anchors, betas, strict=True):
        if j >= 0:
            w_fold[j] += W[h] * b

    K = Dy.of(keys)
    X = K @ Q.T
    ksq = K.sq(axis=1)
    for i in range(keys.shape[0]):
        x = [X.frac((i, c)) for c in range(q.shape[0])]
        k2 = ksq.frac(i)
        pos = lambda v: max(v, Fraction(0))
        for h, j, b, d2 in zip(P, anchors, betas, dsq, strict=True):
            xj = x[j] if j >= 0 else Fraction(0)
            rhs = Surd.sqrt(d2 * k2) * scale + b * pos(xj)
            au.ge(rhs, pos(x[h]), f"key {i}, head {h} (anchor {j}, β={float(b):.3g})")
        lhs = sum((W[j] * pos(x[j]) for j in R), Fraction(0))
        lhs += sum((W[h] * pos(x[h]) for h in P), Fraction(0))
        rhs = sum((w_fold[j] * pos(x[j]) for j in R), Fraction(0))
        allow = Surd(0)
        for h, d2 in zip(P, dsq, strict=True):
            allow = allow + Surd.sqrt(d2 * k2) * W[h]
        au.ge(allow * scale + rhs, lhs, f"key {i}: folded positive part")
    # witness k = d_h (exact, rational): q_h·d = ‖q_h‖² − β q_h·q_j, q_j·d = q_h·q_j − β‖q_j‖²
    for h, j, b, d2 in zip(P, anchors, betas, dsq, strict=True):
        if d2 == 0:
            continue
        xh = gram(h, h) - (b * gram(h, j) if j >= 0 else 0)
        xj = (gram(h, j) - b * gram(j, j)) if j >= 0 else Fraction(0)
        lhs = max(xh, Fraction(0))
        rhs = Surd.sqrt(d2 * d2) * scale + b * max(xj, Fraction(0))
        s = au.ge(rhs, lhs, f"witness k = d_{h}")
        au.tight(s == 0)
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    specials = ["", "zero", "dup", "anti", "parallel", "pyth"]
    for t in range(60):
        H = int(rng.choice([2, 3, 4, 6, 8]))
        D = int(rng.choice([1, 2, 3, 4, 8]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        special = specials[t % len(specials)]
        sign = ["pos", "mixed", "zeros", "pos", "neg"][t % 5]
        q = _gen.heads(rng, H, D, kind, special)
        w = _gen.weights(rng, H, sign, kind)
        r = int(rng.integers(1, H)) if t % 3 else H - 1
        R = None
        if t % 4 == 1:
            R = rng.choice(H, size=r, replace=False)
        if t % 9 == 4:  # zero-norm anchor: retained head 0 is the zero vector
            q[0] = 0.0
            R = np.array([0])
        beta = ["plan", "optimal", "arbitrary"][t % 3]
        if beta == "arbitrary":
            # any β ≥ 0 is valid: 0, ordinary, huge and tiny coefficients
            beta = np.abs(rng.standard_normal(H)) * np.array([0.0, 1.0, 1e30, 2.0**-30] * H)[:H]
        k = _gen.keys(rng, 5, D, kind, q)
        out.append(
            dict(q=q, w=w, keys=k, r=r, R=R, beta=beta, context=f"case {t} {kind}/{special}")
        )
    return out
