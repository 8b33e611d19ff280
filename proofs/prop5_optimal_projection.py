"""Prop. 5 — optimal single-anchor allowance (docs/method.md §4; paper appendix B.1, Prop. 5).

Statement.  For q, p ∈ R^D consider all pairs β, c ≥ 0 with
[q·k]_+ ≤ β [p·k]_+ + c ‖k‖ for every k.  The least achievable c is

    c* = min_{β≥0} ‖q − βp‖ ,  attained (p ≠ 0) by β* = [q·p]_+ / ‖p‖²,  c* = ‖q − β*p‖

(p = 0: c* = ‖q‖).  Hence the best anchor j maximises [q·p_j]_+/‖p_j‖, because
c*_j² = ‖q‖² − ([q·p_j]_+)²/‖p_j‖².

Proof (paper B.1, by contradiction with a specific direction): with d = q − β*p,
witness k = q if q·p ≤ 0 (then β* = 0, c* = ‖q‖), else k = d (then p·d = 0).  At the
witness, [q·k]_+ − β[p·k]_+ = c*‖k‖ for EVERY β ≥ 0, so no c < c* works for any β.

``check`` verifies exactly (rationals; c* only through c*² or exact ``Surd`` roots):
‖q − βp‖² ≥ c*² for sampled β ≥ 0 (β* minimises), the witness identity above for every
sampled β (this is the tightness witness: the bound with c* is attained), validity of the
bound (β*, c*) on the given keys, the anchor identity c*_j² = ‖q‖² − ([q·p_j]_+)²/‖p_j‖²,
and (as a note only) whether ``dosa_ref.plan.build_plan`` picked an anchor with minimal c*.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.plan import PlanOptions, build_plan

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy, Surd

NAME = "prop5_optimal_projection"
STATEMENT = "c* = min_β≥0‖q−βp‖ attained by β*; witness keys attain c*"


def _sq(v: Dy) -> Fraction:
    return v.sq().frac()


def check(q, p, keys=(), betas=(), anchors=None, c_scale=1, context="") -> Result:
    """Verify Prop. 5 for q, p [D]; keys [n, D]; extra β ≥ 0 values; c_scale multiplies c*.

    anchors: optional [m, D] alternative anchors p_j (p is added as one of them) for the
    best-anchor identity and the note on ``build_plan``'s anchor choice.
    """
    q = np.asarray(q, dtype=np.float64).ravel()
    p = np.asarray(p, dtype=np.float64).ravel()
    D = q.size
    au = Audit(NAME, tightness=True, context=context)
    c_scale = Fraction(c_scale)
    Q, P = Dy.of(q), Dy.of(p)
    qq, pp, qp = _sq(Q), _sq(P), (Q @ P).frac()
    beta = max(qp, Fraction(0)) / pp if pp > 0 else Fraction(0)
    csq = qq - 2 * beta * qp + beta * beta * pp  # c*² = ‖q − β*p‖²
    au.eq(csq, qq - (max(qp, Fraction(0)) ** 2 / pp if pp > 0 else 0), "c*² = ‖q‖² − [q·p]+²/‖p‖²")
    # β* minimises ‖q − βp‖² over β ≥ 0
    bs = [Fraction(0), beta, beta * (1 + Fraction(1, 2**30)), beta * (1 - Fraction(1, 2**30))]
    bs += [2 * beta + 1, Fraction(10) ** 30] + [Fraction(float(b)) for b in betas]
    bs = [b for b in bs if b >= 0]
    for b in bs:
        au.ge(qq - 2 * b * qp + b * b * pp, csq, f"‖q − βp‖² ≥ c*² at β={float(b):.3g}")
    # the witness: k = q when q·p ≤ 0, else k = d = q − β*p (exact rational vector)
    if qp <= 0 or pp == 0:
        wq, wp, wk2 = qq, qp, qq  # q·k, p·k, ‖k‖² for k = q
    else:
        wq, wp, wk2 = qq - beta * qp, qp - beta * pp, csq
    c_k = Surd.sqrt(csq * wk2)  # c*‖k‖ exactly
    if wk2 > 0:
        for b in bs:
            need = max(wq, Fraction(0)) - b * max(wp, Fraction(0))
            # need = c*‖k‖ for every β: no c < c* is valid with any β
            au.eq(c_k, need, f"witness: [q·k]+ − β[p·k]+ = c*‖k‖ at β={float(b):.3g}")
        s = au.ge(
            c_k * c_scale + beta * max(wp, Fraction(0)), max(wq, Fraction(0)), "witness bound"
        )
        au.tight(s == 0)
    elif csq == 0:
        au.tight(True)  # q = β*p: the bound holds with c* = 0, equality for every k
    # validity of (β*, c*) on the given keys
    keys = np.asarray(keys, dtype=np.float64).reshape(-1, D)
    if keys.shape[0]:
        K = Dy.of(keys)
        xq, xp, k2 = (K @ Q).fracs(), (K @ P).fracs(), K.sq(axis=1).fracs()
        for i in range(keys.shape[0]):
            rhs = Surd.sqrt(csq * k2[i]) * c_scale + beta * max(xp[i], Fraction(0))
            au.ge(rhs, max(xq[i], Fraction(0)), f"key {i}: [q·k]+ ≤ β*[p·k]+ + c*‖k‖")
    # best anchor: argmax [q·p_j]+/‖p_j‖ ⇔ argmin c*_j (exact), and build_plan's choice
    if anchors is not None:
        A = np.concatenate([p[None], np.asarray(anchors, dtype=np.float64).reshape(-1, D)])
        Ad = Dy.of(A)
        c2 = []
        for j in range(A.shape[0]):
            aj = Ad[j]
            ajj, qa = _sq(aj), (Q @ aj).frac()
            bj = max(qa, Fraction(0)) / ajj if ajj > 0 else Fraction(0)
            c2.append(qq - 2 * bj * qa + bj * bj * ajj)
            ratio2 = max(qa, Fraction(0)) ** 2 / ajj if ajj > 0 else Fraction(0)
            au.eq(c2[-1], qq - ratio2, f"anchor {j}: c*_j² = ‖q‖² − ratio_j²")
        heads = np.concatenate([A, q[None]])
        w = np.ones(heads.shape[0])
        R = np.arange(A.shape[0])
        plan = build_plan(heads, w, np.full(w.size, 0.5), 1, PlanOptions(), R=R)
        j = int(plan.anchor[0])
        chosen = c2[j] if j >= 0 else qq
        if chosen != min(c2 + [qq]):
            au.note(
                "build_plan picked an anchor with c*² above the exact minimum by "
                f"{float((chosen - min(c2)) / max(min(c2), Fraction(1, 10**300))):.3g} (relative)"
                " — float near-tie; efficiency only"
            )
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(60):
        D = int(rng.choice([1, 2, 3, 5, 8]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        mode = t % 8
        q = _gen.array(rng, D, kind)
        p = _gen.array(rng, D, kind)
        if mode == 1:
            p = np.zeros(D)  # zero-norm anchor
        elif mode == 2:
            q = np.zeros(D)
        elif mode == 3:
            p = -q * 2.0  # anti-parallel: β* = 0, c* = ‖q‖
        elif mode == 4:
            p = q * 0.5  # parallel: c* = 0
        elif mode == 5 and D >= 2:
            p = q.copy()
            p[0] = -p[0]  # q·p can be of either sign, near orthogonal
        keys = _gen.keys(rng, 4, D, kind, np.stack([q, p]))
        betas = np.abs(rng.standard_normal(3)) * np.array([1.0, 1e-30, 1e30])
        anchors = _gen.array(rng, (3, D), kind) if t % 2 else None
        out.append(
            dict(q=q, p=p, keys=keys, betas=betas, anchors=anchors, context=f"case {t} {kind}")
        )
    return out
