"""Prop. 6 — exact certificate slack (docs/method.md §6; paper appendix B.2, Prop. 6).

Statement.  For the bound (9), U(k) = Σ_R w̃_j[x_j]_+ + Φ(k) − [a_A·k]_+ (x_h = q_h·k, Φ the
positive allowance), and s(k) = Σ_h w_h [x_h]_+,

    U − s = δ_P(k) + Σ_{h∈N\\A} |w_h| [x_h]_+ + min{Z_A^+(k), Z_A^-(k)}     exactly,

with δ_P = Σ_R w̃_j[x_j]_+ + Φ − Σ_R w_j[x_j]_+ − Σ_P w_h[x_h]_+ ≥ 0 (Prop. 1) and
Z_A^± the positive / negative parts of Σ_{h∈A}|w_h| x_h (so a_A·k = Z^+ − Z^-).

Proof (paper B.2): the retained terms cancel in U − s; the negative remainder is
δ_N = Σ_N |w_h|[x_h]_+ − [Z^+ − Z^-]_+ and z − [z − y]_+ = min(z, y) with z = Z^+.
Also from B.2: 0 ≤ δ_N ≤ ‖k‖ Σ_{h∈A△M(k)} |w_h|‖q_h‖ (M(k) = active omitted negative heads),
and the majority support A* = {h : p_h ≥ ½} minimises the separable surrogate
J(A) = Σ_{h∈A} a_h(1−p_h) + Σ_{h∈N\\A} a_h p_h (a_h = |w_h|‖q_h‖).

``check`` builds the plan with ``dosa_ref.plan.build_plan`` (structure R, P, N, A and the
plan's β at exact value; everything else recomputed exactly) and verifies the identity
exactly (Φ is an exact ``Surd`` and cancels symbolically), the nonnegativity of each part,
the δ_N bound, and the J-optimality of the majority support with exact frequencies.
Tightness: a key with U = s exactly (P = ∅, A = N, active set = A) — zero slack.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np

from dosa_ref.plan import PlanOptions, build_plan

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy, Surd
from ._exactplan import ExactPlan

NAME = "prop6_slack_decomposition"
STATEMENT = "U − s = δ_P + Σ_{N\\A}|w|[x]+ + min(Z+, Z−), each ≥ 0"

MUTATIONS = (None, "drop_cancellation", "drop_missed")


def check(
    q, w, keys, r=1, R=None, A=None, allowance="triangle", p=None, mutate=None, context=""
) -> Result:
    """Verify Prop. 6 for the plan of (q [H, D], w [H]) on keys [n, D].

    p: activation frequencies as exact pairs (count, total) per head, or None (all 1/2).
    mutate: drop one slack component (mutation tests) — the identity must then fail.
    """
    q = np.asarray(q, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    H = q.shape[0]
    au = Audit(NAME, tightness=True, context=context)
    pf = [Fraction(1, 2)] * H if p is None else [Fraction(int(c), int(n)) for c, n in p]
    pfloat = np.array([float(v) for v in pf])
    plan = build_plan(q, w, pfloat, r, PlanOptions(allowance=allowance), R=R, A=A)
    ep = ExactPlan(plan, q, w)
    Wf = ep.w
    K = Dy.of(keys)
    X = K @ Dy.of(q).T
    notA = [h for h in ep.N if h not in ep.A]
    qsq = Dy.of(q).sq(axis=1).fracs()
    zero = Fraction(0)
    for i in range(keys.shape[0]):
        x = [X.frac((i, h)) for h in range(H)]
        kf = Dy.of(keys[i]).fracs()
        parts = ep.parts(x, K[i], kf)
        relu = parts["relu"]
        s = sum((Wf[h] * relu[h] for h in range(H)), zero)
        U = parts["U"]
        exact_pos = sum((Wf[j] * relu[j] for j in ep.R), zero) + sum(
            (Wf[h] * relu[h] for h in ep.P), zero
        )
        delta_P = parts["allow"] + (parts["retained"] - exact_pos)
        missed = sum((abs(Wf[h]) * relu[h] for h in notA), zero)
        zp = sum((abs(Wf[h]) * relu[h] for h in ep.A), zero)
        zm = sum((abs(Wf[h]) * max(-x[h], zero) for h in ep.A), zero)
        cancel = min(zp, zm)
        au.eq(zp - zm, parts["aAk"], f"key {i}: a_A·k = Z+ − Z−")
        au.eq(zp - max(parts["aAk"], zero), cancel, f"key {i}: Σ_A|w|[x]+ − [a_A·k]+ = min(Z+,Z−)")
        au.margin(delta_P, f"key {i}: δ_P ≥ 0")
        au.margin(missed, f"key {i}: missed ≥ 0")
        au.margin(cancel, f"key {i}: cancellation ≥ 0")
        total = delta_P + (
            (missed if mutate != "drop_missed" else 0)
            + (cancel if mutate != "drop_cancellation" else 0)
        )
        au.eq(U - s, total, f"key {i}: U − s = δ_P + missed + min(Z+,Z−)")
        if plan.screens:
            au.tight((U - s).sign() == 0)
        # B.2: 0 ≤ δ_N ≤ ‖k‖ Σ_{A△M(k)} |w_h|‖q_h‖
        M = {h for h in ep.N if x[h] > 0}
        k2 = Dy.of(keys[i]).sq().frac()
        bound = sum((Surd.sqrt(qsq[h] * k2) * abs(Wf[h]) for h in sorted(M ^ set(ep.A))), Surd(0))
        au.ge(bound, missed + cancel, f"key {i}: δ_N ≤ ‖k‖Σ_{{A△M}} a_h")
    # J(A) minimised by the majority support (exact frequencies), per head and by enumeration
    a = {h: Surd.sqrt(qsq[h]) * abs(Wf[h]) for h in ep.N}
    major = [h for h in ep.N if pf[h] >= Fraction(1, 2)]

    def J(S):
        return sum((a[h] * (1 - pf[h]) if h in S else a[h] * pf[h] for h in ep.N), Surd(0))

    for h in ep.N:
        inside, outside = a[h] * (1 - pf[h]), a[h] * pf[h]
        if h in major:
            au.ge(outside, inside, f"head {h}: majority keeps the cheaper J term")
        else:
            au.ge(inside, outside, f"head {h}: majority drops the cheaper J term")
    if len(ep.N) <= 5:
        Jm = J(set(major))
        for m in range(len(ep.N) + 1):
            for S in combinations(ep.N, m):
                au.ge(J(set(S)), Jm, f"J({list(S)}) ≥ J(majority)")
    return au.result()


def _freq(rng, q, n=16):
    """Exact activation frequencies (count, n) of heads over n integer sample keys."""
    ks = rng.integers(-2, 3, size=(n, q.shape[1])).astype(np.float64)
    X = Dy.of(ks) @ Dy.of(q).T
    return [(int(np.sum(X.positive()[:, h])), n) for h in range(q.shape[0])]


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    specials = ["", "zero", "dup", "anti", "parallel", "pyth"]
    for t in range(50):
        H = int(rng.choice([2, 3, 4, 6, 8]))
        D = int(rng.choice([1, 2, 3, 4, 8]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        q = _gen.heads(rng, H, D, kind, specials[t % len(specials)])
        w = _gen.weights(rng, H, ["mixed", "zeros", "neg", "pos"][t % 4], kind)
        r = int(rng.integers(1, H)) if t % 3 else H - 1
        R = A = None
        keys = _gen.keys(rng, 5, D, kind, q)
        if t % 5 == 0:
            # zero-slack witness: every positive head retained, A = N, a key with M(k) = A
            H, D = 3, int(rng.choice([2, 3]))
            q = rng.integers(-3, 4, size=(H, D)).astype(np.float64)
            w = np.array([1.0, -1.0, -2.0])
            kk = rng.integers(-2, 3, size=D).astype(np.float64)
            kk[0] = 1.0
            for h in (1, 2):
                if q[h] @ kk <= 0:
                    q[h] = -q[h] if q[h] @ kk < 0 else q[h] + kk
            R, A, r = np.array([0]), np.array([1, 2]), 1
            keys = np.concatenate([kk[None], _gen.keys(rng, 3, D, "int", q)])
        elif t % 5 == 1:
            A = rng.choice(H, size=int(rng.integers(0, H + 1)), replace=False)
        out.append(
            dict(
                q=q,
                w=w,
                keys=keys,
                r=r,
                R=R,
                A=A,
                allowance=["triangle", "joint", "grouped"][t % 3],
                p=_freq(rng, q),
                context=f"case {t} {kind}",
            )
        )
    return out
