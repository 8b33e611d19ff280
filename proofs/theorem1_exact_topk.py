"""Theorem 1 — exact Top-K selection (docs/method.md §7; paper appendix A.2, Theorem 1).

Statement.  In Algorithm 1 (seeds S, τ = τ_K(S), screen V = {i ∈ Ω\\S : U_i ≥ τ}, refine
C = {i ∈ V : s_i ≥ τ}, return TopK(S ∪ C)), if every rejected key satisfies s_i ≤ U_i < τ
and no surviving candidate is lost, the result equals full-domain Top-K under a common
total tie order (here: score descending, then key id ascending).

Proof (paper A.2): a key i ∉ S ∪ C was either rejected (s_i ≤ U_i < τ) or refined with
s_i < τ; either way s_i < τ_K(S) ≤ τ_K(Ω) (Prop. 4), so it is in no Top-K of Ω, and
TopK(Ω) ⊆ S ∪ C; Top-K of a superset of TopK(Ω) under the same total order is TopK(Ω).

What is checked:

* ``check`` runs ``dosa_ref.dosa_topk`` (the implementation: float64 scorer, rounding-
  allowance bound, bounded buffer with exact merging, recovery) against brute force
  ``topk_ids(index_scores(...))`` on adversarial inputs — massive integer ties, duplicate
  and zero keys, zero queries (all scores tied), single head, r = H−1, tiny buffers, short /
  empty visible ranges — comparing ids exactly, plus the tie-agnostic contract (no
  duplicates, count = min(K, |Ω|), selected scores ≥ every unselected score).  Tightness
  witness: an all-ties query that is screened keeps every tied key (survivors = screened).
* ``check_abstract`` runs Algorithm 1 itself on exact rational scores and any bounds
  U ≥ s, including U = s (the tightest valid bound) and all-ties inputs.
"""

from __future__ import annotations

import numpy as np

from dosa_ref import dosa_topk, index_scores, topk_ids

from . import _gen
from ._audit import Audit, Result
from ._exact import fr

NAME = "theorem1_exact_topk"
STATEMENT = "Algorithm 1 (dosa_topk) ids = full Top-K under (score desc, id asc)"

KNOWN_ISSUE_TAG = _gen.KNOWN_ISSUE_TAG


def _order(scores: list, ids) -> list[int]:
    return sorted(ids, key=lambda i: (-scores[i], i))


def check(q, w, k, K, ks=None, ke=None, options=None, selector=None, context="") -> Result:
    """dosa_topk (or ``selector``, same signature) vs brute-force Top-K on one problem."""
    au = Audit(NAME, tightness=True, context=context)
    select = selector or dosa_topk
    q, w, k = (np.asarray(a, dtype=np.float64) for a in (q, w, k))
    Qn, N = q.shape[0], k.shape[0]
    ks = np.zeros(Qn, dtype=np.int64) if ks is None else np.asarray(ks, dtype=np.int64)
    ke = np.full(Qn, N, dtype=np.int64) if ke is None else np.asarray(ke, dtype=np.int64)
    res = select(q, w, k, K, ks, ke, **(options or {}))
    scores = index_scores(q, w, k, ks, ke)
    ref = topk_ids(scores, K)
    ids = np.asarray(res.ids)
    au.claim(ids.shape == ref.shape, f"ids shape {ids.shape} != {ref.shape}")
    if ids.shape != ref.shape:
        return au.result()
    for t in range(Qn):
        a, b = int(ks[t]), int(ke[t])
        row = ids[t]
        au.claim(
            np.array_equal(row, ref[t]),
            f"query {t}: ids {row[:8].tolist()}… != full Top-K {ref[t][:8].tolist()}…",
        )
        sel = row[row >= 0]
        au.claim(sel.size == min(K, b - a), f"query {t}: {sel.size} ids, expected {min(K, b - a)}")
        au.claim(np.unique(sel).size == sel.size, f"query {t}: duplicate ids")
        au.claim(bool(np.all((sel >= a) & (sel < b))), f"query {t}: invisible id selected")
        au.claim(bool(np.all(row[sel.size :] == -1)), f"query {t}: padding must be -1")
        if sel.size and b > a and sel.size == np.unique(sel).size:
            rest = np.setdiff1d(np.arange(a, b), sel)
            if rest.size:
                # exact comparison of the float scores (tie-agnostic contract)
                au.ge(
                    fr(scores[t, sel].min()),
                    fr(scores[t, rest].max()),
                    f"query {t}: min(sel) ≥ max(unsel)",
                )
        st = getattr(res, "stats", None)
        if st is not None and b - a > K and not st.dense[t] and not st.recovered[t]:
            vis = scores[t, a:b]
            if np.all(vis == vis[0]):
                # all ties: every bound is ≥ s = τ, so every non-seed key passes U ≥ τ
                # (the tie-aware rule may still reject some: proofs/zero_plateau.py)
                passed = int(st.survivors[t]) + int(st.tie_rejected[t])
                kept = au.claim(
                    passed == int(st.screened[t]),
                    f"query {t}: all ties but only {passed} of {st.screened[t]} passed U ≥ τ",
                )
                au.tight(kept)
    return au.result()


