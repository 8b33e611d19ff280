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

from dosa_ref.shards import shard_starts

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
    in the shard's ids: int32 [Qn] each (empty where a query sees none of the shard)."""
    lo = xp.clip(xp.asarray(ks).astype(xp.int64), start, start + n) - start
    hi = xp.clip(xp.asarray(ke).astype(xp.int64), start, start + n) - start
    return lo.astype(xp.int32), xp.maximum(hi, lo).astype(xp.int32)


def shard_tau(q, w, kp, ksc, K: int, ks, ke, start: int, **options):
    """fp32 [Qn] (CuPy): per query, the τ of the shard's own seeds (``seeds.seed_stage`` with
    the options' strategies: the K-th largest canonical score among them, −inf with fewer
    than K) — a lower bound on the context's K-th score.  kp uint8 [n, 128], ksc fp32 [n]:
    the shard's keys, whose first is the context's key ``start``; ks, ke: the context's
    visible ranges."""
    from .options import start as begin
    from .seeds import seed_stage

    cp = cupy_or_raise()
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), int(kp.shape[0]), cp)
    o, _, _, b, empty = begin(q, w, kp, ksc, K, lo, hi, dict(options, tau_floor=None))
    if empty is not None:
        return cp.full(b.Qn, -np.inf, dtype=cp.float32)
    b.raise_if_bad()
    return seed_stage(b, o).tau


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
    invalid scale, which ``dosa_topk`` recovers) has no record to merge: ValueError naming
    ``k_scale``."""
    from .pipeline import dosa_topk
    from .prepare import pad_batch
    from .seeds import score_seed_ids

    cp = cupy_or_raise()
    n, Qn = int(kp.shape[0]), int(q.shape[0])
    if n == 0:  # an empty shard: no key, no record
        return cp.zeros((Qn, int(K)), dtype=cp.uint64)
    lo, hi = _local(cp.asarray(ks), cp.asarray(ke), int(start), n, cp)
    ids = dosa_topk(q, w, kp, ksc, K, lo, hi, tau_floor=floor, **options)
    b = pad_batch(q, w, kp, ksc, K, lo, hi, check=False,
                  scorer=options.get("scorer", "f16"))  # fmt: skip
    rec, cnt = score_seed_ids(b, cp.ascontiguousarray(ids.astype(cp.int32)))
    if bool(cp.any(cnt.astype(cp.int64) < cp.sum(ids >= 0, axis=1))):  # one synchronization
        raise ValueError("k_scale: a selected key's score is NaN (an invalid scale): the "
                         "sharded merge needs the selected keys' scores")  # fmt: skip
    return global_records(rec, cnt, int(start), cp)


def sharded_topk(q, w, kp, ksc, K: int, ks=None, ke=None, *, starts=None, **options):
    """Top-K ids int64 [Qn, K] of the keys kp [N, 128], ksc [N] held in the shards ``starts``
    (int [R + 1], ``shard_starts``; default two nearly equal shards), every shard in this
    process: the shards' largest τ as the floor, each shard's records against it, the exact
    merge.  Equal to ``dense_topk`` (and ``dosa_topk``) on the whole context; options as
    ``dosa_topk``'s."""
    cp = cupy_or_raise()
    N = int(kp.shape[0])
    Qn = int(q.shape[0])
    ks = cp.zeros(Qn, dtype=cp.int32) if ks is None else cp.asarray(ks)
    ke = cp.full(Qn, N, dtype=cp.int32) if ke is None else cp.asarray(ke)
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
    ``start``; one ``all_reduce`` (max) of τ fp32 [Qn] gives every rank the floor, each rank
    builds its records [Qn, K] against it, one ``all_gather`` of them, and every rank returns
    the merged ids int64 [Qn, K] (CuPy).  CuPy runs on torch's current stream, so the
    collectives order with the kernels."""
    import torch
    import torch.distributed as dist

    cp = cupy_or_raise()
    stream = torch.cuda.current_stream().cuda_stream
    with cp.cuda.ExternalStream(stream):
        tau = shard_tau(q, w, kp, ksc, K, ks, ke, int(start), **options)
        t = torch.from_dlpack(cp.ascontiguousarray(tau))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        floor = cp.from_dlpack(t)
        rec = shard_records(q, w, kp, ksc, K, ks, ke, int(start), floor, **options)
        local = torch.from_dlpack(cp.ascontiguousarray(rec).view(cp.int64))
        bufs = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(bufs, local, group=group)
        parts = [cp.from_dlpack(x).view(cp.uint64) for x in bufs]
        return merge_records(parts, K, cp)
