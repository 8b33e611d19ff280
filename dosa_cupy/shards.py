"""Exact Top-K over a context split into contiguous shards, on the GPU (docs/method.md §12
"Sharded contexts"; the reference and its proof: ``dosa_ref.shards``).

Each shard holds the keys [start, start + n) of the context.  A shard's seeds are real keys,
and the shards' seeds are disjoint, so the K-th score of the union of the shards' best K
seeds is a lower bound on the context's K-th score — at least every shard's own τ: every
shard screens against that floor (``dosa_topk``'s ``tau_floor``), keeps its Top-K (which
holds every key of the context's Top-K that lies in the shard), and the lists — as records
(score code, ~global id), the canonical scores of the selected keys — are merged exactly by
one descending sort per query: (score desc, global id asc), the selection's order.

    sharded_topk(...)        every shard in this process (one GPU): the merge's check, and
                             what a rank computes
    distributed_topk(...)    one shard per rank of a ``torch.distributed`` group (NCCL on
                             GPUs): one ``all_gather`` of the best seed records [Qn, K], one
                             of the lists [Qn, K] — sizes that do not depend on the data
    sharded_decode_step(...), distributed_decode_step(...)
                             a decode step over a paged cache split into page-aligned shards
                             (``DecodeShard``): the union's τ of the shards' witnesses

A shard's seeds are scored twice (for the floor, and again inside ``dosa_topk``), as in the
reference.
"""

from __future__ import annotations

import numpy as np

from dosa_ref.shards import local_ranges, shard_starts

from ._build import cupy_or_raise
from .decode_ops import PAGE

__all__ = [
    "distributed_topk",
    "global_records",
    "merge_records",
    "selection_records",
    "shard_records",
    "shard_seed_records",
    "shard_starts",
    "shard_tau",
    "sharded_topk",
    "union_floor",
]

_LOW = np.uint64(0xFFFFFFFF)


def _local(ks, ke, start: int, n: int, xp):
    """Visible ranges ks, ke int [Qn] of the context clipped to the shard [start, start + n),
    in the shard's ids (dosa_ref.shards.local_ranges): int32 [Qn] each."""
    lo, hi = local_ranges(ks, ke, start, start + n, xp)
    return lo.astype(xp.int32), hi.astype(xp.int32)


def shard_tau(q, w, kp, ksc, K: int, ks, ke, start: int, **options):
    """fp32 [Qn] (CuPy): per query, the τ of the shard's own seeds (``seeds.seed_stage`` with
    the options' strategies: the K-th largest canonical score among them, −inf with fewer
    than K) — a lower bound on the context's K-th score.  kp uint8 [n, 128], ksc fp32 [n]:
    the shard's keys, whose first is the context's key ``start``; ks, ke: the context's
    visible ranges.  The K-th of its own best seed records (``union_floor`` of one shard)."""
    return union_floor([shard_seed_records(q, w, kp, ksc, K, ks, ke, start, **options)], K)


def shard_seed_records(q, w, kp, ksc, K: int, ks, ke, start: int, **options):
    """uint64 [Qn, K] (CuPy): per query, the records (score code, ~global id) of the K best
    of the shard's own seeds (``seeds.seed_stage`` with the options' strategies; their
    canonical scores, ``selection_records``), 0 in unused slots — distinct visible keys of
    the context.  The shards' seeds are disjoint, so the K-th record of the union of every
    shard's list (``union_floor``) is the τ of distinct keys of the context: a lower bound on
    its K-th score, at least every shard's own τ.  Arguments as ``shard_tau``."""
    from .dense import select_records
    from .options import start as begin
    from .seeds import seed_stage

    cp = cupy_or_raise()
    _check_sharded_options(options)
    n, Qn = int(kp.shape[0]), int(q.shape[0])
    if n == 0:
        return cp.zeros((Qn, int(K)), dtype=cp.uint64)
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), n, cp)
    o, _, _, b, empty = begin(q, w, kp, ksc, K, lo, hi, dict(options, tau_floor=None))
    if empty is not None:
        return cp.zeros((Qn, int(K)), dtype=cp.uint64)
    b.raise_if_bad()
    seeds = seed_stage(b, o)
    ids, _ = select_records(b.K, seeds.default.rec, seeds.default.cnt)
    return selection_records(q, w, kp, ksc, K, lo, hi, ids, int(start), b.scorer)


