"""Grouped positive residual allowance (docs/method.md §4; paper appendix A.1, "grouped positive
residual" and Prop. 3 per group).

Statement.  Split the D coordinates into G disjoint groups k^(g).  With w_h > 0 (h ∈ P),
E_{P,g} = Σ_h w_h ‖d_h^(g)‖ and the per-group joint form B_g (Prop. 3 on u_h^(g) = w_h d_h^(g)):

    (a)  Σ_h w_h [d_h·k]_+ ≤ Σ_g min(E_{P,g}, B_g) ‖k^(g)‖ ≤ Σ_g E_{P,g} ‖k^(g)‖
    (b)  Σ_g E_{P,g} ‖k^(g)‖ ≤ (Σ_g E_{P,g}²)^{1/2} ‖k‖                (Cauchy–Schwarz)
    (c)  (Σ_g E_{P,g}²)^{1/2} ≤ E_P = Σ_h w_h ‖d_h‖                     (Minkowski)

Proof (paper A.1): d_h·k = Σ_g d_h^(g)·k^(g) and ReLU subadditivity split the sum by group;
per group Cauchy–Schwarz (or Prop. 3) bounds each piece; (b) is Cauchy–Schwarz in R^G;
(c) is Minkowski's inequality for the vectors (w_h‖d_h^(g)‖)_g.

``check`` verifies (a)–(c) exactly ((b) and (c) by comparing squares of nonnegative
``Surd`` values) with the groups of ``dosa_ref.plan.coordinate_groups`` (and that they
partition 0..D).  Tightness: one head, k = d_h with rational per-group norms gives
equality in (a), (b) and (c) simultaneously.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.plan import coordinate_groups

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy, Surd, smin

NAME = "grouped_allowance"
STATEMENT = "Σw[d·k]+ ≤ Σ_g E_g‖k_g‖ ≤ (ΣE_g²)^½‖k‖, (ΣE_g²)^½ ≤ E_P"


def check(w, d, keys, groups=4, scale=1, context="") -> Result:
    """Verify the grouped allowance for w [m] > 0, residuals d [m, D], keys [n, D].

    groups: G for ``coordinate_groups(D, G)`` or explicit cuts (list of G+1 ints).
    scale multiplies every allowance coefficient (mutation tests use 1/2).
    """
    w = np.asarray(w, dtype=np.float64).ravel()
    keys = np.asarray(keys, dtype=np.float64)
    D = keys.shape[1]
    d = np.asarray(d, dtype=np.float64).reshape(-1, D)
    au = Audit(NAME, tightness=True, context=context)
    scale = Fraction(scale)
    cuts = list(coordinate_groups(D, groups)) if np.isscalar(groups) else list(groups)
    cuts = [int(c) for c in cuts]
    au.claim(
        cuts[0] == 0
        and cuts[-1] == D
        and all(a <= b for a, b in zip(cuts[:-1], cuts[1:], strict=True)),
        f"cuts {cuts} do not partition 0..{D}",
    )
    au.claim(bool(np.all(w > 0)), "weights of omitted positive heads must be > 0")
    G = len(cuts) - 1
    m = d.shape[0]
    Wf = Dy.of(w).fracs()
    Dd = Dy.of(d)
    U = Dy(Dy.of(w).m.reshape(-1, 1), Dy.of(w).e) * Dd
    dsq = [[Dd[h, cuts[g] : cuts[g + 1]].sq().frac() for g in range(G)] for h in range(m)]
    full = [Dd[h].sq().frac() for h in range(m)]
    # E_{P,g} and E_P as exact Surds
    E = [sum((Surd.sqrt(dsq[h][g]) * Wf[h] for h in range(m)), Surd(0)) * scale for g in range(G)]
    E_P = sum((Surd.sqrt(full[h]) * Wf[h] for h in range(m)), Surd(0))
    sumsq = sum((e * e for e in E), Surd(0))
    s = au.ge(E_P * E_P * scale * scale, sumsq, "(c) Minkowski: Σ_g E_g² ≤ E_P²")
    if m:
        au.tight(s == 0 and any(full))
    # per-group joint quantities
    usum = [U[:, cuts[g] : cuts[g + 1]].sum(axis=0).sq().frac() if m else 0 for g in range(G)]
    ugram = []
    for g in range(G):
        ug = U[:, cuts[g] : cuts[g + 1]]
        ugram.append((ug @ ug.T).abs().sum().frac() if m else Fraction(0))
    K = Dy.of(keys)
    X = K @ Dd.T if m else None
    for i in range(keys.shape[0]):
        lhs = sum((Wf[h] * max(X.frac((i, h)), Fraction(0)) for h in range(m)), Fraction(0))
        ksq = [K[i, cuts[g] : cuts[g + 1]].sq().frac() for g in range(G)]
        k2 = sum(ksq, Fraction(0))
        # E_g ‖k_g‖ written as Σ_h w_h sqrt(‖d_h^(g)‖²‖k_g‖²) (exact products of roots)
        tri = [
            sum((Surd.sqrt(dsq[h][g] * ksq[g]) * Wf[h] for h in range(m)), Surd(0)) * scale
            for g in range(G)
        ]
        joint = [
            (Surd.sqrt(usum[g] * ksq[g]) + Surd.sqrt(ugram[g] * ksq[g])) * (scale / 2)
            for g in range(G)
        ]
        best = sum((smin(a, b) for a, b in zip(tri, joint, strict=True)), Surd(0))
        grouped = sum(tri, Surd(0))
        s1 = au.ge(best, lhs, f"key {i}: (a) Σw[d·k]+ ≤ Σ_g min(E_g,B_g)‖k_g‖")
        au.ge(grouped, best, f"key {i}: (a) min form ≤ triangle form")
        s2 = au.ge(sumsq * k2, grouped * grouped, f"key {i}: (b) (Σ_g E_g‖k_g‖)² ≤ ΣE_g²‖k‖²")
        if lhs > 0:
            au.tight(s1 == 0 and s2 == 0)
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(50):
        D = int(rng.choice([1, 2, 3, 4, 6, 8]))
        m = int(rng.choice([0, 1, 2, 3, 5]))
        G = int(rng.choice([1, 2, 3, 4, 8]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        mode = t % 4
        if mode == 0:  # tight witness: one head, rational group norms, k = d
            cuts = coordinate_groups(D, G)
            dv = np.zeros(D)
            for g in range(cuts.size - 1):
                a, b = int(cuts[g]), int(cuts[g + 1])
                if b - a >= 2:
                    dv[a], dv[a + 1] = 3.0 * (g + 1), 4.0 * (g + 1)
                elif b - a == 1:
                    dv[a] = -(g + 2.0)
            d = dv[None]
            w = np.array([float(rng.integers(1, 4))])
            k = np.concatenate([dv[None], _gen.keys(rng, 3, D, "int")], axis=0)
        elif mode == 1:  # parallel residuals with proportional group norms
            v = _gen.heads(rng, 1, D, "int", "pyth")[0]
            d = rng.integers(1, 4, size=(max(m, 1), 1)) * v
            w = _gen.weights(rng, d.shape[0], "pos", "int")
            k = np.concatenate([v[None], _gen.keys(rng, 3, D, "int")], axis=0)
        else:
            d = _gen.heads(rng, m, D, kind, ["", "zero", "dup"][t % 3]) if m else np.zeros((0, D))
            w = _gen.weights(rng, m, "pos", kind) if m else np.zeros(0)
            k = _gen.keys(rng, 5, D, kind, d if m else None)
        out.append(dict(w=w, d=d, keys=k, groups=G, context=f"case {t} {kind} m={d.shape[0]}"))
    return out
