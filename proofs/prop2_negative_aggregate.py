"""Prop. 2 — negative-head support bound (docs/method.md §5; paper appendix A.1, Prop. 2).

Statement.  For the omitted negative heads N and ANY A ⊆ N, with a_A = Σ_{h∈A} |w_h| q_h,

    [a_A·k]_+ ≤ Σ_{h∈A} |w_h| [q_h·k]_+ ≤ Σ_{h∈N} |w_h| [q_h·k]_+        for every k.

Proof (paper A.1): ReLU subadditivity with c_h = |w_h| ≥ 0, x_h = q_h·k:
[Σ_A c_h x_h]_+ ≤ Σ_A c_h [x_h]_+ ≤ Σ_N c_h [x_h]_+ (the extra terms are ≥ 0).

Exactness claim (docs/method.md §5): if the key's active set M(k) = {h ∈ N : q_h·k > 0} equals
A, the aggregate is exact: [a_A·k]_+ = Σ_{h∈N} |w_h|[q_h·k]_+.  ``check`` verifies the two
inequalities for every A ⊆ N when |N| ≤ 6 (else for ∅, N, the majority support and each
key's own active set), in exact dyadic arithmetic, and verifies the exactness claim on
every key whose active set is an enumerated A — each such key is a tightness witness.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np

from . import _gen
from ._audit import Audit, Result
from ._exact import Dy

NAME = "prop2_negative_aggregate"
STATEMENT = "[a_A·k]+ ≤ Σ_A|w_h|[q_h·k]+ ≤ Σ_N|w_h|[q_h·k]+, equality if M(k)=A"


def check(q, w, keys, N=None, subsets=None, scale=1, context="") -> Result:
    """Verify Prop. 2 for heads q [H, D], weights w [H] on keys [n, D].

    N: the omitted negative heads (default: every head with w_h < 0).  subsets: list of
    A ⊆ N to check (default: all of them if |N| ≤ 6).  scale multiplies the aggregate
    (a mutation test uses 2).
    """
    q = np.asarray(q, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    au = Audit(NAME, tightness=True, context=context)
    scale = Fraction(scale)
    if N is None:
        N = [int(h) for h in np.flatnonzero(w < 0)]
    N = sorted(int(h) for h in N)
    au.claim(all(w[h] < 0 for h in N), "N must hold negative heads only")
    Q, K = Dy.of(q), Dy.of(keys)
    X = K @ Q.T  # exact logits
    absw = Dy.of(np.abs(w))
    cw = absw.fracs()
    active = X.positive()
    if subsets is None:
        if len(N) <= 6:
            subsets = [list(c) for m in range(len(N) + 1) for c in combinations(N, m)]
        else:
            subsets = [[], N]
            subsets += [[h for h in N if active[i, h]] for i in range(keys.shape[0])]
    seen = set()
    for A in subsets:
        A = sorted(int(h) for h in A)
        if tuple(A) in seen:
            continue
        seen.add(tuple(A))
        au.claim(set(A) <= set(N), f"A={A} not a subset of N")
        if A:
            # a_A·k exactly: a_A = Σ_A |w_h| q_h is dyadic
            a_A = Dy(absw.m[A].reshape(-1, 1), absw.e) * Q[np.asarray(A)]
            aak = K @ a_A.sum(axis=0)
        else:
            aak = Dy(np.zeros(keys.shape[0], dtype=object), 0)
        for i in range(keys.shape[0]):
            x = [X.frac((i, h)) for h in range(q.shape[0])]
            agg = scale * max(aak.frac(i), Fraction(0))
            mid = sum((cw[h] * max(x[h], Fraction(0)) for h in A), Fraction(0))
            top = sum((cw[h] * max(x[h], Fraction(0)) for h in N), Fraction(0))
            au.ge(mid, agg, f"key {i}, A={A}: [a_A·k]+ ≤ Σ_A")
            au.ge(top, mid, f"key {i}, A={A}: Σ_A ≤ Σ_N")
            if [h for h in N if active[i, h]] == A:
                ok = au.eq(top, agg, f"key {i}: active set = A={A} but aggregate not exact")
                au.tight(ok)
    return au.result()


def _realise(rng, q: np.ndarray, k: np.ndarray, N: list, A: list) -> np.ndarray:
    """Flip rows of q so that key k's active set over N is exactly A."""
    q = q.copy()
    for h in N:
        x = float(q[h] @ k)
        if x == 0.0:
            q[h] = q[h] + np.sign(k) * (1 if h in A else -1)
            x = float(q[h] @ k)
        if (x > 0) != (h in A):
            q[h] = -q[h]
    return q


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    specials = ["", "zero", "dup", "anti", "parallel", "pyth"]
    for t in range(40):
        H = int(rng.choice([1, 2, 3, 5, 7, 9]))
        D = int(rng.choice([1, 2, 4, 8]))
        kind = ["int", "unit", "huge", "tiny", "wide", "sparse"][t % 6]
        q = _gen.heads(rng, H, D, kind, specials[t % len(specials)])
        w = _gen.weights(rng, H, ["neg", "mixed", "zeros"][t % 3], kind)
        k = _gen.keys(rng, 6, D, kind, q)
        N = [int(h) for h in np.flatnonzero(w < 0)]
        if N and D >= 1 and t % 2 == 0 and kind in ("int", "unit", "pyth"):
            # a witness key whose active set is a chosen A (integers keep it exact)
            A = [h for h in N if rng.random() < 0.5]
            kk = rng.integers(-2, 3, size=D).astype(np.float64)
            kk[0] = 1.0
            q = _realise(rng, q, kk, N, A)
            k = np.concatenate([k, kk[None]], axis=0)
        out.append(dict(q=q, w=w, keys=k, context=f"case {t} {kind}"))
    return out