def union_floor(parts, K: int):
    """fp32 [Qn] (CuPy): the score of the K-th record of the union of the shards' lists
    ``parts`` (``shard_seed_records``, uint64 [Qn, K_r] each, 0 in unused slots); −inf where
    the union holds fewer than K records, and where that record's score is NaN or +inf (a
    query that ``dosa_topk`` recovers by the dense route: −inf, the bound that always holds).
    """
    from .select import score_of_records, union_kth

    cp = cupy_or_raise()
    tau = score_of_records(union_kth(parts, K))
    return cp.where(cp.isnan(tau) | (tau == cp.inf), cp.float32(-cp.inf), tau)


def global_records(rec, cnt, start: int, xp):
    """Records uint64 [Qn, S] of shard ids (``select`` order: code << 32 | ~id), the first
    cnt[t] of row t valid, → the same records with global ids id + ``start`` and every other
    slot 0 (below every record of a real key: its id would be 2^32 − 1).  xp: numpy or CuPy."""
    rec = xp.asarray(rec, dtype=xp.uint64)
    valid = xp.arange(rec.shape[1])[None, :] < xp.asarray(cnt).astype(xp.int64)[:, None]
    ids = (~(rec & _LOW)) & _LOW  # the shard's ids (< 2^31)
    relabeled = (rec & ~_LOW) | ((~(ids + np.uint64(start))) & _LOW)
    return xp.where(valid, relabeled, np.uint64(0))


def merge_records(parts, K: int, xp):
    """The exact Top-K ids int64 [Qn, K] of the shards' records ``parts`` (uint64 [Qn, S_r]
    each, global ids, 0 in unused slots): one descending sort of each query's records
    (record order = score desc, id asc), the first K, −1 where a query has fewer."""
    rec = xp.concatenate([xp.asarray(p, dtype=xp.uint64) for p in parts], axis=1)
    top = xp.sort(rec, axis=1)[:, ::-1][:, :K]
    ids = ((~(top & _LOW)) & _LOW).astype(xp.int64)
    out = xp.where(top == 0, -1, ids)
    if out.shape[1] < K:  # fewer slots than K in all: −1 padding
        pad = xp.full((out.shape[0], K - out.shape[1]), -1, dtype=xp.int64)
        out = xp.concatenate([out, pad], axis=1)
    return xp.ascontiguousarray(out)


def shard_records(q, w, kp, ksc, K: int, ks, ke, start: int, floor=None, **options):
    """One shard's list: its Top-K by ``dosa_topk`` (screened against ``floor`` fp32 [Qn] where
    it is above the shard's own τ; None: its own) as records uint64 [Qn, K] with global ids
    (``selection_records``).  Arguments as ``shard_tau``."""
    from .pipeline import dosa_topk

    cp = cupy_or_raise()
    _check_sharded_options(options)
    n, Qn = int(kp.shape[0]), int(q.shape[0])
    if n == 0:  # an empty shard: no key, no record
        return cp.zeros((Qn, int(K)), dtype=cp.uint64)
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), n, cp)
    ids = dosa_topk(q, w, kp, ksc, K, lo, hi, tau_floor=floor, **options)
    return selection_records(q, w, kp, ksc, K, lo, hi, ids, int(start),
                             options.get("scorer", "f16"))  # fmt: skip


