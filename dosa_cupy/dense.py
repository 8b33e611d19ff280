"""The dense route (docs/method.md §1): the canonical GPU original scorer over every visible
key (``dense_logits``) and ``dense_topk`` = dense logits + the project's exact selection
kernel (order score desc, id asc, −1 padding).  ``select_rows`` / ``select_records`` are
the selection kernel's two sources (docs/method.md §7, §9).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dosa_ref.options import check_flag
from dosa_ref.validate import check_K

from ._build import cupy_or_raise, kernel, num_sms
from ._signature import _what
from .prepare import Batch, pad_batch
from .scorer import dense_logits_raw

__all__ = [
    "dense_ids",
    "dense_logits",
    "dense_topk",
    "select_records",
    "select_rows",
]

SCRATCH = 1 << 16  # candidate scratch per selection block, in records
SEL_BLOCKS = 264
# select_kernel_ilp (csrc/select.cu each_record: four loads of each thread in flight in every
# pass over a row's records, docs/method.md §9 "The selection's loads"; the same selection):
# 1.15× faster on the dense route's rows and a DoSA call's records on an H100
# (docs/records/benchmarks.md "The selection's loads and ρ from integer squares"); bench build
# noilp keeps select_kernel.
SELECT_ILP = True
# select_kernel_buf (csrc/select.cu select_row's ABOVE, docs/method.md §9 "The selection's passes"):
# select_kernel_ilp whose compaction also keeps the records above the K-th's bin, so the last pass
# reads the scratch instead of the row — one pass over the row fewer, the same selection: 1.06–1.12×
# faster DoSA calls at 128K keys on an H100 (docs/records/benchmarks.md "Four builds on by default;
# the decode step's selection by rank"); bench build collectrow keeps select_kernel_ilp.
SELECT_BUF = True

_NULL = np.uint64(0)


def _opt(a):
    """An optional device array as a kernel argument: the null pointer for None."""
    return _NULL if a is None else a


def dense_logits(q, w, k_payload, k_scale, ks=None, ke=None, scorer: str = "f16"):
    """Canonical FP8 logits s[t, i] = α_i Σ_h w'_h [q̄_h·k̄_i]_+ (fp32 [Qn, N]) of the
    ``scorer`` (scorer.py: "f16" or "fp8"); −inf where key i is not visible to query t.  Same
    layout as ``dosa_topk``."""
    b = pad_batch(q, w, k_payload, k_scale, 1, ks, ke, scorer=scorer)
    return dense_logits_raw(b.q, b.w, b.kp, b.ksc, b.ks, b.ke, b.scorer)


def scratch(rows):
    """(blocks, candidate buffer) of the selection kernel for ``rows`` rows."""
    cp = cupy_or_raise()
    blocks = max(1, min(rows, SEL_BLOCKS))
    return blocks, cp.empty(blocks * SCRATCH, dtype=cp.uint64)


WIDE_ROWS = 256  # at most this many rows ...
WIDE_MIN_N = 1 << 15  # ... of at least this many keys: the wide selection (many blocks per row)
WIDE_EXTRA = 8192  # records per row beyond K that the wide selection's buffer holds
WSEL_THREADS = 256  # csrc/select.cu
NBIN = 2048


@dataclass(frozen=True)
class RowsWork:
    """Every device buffer of ``select_rows`` for ``rows`` rows of ``n`` logits and K
    (``rows_work``): ids int32 [rows, K] (the result) and the selection's scratch; for the
    wide selection also its histograms uint32 [2, rows, NBIN], state uint32 [rows, 4],
    counts uint32 [rows] and records uint64 [rows, K + WIDE_EXTRA] (None otherwise).  A call
    with it allocates nothing, so it can be captured in a CUDA graph."""

    shape: tuple
    ids: object
    scr: tuple
    hist: object = None
    state: object = None
    cnt: object = None
    rec: object = None


def _wide(rows: int, n: int) -> bool:
    """Whether ``select_rows`` takes the wide selection for ``rows`` rows of ``n`` logits."""
    return 0 < rows <= WIDE_ROWS and n >= WIDE_MIN_N


def rows_work(rows: int, n: int, K: int) -> RowsWork:
    """The buffers of ``select_rows`` on logits [rows, n] at K (``RowsWork``)."""
    cp = cupy_or_raise()
    ids = cp.empty((rows, K), dtype=cp.int32)
    if not _wide(rows, n):
        return RowsWork((rows, n, K), ids, scratch(rows))
    return RowsWork(
        (rows, n, K), ids, scratch(rows), hist=cp.empty((2, rows, NBIN), dtype=cp.uint32),
        state=cp.empty((rows, 4), dtype=cp.uint32), cnt=cp.empty(rows, dtype=cp.uint32),
        rec=cp.empty((rows, K + WIDE_EXTRA), dtype=cp.uint64),
    )  # fmt: skip


SEL_KMAX = 4096  # csrc/select.cu SEL_KMAX: the selection kernel's largest K


def select_rows(logits, K, ks=None, ke=None, work: RowsWork | None = None):
    """Exact Top-K ids (int32 [Qn, K], −1 padded) of each row's visible range [ks, ke)
    of fp32 logits [Qn, N] (a C-contiguous CuPy array); order score desc, id asc.

    ks, ke: int32 [Qn] device arrays with 0 ≤ ks ≤ ke ≤ N (None: 0 and N).  ``work``
    (``rows_work(Qn, N, K)``): the buffers to use (the ids are ``work.ids``); else new.  Bad
    input raises a ValueError naming the argument; the ranges are checked on the device
    with one read-back (``_select_rows``, the library's own calls, checks nothing)."""
    cp = cupy_or_raise()
    check_K(K, max_K=SEL_KMAX, why="the selection kernel's limit")
    if not isinstance(logits, cp.ndarray) or logits.dtype != np.float32 or logits.ndim != 2:
        raise ValueError(f"logits: expected a float32 [Qn, N] CuPy array, got {_what(logits)}")
    if not logits.flags.c_contiguous:
        raise ValueError(f"logits: expected a C-contiguous array, strides {logits.strides}")
    Qn, N = (int(x) for x in logits.shape)
    ends = []
    for name, a, fill in (("ks", ks, 0), ("ke", ke, N)):
        if a is None:
            a = cp.full(Qn, fill, dtype=cp.int32)
        elif not isinstance(a, cp.ndarray) or a.dtype != np.int32 or a.shape != (Qn,):
            raise ValueError(f"{name}: expected an int32 [{Qn}] CuPy array, got {_what(a)}")
        ends.append(cp.ascontiguousarray(a))
    ks, ke = ends
    if Qn and bool(((ks < 0) | (ks > ke) | (ke > N)).any()):  # the one read-back
        raise ValueError(f"ks, ke: every row needs 0 <= ks <= ke <= N = {N}")
    return _select_rows(logits, int(K), ks, ke, work)


def _select_rows(logits, K, ks, ke, work: RowsWork | None = None):
    """``select_rows`` without its checks: the library's own calls, whose inputs are valid
    by construction (int32 [Qn] ranges within [0, N], float32 C-contiguous logits)."""
    Qn, N = logits.shape
    if work is None:
        work = rows_work(Qn, N, K)
    elif work.shape != (Qn, N, K):
        raise ValueError(f"work: built for {work.shape}, got logits {(Qn, N)} and K={K}")
    if Qn == 0:
        return work.ids
    if _wide(Qn, N):
        return _select_rows_wide(logits, K, ks, ke, work)
    _select_kernel(0, K, work.scr, work.ids, None, rows=(logits, ks, ke))
    return work.ids


def _select_kernel(mode, K, scr, ids, kth, rows=None, recA=None, recB=None) -> None:
    """One launch of select_kernel (csrc/select.cu; ``mode`` 0: logits rows, 1: record
    lists, 2: per row either).  ``rows`` = (logits fp32 [R, N], ks, ke int32 [R]); ``recA``,
    ``recB`` = (records uint64 [R, cap], counts uint32 [R]); ``scr`` = ``scratch(R)``; ids
    int32 [R, K] and kth uint64 [R] may be None."""
    logits, ks, ke = rows if rows is not None else (None, None, None)
    R = (logits if logits is not None else recA[0]).shape[0]

    def lst(r):  # a record list: (records, counts, capacity)
        return (_NULL, _NULL, np.int64(0)) if r is None else (*r, np.int64(r[0].shape[1]))

    blocks, buf = scr
    kernel(
        "select_kernel_buf"
        if SELECT_BUF
        else "select_kernel_ilp"
        if SELECT_ILP
        else "select_kernel"
    )(
        (blocks,),
        (512,),
        (
            np.int32(mode), np.int32(R), np.int32(K), _opt(logits),
            np.int64(logits.shape[1] if logits is not None else 0), _opt(ks), _opt(ke),
            *lst(recA), *lst(recB), buf, np.int64(SCRATCH), _opt(ids), _opt(kth),
        ),
    )  # fmt: skip


# select_rank (csrc/select.cu, docs/method.md §9 "Few rows of few records"): at most RANK_ROWS
# rows of records, each row's records ranked by many blocks at once where it holds at most
# rank_max(rows), else selected by one block as select_kernel_buf does; the same selection.
# The decode step's two selections take it (decode_ops.RANK_SELECT).  Eight rows (B = 8 at
# next_n 1): on an H100 such steps replayed 1.02–1.12× faster than with select_kernel_buf
# (back to back, 128K and 1M, H 32 / 64), while 16 rows (B = 8 at next_n 2) were 0.95–0.98×
# (docs/records/benchmarks.md "The decode screen on the GPU; the decode grid with DeepGEMM +
# exact select"); bench build rank4 keeps the earlier four.
RANK_ROWS = 8
RANK_PER_BLOCK = 64  # csrc/select.cu RANK_PER_BLOCK: records a block ranks


def rank_max(rows: int) -> int:
    """Records of a row that select_rank ranks, for ``rows`` rows (more: its one-block
    selection).  Ranking n records compares n² pairs in n / 64 blocks; up to rows · n = 16K
    they fit one wave of two blocks per SM with a few thousand comparisons per thread."""
    return 8192 if rows <= 2 else 4096


def select_records_rank_into(K, rec, cnt, ids, kth, scr) -> None:
    """``select_records_into`` for at most RANK_ROWS rows of one record list (rec uint64
    [rows, cap], cnt uint32 [rows]) by select_rank; ids int32 [rows, K] and kth uint64 [rows]
    may be None; ``scr`` = ``scratch(rows)``.  One launch, no allocation (capturable)."""
    rows = int(rec.shape[0])
    blocks, buf = scr
    if not 1 <= rows <= RANK_ROWS:
        raise ValueError(f"rec: select_rank takes 1 to {RANK_ROWS} rows, got {rows}")
    if blocks < rows:
        raise ValueError(f"scr: a scratch region per row needed ({rows}), got {blocks}")
    rm = rank_max(rows)
    kernel("select_rank")(
        (-(-rm // RANK_PER_BLOCK), rows),
        (512,),
        (
            np.int32(K), rec, cnt, np.int64(rec.shape[1]), np.int64(rm), buf,
            np.int64(SCRATCH), _opt(ids), _opt(kth),
        ),
    )  # fmt: skip


def wide_blocks(n: int, rows: int) -> int:
    """Blocks per row of the wide histograms over rows of ``n`` entries (select_wide_hist,
    floor_wide_hist): about eight entries per thread, and about four blocks per SM in all."""
    return max(1, min(-(-n // (8 * WSEL_THREADS)), -(-4 * num_sms() // rows)))


def wide_cut(K: int, ks, ke, cnt, count, hist=None, state=None):
    """The wide selection's threshold (docs/method.md §9 "Few long rows"): per row of the
    ranges [ks, ke) (int32 [rows]), ``count(level, state, hist)`` launches a histogram kernel
    of the row's score codes at that level into hist uint32 [rows, NBIN], and select_wide_cut
    cuts it, for levels 0 and 1.  Returns state uint32 [rows, 4] = {d1*, above, T, done};
    cnt uint32 [rows] is zeroed (the compaction's counts).  ``hist`` uint32 [2, rows, NBIN]
    (zeroed here) and ``state``: buffers to use, else new."""
    cp = cupy_or_raise()
    rows = int(ks.shape[0])
    if hist is None:
        hist = cp.zeros((2, rows, NBIN), dtype=cp.uint32)
    else:
        hist.fill(0)
    if state is None:
        state = cp.empty((rows, 4), dtype=cp.uint32)
    for level in (0, 1):
        count(level, state, hist[level])
        kernel("select_wide_cut")(
            (rows,), (1024,), (np.int32(level), np.int32(K), ks, ke, hist[level], state, cnt)
        )  # fmt: skip
    return state


def _select_rows_wide(logits, K, ks, ke, work: RowsWork):
    """select_rows for few long rows (docs/method.md §9 "Few long rows"): a two-level
    histogram of the score codes with many blocks per row finds a code T such that every
    key of the Top-K has code >= T; those keys' records are compacted and selected, and a
    row whose records did not fit is selected from its logits (select_kernel mode 2)."""
    rows, N = logits.shape
    cnt, rec = work.cnt, work.rec
    cap = int(rec.shape[1])
    xb = wide_blocks(N, rows)
    ld = np.int64(N)
    state = wide_cut(K, ks, ke, cnt, lambda level, state, hist: kernel("select_wide_hist")(
        (xb, rows), (WSEL_THREADS,), (np.int32(level), logits, ld, ks, ke, state, hist)
    ), work.hist, work.state)  # fmt: skip
    kernel("select_wide_compact")(
        (xb, rows), (WSEL_THREADS,), (logits, ld, ks, ke, state, np.int64(cap), cnt, rec)
    )  # fmt: skip
    _select_kernel(2, K, work.scr, work.ids, None, rows=(logits, ks, ke), recA=(rec, cnt))
    return work.ids


def select_records(K, recA, cntA, recB=None, cntB=None, want_ids=True, want_kth=False):
    """Exact Top-K over per-row record lists (seed records + compact records).

    recA [rows, capA] uint64 with counts cntA [rows] (entries beyond min(count, cap) are
    ignored); optional second list recB/cntB.  Returns (ids int32 [rows, K] or None,
    kth uint64 [rows] or None): kth is the K-th record (0 when a row has fewer than K).
    """
    cp = cupy_or_raise()
    rows = recA.shape[0]
    ids = cp.empty((rows, K), dtype=cp.int32) if want_ids else None
    kth = cp.empty(rows, dtype=cp.uint64) if want_kth else None
    if rows == 0:
        return ids, kth
    select_records_into(K, recA, cntA, ids, kth, scratch(rows), recB, cntB)
    return ids, kth


def select_records_into(K, recA, cntA, ids, kth, scr, recB=None, cntB=None) -> None:
    """``select_records`` into given buffers: ids int32 [rows, K] and kth uint64 [rows]
    (either may be None) with the selection scratch ``scr`` = ``scratch(rows)``; launches
    one kernel and allocates nothing (a CUDA-graph capturable step uses it)."""
    _select_kernel(1, K, scr, ids, kth, recA=(recA, cntA),
                   recB=(recB, cntB) if recB is not None else None)  # fmt: skip


def dense_topk(q, w, k_payload, k_scale, K, ks=None, ke=None, chunk=None, check=True,
               scorer: str = "f16"):  # fmt: skip
    """The dense route: canonical logits of every visible key (the ``scorer``'s, scorer.py:
    "f16" or "fp8"), then exact selection.

    Returns int64 [Qn, K] ids (score desc, id asc; −1 pads rows with fewer than K visible
    keys) — the ``dosa_ref.topk_ids`` contract (docs/design.md).  ``chunk`` limits queries per
    logits buffer (memory: chunk·N·4 bytes); ``check=False`` skips the value checks of
    ``prepare.check_inputs`` (a caller that validated its inputs; no synchronization).
    Raises ``prepare.SCORE_OVERFLOW`` (with the checks on) where a visible score is not
    finite in fp32, as every other route does (docs/method.md §1 "The scorer's domain").
    """
    cp = cupy_or_raise()
    check = check_flag("check", check)
    b = pad_batch(q, w, k_payload, k_scale, K, ks, ke, check, defer=True, scorer=scorer)
    ids = _dense_topk_raw(b.q, b.w, b.kp, b.ksc, b.K, b.ks, b.ke, chunk, b.scorer)
    b.raise_if_bad()  # read back after the launches (the ranges were clamped for them)
    return ids.astype(cp.int64)


def _dense_topk_raw(q, w, kp, ksc, K, ks, ke, chunk=None, scorer: str = "f16"):
    """``dense_topk`` on checked inputs padded for the ``scorer`` → int32 [Qn, K] (the
    selection kernel's own dtype; used inside the pipeline: anchors, recovery, bench)."""
    cp = cupy_or_raise()
    Qn = q.shape[0]
    N = kp.shape[0]
    if chunk is None:
        chunk = max(1, min(Qn, (8 << 30) // max(1, 4 * N)))
    out = cp.empty((Qn, K), dtype=cp.int32)
    for a in range(0, Qn, chunk):
        b = min(Qn, a + chunk)
        lg = dense_logits_raw(q[a:b], w[a:b], kp, ksc, ks[a:b], ke[a:b], scorer)
        out[a:b] = _select_rows(lg, K, ks[a:b], ke[a:b])
        del lg
    return out


def dense_ids(b: Batch):
    """``_dense_topk_raw`` of a ``Batch`` → int32 [Qn, K] (the pipeline's anchors and
    query-level recovery)."""
    return _dense_topk_raw(b.q, b.w, b.kp, b.ksc, b.K, b.ks, b.ke, scorer=b.scorer)
