"""Seeds and the threshold lower bound τ (docs/method.md §2, Prop. 4).

Any set S of distinct visible keys scored exactly gives τ = τ_K(S) ≤ τ_K(Ω).  Seed rules
change only efficiency; each rule here returns candidate key ids for one query, and the
selector scores them with the original scorer.

Strategies (names in ``options.STRATEGIES``):
  explicit     — caller-given ids per query (e.g. the previous chunk's selections).
  local        — the ``window`` most recent visible keys plus ``sinks`` first keys.
  anchor       — the union of the exact Top-K of ``n_anchors`` queries of the chunk.
  certificate  — the ``cert_seeds`` visible keys with the largest bounds U (scored
                 exactly; any exact score of a visible key is a valid witness).
"""

from __future__ import annotations

import numpy as np

from .scorer import score_keys, topk_of

__all__ = [
    "anchor_pool",
    "explicit_seeds",
    "kth_score",
    "local_seeds",
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


def anchor_pool(
    q: np.ndarray, w: np.ndarray, k: np.ndarray, ks: np.ndarray, ke: np.ndarray, K: int, n: int
) -> np.ndarray:
    """Union (sorted int64) of the exact Top-K of ``n`` anchor queries spread over the chunk.

    Anchors are scored fully (the fraction f of the cost model, docs/method.md §6).
    """
    Qn = q.shape[0]
    if n <= 0 or Qn == 0:
        return np.zeros(0, dtype=np.int64)
    anchors = np.unique(np.linspace(0, Qn - 1, min(n, Qn)).round().astype(np.int64))
    pool = []
    for t in anchors:
        a, b = int(ks[t]), int(ke[t])
        ids = np.arange(a, b, dtype=np.int64)
        top, _ = topk_of(score_keys(q[t], w[t], k[a:b]), ids, K)
        pool.append(top)
    return np.unique(np.concatenate(pool)) if pool else np.zeros(0, dtype=np.int64)


def kth_score(scores: np.ndarray, K: int) -> float:
    """τ_K of a seed set: its K-th largest score (−inf if fewer than K seeds)."""
    if scores.shape[0] < K:
        return -np.inf
    return float(np.partition(scores, scores.shape[0] - K)[scores.shape[0] - K])