def selection_records(q, w, kp, ksc, K: int, lo, hi, ids, start: int, scorer: str = "f16"):
    """The records uint64 [Qn, K] (global ids, ``global_records``) of a shard's selection
    ``ids`` int [Qn, K] (local ids, −1 padding; the shard's keys kp, ksc and local ranges lo,
    hi): their canonical scores on ``scorer`` (``seeds.score_seed_ids``).  A selected key
    whose score is NaN gets the record of code 0, as the selection orders it: the f16 seed
    kernel records no NaN score, and the selection puts the NaN keys last, so they are the
    row's ids past its count."""
    from .prepare import pad_batch
    from .seeds import score_seed_ids

    cp = cupy_or_raise()
    b = pad_batch(q, w, kp, ksc, K, lo, hi, check=False, scorer=scorer)
    rec, cnt = score_seed_ids(b, cp.ascontiguousarray(ids.astype(cp.int32)))
    out = global_records(rec, cnt, int(start), cp)
    j = cp.arange(ids.shape[1])[None, :]
    nan = (j >= cnt.astype(cp.int64)[:, None]) & (ids >= 0)  # selected, not recorded: NaN
    code0 = (~(ids.astype(cp.uint64) + np.uint64(start))) & _LOW  # (0 << 32) | ~global id
    return cp.where(nan, code0, out)


_NOT_SHARDED = ("tau_floor", "seed_ids", "return_stats", "debug_bounds")


def _check_sharded_options(options: dict) -> None:
    """The options a sharded call sets itself (tau_floor) or cannot carry across shards
    (explicit seed ids are global, statistics per shard): ValueError naming the option."""
    for k in _NOT_SHARDED:
        v = options.get(k)
        if v is not None and v is not False:  # by identity: an array is never "off"
            raise ValueError(f"{k}: not available in a sharded call, got {type(v).__name__}")


def sharded_topk(q, w, kp, ksc, K: int, ks=None, ke=None, *, starts=None, **options):
    """Top-K ids int64 [Qn, K] of the keys kp [N, 128], ksc [N] held in the shards ``starts``
    (int [R + 1], ``shard_starts``; default two nearly equal shards), every shard in this
    process: the K-th of the union of the shards' best seeds as the floor (``union_floor``),
    each shard's records against it, the exact merge.  Equal to ``dense_topk`` (and
    ``dosa_topk``) on the whole context; options as ``dosa_topk``'s."""
    cp = cupy_or_raise()
    _check_sharded_options(options)
    N = int(kp.shape[0])
    Qn = int(q.shape[0])
    ks = cp.zeros(Qn, dtype=cp.int32) if ks is None else cp.asarray(ks)
    ke = cp.full(Qn, N, dtype=cp.int32) if ke is None else cp.asarray(ke)
    if ks.shape != (Qn,) or ke.shape != (Qn,):
        raise ValueError(f"ks: expected ks, ke of shape ({Qn},), got {ks.shape}, {ke.shape}")
    if Qn and bool(cp.any((ks < 0) | (ke > N) | (ks > ke))):  # the dense route's checks
        raise ValueError(f"ks: expected 0 <= ks <= ke <= N={N} for every query")
    starts = shard_starts(N, 2) if starts is None else np.asarray(starts, dtype=np.int64)
    if starts.ndim != 1 or starts[0] != 0 or starts[-1] != N or (np.diff(starts) < 0).any():
        raise ValueError(f"starts: expected 0 ≤ … ≤ N={N}, nondecreasing, got {starts.tolist()}")
    bounds = list(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True))
    floor = union_floor([shard_seed_records(q, w, kp[s0:s1], ksc[s0:s1], K, ks, ke, s0, **options)
                         for s0, s1 in bounds], K)  # fmt: skip
    parts = [shard_records(q, w, kp[s0:s1], ksc[s0:s1], K, ks, ke, s0, floor, **options)
             for s0, s1 in bounds]  # fmt: skip
    return merge_records(parts, K, cp)


