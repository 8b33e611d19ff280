"""The original DSA indexer scorer (docs/method.md §1, eq. (1)) and exact Top-K with tie order.

``s_i = Σ_h w_h [q_h·k_i]_+`` evaluated in float64; keys outside ``[ks[t], ke[t])`` score
``-inf``.  Selection order is score descending, then key id ascending (docs/design.md).
"""

from __future__ import annotations

import numpy as np

from .validate import check_K, check_qwk, check_ranges

__all__ = ["index_scores", "score_keys", "topk_ids", "topk_of"]

# Rows per BLAS call of the canonical scorer.  Every call has the same shape
# [SCORE_TILE, D] @ [D, H], so a key's float64 score does not depend on which other keys
# are scored with it (BLAS edge kernels for odd row counts round differently; measured).
# The CPU exactness contract compares ids bitwise, so the score of a key must be one
# value whether it is scored as a seed, a survivor, or in the full matrix.
SCORE_TILE = 4096


def score_keys(q_t: np.ndarray, w_t: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Canonical float64 scores of one query against ``k`` [n, D]: float64 [n] (eq. (1)).

    ``q_t`` [H, D] and ``w_t`` [H] are float64.  The ReLU is applied per head before the
    weighted sum; no head is dropped, so this is the original scorer.  The value for a
    key depends only on (q_t, w_t, that key): logits come from fixed-shape tiles and the
    head sum runs in head order.
    """
    n, D = k.shape
    if n == 0:
        return np.zeros(0)
    m = -(-n // SCORE_TILE) * SCORE_TILE
    kp = np.zeros((m, D))
    kp[:n] = k
    logits = np.matmul(kp.reshape(-1, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]
    np.maximum(logits, 0.0, out=logits)
    s = np.zeros(n)
    for h in range(q_t.shape[0]):
        s += w_t[h] * logits[:, h]
    return s


def index_scores(q, w, k, ks=None, ke=None) -> np.ndarray:
    """Full original-scorer matrix.

    Args:
        q: [Qn, H, D] float32/float64 query heads.
        w: [Qn, H] head weights (either sign).
        k: [N, D] keys (shared by all heads).
        ks, ke: int [Qn] visible range ``[ks[t], ke[t])``; default all keys.
    Returns:
        float64 [Qn, N]; ``-inf`` where a key is not visible to the query.
    """
    q, w, k = check_qwk(q, w, k)
    Qn, H, D = q.shape
    N = k.shape[0]
    ks, ke = check_ranges(ks, ke, Qn, N)
    out = np.full((Qn, N), -np.inf)
    for t in range(Qn):
        a, b = int(ks[t]), int(ke[t])
        if b > a:
            out[t, a:b] = score_keys(q[t], w[t], k[a:b])
    return out


def topk_of(scores: np.ndarray, ids: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact Top-K of a candidate list under (score desc, id asc).

    ``scores`` float64 [n] (finite), ``ids`` int64 [n] distinct.  Returns the selected
    (ids, scores), at most K of them, in selection order.  Anything not returned cannot be
    in the Top-K of any superset (the basis of exact buffer merging, docs/method.md §7 C.3).
    """
    n = scores.shape[0]
    if n > K:
        # K-th largest value; every key strictly below it is out.
        kth = np.partition(scores, n - K)[n - K]
        keep = scores >= kth
        scores, ids = scores[keep], ids[keep]
    order = np.lexsort((ids, -scores))[:K]
    return ids[order], scores[order]


def topk_ids(scores, K) -> np.ndarray:
    """Top-K ids of each row: int64 [Qn, K], order (score desc, id asc), ``-1`` padding.

    ``scores`` float [Qn, N]; ``-inf`` marks keys that are not visible.  NaN is rejected.
    """
    K = check_K(K)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores: expected 2 dimensions, got shape {s.shape}")
    if np.any(np.isnan(s)) or np.any(s == np.inf):
        raise ValueError("scores: contains nan or +inf")
    Qn, N = s.shape
    out = np.full((Qn, K), -1, dtype=np.int64)
    all_ids = np.arange(N, dtype=np.int64)
    for t in range(Qn):
        vis = s[t] > -np.inf
        ids, _ = topk_of(s[t][vis], all_ids[vis], K)
        out[t, : ids.shape[0]] = ids
    return out
