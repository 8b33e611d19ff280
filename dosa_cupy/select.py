"""The selection stage (docs/method.md §7, §9): record buffers, τ of the seed records, exact
selection over seed records ∪ compact records with the exact overflow extension, and the
query-level recovery of the dense route.

A record is the uint64 ``code(s) << 32 | ~id`` of the selection kernel (select.cu,
``emulate.record_order``): its order is score descending, id ascending.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._build import cupy_or_raise, kernel
from .dense import _NULL, WSEL_THREADS, dense_ids, select_records, wide_blocks, wide_cut
from .prepare import Batch, envelope_queries
from .scorer import valid_scales

__all__ = [
    "RecordBuffer",
    "Records",
    "SpillBuffer",
    "captured_floor",
    "extend_overflow",
    "flagged_rows",
    "NO_KTH_ID",
    "overflow_counts",
    "raised_tau",
    "recovery_queries",
    "kth_ids",
    "recover",
    "recover_condition",
    "recover_first",
    "score_of_records",
    "union_kth",
    "select_ids",
    "tau_of_seeds",
]


class RecordBuffer:
    """Per-query record lists written by a kernel: rec uint64 [Qn, cap], cnt uint32 [Qn]
    (zeroed; a kernel counts every qualifying record, also past ``cap``, so a full buffer
    is detected and nothing is silently lost — docs/method.md §9)."""

    def __init__(self, Qn: int, cap: int):
        cp = cupy_or_raise()
        self.cap = int(cap)
        self.cnt = cp.zeros(Qn, dtype=cp.uint32)
        self.rec = cp.empty((Qn, self.cap), dtype=cp.uint64)

    def args(self) -> tuple:
        """(cnt, rec, cap): the trailing parameters of every kernel that appends records
        (seed_score, fused, refine, screen_cert)."""
        return (self.cnt, self.rec, np.int64(self.cap))


class SpillBuffer:
    """The spill of a first refinement pass (docs/method.md §7 C.3 "The spill"): the records
    past their row's cap, rec uint64 [cap] with their rows row int32 [cap], in the order the
    kernel appended them; count uint64 [1] (zeroed) counts every spilled record, also past
    ``cap`` (64-bit: Qn · N records can pass 2^32), so a full spill is detected and the
    extension scores the rows again."""

    def __init__(self, cap: int):
        cp = cupy_or_raise()
        self.cap = int(cap)
        self.count = cp.zeros(1, dtype=cp.uint64)
        self.rec = cp.empty(self.cap, dtype=cp.uint64)
        self.row = cp.empty(self.cap, dtype=cp.int32)

    def args(self) -> tuple:
        """(count, rec, row, cap): the trailing parameters of refine_fp8_spill_h*."""
        return (self.count, self.rec, self.row, np.int64(self.cap))


@dataclass
class Records:
    """Compact records of every query (docs/method.md §9), with the exact overflow extension.

    rec uint64 [Qn, cap], cnt uint32 [Qn] (the number of records of the first pass, also
    past cap), over bool [Qn] (cnt > cap); ext = (rows int [n], rec2 uint64 [n, cap2], cnt2
    uint32 [n]) or None: the complete lists of the overflowed rows, counted by the pass
    that wrote them (rows[j]'s records are rec2[j, :cnt2[j]]: its records s ≥ max(τ, floor),
    ``captured_floor``; cnt2 = cnt[rows] where the floor is −inf or ``RAISED_EXTENSION`` is
    off, which the tests check).  spill: the first pass's records past cap
    (``SpillBuffer``), or None where it kept none.
    """

    rec: object
    cnt: object
    over: object
    ext: tuple | None = None
    spill: SpillBuffer | None = None

    def row(self, t: int):
        """Query t's records (host or device array; for tests and diagnostics)."""
        if self.ext is not None and bool(self.over[t]):
            rows, rec2, cnt2 = self.ext
            j = int(np.flatnonzero(_host(rows) == t)[0])
            return rec2[j, : int(cnt2[j])]
        return self.rec[t, : int(self.cnt[t])]


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def extend_overflow(first: RecordBuffer, rescore, K: int) -> Records:
    """``Records`` of a first pass, extended exactly (docs/method.md §7 C.3): the rows with
    count > cap are scored again as a sub-problem of those rows only, into a [rows, max
    count] buffer — ``rescore(rows int32 [n], cap2, floor fp32 [n]) → RecordBuffer [n,
    cap2]``, which keeps the records s ≥ max(τ, floor) of each row, ``floor`` the score of
    the K-th record the first pass kept (``captured_floor``).  A [Qn, max count] table
    would not fit (one row with 500K records at Qn = 32K, N = 1M: 131 GB)."""
    return extend_flagged(Records(first.rec, first.cnt, first.cnt > first.cap), rescore, K)


