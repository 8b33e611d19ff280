"""The refine stage (docs/method.md §9): the per-query stream and the shared stream of query
groups, with compact writeback and the exact overflow extension (``refine_stage``).

* ``stream="per_query"`` (default): ``refine_mt*`` (refine.cu) scores every survivor of
  ``surv[t]`` for query t.  Blocks take (query, word chunk) with the query index fastest,
  so gathered keys are shared through L2 by the queries that refine them.
* ``stream="shared"``: ``split_shared`` splits the survivor masks into the groups' shared
  sets (groups of 4 consecutive queries; a key is shared iff it lies in the group's common
  visible range [max ks, min ke) and survives for ≥ 2 of the group's queries) and residual
  masks ``surv[t] & ~shared[t // 4]``.  ``refine_shared_mt*`` (csrc/refine_shared.cu)
  gathers each shared key once and scores it for every query of the group whose survivor
  bit is set; ``refine_mt*`` refines the residual masks.  Both append to the same
  per-query record buffers and counters, so the selection is unchanged.  Every
  (query, surviving key) pair is refined by exactly one of the two streams (a partition
  of the survivor bits), so each record s ≥ τ is written exactly once; the kept records
  are the same set as with the per-query stream.

Both kernels call the canonical scorer ``dosa::score_batch`` (common.cuh), so every score
equals the dense route's bit for bit.  Overflow: the counters count every qualifying
record (shared + residual); the rows with count > capacity are refined again by the
per-query stream over their whole survivor rows (the union of the shared and residual
bits, so the same record set whichever stream ran first) as a sub-problem of those rows
only (``select.extend_overflow``).

The split is written once for numpy and CuPy (``xp``); tests/test_refine_shared.py checks
its properties and emulates the kernels' loop decomposition on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._build import CSRC, cupy_or_raise, device_const, kernel, raise_smem_limit, source_module
from .prepare import Batch
from .select import RecordBuffer, Records, extend_overflow

__all__ = [
    "GROUP",
    "STREAMS",
    "RefineLaunch",
    "common_range_masks",
    "group_majority",
    "popcount_rows",
    "refine_stage",
    "shared_smem_bytes",
    "split_shared",
]

GROUP = 4  # queries per group (refine_shared.cu RS_G)
RS_WARPS = 8  # warps per block of refine_shared (RS_WARPS)
RS_W = 256  # shared-mask words per warp (RS_W)
RS_BUF = 1024 + 32  # per-warp id buffer (RS_BUF)
RW = 256  # words per warp of the per-query refine (refine.cu RW)
REFINE_WARPS = 8  # warps per block of the per-query refine
STREAMS = ("per_query", "shared")
SHARED_FILE = CSRC / "refine_shared.cu"

_ALL = np.uint32(0xFFFFFFFF)


# ---------------------------------------------------------------------------------------
# The split (numpy or CuPy, word-level uint32 arithmetic)
# ---------------------------------------------------------------------------------------


def _group_rows(x, xp):
    """[Qn, NW] → [NG, GROUP, NW], the last group padded with zero rows."""
    Qn, NW = x.shape
    NG = -(-Qn // GROUP)
    pad = NG * GROUP - Qn
    if pad:
        x = xp.concatenate([x, xp.zeros((pad, NW), dtype=x.dtype)], axis=0)
    return x.reshape(NG, GROUP, NW)


def group_majority(surv, xp=np):
    """uint32 [NG, NW]: bit i of word j set iff bit i of word j of ≥ 2 of the group's rows
    of ``surv`` uint32 [Qn, NW] is set (groups of GROUP = 4 consecutive rows; a short last
    group is padded with zero rows).  Popcount-free: for words a, b, c, d,
    "≥ 2 set" = (a&b) | (a&c) | (a&d) | (b&c) | (b&d) | (c&d)."""
    g = _group_rows(surv.astype(xp.uint32, copy=False), xp)
    a, b, c, d = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
    return (a & b) | (a & c) | (a & d) | (b & c) | (b & d) | (c & d)


def group_ranges(ks, ke, xp=np):
    """Common visible range [lo, hi) of each group: int64 [NG] each (hi ≤ lo: empty)."""
    ks = ks.astype(xp.int64)
    ke = ke.astype(xp.int64)
    Qn = ks.shape[0]
    NG = -(-Qn // GROUP)
    pad = NG * GROUP - Qn
    if pad:  # padding rows do not narrow the range
        ks = xp.concatenate([ks, xp.full(pad, -1, dtype=xp.int64)])
        ke = xp.concatenate([ke, xp.full(pad, np.iinfo(np.int64).max, dtype=xp.int64)])
    return ks.reshape(NG, GROUP).max(axis=1), ke.reshape(NG, GROUP).min(axis=1)


def _bits_below(n, xp):
    """uint32 with the low n bits set, n int64 in [0, 32] (elementwise)."""
    one = xp.uint64(1)  # xp's ufunc with the array operand (no numpy-scalar-left operator)
    return (xp.left_shift(one, n.astype(xp.uint64)) - one).astype(xp.uint32)


def common_range_masks(ks, ke, NW, xp=np):
    """uint32 [NG, NW]: bit i of word j set iff key 32j + i lies in the group's common
    visible range [max ks, min ke) — full words inside, partial first / last words
    masked bit by bit, zero outside (and for empty ranges)."""
    lo, hi = group_ranges(ks, ke, xp)
    NG = lo.shape[0]
    j = xp.arange(NW, dtype=xp.int64)[None, :]
    inside = (32 * j >= lo[:, None]) & (32 * j + 32 <= hi[:, None])
    m = xp.where(inside, _ALL, np.uint32(0)).astype(xp.uint32)
    ok = xp.flatnonzero(hi > lo)
    if ok.size:
        lo_, hi_ = lo[ok], hi[ok]
        for wj in (lo_ >> 5, (hi_ - 1) >> 5):  # the (at most two) partial words
            a = xp.clip(lo_ - 32 * wj, 0, 32)
            b = xp.clip(hi_ - 32 * wj, 0, 32)
            m[ok, wj] = _bits_below(b, xp) & ~_bits_below(a, xp)
    assert m.shape == (NG, NW)
    return m


def split_shared(surv, ks, ke, xp=np):
    """Split the survivor masks (docs/method.md §9): (shared uint32 [NG, NW], residual uint32
    [Qn, NW]).  shared[g] = keys in group g's common visible range that survive for ≥ 2
    of its queries; residual[t] = surv[t] with exactly the bits of shared[t // 4] cleared.
    For every query t: (shared[t // 4] & surv[t]) and residual[t] are disjoint and their
    union is surv[t] (the shared kernel emits only where surv[t] is set)."""
    surv = surv.astype(xp.uint32, copy=False)
    Qn, NW = surv.shape
    shared = group_majority(surv, xp) & common_range_masks(ks, ke, NW, xp)
    resid = surv & ~xp.repeat(shared, GROUP, axis=0)[:Qn]
    return xp.ascontiguousarray(shared), xp.ascontiguousarray(resid)


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


def shared_smem_bytes(mt: int) -> int:
    """Dynamic shared memory of refine_shared_mt<mt> (refine_shared.cu RS_SMEM)."""
    return GROUP * mt * 8 * 32 * 16 + GROUP * mt * 16 * 4 + RS_WARPS * RS_BUF * 4


def _shared_kernel(name: str, smem: int):
    """refine_shared.cu kernel with its dynamic shared-memory limit raised to ``smem``
    (always: the default 48 KB counts static + dynamic together)."""
    f = source_module(SHARED_FILE).get_function(name)
    return raise_smem_limit(f, smem, "refine_shared", name)


@dataclass(frozen=True)
class RefineLaunch:
    """Refinement launches of one batch ``b`` against τ (fp32 [Qn]): each method passes its
    kernel the arguments in the kernel's parameter order and appends the records s ≥ τ of
    the refined (query, key) pairs to ``out`` (rows of ``b``)."""

    b: Batch
    tau: object

    def per_query(self, qlist, surv, out: RecordBuffer) -> None:
        """refine.cu refine_mt*: survivors of surv[t] (uint32 [Qn, NW]) for t in qlist
        (int32) → out.rec[t], out.cnt[t]."""
        b = self.b
        gx = (b.NW + REFINE_WARPS * RW - 1) // (REFINE_WARPS * RW)
        kernel(f"refine_mt{b.mth}")(
            (int(qlist.size), gx),
            (32 * REFINE_WARPS,),
            (b.q, b.w, b.kp, b.ksc, self.tau, b.ks, b.ke, qlist, np.int64(b.N), surv) + out.args(),
        )

    def shared(self, glist, shared, surv, out: RecordBuffer) -> None:
        """refine_shared.cu refine_shared_mt*: shared sets (uint32 [NG, NW]) of the groups
        in glist (int32) → out.rec[t], out.cnt[t] for the group's queries t whose survivor
        bit is set."""
        b = self.b
        gy = (b.NW + RS_WARPS * RS_W - 1) // (RS_WARPS * RS_W)
        smem = shared_smem_bytes(b.mth)
        _shared_kernel(f"refine_shared_mt{b.mth}", smem)(
            (int(glist.size), gy),
            (32 * RS_WARPS,),
            (
                b.q, b.w, b.kp, b.ksc, self.tau, b.ks, b.ke, np.int32(b.Qn), glist,
                np.int64(b.N), shared, surv,
            ) + out.args(),
            shared_mem=smem,
        )  # fmt: skip


def refine_stage(b: Batch, tau, surv, cap: int, stream: str = "per_query",
                 extend: bool = True):  # fmt: skip
    """Refinement with compact writeback and the exact extension on overflow (docs/method.md
    §7 C.3, §9): τ fp32 [Qn], surv uint32 [Qn, NW], ``cap`` records per query in the first
    pass.  Returns (``Records``, shared uint32 [NG, NW] or None); the records of query t
    (s ≥ τ_t, one per surviving key, whichever stream) are ``Records.row(t)``.  With
    ``extend=False`` the overflowed rows are only flagged (``Records.over``, no
    synchronization): their records are incomplete and the caller must finish those
    queries another way (capture.py re-runs them)."""
    if stream not in STREAMS:
        raise ValueError(f"stream: expected one of {STREAMS}, got {stream!r}")
    xp = cupy_or_raise()
    first = RecordBuffer(b.Qn, cap)
    launch = RefineLaunch(b, tau)
    shared = None
    resid = surv
    if stream == "shared":
        shared, resid = split_shared(surv, b.ks, b.ke, xp)
        launch.shared(xp.arange(shared.shape[0], dtype=xp.int32), shared, surv, first)
    launch.per_query(xp.arange(b.Qn, dtype=xp.int32), resid, first)

    def rescore(oq, cap2):
        out = RecordBuffer(int(oq.size), cap2)
        sub = RefineLaunch(b.rows(oq), tau[oq])
        sub.per_query(xp.arange(int(oq.size), dtype=xp.int32), surv[oq], out)
        return out

    if not extend:
        return Records(first.rec, first.cnt, first.cnt > first.cap), shared
    return extend_overflow(first, rescore), shared
