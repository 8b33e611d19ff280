"""Exact Top-K over a context split into contiguous shards, on the GPU (docs/method.md §12
"Sharded contexts"; the reference and its proof: ``dosa_ref.shards``).

Each shard holds the keys [start, start + n) of the context.  A shard's seeds are real keys,
so the K-th score among them (its τ) is a lower bound on the context's K-th score, and so is
the largest τ of all the shards: every shard screens against that floor (``dosa_topk``'s
``tau_floor``), keeps its Top-K (which holds every key of the context's Top-K that lies in
the shard), and the lists — as records (score code, ~global id), the canonical scores of the
selected keys — are merged exactly by one descending sort per query: (score desc, global id
asc), the selection's order.

    sharded_topk(...)        every shard in this process (one GPU): the merge's check, and
                             what a rank computes
    distributed_topk(...)    one shard per rank of a ``torch.distributed`` group (NCCL on
                             GPUs): one ``all_reduce`` (max) of τ [Qn], one ``all_gather`` of
                             the records [Qn, K] — sizes that do not depend on the data

A shard's seeds are scored twice (for its τ, and again inside ``dosa_topk``), as in the
reference.
"""

from __future__ import annotations

import numpy as np

from dosa_ref.shards import local_ranges, shard_starts

from ._build import cupy_or_raise

__all__ = [
    "distributed_topk",
    "global_records",
    "merge_records",
    "shard_records",
    "shard_starts",
    "shard_tau",
    "sharded_topk",
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
    visible ranges."""
    from .options import start as begin
    from .seeds import seed_stage

    cp = cupy_or_raise()
    _check_sharded_options(options)
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), int(kp.shape[0]), cp)
    o, _, _, b, empty = begin(q, w, kp, ksc, K, lo, hi, dict(options, tau_floor=None))
    if empty is not None:
        return cp.full(b.Qn, -np.inf, dtype=cp.float32)
    b.raise_if_bad()
    tau = seed_stage(b, o).tau
    # a NaN (a K-th seed of NaN score) or +inf τ comes from a query that dosa_topk recovers
    # by the dense route (invalid scales, the envelope): −inf, the bound that always holds
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
    (``global_records``): the canonical scores of the selected keys (``seeds.score_seed_ids``,
    the call's scorer).  Arguments as ``shard_tau``.  A selected key whose score is NaN (an
    invalid scale, which ``dosa_topk`` recovers by the dense route) gets the record of code
    0, as the selection orders it: the f16 seed kernel records no NaN score, and the
    selection puts the NaN keys last, so they are the row's ids past its count."""
    from .pipeline import dosa_topk
    from .prepare import pad_batch
    from .seeds import score_seed_ids

    cp = cupy_or_raise()
    _check_sharded_options(options)
    n, Qn = int(kp.shape[0]), int(q.shape[0])
    if n == 0:  # an empty shard: no key, no record
        return cp.zeros((Qn, int(K)), dtype=cp.uint64)
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), n, cp)
    ids = dosa_topk(q, w, kp, ksc, K, lo, hi, tau_floor=floor, **options)
    b = pad_batch(q, w, kp, ksc, K, lo, hi, check=False,
                  scorer=options.get("scorer", "f16"))  # fmt: skip
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
    process: the shards' largest τ as the floor, each shard's records against it, the exact
    merge.  Equal to ``dense_topk`` (and ``dosa_topk``) on the whole context; options as
    ``dosa_topk``'s."""
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
    floor = cp.full(Qn, -np.inf, dtype=cp.float32)
    for s0, s1 in bounds:
        t = shard_tau(q, w, kp[s0:s1], ksc[s0:s1], K, ks, ke, s0, **options)
        floor = cp.maximum(floor, t)
    parts = [shard_records(q, w, kp[s0:s1], ksc[s0:s1], K, ks, ke, s0, floor, **options)
             for s0, s1 in bounds]  # fmt: skip
    return merge_records(parts, K, cp)


def distributed_topk(q, w, kp, ksc, K: int, ks, ke, start: int, group=None, **options):
    """``sharded_topk`` with one shard per rank of the ``torch.distributed`` ``group``
    (default: the world; NCCL on GPUs): every rank passes the replicated chunk (q, w, the
    context's ranges ks, ke) and its shard kp, ksc whose first key is the context's key
    ``start``; one ``all_reduce`` (max) of τ fp32 [Qn] — with one more element, a rank's
    error flag — gives every rank the floor, each rank builds its records [Qn, K] against it,
    an ``all_reduce`` of the error flag and one ``all_gather`` of the records, and every rank
    returns the merged ids int64 [Qn, K] (CuPy).  An error on one rank (bad input) is raised
    on every rank after the collective it would have missed, so no rank waits for ever.
    CuPy runs on the current torch stream of q's device, so the collectives order with the
    kernels."""
    import torch
    import torch.distributed as dist

    cp = cupy_or_raise()
    _check_sharded_options(options)
    dev = q.device.index if isinstance(q, torch.Tensor) else cp.cuda.Device().id
    stream = torch.cuda.current_stream(dev).cuda_stream
    Qn = int(q.shape[0])

    def agreed(flag: float, payload=None):
        """payload fp32 [Qn] (or None) with the flag appended, all-reduced (max)."""
        t = (
            cp.full(Qn + 1, -cp.inf, dtype=cp.float32)
            if payload is None
            else cp.concatenate([payload.astype(cp.float32), cp.zeros(1, dtype=cp.float32)])
        )
        t[-1] = flag
        tt = torch.from_dlpack(t)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
        out = cp.from_dlpack(tt)
        if float(out[-1]) > 0:  # some rank failed: every rank raises
            raise ValueError("a rank's shard: bad input on another rank of the sharded call")
        return out[:-1]

    with cp.cuda.Device(dev), cp.cuda.ExternalStream(stream):
        err, tau = None, None
        try:
            tau = shard_tau(q, w, kp, ksc, K, ks, ke, int(start), **options)
        except ValueError as e:
            err = e
        try:
            floor = agreed(1.0 if err else 0.0, tau)
        except ValueError:
            raise (err or ValueError("a rank's shard: bad input on another rank")) from None
        rec, err = None, None
        try:
            rec = shard_records(q, w, kp, ksc, K, ks, ke, int(start), floor, **options)
        except ValueError as e:
            err = e
        try:
            agreed(1.0 if err else 0.0)
        except ValueError:
            raise (err or ValueError("a rank's shard: bad input on another rank")) from None
        local = torch.from_dlpack(cp.ascontiguousarray(rec).view(cp.int64))
        bufs = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(bufs, local, group=group)
        parts = [cp.from_dlpack(x).view(cp.uint64) for x in bufs]
        return merge_records(parts, K, cp)
