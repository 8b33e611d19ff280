"""Seeds and the threshold lower bound τ (docs/method.md §2, Prop. 4).

Any set S of distinct visible keys scored exactly gives τ = τ_K(S) ≤ τ_K(Ω).  Seed rules
change only efficiency; each rule here returns candidate key ids for one query, and the
selector scores them with the original scorer.

Strategies (names in ``options.STRATEGIES``):
  explicit     — caller-given ids per query (e.g. the previous chunk's selections).
  local        — the ``window`` most recent visible keys plus ``sinks`` first keys.
  anchor       — the union of the exact Top-K of ``n_anchors`` queries of the chunk (within
                 each of ``anchor_segments`` equal segments of the keys).
  certificate  — the ``cert_seeds`` visible keys with the largest bounds U (scored
                 exactly; any exact score of a visible key is a valid witness).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .scorer import score_keys, topk_of

if TYPE_CHECKING:
    from .prepare import QueryContext

__all__ = [
    "SeedSet",
    "add_certificate_seeds",
    "anchor_pool",
    "anchor_queries",
    "explicit_seeds",
    "kth_score",
    "local_seeds",
    "seed_set",
    "stride_sample",
]


def local_seeds(ks_t: int, ke_t: int, window: int, sinks: int) -> np.ndarray:
    """Most recent ``window`` keys of [ks_t, ke_t) and its first ``sinks`` keys (sorted)."""
    recent = np.arange(max(ks_t, ke_t - window), ke_t, dtype=np.int64)
    first = np.arange(ks_t, min(ke_t, ks_t + sinks), dtype=np.int64)
    return np.union1d(first, recent)


def explicit_seeds(ids_t, ks_t: int, ke_t: int) -> np.ndarray:
    """Caller ids restricted to the visible range; −1 entries are padding (sorted, unique)."""
    a = np.asarray(ids_t, dtype=np.int64).ravel()
    a = a[(a >= ks_t) & (a < ke_t)]
    return np.unique(a)


def anchor_queries(Qn: int, n: int) -> np.ndarray:
    """The ``n`` anchor queries spread evenly over a chunk of ``Qn`` (int64, sorted)."""
    if n <= 0 or Qn == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(0, Qn - 1, min(n, Qn)).round().astype(np.int64))


def anchor_segments_of(N: int, segments: int) -> np.ndarray:
    """int64 [S + 1]: the boundaries of the S segments of the keys [0, N) whose Top-K each
    anchor contributes to the pool (docs/method.md §2): ⌈N / S⌉ keys each, the last
    shorter (the GPU selects them as rows of one padded logits buffer)."""
    L = -(-int(N) // int(segments))
    return np.minimum(np.arange(int(segments) + 1, dtype=np.int64) * L, int(N))


def anchor_pool(
    q: np.ndarray, w: np.ndarray, k: np.ndarray, ks: np.ndarray, ke: np.ndarray, K: int, n: int,
    segments: int = 1,
) -> np.ndarray:  # fmt: skip
    """Union (sorted int64) of the exact Top-K of ``n`` anchor queries spread over the chunk,
    within each of the ``segments`` segments of the keys (``anchor_segments_of``; 1: each
    anchor's Top-K over its visible range).

    Anchors are scored fully (the fraction f of the cost model, docs/method.md §6).
    """
    cuts = anchor_segments_of(k.shape[0], segments)
    pool = []
    for t in anchor_queries(q.shape[0], n):
        a, b = int(ks[t]), int(ke[t])
        s = score_keys(q[t], w[t], k[a:b])
        for c0, c1 in zip(cuts[:-1], cuts[1:], strict=True):
            lo, hi = max(a, int(c0)), min(b, int(c1))
            if hi > lo:
                top, _ = topk_of(s[lo - a : hi - a], np.arange(lo, hi, dtype=np.int64), K)
                pool.append(top)
    return np.unique(np.concatenate(pool)) if pool else np.zeros(0, dtype=np.int64)


def kth_score(scores: np.ndarray, K: int) -> float:
    """τ_K of a seed set: its K-th largest score (−inf if fewer than K seeds)."""
    if scores.shape[0] < K:
        return -np.inf
    return float(np.partition(scores, scores.shape[0] - K)[scores.shape[0] - K])


def stride_sample(a: int, b: int, m: int) -> np.ndarray:
    """At most ``m`` ids spread evenly over [a, b) (all of them when b − a ≤ m): int64."""
    n = b - a
    if n <= m:
        return np.arange(a, b, dtype=np.int64)
    return (a + (np.arange(m, dtype=np.int64) * n) // m).astype(np.int64)


@dataclass
class SeedSet:
    """Distinct visible keys of one query scored exactly: ``ids`` int64 [S], ``scores``
    float64 [S]; ``explicit`` counts the ids that came only from ``seed_ids``."""

    ids: np.ndarray
    scores: np.ndarray
    explicit: int = 0

    def tau(self, K: int) -> float:
        """τ_K(S) ≤ τ_K(Ω) (Prop. 4)."""
        return kth_score(self.scores, K)


def seed_set(ctx: QueryContext) -> SeedSet:
    """Steps 1–2 of Algorithm 1 (docs/method.md §7): the query's seeds from its strategies
    (explicit ∪ local ∪ anchor pool; "certificate" alone starts from the local seeds),
    scored with the original scorer."""
    c = ctx.chunk
    default = []
    if "local" in c.strategies or c.strategies == ("certificate",):
        default.append(local_seeds(ctx.a, ctx.b, c.window, c.opt.sinks))
    if "anchor" in c.strategies:
        default.append(c.pool[(c.pool >= ctx.a) & (c.pool < ctx.b)])
    S = np.unique(np.concatenate(default)) if default else np.zeros(0, dtype=np.int64)
    n_explicit = 0
    if "explicit" in c.strategies:
        extra = np.setdiff1d(explicit_seeds(c.seed_ids[ctx.t], ctx.a, ctx.b), S)
        n_explicit = int(extra.size)
        S = np.union1d(S, extra)
    return SeedSet(S, score_keys(ctx.q_t, ctx.w_t, c.k[S]), n_explicit)


def add_certificate_seeds(ctx: QueryContext, U: np.ndarray, seeds: SeedSet, m: int) -> SeedSet:
    """Certificate-guided seeds (docs/method.md §2): score the ``m`` visible keys of largest
    bound ``U`` float64 [b − a] that are not seeds yet (any exact score of a visible key
    is a valid witness, so τ can only rise)."""
    m = min(m, ctx.b - ctx.a)
    if m <= 0:
        return seeds
    cand = ctx.a + np.argpartition(-U, m - 1)[:m]
    extra = np.setdiff1d(cand, seeds.ids)
    scores = score_keys(ctx.q_t, ctx.w_t, ctx.chunk.k[extra])
    return SeedSet(
        np.concatenate([seeds.ids, extra]), np.concatenate([seeds.scores, scores]), seeds.explicit
    )
