"""Refine (docs/method.md §7 steps 5–6, §9): score keys with the original scorer and keep
the records with s ≥ τ in the candidate buffer (``select.CandidateBuffer``)."""

from __future__ import annotations

import numpy as np

from .prepare import QueryContext
from .scorer import score_keys
from .select import CandidateBuffer

__all__ = ["refine"]


def refine(ctx: QueryContext, ids: np.ndarray, buf: CandidateBuffer) -> None:
    """Score ``ids`` int64 (visible keys of the query) in batches of ``refine_batch`` and
    offer every record to ``buf`` (which keeps s ≥ its τ and merges exactly when full)."""
    step = ctx.chunk.opt.refine_batch
    for lo in range(0, ids.size, step):
        part = ids[lo : lo + step]
        buf.offer(part, score_keys(ctx.q_t, ctx.w_t, ctx.chunk.k[part]))
