"""Prop. 3 — joint residual allowance (docs/method.md §4; paper appendix A.1, Prop. 3).

Statement.  For rows u_h ∈ R^D (h ∈ P; u_h = w_h d_h in the certificate),

    E^joint = ½ ( ‖Σ_h u_h‖ + sqrt( Σ_{h,l} |u_h·u_l| ) ) ≤ E_P = Σ_h ‖u_h‖ ,
    Σ_h [u_h·k]_+ ≤ E^joint ‖k‖                                   for every k.

Proof (paper A.1): [x]_+ = (x + |x|)/2, so Σ_h[u_h·k]_+ = ½((Σu_h)·k + Σ_h|u_h·k|);
Σ_h |u_h·k| = max_{σ∈{±1}^P} (Σ σ_h u_h)·k, and ‖Σ σ_h u_h‖² = Σ_{h,l} σ_hσ_l u_h·u_l
≤ Σ_{h,l}|u_h·u_l|; Cauchy–Schwarz gives the bound; the triangle inequality gives
‖Σu‖ ≤ Σ‖u_h‖ and sqrt(Σ|u_h·u_l|) ≤ Σ‖u_h‖.

``check`` verifies, exactly: the lemma ‖Σσu‖² ≤ Σ|u_h·u_l| for every sign vector σ (all of
them when |P| ≤ 10), the identity Σ|u_h·k| = (Σ σ*_h u_h)·k with σ*_h = sign(u_h·k) and
its maximality, E^joint ≤ E_P, and the key bound.  Tightness: when all rows are positive
multiples of one vector v (in particular |P| = 1), E^joint = E_P and the key k = v attains
Σ[u_h·k]_+ = E^joint‖k‖.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import numpy as np

from dosa_ref.plan import PlanOptions, build_plan

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy, Surd

NAME = "prop3_joint_allowance"
STATEMENT = "E_joint ≤ E_P and Σ_h[u_h·k]+ ≤ E_joint‖k‖"


def check(u, keys, scale=1, context="") -> Result:
    """Verify Prop. 3 for rows u [m, D] on keys [n, D]; scale multiplies E^joint."""
    u = np.asarray(u, dtype=np.float64).reshape(-1, np.asarray(keys).shape[1])
    keys = np.asarray(keys, dtype=np.float64)
    au = Audit(NAME, tightness=True, context=context)
    scale = Fraction(scale)
    m = u.shape[0]
    U = Dy.of(u)
    K = Dy.of(keys)
    G = U @ U.T
    gsum = G.abs().sum().frac() if m else Fraction(0)
    ssum = U.sum(axis=0).sq().frac() if m else Fraction(0)
    # lemma: ‖Σ σ_h u_h‖² ≤ Σ|u_h·u_l| for sign vectors σ
    if m <= 10:
        sigmas = list(product((1, -1), repeat=m))
    else:
        rng = np.random.default_rng(m)
        sigmas = [tuple(int(v) for v in rng.choice([1, -1], size=m)) for _ in range(256)]
    Gf = [[G.frac((a, b)) for b in range(m)] for a in range(m)]
    if m:
        # all sign vectors at once, in exact integers (common exponent G.e)
        Sg = np.array(sigmas, dtype=object)
        quad = ((Sg @ G.m) * Sg).sum(axis=1)
        worst = max(range(len(sigmas)), key=quad.__getitem__)
        au.ge(gsum, Dy(quad[worst], G.e).frac(), f"‖Σσu‖² ≤ Σ|u_h·u_l| (worst σ={sigmas[worst]})")
    # E_joint ≤ E_P
    E_P = Surd(0)
    for a in range(m):
        E_P = E_P + Surd.sqrt(Gf[a][a])
    E_J = (Surd.sqrt(ssum) + Surd.sqrt(gsum)) * Fraction(1, 2)
    s = au.ge(E_P, E_J, "E_joint ≤ E_P")
    if m:
        au.tight(s == 0 and gsum > 0)
    # key bound and the max-over-signs identity
    X = K @ U.T if m else None
    ksq = K.sq(axis=1)
    for i in range(keys.shape[0]):
        x = [X.frac((i, a)) for a in range(m)] if m else []
        k2 = ksq.frac(i)
        lhs = sum((max(v, Fraction(0)) for v in x), Fraction(0))
        bound = (Surd.sqrt(ssum * k2) + Surd.sqrt(gsum * k2)) * (scale / 2)
        s = au.ge(bound, lhs, f"key {i}: Σ[u_h·k]+ ≤ E_joint‖k‖")
        if lhs > 0:
            au.tight(s == 0)
        absum = sum((abs(v) for v in x), Fraction(0))
        star = sum(((1 if v >= 0 else -1) * v for v in x), Fraction(0))
        au.eq(absum, star, f"key {i}: Σ|u_h·k| = (Σσ*u)·k")
        if m:
            xs = X.m[i]
            best = max((Sg @ xs).tolist())  # max_σ (Σσu)·k, exact integers
            if m <= 10:  # every σ enumerated: the maximum is attained by σ*
                au.eq(absum, Dy(best, X.e).frac(), f"key {i}: Σ|u_h·k| = max_σ (Σσu)·k")
            else:
                au.ge(absum, Dy(best, X.e).frac(), f"key {i}: (Σσu)·k ≤ Σ|u_h·k|")
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(50):
        D = int(rng.choice([1, 2, 3, 5, 8]))
        m = int(rng.choice([0, 1, 2, 3, 5, 8, 12]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        mode = t % 5
        if mode == 0 and m:  # parallel rows: tight
            v = rng.integers(-3, 4, size=D).astype(np.float64)
            v[0] = v[0] or 1.0
            u = rng.integers(1, 4, size=(m, 1)) * v
            k = np.concatenate([v[None], _gen.keys(rng, 3, D, "int", u)], axis=0)
        elif mode == 1:  # rows from a real plan: u_h = w_h d_h
            H = m + 2
            q = _gen.heads(rng, H, D, kind, ["", "dup", "anti"][t % 3])
            w = _gen.weights(rng, H, "pos", kind)
            plan = build_plan(q, w, np.full(H, 0.5), 2, PlanOptions(allowance="triangle"))
            u = w[plan.P][:, None] * plan.d
            k = _gen.keys(rng, 5, D, kind, q)
        else:
            u = _gen.array(rng, (m, D), kind)
            if mode == 3 and m >= 2:
                u[1] = -u[0]  # cancelling rows
            k = _gen.keys(rng, 5, D, kind, u)
        out.append(dict(u=u, keys=k, context=f"case {t} {kind} m={u.shape[0]}"))
    return out
