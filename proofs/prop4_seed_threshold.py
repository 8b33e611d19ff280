"""Prop. 4 — subset threshold and rejection safety (docs/method.md §2; paper appendix A.2, Prop. 4).

Statement.  For any S ⊆ Ω with |S| ≥ K, τ_K(S) ≤ τ_K(Ω) (τ_K = K-th largest score), and
more exact scores can only raise τ: τ_K(S) ≤ τ_K(S ∪ T) ≤ τ_K(Ω).  Consequently a key with
s_i ≤ U_i < τ_K(S) is not in TopK(Ω) — under ANY tie order, since s_i < τ_K(Ω).
Rejection must be strict: a key with U_i = τ may be a required (tied) member.

Proof (paper A.2): the K largest scores of S are K distinct members of Ω, so Ω has at least
K scores ≥ τ_K(S); hence τ_K(Ω) ≥ τ_K(S).

``check`` verifies, on exact rational scores: the two inequalities, that
``dosa_ref.seeds.kth_score`` returns τ_K(S) exactly, and that no key rejected by
U_i < τ belongs to TopK(Ω) under (score desc, id asc) (U must dominate s; U = s is the
tightest valid bound).  Tightness: τ_K(S) = τ_K(Ω) is attained, and a required key with
U_i = s_i = τ (equality — it must survive) occurs; all-ties inputs keep every key.
With ``strict=False`` (reject U_i ≤ τ) that witness is lost, which the check reports.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.seeds import kth_score

from . import _gen
from ._audit import Audit, Result
from ._exact import fr

NAME = "prop4_seed_threshold"
STATEMENT = "τ_K(S) ≤ τ_K(S∪T) ≤ τ_K(Ω); U_i < τ_K(S) ⇒ i ∉ TopK(Ω)"


def kth(vals: list, K: int) -> Fraction:
    return sorted(vals, reverse=True)[K - 1]


def topk_exact(scores: list, K: int) -> list[int]:
    """TopK under (score desc, id asc) on exact scores."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:K]


def check(scores, S, K, U=None, extra=(), strict=True, context="") -> Result:
    """Verify Prop. 4 on scores [n] (floats/ints), seeds S (ids), K, bounds U [n] ≥ s."""
    au = Audit(NAME, tightness=True, context=context)
    sc = [fr(v) for v in np.asarray(scores).ravel()]
    n = len(sc)
    S = [int(i) for i in S]
    extra = [int(i) for i in extra]
    Ub = sc if U is None else [fr(v) for v in np.asarray(U).ravel()]
    au.claim(len(set(S)) == len(S) and all(0 <= i < n for i in S), "S: distinct visible keys")
    au.claim(len(S) >= K, f"|S| = {len(S)} < K = {K}")
    if len(S) < K:
        return au.result()
    au.claim(all(u >= s for u, s in zip(Ub, sc, strict=True)), "precondition: U ≥ s")
    tS = kth([sc[i] for i in S], K)
    tST = kth([sc[i] for i in sorted(set(S) | set(extra))], K)
    tO = kth(sc, K)
    au.ge(tST, tS, "τ_K(S) ≤ τ_K(S∪T)")
    au.ge(tO, tST, "τ_K(S∪T) ≤ τ_K(Ω)")
    au.tight(tS == tO)
    if np.asarray(scores).dtype.kind == "f":
        ks = kth_score(np.asarray(scores, dtype=np.float64)[S], K)
        au.eq(fr(ks), tS, "seeds.kth_score returns τ_K(S) exactly")
    top = set(topk_exact(sc, K))
    for i in range(n):
        rejected = Ub[i] < tS if strict else Ub[i] <= tS
        if rejected:
            au.claim(i not in top, f"key {i} rejected (U={float(Ub[i]):.6g}) but in TopK(Ω)")
            au.ge(tO, sc[i], "rejected key scores below τ_K(Ω)")
        if i in top and Ub[i] == tS:
            au.tight(True)  # a required key sits exactly at the threshold and survives
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(60):
        n = int(rng.choice([1, 2, 5, 20, 64]))
        mode = t % 6
        if mode == 0:  # all ties
            s = np.full(n, float(rng.integers(-2, 3)))
        elif mode == 1:  # integer scores, heavy ties
            s = rng.integers(-2, 3, size=n).astype(np.float64)
        elif mode == 2:
            s = _gen.array(rng, n, ["huge", "tiny", "wide"][t % 3])
        elif mode == 3:  # distinct floats differing in the last bit
            s = rng.permutation(1.0 + np.arange(n) * 2.0**-52)
        else:
            s = rng.standard_normal(n)
        K = int(rng.integers(1, n + 1))
        size = int(rng.integers(K, n + 1))
        S = rng.choice(n, size=size, replace=False)
        extra = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        slack = [np.zeros(n), rng.integers(0, 2, size=n).astype(np.float64), np.abs(s) * 0.5]
        U = s + slack[t % 3]
        out.append(dict(scores=s, S=S, K=K, U=U, extra=extra, context=f"case {t} mode {mode}"))
    return out