def distributed_topk(q, w, kp, ksc, K: int, ks, ke, start: int, group=None, **options):
    """``sharded_topk`` with one shard per rank of the ``torch.distributed`` ``group``
    (default: the world; NCCL on GPUs): every rank passes the replicated chunk (q, w, the
    context's ranges ks, ke) and its shard kp, ksc whose first key is the context's key
    ``start``; an ``all_reduce`` of a rank's error flag, one ``all_gather`` of each rank's
    best seed records [Qn, K] gives every rank the floor (``union_floor``), each rank builds
    its records [Qn, K] against it, an ``all_reduce`` of the error flag and one
    ``all_gather`` of the records, and every rank returns the merged ids int64 [Qn, K]
    (CuPy).  An error on one rank (bad input) is raised
    on every rank after the collective it would have missed, so no rank waits for ever.
    CuPy runs on the current torch stream of q's device, so the collectives order with the
    kernels."""
    cp = cupy_or_raise()
    _check_sharded_options(options)
    ranks = _Ranks(group, cp)
    with ranks.stream(q):
        top, err = None, None
        try:
            top = shard_seed_records(q, w, kp, ksc, K, ks, ke, int(start), **options)
        except ValueError as e:
            err = e
        ranks.agreed_max(None, err, 0, cp.float32)
        floor = union_floor(ranks.gather(top), K)
        rec, err = None, None
        try:
            rec = shard_records(q, w, kp, ksc, K, ks, ke, int(start), floor, **options)
        except ValueError as e:
            err = e
        ranks.agreed_max(None, err, 0, cp.float32)
        return merge_records(ranks.gather(rec), K, cp)


class _Ranks:
    """The collectives of a sharded call over a ``torch.distributed`` group on arrays of
    ``xp``: numpy (gloo) or CuPy (NCCL, on the current torch stream of the arrays'
    device, so the collectives order with the kernels)."""

    def __init__(self, group, xp):
        import torch
        import torch.distributed as dist

        self.group, self.xp, self.torch, self.dist = group, xp, torch, dist

    def stream(self, q):
        """The context a device call runs in: the current torch stream of q's device."""
        import contextlib

        if self.xp is np:
            return contextlib.nullcontext()
        torch, cp = self.torch, self.xp
        dev = q.device.index if isinstance(q, torch.Tensor) else cp.cuda.Device().id
        stream = torch.cuda.current_stream(dev).cuda_stream
        stack = contextlib.ExitStack()
        stack.enter_context(cp.cuda.Device(dev))
        stack.enter_context(cp.cuda.ExternalStream(stream))
        return stack

    def _t(self, a):
        return self.torch.from_numpy(a) if self.xp is np else self.torch.from_dlpack(a)

    def _a(self, t):
        return t.numpy() if self.xp is np else self.xp.from_dlpack(t)

    def agreed_max(self, x, err, size: int, dtype):
        """x [size] of ``dtype`` (None where this rank failed: ``err``) all-reduced (max)
        with this rank's error flag appended; raises a ValueError on every rank when any
        rank failed (this rank's own ``err`` on it)."""
        xp = self.xp
        t = xp.zeros(size + 1, dtype=dtype)
        if x is not None:
            t[:size] = x
        t[size] = 1 if err is not None else 0
        tt = self._t(t)
        self.dist.all_reduce(tt, op=self.dist.ReduceOp.MAX, group=self.group)
        out = self._a(tt)
        if err is not None:
            raise err
        if float(out[size]) > 0:
            raise ValueError("a rank's shard: bad input on another rank of the sharded call")
        return out[:size]

    def gather(self, a):
        """Every rank's ``a`` (one shape on every rank; a tuple of arrays, or one array;
        uint64 travels as int64) by one ``all_gather`` each: a list in rank order."""
        if isinstance(a, tuple):
            return list(zip(*(self.gather(x) for x in a), strict=True))
        u64 = a.dtype == np.uint64
        local = self._t(self.xp.ascontiguousarray(a.view(self.xp.int64) if u64 else a))
        bufs = [self.torch.empty_like(local) for _ in range(self.dist.get_world_size(self.group))]
        self.dist.all_gather(bufs, local, group=self.group)
        out = [self._a(b) for b in bufs]
        return [x.view(self.xp.uint64) for x in out] if u64 else out