def check_abstract(scores, U, S, K, strict=True, context="") -> Result:
    """Algorithm 1 on exact scores [n] with bounds U [n] and seeds S; compares with TopK(Ω)."""
    au = Audit(NAME, tightness=True, context=context)
    s = [fr(v) for v in np.asarray(scores).ravel()]
    Ub = [fr(v) for v in np.asarray(U).ravel()]
    n = len(s)
    S = sorted({int(i) for i in S})
    au.claim(len(S) >= min(K, n), "precondition |S| ≥ K")
    au.claim(all(u >= v for u, v in zip(Ub, s, strict=True)), "precondition U ≥ s")
    if len(S) < K:
        return au.result()
    tau = sorted((s[i] for i in S), reverse=True)[K - 1]
    Sset = set(S)
    V = [i for i in range(n) if i not in Sset and (Ub[i] >= tau if strict else Ub[i] > tau)]
    C = [i for i in V if s[i] >= tau]
    out = _order(s, S + C)[:K]
    full = _order(s, range(n))[:K]
    au.claim(out == full, f"TopK(S ∪ C) = {out[:8]}… != TopK(Ω) = {full[:8]}…")
    if len(set(s)) == 1 and n > len(S):
        au.tight(len(C) == n - len(S) and out == full)  # every tied key kept
    return au.result()


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(90):
        Qn = int(rng.choice([1, 2, 3]))
        H = int(rng.choice([1, 2, 3, 4, 8]))
        D = int(rng.choice([1, 2, 3, 4, 8]))
        N = int(rng.choice([6, 20, 60, 150]))
        kind = ["int", "sparse", "unit", "int", "wide", "huge"][t % 6]
        q = np.stack(
            [_gen.heads(rng, H, D, kind, ["", "zero", "dup", "anti"][t % 4]) for _ in range(Qn)]
        )
        w = np.stack(
            [_gen.weights(rng, H, ["mixed", "neg", "pos", "zeros"][t % 4], kind) for _ in range(Qn)]
        )
        k = _gen.array(rng, (N, D), kind)
        if t % 5 == 0:
            k[rng.random(N) < 0.5] = k[0]  # duplicate keys: massive exact ties
        if t % 7 == 0:
            q[0] = 0.0  # zero query: every score ties at 0
        if t % 11 == 3:
            k[:] = k[0]  # every key identical: all ties
        context = f"case {t} {kind}"
        if t % 13 == 12:
            for i in range(Qn):
                q[i], w[i] = _gen.spread_heads(rng, H, D)
            k = np.ldexp(_gen.array(rng, (N, D), "unit"), 560)
            context = f"case {t} [{KNOWN_ISSUE_TAG}]"
        K = int(rng.choice([1, 2, 3, max(1, N // 3), N - 1, N, N + 2]))
        ks = rng.integers(0, N // 2 + 1, size=Qn)
        ke = np.minimum(N, ks + rng.integers(0, N + 1, size=Qn))
        if t % 3 == 0:
            ks, ke = None, None
        window = int(rng.integers(0, K + 2))
        options = dict(
            seeds=["local", "local+anchor", "certificate", "local+anchor+certificate", "anchor"][
                t % 5
            ],
            window=window,
            sinks=int(rng.integers(0, 3)),
            n_anchors=int(rng.integers(0, 3)),
            cert_seeds=int(rng.integers(0, K + 3)),
            r=["auto", 1, max(1, H - 1), H][t % 4],
            form=["base", "abs"][t % 2],
            buffer=int(rng.choice([1, 2, 7, 65536])),
            refine_batch=int(rng.choice([1, 5, 16384])),
            neg_aggregate=["majority", "all", "none"][t % 3],
            allowance=["triangle", "joint", "grouped"][(t // 2) % 3],
            pos_projection=t % 6 != 5,
        )
        out.append(dict(q=q, w=w, k=k, K=K, ks=ks, ke=ke, options=options, context=context))
    # the fixed reproduction of the known issue (README): key 0 is the true Top-1
    q, w, k = _gen.spread_witness()
    for form in ("base", "abs"):
        options = dict(seeds="local", window=1, sinks=0, r=1, form=form)
        out.append(dict(q=q, w=w, k=k, K=1, options=options, context=f"[{KNOWN_ISSUE_TAG}]"))
    # Algorithm 1 on exact scores, any valid bounds
    for t in range(30):
        n = int(rng.choice([1, 3, 10, 40]))
        s = rng.integers(-2, 3, size=n).astype(np.float64) if t % 3 else rng.standard_normal(n)
        if t % 5 == 0:
            s[:] = s[0]  # all ties
        U = s + [np.zeros(n), rng.integers(0, 3, size=n), np.abs(s)][t % 3]
        K = int(rng.integers(1, n + 1))
        S = rng.choice(n, size=int(rng.integers(K, n + 1)), replace=False)
        out.append(dict(_check="check_abstract", scores=s, U=U, S=S, K=K, context=f"abstract {t}"))
    return out