def extend_flagged(recs: Records, rescore, K: int,
                   counted: tuple[int, int] | None = None) -> Records:  # fmt: skip
    """``extend_overflow`` of a first pass whose rows are flagged already (``Records.over``,
    no ``ext``): ``recs`` with the complete lists of its overflowed rows in ``ext``.
    ``counted``: (overflowed rows, their largest count), read back by the caller
    (``overflow_counts``), so nothing here synchronizes; None: one synchronization for
    their number, one more for their largest count when there are any.  An extended row
    holds the records s ≥ max(τ, floor) of its survivors (``captured_floor``): every key
    of its Top-K, fewer records to select from."""
    xp = cupy_or_raise()
    if counted is None:
        n = int(recs.over.sum())
        oq = xp.flatnonzero(recs.over).astype(xp.int32) if n else None
        counted = (n, int(recs.cnt[oq].max()) if n else 0)
    else:
        oq = flagged_rows(recs.over, counted[0], xp) if counted[0] else None
    if counted[0]:
        floor = captured_floor(K, recs, oq) if RAISED_EXTENSION else None
        second = rescore(oq, counted[1], floor)
        recs.ext = (oq, second.rec, second.cnt)
    return recs


# The overflowed rows refined again against the K-th record their first pass kept, not only
# against τ (``captured_floor``; docs/method.md §7 C.3): a row's second pass keeps fewer than
# its count of records s ≥ τ (more than the buffer's 65,536) for the selection to read
# (tests/test_gpu.py test_raised_extension_selects_from_fewer_records).  No change in the
# call's time was resolved on an H100 (docs/records/benchmarks.md "The raised extension and
# the pipelined halves"); bench build plainext refines them against τ alone.
RAISED_EXTENSION = True


# The captured floor found by many blocks per overflowed row (``captured_floor``: the lower edge of
# the K-th kept record's 22-bit code bucket, csrc/select.cu floor_wide_hist) instead of one block
# per row selecting its K-th kept record (0.35 ms for the 53 rows of a 1M H 64 chunk on an H100:
# docs/records/benchmarks.md "The selection's loads and ρ from integer squares"; measured together
# with the three other builds of docs/records/benchmarks.md "Four builds on by default; the decode
# step's selection by rank"). Bench build kthfloor takes the K-th kept record itself.
FLOOR_WIDE = True


def captured_floor(K: int, recs: Records, oq):
    """fp32 [n]: a floor of each overflowed row ``oq`` (int32 [n]) from the records its
    first pass kept (``recs.rec[oq, :cap]``): the score of the K-th largest of them, −inf
    where it kept fewer than K — or with ``FLOOR_WIDE`` the lower edge of that record's
    22-bit score-code bucket (≤ its score, within a relative 2^-13 for normal scores; −inf
    where it kept at most K: the wide cut takes such a row whole).
    Those records are exact scores of distinct visible keys, so by Prop. 4 (docs/method.md
    §2) either floor is ≤ the row's K-th score: every key of the row's Top-K has s ≥ floor,
    and a second pass may keep s ≥ max(τ, floor) only (§7 C.3)."""
    if FLOOR_WIDE:
        return _floor_wide(int(K), recs.rec, oq)
    _, kth = select_records(int(K), recs.rec[oq], recs.cnt[oq], want_ids=False, want_kth=True)
    return score_of_records(kth)