# --------------------------------------------------------------------------------------
# Decode over a sharded paged cache (docs/method.md §12 "Sharded contexts", §10)
# --------------------------------------------------------------------------------------


class DecodeShard:
    """One shard's part of a decode step (``dosa_ref.shards`` decode's rule, on a
    ``decode.DecodeSelectorGPU``): the shard holds the tokens [start, stop) of every
    request in its own paged cache (``kv_payload``, ``kv_scale``, ``block_table`` [B,
    max_blocks]: the shard's page i holds its tokens [64·i, 64·i + 64); stop None: as far as
    the table reaches, start + 64·max_blocks); ``lengths`` int [B] are the requests' global
    context lengths.  ``sel`` keeps the shard's witnesses in its
    local ids (global − start).

    The parts, in the order every shard runs them: ``top`` (each row's visible witnesses of
    the shard: the records of its K best with global ids, uint64 [R, ≤ K] on the device, 0
    past the count; their K largest scores float64 [R, K] on the numpy backend), then
    ``candidates(floor)`` with the floor of the union of every shard's ``top``
    (``sel.ops.union_floor``: the K-th of distinct visible witnesses of the context, the
    shards' witnesses being disjoint — the single cache's τ; a score code int64 [R] on the
    device, τ float64 [R] on the numpy backend) — the scan compacts every visible key at or
    above it, the shard selects their Top-K, and returns their records with global ids
    (device: uint64 [R, n·K], 0 in unused slots; numpy: ids int64 and scores float64
    [R, n·K], −1 / −inf) — and ``push`` of the merged ids.  Every shard's selector has the
    same K and history (one shape of ``top``)."""

    def __init__(self, sel, q, w, kv_payload, kv_scale, block_table, lengths, start: int,
                 stop=None):  # fmt: skip
        from .decode import visible_ends

        xp = sel.xp
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
            raise ValueError(f"start: expected an integer ≥ 0, got {start!r}")
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, (int, np.integer))
                                 or stop < start):  # fmt: skip
            raise ValueError(f"stop: expected None or an integer ≥ start={start}, got {stop!r}")
        if getattr(q, "ndim", 0) != 4:
            raise ValueError("q: expected shape [B, next_n, H, 128]")
        L = xp.asarray(lengths)
        if L.ndim != 1 or L.dtype.kind not in "iu":
            raise ValueError(f"lengths: expected integers [B], got {L.dtype} {tuple(L.shape)}")
        self.sel, self.start, n = sel, int(start), int(q.shape[1])
        if stop is None:  # as far as the shard's block table reaches
            stop = self.start + PAGE * int(getattr(block_table, "shape", (0, 0))[1])
        local = xp.clip(L.astype(xp.int64) - self.start, 0, int(stop) - self.start)
        ends = xp.minimum(visible_ends(L.astype(xp.int64) - self.start, n, xp), local[:, None])
        self.d, self.ws = sel.begin(q, w, kv_payload, kv_scale, block_table,
                                    local.astype(xp.int32), ends=ends)  # fmt: skip
        self.thr, self.wcnt = sel.ops.tau(self.d, self.ws)

    def top(self):
        """The shard's part of the union whose K-th is the floor (see the class): on the
        device its K largest witness records with global ids (records of two shards never
        repeat: the selection needs distinct records), K of them whatever the history."""
        top = self.sel.ops.witness_top(self.d, self.ws)
        if self.sel.backend == "numpy":
            return top
        cp, K = cupy_or_raise(), self.d["K"]
        cnt = self.ws.wcnt if self.ws.ring is not None else cp.zeros(top.shape[0], cp.uint32)
        rec = global_records(top, cnt, self.start, cp)
        if rec.shape[1] > K:  # the K largest: the union's K-th is among them
            rec = cp.ascontiguousarray(cp.sort(rec, axis=1)[:, -K:])
        return rec

    def candidates(self, floor):
        """The shard's list against ``floor`` (``sel.ops.union_floor`` of the shards' ``top``):
        see the class.  Also sets ``compacted`` (records at or above the floor per row)."""
        sel, ops, d, ws = self.sel, self.sel.ops, self.d, self.ws
        thr = ops.thr_of_floor(floor)
        cap = d["L"] if sel.buffer is None else sel.buffer
        rec, cnt = ops.scan(d, thr, cap, ws)
        if sel.buffer is not None:
            need = ops.max_count(cnt)
            if need > cap:  # the exact extension, as in a step
                rec, cnt = ops.scan(d, thr, need, ws, again=True)
        self.compacted = cnt
        ids, _ = ops.select(d, rec, cnt, False, ws)
        if sel.backend == "numpy":
            lists, _ = ops.selected_records(d, ids)
            R, m = len(lists), d["n"] * d["K"]
            gid, sc = np.full((R, m), -1, np.int64), np.full((R, m), -np.inf)
            for r, (s, i) in enumerate(lists):
                gid[r, : i.size], sc[r, : i.size] = i + self.start, s
            return gid, sc
        cp = cupy_or_raise()
        R, m = d["B"] * d["n"], d["n"] * d["K"]
        bufs = _SelectedBufs(cp.empty((d["B"], m), cp.int32), cp.empty((R, m), cp.uint64),
                             cp.zeros(R, cp.uint32))  # fmt: skip
        wrec, wcnt = ops.selected_records(d, ids, bufs)
        return global_records(wrec, wcnt, self.start, cp)

    def push(self, merged) -> None:
        """The merged ids int64 [B, n, K] (global) as the shard's witnesses: those it holds,
        in its local ids."""
        xp, d = self.sel.xp, self.d
        g = xp.asarray(merged).reshape(d["B"] * d["n"], d["K"]).astype(xp.int64)
        hi = xp.repeat(d["lengths"].astype(xp.int64), d["n"])[:, None] + self.start
        local = xp.where((g >= self.start) & (g < hi), g - self.start, -1)
        self.sel.ops.push(d, self.ws, xp.ascontiguousarray(local.astype(xp.int32)))


