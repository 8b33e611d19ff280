"""The original DSA indexer scorer (docs/method.md §1, eq. (1)) and exact Top-K with tie order.

``s_i = Σ_h w_h [q_h·k_i]_+`` evaluated in float64; keys outside ``[ks[t], ke[t])`` score
``-inf``.  Selection order is score descending, then key id ascending (docs/design.md).
The scorer is defined where every visible score is finite: ``score_keys`` raises
``ValueError(SCORE_OVERFLOW)`` otherwise, and ``finite_envelope`` proves finiteness for a
whole query without scoring it (docs/method.md §1 "The scorer's domain").
"""

from __future__ import annotations

import numpy as np

from .validate import check_K, check_qwk, check_ranges, check_scores

__all__ = [
    "ENVELOPE_MAX",
    "SCORE_OVERFLOW",
    "envelope_weights",
    "finite_envelope",
    "index_scores",
    "key_amax",
    "score_keys",
    "topk_ids",
    "topk_of",
]

# Rows per BLAS call of the canonical scorer.  Every call has the same shape
# [SCORE_TILE, D] @ [D, H], so a key's float64 score does not depend on which other keys
# are scored with it (BLAS edge kernels for odd row counts round differently; measured).
# The CPU exactness contract compares ids bitwise, so the score of a key must be one
# value whether it is scored as a seed, a survivor, or in the full matrix.
SCORE_TILE = 4096

# The one error of every route when a visible key's score is not finite (docs/method.md §1
# "The scorer's domain"): the brute force, the screened routes and decode raise it alike.
SCORE_OVERFLOW = (
    "q, w, k: a visible key's score overflows float64 (|w|·|q|·|k| too large; docs/method.md §1)"
)
# finite_envelope's threshold: a computed envelope at most 2^1022 leaves room for every
# rounding factor of the envelope and of score_keys below DBL_MAX ≈ 2^1024
# (proofs/score_envelope.py).
ENVELOPE_MAX = 2.0**1022
_ENVELOPE_TERMS_MAX = 2**40  # D + H + 2 rounding steps at most (the proof's γ ≤ 2^-12)


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
    s = np.zeros(n)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked below
        logits = np.matmul(kp.reshape(-1, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]
        np.maximum(logits, 0.0, out=logits)
        for h in range(q_t.shape[0]):
            s += w_t[h] * logits[:, h]
    # A non-finite intermediate (a dot or a weighted term past DBL_MAX, 0·inf) always
    # leaves s non-finite except a dot at −inf, whose ReLU is the exact 0: checking s is
    # checking the whole evaluation.
    if not np.isfinite(s).all():
        raise ValueError(SCORE_OVERFLOW)
    return s


def key_amax(k: np.ndarray) -> float:
    """max |k_ij| of float64 keys [N, D] (0 for no keys): ``finite_envelope``'s input."""
    return float(np.max(np.abs(k))) if k.size else 0.0


def envelope_weights(w_t: np.ndarray) -> np.ndarray:
    """float64 [H]: max(1, |w_h|), the head factors of ``finite_envelope``'s E (exact)."""
    return np.maximum(np.abs(np.asarray(w_t, dtype=np.float64)), 1.0)


def finite_envelope(q_t: np.ndarray, w_t: np.ndarray, k_amax: float) -> bool:
    """True when ``score_keys(q_t, w_t, k)`` is finite, every intermediate included, for
    every key with max |k_ij| ≤ ``k_amax`` (docs/method.md §1 "The scorer's domain").

    ``q_t`` float64 [H, D], ``w_t`` float64 [H].  The envelope
    E = (Σ_h max(1, |w_h|) ‖q_h‖_1) · k_amax bounds every head's dot |q_h·k| (the weight
    floored at 1: a head of weight 0 or below 1 still computes its dot, and 0 · ∞ is NaN)
    and |q_h·k|·|w_h| summed over heads, and every partial sum of score_keys is below
    (1 + γ_{D+H+1}) E in any summation order, FMA or not; a computed E ≤ ``ENVELOPE_MAX`` =
    2^1022 keeps that below DBL_MAX (proofs/score_envelope.py).  False is no claim: the
    caller scores the query in full, and ``score_keys`` then raises ``SCORE_OVERFLOW`` if a
    score is not finite.
    """
    H, D = q_t.shape
    if D + H + 2 > _ENVELOPE_TERMS_MAX:
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        e = float(envelope_weights(w_t) @ np.abs(q_t).sum(axis=1)) * float(k_amax)
    return bool(e <= ENVELOPE_MAX)  # False for inf and nan


def index_scores(q, w, k, ks=None, ke=None) -> np.ndarray:
    """Full original-scorer matrix.

    Args:
        q: [Qn, H, D] float32/float64 query heads.
        w: [Qn, H] head weights (either sign).
        k: [N, D] keys (shared by all heads).
        ks, ke: int [Qn] visible range ``[ks[t], ke[t])``; default all keys.
    Returns:
        float64 [Qn, N]; ``-inf`` where a key is not visible to the query.
    Raises:
        ValueError(SCORE_OVERFLOW) when a visible key's score is not finite (the scorer's
        domain, docs/method.md §1), the same error as every other route.
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
    s = check_scores(scores)
    Qn, N = s.shape
    K = check_K(K, rows=Qn)
    out = np.full((Qn, K), -1, dtype=np.int64)
    all_ids = np.arange(N, dtype=np.int64)
    for t in range(Qn):
        vis = s[t] > -np.inf
        ids, _ = topk_of(s[t][vis], all_ids[vis], K)
        out[t, : ids.shape[0]] = ids
    return out