def _floor_wide(K: int, rec, oq):
    """``captured_floor`` with ``FLOOR_WIDE``: floor_wide_hist and select_wide_cut at two
    levels over the cap records of each row ``oq`` of ``rec`` uint64 [Qn, cap] (full rows),
    then floor_of_cut — no synchronization."""
    cp = cupy_or_raise()
    n, cap = int(oq.shape[0]), int(rec.shape[1])
    floor = cp.empty(n, dtype=cp.float32)
    if n == 0:
        return floor
    xb = wide_blocks(cap, n)
    spare = cp.empty(n, dtype=cp.uint32)  # select_wide_cut's record counts (no records here)
    ks, ke = cp.zeros(n, dtype=cp.int32), cp.full(n, cap, dtype=cp.int32)
    state = wide_cut(K, ks, ke, spare, lambda level, state, hist: kernel("floor_wide_hist")(
        (xb, n), (WSEL_THREADS,), (np.int32(level), rec, np.int64(cap), oq, state, hist)
    ))  # fmt: skip
    kernel("floor_of_cut")((-(-n // 256),), (256,), (state, np.int32(n), floor))
    return floor


def raised_tau(tau, oq, floor):
    """fp32 [n]: the threshold of the overflowed rows ``oq``'s second pass — their τ (fp32
    [Qn]) raised to ``floor`` (``captured_floor``), or τ alone where floor is None
    (``RAISED_EXTENSION`` off): the records s ≥ it hold the rows' Top-K (§7 C.3)."""
    xp = cupy_or_raise()
    return tau[oq] if floor is None else xp.maximum(tau[oq], floor)


def flagged_rows(mask, n: int, xp):
    """int32 [n]: the indices of the True entries of ``mask`` (bool [Qn], an ``xp`` array)
    in ascending order — ``flatnonzero`` — given their number ``n`` (read back by the
    caller), without a synchronization: each flagged row is scattered to its rank, the
    others to a slot past the end that is dropped.  With fewer than n True entries the
    slots past them hold 0; with more, the first n (``recover_first``)."""
    pos = xp.cumsum(mask, dtype=xp.int64) - 1
    out = xp.zeros(n + 1, dtype=xp.int32)
    out[xp.where(mask & (pos < n), pos, n)] = xp.arange(mask.shape[0], dtype=xp.int32)
    return out[:n]


def overflow_counts(recs: Records, bad):
    """int64 device [4]: the overflowed rows of ``recs`` (``Records.over``), the largest
    count among them (0 without one), the rows of ``bad`` (bool [Qn], the query-level
    recovery's) and the spilled records (``Records.spill``; 0 without a spill) — what the
    exact extension and the recovery need on the host, read back once (pipeline.py,
    ``refine.PREFETCH_COUNTS``)."""
    cp = cupy_or_raise()
    over_cnt = cp.where(recs.over, recs.cnt.astype(cp.int64), 0)
    top = over_cnt.max() if over_cnt.size else cp.zeros((), dtype=cp.int64)
    sp = recs.spill
    spilled = sp.count[0].astype(cp.int64) if sp is not None else cp.zeros((), dtype=cp.int64)
    return cp.stack([recs.over.sum(dtype=cp.int64), top, bad.sum(dtype=cp.int64), spilled])


# "No K-th record": an id no visible key exceeds (ids < N ≤ 2^31 − 1), so "U = τ and i > j"
# (docs/method.md §7 "Tie-aware rejection and zero plateaus") never holds.
NO_KTH_ID = np.iinfo(np.int32).max


def kth_ids(kth, xp=np):
    """Id j of each K-th record (τ, j) (uint64 ``code << 32 | ~id`` [Qn]) as int32 [Qn], or
    ``NO_KTH_ID`` where there is none (record 0: fewer than K records, τ = −inf).  xp: numpy
    or CuPy (elementwise, no host synchronization)."""
    kth = xp.asarray(kth, dtype=xp.uint64)
    ids = (~(kth & xp.uint64(0xFFFFFFFF)).astype(xp.uint32)).astype(xp.int64)
    return xp.where(kth == 0, int(NO_KTH_ID), ids).astype(xp.int32)


def tau_of_seeds(K: int, seeds: RecordBuffer, xrec, xcnt, want_id: bool = False):
    """τ = K-th record of default ∪ extra seed records (Prop. 4): fp32 [Qn], −inf when
    fewer than K; with ``want_id`` also its id j int32 [Qn] (``kth_ids``).  The two lists
    must not share a key (docs/method.md §2).  xrec uint64 [Qn, S] or None, xcnt uint32
    [Qn]."""
    cp = cupy_or_raise()
    xc = xcnt if xrec is not None else None
    _, kth = select_records(K, seeds.rec, seeds.cnt, xrec, xc, want_ids=False, want_kth=True)
    if not want_id:
        return score_of_records(kth)
    ids = cp.empty(int(kth.shape[0]), dtype=cp.int32)
    return score_of_records(kth, ids), ids


def union_kth(parts, K: int):
    """uint64 [rows]: the K-th record of the union of the record lists ``parts`` (uint64
    [rows, n_i] each, 0 in unused slots — the record below every key), 0 where the union
    holds fewer than K: one selection over the concatenated rows (the shards' floors,
    ``dosa_cupy.shards``; records of distinct keys, as the selection needs)."""
    cp = cupy_or_raise()
    rec = cp.ascontiguousarray(cp.concatenate([cp.asarray(p, dtype=cp.uint64) for p in parts],
                                              axis=1))  # fmt: skip
    cnt = cp.full(rec.shape[0], rec.shape[1], dtype=cp.uint32)
    _, kth = select_records(int(K), rec, cnt, want_ids=False, want_kth=True)
    return kth


def score_of_records(kth, ids=None):
    """fp32 [n]: the score of each record uint64 [n], −inf for the empty record 0
    (select.cu tau_from_kth; ``emulate.record_score`` on the host); with ``ids`` (int32 [n],
    written) also each record's id, ``kth_ids``'s values, in the same launch."""
    cp = cupy_or_raise()
    n = int(kth.shape[0])
    tau = cp.empty(n, dtype=cp.float32)
    if n:
        out = _NULL if ids is None else ids
        kernel("tau_from_kth")(((n + 255) // 256,), (256,), (kth, np.int32(n), tau, out))
    return tau


def select_ids(K: int, seeds: RecordBuffer, recs: Records, want_kth: bool = False):
    """Exact Top-K of seed records ∪ compact records (docs/method.md §7, §9): (ids int32
    [Qn, K], the K-th record uint64 [Qn] (0: fewer than K) or None); the overflowed rows are
    selected again from their complete lists (``recs.ext``)."""
    ids, kth = select_records(K, seeds.rec, seeds.cnt, recs.rec, recs.cnt, want_kth=want_kth)
    select_extended(K, seeds, recs, ids, kth)
    return ids, kth


def select_extended(K: int, seeds: RecordBuffer, recs: Records, ids, kth) -> None:
    """The rows of ``recs.ext`` (the overflowed ones) of ids int32 [Qn, K] and of the K-th
    records kth uint64 [Qn] (or None) selected again from their complete lists, in place."""
    if recs.ext is None:
        return
    oq, rec2, cnt2 = recs.ext
    ids[oq], k2 = select_records(K, seeds.rec[oq], seeds.cnt[oq], rec2, cnt2,
                                 want_kth=kth is not None)  # fmt: skip
    if kth is not None:
        kth[oq] = k2


def recovery_queries(b: Batch):
    """Queries the dense route must answer (query-level recovery, docs/method.md §7 C.3):
    those that see a key with an invalid scale (α < 0, NaN, inf) and those whose scores the
    envelope cannot prove finite in fp32 (``prepare.envelope_queries``; docs/method.md §1
    "The scorer's domain"): bool [Qn].  All False without device work where the call's
    value checks, read back, saw neither (``Batch.recovery_known_empty``)."""
    cp = cupy_or_raise()
    if b.recovery_known_empty():
        return cp.zeros(b.Qn, dtype=cp.bool_)
    bad = ~valid_scales(b.ksc)
    pre = cp.concatenate([cp.zeros(1, dtype=cp.int64), cp.cumsum(bad.astype(cp.int64))])
    sees_bad = (pre[b.ke.astype(cp.int64)] - pre[b.ks.astype(cp.int64)]) > 0
    return sees_bad | envelope_queries(b.w, b.ksc)


def recover(b: Batch, ids, bad, n: int | None = None) -> None:
    """Query-level recovery (docs/method.md §7 C.3): the rows ``bad`` (bool [Qn]) of ids
    int32 [Qn, K] are replaced by the dense route's ids, in place.  ``n``: the number of
    rows of ``bad``, read back by the caller (``overflow_counts``: no synchronization
    here); None: read back here."""
    cp = cupy_or_raise()
    if n is None:
        if not bool(bad.any()):
            return
        bq = cp.flatnonzero(bad)
    elif n:
        bq = flagged_rows(bad, n, cp)
    else:
        return
    ids[bq] = dense_ids(b.rows(bq))


def recover_first(b: Batch, ids, redo, status, m: int) -> None:
    """Query-level recovery (docs/method.md §7 C.3) of the first ``m`` flagged rows without a
    read-back — a captured step's, inside the graph (capture.py ``RECOVER_ROWS``): the
    first min(m, Qn) rows of ``redo`` (bool [Qn], in row order) get the dense route's ids in
    ``ids`` (int32 or int64 [Qn, K]), their flags are cleared and status[1] (int64 device)
    becomes the number of rows still flagged, which ``PrefillStep.finish`` completes.
    Fixed sizes whatever ``redo`` holds: the m slots are the flagged rows by rank
    (``flagged_rows``), the rest row 0 — each slot holds a real row and receives that row's
    own exact ids, so a row written twice is written with the same ids."""
    cp = cupy_or_raise()
    rows = flagged_rows(redo, min(int(m), b.Qn), cp)
    ids[rows] = dense_ids(b.rows(rows)).astype(ids.dtype)
    redo[rows] = False
    status[1] = cp.count_nonzero(redo)


def recover_condition(status, cond) -> None:
    """Queue csrc/route.cu recover_pick: the conditional graph node ``cond``'s value (a
    ``_graph.condition`` handle) = 1 where status[1] (int64 device, the step's flagged rows)
    is positive, else 0."""
    kernel("recover_pick")((1,), (32,), (status, np.uint64(int(cond))))