class _SelectedBufs:
    def __init__(self, wit, wrec, wcnt):
        self.wit, self.wrec, self.wcnt = wit, wrec, wcnt


def merge_candidates(parts, K: int, xp):
    """The exact Top-K ids int64 [R, K] of the shards' ``DecodeShard.candidates``."""
    if xp is np:
        from dosa_ref.shards import merge_topk

        return merge_topk(parts, K)
    return merge_records(parts, K, xp)


def _check_shard_starts(starts, mb: int) -> list:
    """(start, stop) pairs of the page-aligned shards ``starts`` of a cache of ``mb`` pages."""
    s = np.asarray(starts)
    if s.ndim != 1 or s.size < 2 or s.dtype.kind not in "iu":
        raise ValueError(f"starts: expected integers [R + 1], got {s.tolist()}")
    s = s.astype(np.int64)
    if s[0] != 0 or s[-1] < mb * PAGE or (np.diff(s) < 0).any() or (s[1:-1] % PAGE).any():
        raise ValueError(f"starts: expected 0 ≤ … nondecreasing multiples of 64, the last "
                         f"≥ max_blocks·64 = {mb * PAGE}, got {s.tolist()}")  # fmt: skip
    return list(zip(s[:-1].tolist(), s[1:].tolist(), strict=True))


