"""Tie-aware rejection and zero plateaus (docs/method.md §7 "Tie-aware rejection and zero
plateaus").

Statement 1 (tie-aware rejection).  Order records (s, i) totally: (s, i) is above (s', i')
iff s > s', or s = s' and i < i' (score desc, id asc, the selection order of §1).  Let
S be distinct visible seeds with |S| ≥ K scored exactly and (τ, j) the K-th seed record in
that order.  A non-seed key i with a valid bound s_i ≤ U_i and

    U_i < τ,   or   U_i = τ and i > j,

is in no Top-K of Ω.  Proof: (s_i, i) is at or below (U_i, i), which is strictly below
(τ, j) (i ≠ j, since i is not a seed); the K seed records at or above (τ, j) are K distinct
members of Ω strictly above (s_i, i), so i is not among the first K of Ω.  The same argument
drops a refined record (s_i, i) below the K-th record of the candidate buffer's current
Top-K (``select.CandidateBuffer`` with ``tie_reject``).

Statement 2 (zero plateau).  If every head with w_h > 0 has a non-positive logit as the
canonical scorer computes it (a float64 dot of length D, in any summation order), then the
canonical score s_i = Σ_h w_h [x_h]_+ is ≤ 0: each term is w_h·0 or w_h·(≥ 0) with w_h ≤ 0,
hence ≤ 0 after rounding to nearest, and a rounded sum of non-positive terms is ≤ 0 (0 is
representable and rounding is monotone).  So U'_i = min(U_i, 0) is a valid bound, and with
τ = 0 such a key is rejected iff i > j (Statement 1).  ``dosa_ref.screen.zero_plateau``
certifies the logits with x̂ + 2(γ_D·Σ|q_h||k| + D·2^-1074) ≤ 0, where x̂ is its own
float dot: both float dots lie within γ_D·Σ|q_h||k| + D·2^-1074 of the exact one.

What is checked:

* ``check``: Statement 1 on exact rational scores with bounds U ≥ s — every key the rule
  rejects is outside TopK(Ω), its record is below (τ, j) (margin τ − s_i ≥ 0); the
  reference's ``ScreenRule`` survivors equal the rule's exactly, and Algorithm 1 with the
  tie-aware ``CandidateBuffer`` (any capacity) returns TopK(Ω).  Tightness: a rejected key
  with U_i = s_i = τ (rejected at equality, by its id alone) and a required key with
  U_i = s_i = τ, i < j, in the same case.  Mutants (``mutate``): "le" (reject every U = τ),
  "flip" (reject i < j instead), "j_first" (j = the first seed id at τ) — each loses a
  required key on some generated case.
* ``check_plateau``: Statement 2 — for every key ``zero_plateau`` certifies: the exact score
  ≤ 0, the canonical float score ``scorer.score_keys`` ≤ 0 (compared exactly), and each
  positive head's dot ≤ 0 under several explicit summation orders evaluated in IEEE float64
  (all permutations for D ≤ 4; forward, reverse, pairwise and magnitude orders otherwise),
  and the head sum in forward and reverse order ≤ 0.  Tightness: a certified key whose
  exact score is 0 (U' = 0 attained).  Mutants: "no_allowance" (certify x̂ ≤ 0 alone) —
  the cancellation witness q·k = 2^-60 > 0 whose left-to-right dot is 0 breaks it;
  "uncertified" (treat every key as a plateau key) — a positive score breaks it.
* ``check_select``: ``dosa_topk`` with the rule (default) and without it (tie_reject=False)
  on plateau workloads (integer data, exact ties at 0, K-th record at 0, all-zero rows,
  K > |Ω|, tiny buffers) — ids equal brute force ``topk_ids(index_scores(...))`` exactly,
  and survivors(off) = survivors(on) + tie_rejected for every query that both runs screen
  with the same r (same seeds, plan and U).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np

from dosa_ref import dosa_topk, index_scores, topk_ids
from dosa_ref.scorer import score_keys
from dosa_ref.screen import ScreenRule, zero_plateau
from dosa_ref.select import CandidateBuffer

from . import _gen
from ._audit import Audit, Result
from ._exact import fr

NAME = "zero_plateau"
STATEMENT = "U_i < τ or (U_i = τ, i > j) ⇒ i ∉ TopK(Ω); positive heads certified inactive ⇒ s_i ≤ 0"

MUTANTS = ("le", "flip", "j_first")


def _order(s: list, ids) -> list[int]:
    return sorted(ids, key=lambda i: (-s[i], i))


def _kth_record(s: list, S: list[int], K: int, mutate: str | None) -> tuple[Fraction, int]:
    rec = _order(s, S)[K - 1]
    tau = s[rec]
    if mutate == "j_first":
        return tau, min(i for i in S if s[i] == tau)
    return tau, rec


def _rejected(u: Fraction, i: int, tau: Fraction, j: int, mutate: str | None) -> bool:
    if mutate == "le":
        return u <= tau
    if mutate == "flip":
        return u < tau or (u == tau and i < j)
    return u < tau or (u == tau and i > j)


def check(scores, U, S, K, capacity=None, mutate=None, context="") -> Result:
    """Statement 1 on scores [n], bounds U [n] ≥ s, seeds S (distinct ids), K ≤ |S|."""
    au = Audit(NAME, tightness=True, context=context)
    s = [fr(v) for v in np.asarray(scores).ravel()]
    Ub = [fr(v) for v in np.asarray(U).ravel()]
    n = len(s)
    S = sorted({int(i) for i in S})
    au.claim(all(u >= v for u, v in zip(Ub, s, strict=True)), "precondition U ≥ s")
    au.claim(K <= len(S), f"precondition |S| = {len(S)} ≥ K = {K}")
    if K > len(S):
        return au.result()
    tau, j = _kth_record(s, S, K, mutate)
    top = set(_order(s, range(n))[:K])
    Sset = set(S)
    V = []
    at_eq_rejected = at_eq_required = False
    for i in range(n):
        if i in Sset:
            continue
        if not _rejected(Ub[i], i, tau, j, mutate):
            V.append(i)
            at_eq_required |= i in top and Ub[i] == s[i] == tau
            continue
        au.claim(i not in top, f"key {i} rejected (U = {float(Ub[i]):.6g}, j = {j}) but in TopK")
        au.ge(tau, s[i], "rejected key: s_i ≤ τ")
        au.claim((-s[i], i) > (-tau, j), f"key {i}: record not below (τ, j)")
        at_eq_rejected |= Ub[i] == s[i] == tau
    au.tight(at_eq_rejected and at_eq_required)
    if mutate is None and all(float(v) == v for v in s + Ub):
        sf = np.array([float(v) for v in s])
        uf = np.array([float(v) for v in Ub])
        ids = np.array(S, dtype=np.int64)
        impl = ScreenRule(float(tau), ids, 0, j).survivors(uf)
        au.claim(impl.tolist() == V, f"ScreenRule survivors {impl[:8].tolist()}… != {V[:8]}…")
        buf = CandidateBuffer(K, capacity or n, ids, sf[ids], tie_reject=True)
        for i in V:  # refined one by one: the buffer's K-th record rises as it fills
            buf.offer(np.array([i], dtype=np.int64), sf[[i]])
        got = buf.result()[0].tolist()
        full = _order(s, range(n))[:K]
        au.claim(got == full, f"TopK(S ∪ C) = {got[:8]}… != TopK(Ω) = {full[:8]}…")
    return au.result()


def _dot_orders(D: int) -> list[list[int]]:
    if D <= 4:
        return [list(p) for p in itertools.permutations(range(D))]
    return [list(range(D)), list(range(D - 1, -1, -1))]


def _float_dots(q: np.ndarray, k: np.ndarray) -> list[float]:
    """The float64 dot q·k under several summation orders (Python floats are IEEE
    float64 round-to-nearest): sequential orders, pairwise, and by magnitude."""
    prods = [float(a) * float(b) for a, b in zip(q, k, strict=True)]
    out = []
    for order in _dot_orders(len(prods)):
        acc = 0.0
        for t in order:
            acc += prods[t]
        out.append(acc)
    vals = list(prods)
    while len(vals) > 1:  # pairwise tree
        vals = [
            vals[t] + vals[t + 1] if t + 1 < len(vals) else vals[t] for t in range(0, len(vals), 2)
        ]
    out.append(vals[0] if vals else 0.0)
    acc = 0.0
    for p in sorted(prods, key=abs):
        acc += p
    out.append(acc)
    return out


def check_plateau(q, w, k, mutate=None, context="") -> Result:
    """Statement 2 for one query q [H, D], w [H] on keys k [n, D] (float64)."""
    au = Audit(NAME, tightness=True, context=context)
    q, w, k = (np.asarray(a, dtype=np.float64) for a in (q, w, k))
    if mutate == "uncertified":
        cert = np.ones(k.shape[0], dtype=bool)
    elif mutate == "no_allowance":
        pos = w > 0
        cert = np.all(k @ q[pos].T <= 0.0, axis=1) if pos.any() else np.ones(k.shape[0], bool)
    else:
        cert = zero_plateau(q, w, k)
    au.claim(cert.shape == (k.shape[0],), "zero_plateau: one flag per key")
    canon = score_keys(q, w, k)
    wf = [fr(v) for v in w]
    for i in np.flatnonzero(cert):
        x = [
            sum((fr(a) * fr(b) for a, b in zip(q[h], k[i], strict=True)), Fraction(0))
            for h in range(q.shape[0])
        ]
        exact = sum((wf[h] * max(x[h], Fraction(0)) for h in range(q.shape[0])), Fraction(0))
        au.ge(Fraction(0), exact, f"key {i}: exact score ≤ 0")
        au.ge(Fraction(0), fr(canon[i]), f"key {i}: canonical score_keys ≤ 0")
        au.tight(exact == 0)
        terms = []
        for h in range(q.shape[0]):
            dots = _float_dots(q[h], k[i])
            if w[h] > 0:
                au.claim(
                    max(dots) <= 0.0,
                    f"key {i} head {h}: a float dot order gives {max(dots):.3g} > 0",
                )
            terms.append([w[h] * max(d, 0.0) for d in dots])
        for pick in (0, -1):
            for seq in (terms, terms[::-1]):
                acc = 0.0
                for t in seq:
                    acc += t[pick]
                au.claim(acc <= 0.0, f"key {i}: a float head sum gives {acc:.3g} > 0")
    au.track("certified keys", float(cert.sum()))
    return au.result()


def check_select(q, w, k, K, ks=None, ke=None, options=None, context="") -> Result:
    """dosa_topk with and without the tie-aware rule vs brute force, ids compared exactly."""
    au = Audit(NAME, tightness=False, context=context)
    opt = dict(options or {})
    ref = topk_ids(index_scores(q, w, k, ks, ke), K)
    on = dosa_topk(q, w, k, K, ks, ke, **opt)
    off = dosa_topk(q, w, k, K, ks, ke, tie_reject=False, **opt)
    au.claim(np.array_equal(on.ids, ref), f"tie_reject: ids {on.ids[0, :8]}… != full Top-K")
    au.claim(np.array_equal(off.ids, ref), "tie_reject=False: ids != full Top-K")
    a, b = on.stats, off.stats
    # same plan and seeds, hence the same U (r="auto" may pick another r or dense scoring
    # once its survival estimate follows the rule)
    same = ~a.dense & ~b.dense & (a.r == b.r)
    au.claim(
        np.array_equal((a.survivors + a.tie_rejected)[same], b.survivors[same]),
        f"survivors {a.survivors} + tie_rejected {a.tie_rejected} != plain {b.survivors}",
    )
    au.claim(bool(np.all(b.tie_rejected == 0)), "tie_reject=False rejected by ties")
    au.track("tie_rejected", float(a.tie_rejected.sum()))
    return au.result()


def plateau_problem(rng: np.random.Generator, Qn: int, H: int, D: int, N: int, hot: float):
    """Integer (q [Qn, H, D], w [Qn, H], k [N, D]) where most keys score exactly 0: every
    head points against the keys' first coordinate (q_h0 = −2, k_0 ∈ {1, 2, 3}) except a
    ``hot`` share of keys (k_0 = −2) and one free negative head; half the heads weigh +."""
    sparse = lambda shape: rng.integers(-1, 2, size=shape) * (rng.random(shape) < 0.2)  # noqa: E731
    k = sparse((N, D)).astype(np.float64)
    k[:, 0] = rng.integers(1, 4, size=N)
    k[rng.random(N) < hot, 0] = -2.0
    q = sparse((Qn, H, D)).astype(np.float64)
    q[:, :, 0] = -2.0
    q[:, -1, 0] = 0.0
    n_pos = max(1, H // 2)
    sign = np.where(np.arange(H) < n_pos, 1.0, -1.0)
    w = rng.integers(1, 4, size=(Qn, H)).astype(np.float64) * sign
    return q, w, k


def cancellation_witness():
    """(q [1, 3], w [1], k [1, 3]): q·k = 2^-60 exactly, but the left-to-right float dot is
    (1 + 2^-60) − 1 = 0 — a float dot alone does not certify the canonical one."""
    return np.array([[1.0, 2.0**-60, -1.0]]), np.array([1.0]), np.array([[1.0, 1.0, 1.0]])


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(60):  # Statement 1 on exact scores with heavy ties at 0
        n = int(rng.choice([2, 5, 12, 40]))
        s = rng.integers(-2, 3, size=n).astype(np.float64) * (rng.random(n) < 0.5)
        if t % 6 == 0:
            s[:] = 0.0  # all keys at 0
        elif t % 6 == 1:
            s = rng.standard_normal(n)
        U = s + [np.zeros(n), rng.integers(0, 2, size=n), np.abs(s)][t % 3]
        K = int(rng.integers(1, n + 1))
        S = rng.choice(n, size=int(rng.integers(K, n + 1)), replace=False)
        cap = int(rng.choice([1, 2, n]))
        out.append(dict(scores=s, U=U, S=S, K=K, capacity=cap, context=f"abstract {t}"))
    # τ = 0 with the K-th record j in the middle: keys just below and above j at U = s = 0
    s = np.zeros(9)
    s[4] = 1.0
    out.append(dict(scores=s, U=s, S=[0, 4, 6], K=3, context="tau 0, j = 6"))
    for t in range(30):  # Statement 2: generated heads and keys, activation boundaries
        H, D = int(rng.choice([1, 2, 3, 5])), int(rng.choice([1, 2, 3, 4, 8]))
        kind = _gen.KINDS[t % len(_gen.KINDS)]
        q = _gen.heads(rng, H, D, kind, ["", "zero", "dup", "anti"][t % 4])
        w = _gen.weights(rng, H, ["mixed", "neg", "pos", "zeros"][t % 4], kind)
        k = np.concatenate([_gen.keys(rng, 12, D, kind, q), -q, -np.abs(q).sum(0, keepdims=True)])
        out.append(dict(_check="check_plateau", q=q, w=w, k=k, context=f"plateau {t} {kind}"))
    for t in range(6):
        q, w, k = plateau_problem(rng, 1, int(rng.choice([2, 4, 6])), 4, 40, 0.1)
        out.append(dict(_check="check_plateau", q=q[0], w=w[0], k=k, context=f"workload {t}"))
    q, w, k = cancellation_witness()
    out.append(dict(_check="check_plateau", q=q, w=w, k=k, context="cancellation witness"))
    for t in range(14):  # the reference pipeline on plateau workloads
        H = int(rng.choice([2, 4, 6]))
        N = int(rng.choice([40, 150, 400]))
        q, w, k = plateau_problem(rng, int(rng.choice([1, 2, 3])), H, 6, N, [0.0, 0.02, 0.1][t % 3])
        if t % 7 == 3:
            k[:] = np.abs(k)  # every key at 0 for every head: all scores 0
            k[:, 0] = 1.0
        K = int(rng.choice([1, 3, 8, N // 3, N + 2]))
        ks = ke = None
        if t % 4 == 1:
            ks = rng.integers(0, N // 2, size=q.shape[0])
            ke = np.minimum(N, ks + rng.integers(1, N, size=q.shape[0]))
        opt = dict(
            seeds=["local", "local+certificate", "local+anchor"][t % 3],
            window=int(rng.integers(K // 2, K + 8)),
            sinks=int(rng.integers(0, 4)),
            cert_seeds=int(rng.integers(0, K + 4)),
            r=[H // 2 + 1, H - 1, "auto"][t % 3] if H > 2 else 1,
            form=["base", "abs"][t % 2],
            buffer=int(rng.choice([1, 3, 65536])),
            refine_batch=int(rng.choice([1, 7, 16384])),
        )
        args = dict(q=q, w=w, k=k, K=K, ks=ks, ke=ke, options=opt)
        out.append(dict(_check="check_select", **args, context=f"select {t}"))
    return out
