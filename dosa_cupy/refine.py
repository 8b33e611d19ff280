"""The refine stage (docs/method.md §9): the per-query refinement stream with compact
writeback and the exact overflow extension (``refine_stage``).

``refine_mt*`` (refine.cu) scores every survivor of ``surv[t]`` for query t.  Blocks take
(query, word chunk) with the query index fastest, so gathered keys are shared through L2 by
the queries that refine them.  The kernel calls the canonical scorer ``dosa::score_batch``
(common.cuh), so every score equals the dense route's bit for bit; it appends the records
s ≥ τ to per-query buffers and counts every qualifying record, also past the capacity.
Overflow: the rows with count > capacity are extended exactly (``select.extend_flagged``):
from the records the FP8 kernel appended past their cap to the call's spill
(``refine_fp8_spill_h*``, ``SPILL``), or, without a spill or with a full one, refined again
over their whole survivor rows as a sub-problem of those rows only.

tests/test_refine.py emulates the kernel's loop decomposition on the CPU and runs
``refine_stage``'s host code against that emulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._build import cupy_or_raise, device_const, kernel
from .prepare import Batch
from .scorer import FP8_SPEC
from .select import RecordBuffer, Records, SpillBuffer, extend_flagged, raised_tau

__all__ = ["RefineLaunch", "extend_records", "popcount_rows", "refine_stage"]

RW = 256  # words per warp of the refine kernel (refine.cu RW)
REFINE_WARPS = 8  # warps per block of the refine kernel
RWF = 2048  # bitmask words per block of the FP8 scorer's refine kernel (score_fp8.cu RWF)

# The overflow check of a DoSA call read back with the recovery's (pipeline.py), so the
# selection is queued behind the refinement without a synchronization between them; the
# overflowed rows (rare) are extended and selected again after that read-back
# (``extend_records``, ``select.select_extended``).  With seeds.POOL_CAPACITY and
# screen.SPECULATIVE_TIE −0.3 to −0.8 ms per call on an H100
# (docs/records/benchmarks.md "The synchronization builds switched on"); bench builds=eagerext
# reads the check right after the refinement.
DEFERRED_EXTENSION = True

# With DEFERRED_EXTENSION: the overflowed rows, their largest count and the recovered rows
# (``select.overflow_counts``) read back by an event right after the refinement, while the
# selection runs, so the extension and the recovery are queued without a synchronization of
# their own (one read-back where there were four); bench builds=latecounts reads the flags
# after the selection (docs/method.md §7 "Candidate buffers and recovery (C.3)").
PREFETCH_COUNTS = True

# The FP8 refinement's records past a row's cap appended to a spill shared by the call's rows
# (refine_fp8_spill_h*, docs/method.md §7 C.3 "The spill"), so that an overflowed row's extension
# selects among the records its first pass scored (``extend_from_spill``) instead of scoring its
# survivors again: at 1M keys, H 64, the 53 overflowed rows of the calibrated chunk cost 1.37 ms of
# scoring again on an H100 (docs/records/benchmarks.md "The selection's loads and ρ from integer
# squares"); with the spill the calibrated 1M calls were 1.03–1.04× faster
# (docs/records/benchmarks.md "Four builds on by default; the decode step's selection by
# rank").  Bench build rescore scores them again.
SPILL = True
SPILL_RATIO = 0.125  # the spill holds Qn · cap · SPILL_RATIO records (a full one: scored again)


_PC8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount_rows(x, xp=np):
    """Number of set bits of each row of uint32 [R, NW]: int64 [R]."""
    x = xp.ascontiguousarray(x.astype(xp.uint32, copy=False))
    if x.size == 0:
        return xp.zeros(x.shape[0], dtype=xp.int64)
    pc = device_const(xp, "popcount8", lambda: _PC8)
    # uint8 counts per byte (as much memory as the bitmask itself; an int64 table would
    # take 8× — 16 GiB for the bench's 16K × 1M statistics run), summed in int64
    return pc[x.view(xp.uint8)].reshape(x.shape[0], -1).sum(axis=1, dtype=xp.int64)


# ---------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefineLaunch:
    """Refinement launches of one batch ``b`` against τ (fp32 [Qn]): ``per_query`` passes
    the kernel the arguments in its parameter order and appends the records s ≥ τ of the
    refined (query, key) pairs to ``out`` (rows of ``b``)."""

    b: Batch
    tau: object

    def per_query(self, qlist, surv, out: RecordBuffer, spill: SpillBuffer | None = None) -> None:
        """The batch's scorer's refine kernel (refine.cu refine_mt*, score_fp8.cu
        refine_fp8_h*; one parameter list): survivors of surv[t] (uint32 [Qn, NW]) for t in
        qlist (int32) → out.rec[t], out.cnt[t]; with ``spill`` (FP8 only), the records past
        a row's cap appended to it (refine_fp8_spill_h*: the parameter list and the spill's)."""
        b = self.b
        args = (b.q, b.w, b.kp, b.ksc, self.tau, b.ks, b.ke, qlist, np.int64(b.N), surv)
        if b.scorer == "fp8":
            name = "refine_fp8_spill_h" if spill is not None else "refine_fp8_h"
            f, grid, block = kernel(f"{name}{16 * b.mth}", 0, FP8_SPEC), -(-b.NW // RWF), 128
        else:
            f = kernel(f"refine_mt{b.mth}")
            grid, block = -(-b.NW // (REFINE_WARPS * RW)), 32 * REFINE_WARPS
        tail = out.args() + (spill.args() if spill is not None else ())
        f((int(qlist.size), grid), (block,), args + tail)


def refine_stage(b: Batch, tau, surv, cap: int, extend: bool = True,
                 spill: bool = False) -> Records:  # fmt: skip
    """Refinement with compact writeback and the exact extension on overflow (docs/method.md
    §7 C.3, §9): τ fp32 [Qn], surv uint32 [Qn, NW], ``cap`` records per query in the first
    pass.  Returns the ``Records``; the records of query t (s ≥ τ_t, one per surviving
    key) are ``Records.row(t)``.  ``spill``: on the FP8 scorer, the records past a row's
    cap are kept in ``Records.spill`` for the extension (``SPILL``).  With ``extend=False``
    the overflowed rows are only flagged (``Records.over``, no synchronization): their
    records are incomplete and the caller must finish those queries another way
    (``extend_records``; capture.py re-runs them)."""
    xp = cupy_or_raise()
    first = RecordBuffer(b.Qn, cap)
    sp = SpillBuffer(int(b.Qn * cap * SPILL_RATIO)) if spill and b.scorer == "fp8" else None
    RefineLaunch(b, tau).per_query(xp.arange(b.Qn, dtype=xp.int32), surv, first, sp)
    recs = Records(first.rec, first.cnt, first.cnt > first.cap, spill=sp)
    if not extend:
        return recs
    return extend_flagged(recs, _extension(b, tau, surv, recs, None), b.K)


def extend_records(b: Batch, tau, surv, recs: Records, counted=None,
                   spilled: int | None = None) -> Records:  # fmt: skip
    """The exact extension of ``refine_stage(..., extend=False)``'s records (``recs.over``
    flagged): the overflowed rows' complete lists (``recs.ext``; ``select.extend_flagged``,
    with its ``counted`` read back by the caller), from the spill where it held every record
    past cap (``spilled``: its count, read back by the caller; None: read here), else refined
    again — the extension after the caller has read the flags back (``DEFERRED_EXTENSION``)."""
    return extend_flagged(recs, _extension(b, tau, surv, recs, spilled), b.K, counted)


def _extension(b: Batch, tau, surv, recs: Records, spilled: int | None):
    """``select.extend_flagged``'s rescore(rows int32 [n], cap2, floor fp32 [n] or None) →
    RecordBuffer [n, cap2] of the rows' records s ≥ max(τ, floor): from the first pass's
    kept and spilled records where the spill holds every record past cap (``spilled`` ≤ its
    capacity), else their survivors refined again (``_rescore``).  The spill's count is read
    only when a row overflowed."""
    again = _rescore(b, tau, surv)
    sp = recs.spill
    if sp is None:
        return again

    def extend(oq, cap2, floor):
        xp = cupy_or_raise()
        ns = int(sp.count[0]) if spilled is None else int(spilled)
        if ns > sp.cap:  # the spill was full: records past cap are lost, score them again
            return again(oq, cap2, floor)
        n, cap = int(oq.size), int(recs.rec.shape[1])
        out = RecordBuffer(n, cap2)
        slot = xp.full(recs.cnt.shape[0], -1, dtype=xp.int32)
        slot[oq] = xp.arange(n, dtype=xp.int32)
        grid = max(1, min(-(-(n * cap + ns) // 256), 4096))
        kernel("extend_from_spill")(
            (grid,), (256,),
            (recs.rec, np.int64(cap), oq, np.int32(n), slot, sp.rec, sp.row, np.int64(ns),
             xp.ascontiguousarray(raised_tau(tau, oq, floor), dtype=xp.float32)) + out.args(),
        )  # fmt: skip
        return out

    return extend


def _rescore(b: Batch, tau, surv):
    """rescore(rows int32 [n], cap2, floor fp32 [n] or None) → RecordBuffer [n, cap2]: the
    rows' survivors refined again as a sub-problem of those rows against max(τ, floor)
    (``select.extend_flagged``'s argument)."""
    xp = cupy_or_raise()

    def rescore(oq, cap2, floor):
        out = RecordBuffer(int(oq.size), cap2)
        sub = RefineLaunch(b.rows(oq), raised_tau(tau, oq, floor))
        sub.per_query(xp.arange(int(oq.size), dtype=xp.int32), surv[oq], out)
        return out

    return rescore