def sharded_decode_step(sels, q, w, kv_payload, kv_scale, block_table, lengths, starts):
    """One decode step (``DecodeSelectorGPU.step``'s ids) over a paged cache split into the
    page-aligned shards ``starts`` (int [R + 1]: 0, multiples of 64, the last ≥
    max_blocks·64), every shard in this process: shard r is the pages [s_r/64, s_{r+1}/64)
    of the block table, ``sels[r]`` its selector (its witnesses in its local ids).  The K-th
    of the union of the shards' witnesses (the single cache's τ) is every shard's threshold,
    each shard's Top-K is merged exactly.  Returns ids int64 [B, next_n, K] (the backend's
    array type)."""
    if not isinstance(sels, (list, tuple)) or not sels:
        raise ValueError("sels: expected a list of DecodeSelectorGPU, one per shard")
    xp = sels[0].xp
    bt = xp.asarray(block_table)
    if bt.ndim != 2:
        raise ValueError(f"block_table: expected [B, max_blocks], got {tuple(bt.shape)}")
    bounds = _check_shard_starts(starts, int(bt.shape[1]))
    if len(bounds) != len(sels):
        raise ValueError(f"sels: expected {len(bounds)} selectors (one per shard), got {len(sels)}")
    shards = []
    for sel, (s0, s1) in zip(sels, bounds, strict=True):
        p0, p1 = s0 // PAGE, max(s0 // PAGE + 1, -(-s1 // PAGE))
        part = bt[:, p0:p1]
        if part.shape[1] == 0:  # a shard past the table (it holds no token): one unused page
            part = xp.zeros((bt.shape[0], 1), dtype=bt.dtype)
        shards.append(DecodeShard(sel, q, w, kv_payload, kv_scale, xp.ascontiguousarray(part),
                                  lengths, s0, s1))  # fmt: skip
    d = shards[0].d
    floor = sels[0].ops.union_floor([sh.top() for sh in shards], d["K"])  # the all-gather
    parts = [sh.candidates(floor) for sh in shards]
    out = merge_candidates(parts, d["K"], xp).reshape(d["B"], d["n"], d["K"])
    for sh in shards:
        sh.push(out)
    return out


def distributed_decode_step(sel, q, w, kv_payload, kv_scale, block_table, lengths, start: int,
                            stop=None, group=None):  # fmt: skip
    """One decode step over a cache split across the ranks of the ``torch.distributed``
    ``group`` (default: the world; NCCL on GPUs, gloo for the numpy backend): every rank
    passes the replicated step (q, w, the requests' global ``lengths``), its own shard's
    paged cache (``kv_payload``, ``kv_scale``, ``block_table``: the tokens [start, stop) of
    every request; stop None: as far as its table reaches) and its own selector ``sel``
    (``DecodeSelectorGPU``: the shard's witnesses; the same K and history on every rank).
    An ``all_reduce`` of an error flag, one ``all_gather`` of the rows' witnesses
    (``DecodeShard.top``: the floor is the K-th of their union), the error flag again, one
    ``all_gather`` of each rank's candidates [B·next_n, next_n·K]; returns the merged ids
    int64 [B, next_n, K] on every rank — ``sharded_decode_step``'s (and a single cache's)
    ids.  A rank's bad input is raised on every rank."""
    xp = sel.xp
    B, n = int(q.shape[0]), int(q.shape[1])  # q is replicated: malformed alike everywhere
    ranks = _Ranks(group, xp)
    with ranks.stream(q):
        shard, err = None, None
        try:
            shard = DecodeShard(sel, q, w, kv_payload, kv_scale, block_table, lengths, start, stop)
        except ValueError as e:
            err = e
        ranks.agreed_max(None, err, 0, np.float32)
        floor = sel.ops.union_floor(ranks.gather(shard.top()), sel.K)
        cand, err = None, None
        try:
            cand = shard.candidates(floor)
        except ValueError as e:
            err = e
        ranks.agreed_max(None, err, 0, np.float32)
        out = merge_candidates(ranks.gather(cand), sel.K, xp).reshape(B, n, sel.K)
        shard.push(out)
        return out
