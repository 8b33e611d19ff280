"""Select (docs/method.md §7 step 7, C.3): the bounded candidate buffer that is reduced by
exact merging (never by dropping) and the exact Top-K of S ∪ C (Theorem 1)."""

from __future__ import annotations

import numpy as np

from .prepare import QueryContext
from .scorer import score_keys, topk_of
from .seeds import kth_score

__all__ = ["CandidateBuffer", "full_topk"]

_NO_ID = np.iinfo(np.int64).max  # no K-th record yet: no key id lies above it


class CandidateBuffer:
    """Candidate records (id, original score) with exact overflow reduction (C.3).

    ``top`` holds the exact Top-K of everything merged so far (seeds first) and ``tau``
    its K-th score; ``buf`` holds at most ``capacity`` records with s ≥ tau.  When full,
    buf is merged into top by exact Top-K — a record not in the Top-K of a subset can
    never be in the Top-K of the whole — which can only raise tau.  With ``tie_reject``
    a record (s, i) is also dropped when s = tau and i is above ``kth_id``, the id of the
    K-th record of top: it lies below K distinct records in the total order
    (docs/method.md §7 "Tie-aware rejection and zero plateaus").
    """

    def __init__(
        self,
        K: int,
        capacity: int,
        seed_ids: np.ndarray,
        seed_scores: np.ndarray,
        tie_reject: bool = False,
    ):
        self.K, self.capacity, self.tie_reject = K, capacity, tie_reject
        self.top_ids, self.top_scores = topk_of(seed_scores, seed_ids, K)
        self.tau = kth_score(self.top_scores, K)
        self.buf_ids: list[np.ndarray] = []
        self.buf_scores: list[np.ndarray] = []
        self.size = 0
        self.kept = 0
        self.overflows = 0

    def _merge(self):
        ids = np.concatenate([self.top_ids, *self.buf_ids])
        sc = np.concatenate([self.top_scores, *self.buf_scores])
        self.top_ids, self.top_scores = topk_of(sc, ids, self.K)
        self.tau = kth_score(self.top_scores, self.K)
        self.buf_ids, self.buf_scores, self.size = [], [], 0

    @property
    def kth_id(self) -> int:
        """j: the id of the K-th record (τ, j) of top (int64 max when top has < K)."""
        return int(self.top_ids[self.K - 1]) if self.top_ids.size >= self.K else _NO_ID

    def offer(self, ids: np.ndarray, scores: np.ndarray):
        """Write records with s ≥ τ (the current τ; with ``tie_reject`` records (τ, i) with
        i above ``kth_id`` are dropped too); merge exactly when full."""
        while ids.size:
            keep = scores >= self.tau
            if self.tie_reject:
                keep &= (scores > self.tau) | (ids < self.kth_id)
            ids, scores = ids[keep], scores[keep]
            take = min(ids.size, self.capacity - self.size)
            if take:
                self.buf_ids.append(ids[:take])
                self.buf_scores.append(scores[:take])
                self.size += take
                self.kept += take
                ids, scores = ids[take:], scores[take:]
            if ids.size:
                self.overflows += 1
                self._merge()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The exact Top-K (ids int64, scores float64) of every record offered."""
        self._merge()
        return self.top_ids, self.top_scores


def full_topk(ctx: QueryContext) -> tuple[np.ndarray, np.ndarray]:
    """Exact Top-K of every visible key of the query (the dense route)."""
    ids = np.arange(ctx.a, ctx.b, dtype=np.int64)
    return topk_of(score_keys(ctx.q_t, ctx.w_t, ctx.chunk.k[ctx.a : ctx.b]), ids, ctx.chunk.K)
