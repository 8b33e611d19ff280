"""``dosa bench --cp``: a prefill chunk over a context split across GPUs (docs/method.md §12
"Sharded contexts"; issue 29), every route on the same inputs in one run.

R ranks (``torch.multiprocessing``, NCCL, one GPU each) hold the contiguous shards
``shard_starts(N, R)`` of the keys and the replicated chunk (q, w, ranges: the workload is
made on every rank from the same seed).  Timed, each a median over ``--reps`` calls after
warm-ups, one call = the slowest rank's CUDA-event time (a barrier before each call, the
ranks' times reduced by max):

    one_gpu_dosa      rank 0 alone: ``dosa_topk`` on the whole context (the other ranks wait)
    one_gpu_dense     rank 0 alone: ``dense_topk`` on the whole context
    sharded_dosa      ``shards.distributed_topk``: the best seed records all-gathered, the
                      K-th of their union the floor each rank screens against, the lists
                      all-gathered, merged
    sharded_dense     each rank the project's dense route on its shard, records of its
                      Top-K all-gathered, merged (exact: the same ids)
    sharded_deepgemm  each rank DeepGEMM's logits on its shard + ``torch.topk``, (scores,
                      global ids) all-gathered, ``torch.topk`` of the union (the peer's
                      sharded route; its ids compared as sets)

and each collective of ``sharded_dosa`` alone at its sizes (bytes per rank, median ms).
Pruning per rank: ``dosa_topk(return_stats=True)`` on the rank's shard with the shared floor
(``tau_floor``: the K-th of the union of the ranks' best seeds) and with its own τ —
visible keys, survivors, refined keys.  Ids: every exact route == ``dense_topk`` on the
whole context, bitwise; DeepGEMM's as sets.

``--one-gpu`` runs the R shards in one process on one GPU (``shards.sharded_topk``; no
collective, the shards one after another), to check ids and pruning where only one GPU is
lent.  ``--dry-run`` lists the plan without a GPU.  Method: docs/benchmark_method.md
"Sharded contexts".
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from dosa_ref.cmdline import CommandParser

from .report import md_table, run_meta

ROUTES = ("one_gpu_dosa", "one_gpu_dense", "sharded_dosa", "sharded_dense", "sharded_deepgemm")
LOGITS_BYTES = 8 << 30  # DeepGEMM's logits per sub-chunk of queries (fp32 rows of a shard)


def parse_args(argv: list[str]):
    ap = CommandParser(prog="dosa bench --cp", description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="shards, one GPU (process) each")
    ap.add_argument("--one-gpu", action="store_true",
                    help="every shard in one process, one GPU (ids, pruning)")  # fmt: skip
    ap.add_argument("--shape", default="64x4096x1048576", help="HxQnxN")
    ap.add_argument("--regime", default="calibrated")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scorer", default="f16", help="the canonical scorer: f16 or fp8 (sm_90a)")
    ap.add_argument("--no-peers", action="store_true", help="skip DeepGEMM")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="bench_cp")
    a = ap.parse_args(argv)
    parts = a.shape.split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"shape: expected HxQnxN, got {a.shape!r}")
    a.H, a.Qn, a.N = (int(p) for p in parts)
    if not (1 <= a.H <= 64 and 1 <= a.Qn <= a.N):
        raise ValueError(f"shape: need 1 <= H <= 64 and 1 <= Qn <= N, got {a.shape!r}")
    if a.ranks < 1 or (a.ranks < 2 and not a.one_gpu):
        raise ValueError(f"ranks: expected at least 2 (or --one-gpu with 1 or more), got {a.ranks}")
    if a.N // a.ranks < a.K:  # each rank's lists are [Qn, K]: one shape on every rank
        raise ValueError(f"shape: each of the {a.ranks} shards needs at least K={a.K} keys, "
                         f"N={a.N}")  # fmt: skip
    if a.reps < 10:
        raise ValueError(f"reps: at least 10 replays, got {a.reps}")
    if a.warm < 1:
        raise ValueError(f"warm: at least 1 warm-up call, got {a.warm}")
    if not 1 <= a.K <= 4096:
        raise ValueError(f"K: expected an integer in [1, 4096], got {a.K}")
    if a.scorer not in ("f16", "fp8"):
        raise ValueError(f"scorer: expected f16 or fp8, got {a.scorer!r}")
    return a


def collective_sizes(Qn: int, K: int) -> dict:
    """Bytes per rank of ``distributed_topk``'s collectives: the error flag's all-reduce
    (twice), the best seed records' all-gather (the floor, uint64 [Qn, K]), the lists'
    all-gather (uint64 [Qn, K])."""
    return {"flag_allreduce": 4, "seed_allgather": 8 * Qn * K, "records_allgather": 8 * Qn * K}


def plan(a) -> str:
    """The run's plan, without a GPU."""
    from dosa_ref.shards import shard_starts

    st = shard_starts(a.N, a.ranks).tolist()
    sz = collective_sizes(a.Qn, a.K)
    where = "one process, one GPU" if a.one_gpu else f"{a.ranks} processes on NCCL"
    spans = ", ".join(f"[{s}, {e})" for s, e in zip(st[:-1], st[1:], strict=True))
    lines = [
        f"# --cp dry run: {a.regime} H={a.H} Qn={a.Qn} N={a.N} K={a.K}, {a.ranks} shards "
        f"({where}), scorer {a.scorer}; reps {a.reps}, warm {a.warm}; no GPU used",
        f"shards [start, stop): {spans}",
    ]
    if a.one_gpu:
        lines.append("one GPU: sharded_topk == dense_topk on the whole context; pruning per "
                     "shard with the shared and the own τ")  # fmt: skip
    else:
        routes = [r for r in ROUTES if not (a.no_peers and r == "sharded_deepgemm")]
        lines.append(f"routes: {', '.join(routes)}")
        lines.append("collectives (bytes per rank): "
                     + ", ".join(f"{k} {v:,}" for k, v in sz.items()))  # fmt: skip
    lines.append(f"# would write {Path(a.out) / 'bench_cp.json'} and bench_cp.md")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if a.one_gpu:
        res = _one_gpu(a)
    else:
        res = _spawn(a)
    res.update(meta=run_meta(a.commit), args={k: v for k, v in vars(a).items()})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_cp.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "bench_cp.md").write_text(markdown(res))
    print(markdown(res))
    return 0


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def markdown(res: dict) -> str:
    """The run as markdown: route times (× the sharded DoSA call), collectives, pruning per
    rank, ids."""
    a, meta = res.get("args", {}), res.get("meta", {})
    head = (
        f"# dosa bench --cp, {meta.get('date_utc', '?')}, commit {meta.get('commit', '?')}\n\n"
        f"{a.get('regime')} H={a.get('H')} Qn={a.get('Qn')} N={a.get('N')} K={a.get('K')}, "
        f"{a.get('ranks')} shards{' on one GPU' if a.get('one_gpu') else ''}, "
        f"scorer {a.get('scorer')}\n\n"
    )
    t = res.get("times_ms", {})
    base = t.get("sharded_dosa")
    rows = [dict(route=k, ms=v) for k, v in t.items()]
    out = head + md_table(
        "## Times (median ms of one call: the slowest rank)\n\n",
        [("route", lambda r: r["route"]), ("ms", lambda r: f"{r['ms']:.2f}"),
         ("÷ sharded_dosa", lambda r: f"{r['ms'] / base:.2f}×" if base else "-")],
        rows,
    )  # fmt: skip
    out += md_table(
        "\n## Collectives of sharded_dosa, alone at their sizes\n\n",
        [("collective", lambda r: r["name"]), ("bytes per rank", lambda r: f"{r['bytes']:,}"),
         ("median ms", lambda r: f"{r['ms']:.3f}")],
        res.get("collectives", []),
    )  # fmt: skip

    def frac(r, k):
        return f"{r[k] / max(r['screened'], 1):.4f}"

    out += md_table(
        "\n## Pruning per shard (survivors / screened keys)\n\n",
        [("shard", lambda r: str(r["shard"])), ("keys", lambda r: f"{r['keys']:,}"),
         ("screened", lambda r: f"{r['screened']:,}"),
         ("survival, shared τ", lambda r: frac(r, "survivors_shared")),
         ("survival, own τ", lambda r: frac(r, "survivors_own")),
         ("queries whose τ the floor raised", lambda r: str(r["raised"]))],
        res.get("pruning", []),
    )  # fmt: skip
    ids = res.get("ids", {})
    if ids:
        out += "\n## Ids\n\n" + "".join(f"- {k}: {v}\n" for k, v in ids.items())
    return out


# ---------------------------------------------------------------------------------------
# On the GPUs
# ---------------------------------------------------------------------------------------


def _workload(a, dev: int):
    import cupy as cp

    from dosa_cupy.workload import make_gpu_workload

    with cp.cuda.Device(dev):
        wl = make_gpu_workload(a.regime, a.Qn, a.N, a.H, seed=a.seed)
        return {k: wl[k] for k in ("q", "w", "k_payload", "k_scale", "ks", "ke")}


def _one_gpu(a) -> dict:
    """Every shard in this process on GPU 0: ids of sharded_topk against dense_topk on the
    whole context, the pruning per shard."""
    import cupy as cp

    from dosa_cupy import dense_topk
    from dosa_cupy.shards import _local, shard_seed_records, shard_starts, sharded_topk, union_floor

    wl = _workload(a, 0)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], a.K, wl["ks"], wl["ke"])
    starts = shard_starts(a.N, a.ranks).tolist()
    want = dense_topk(*args, scorer=a.scorer)
    got = sharded_topk(*args, starts=starts, scorer=a.scorer)
    tops = [shard_seed_records(wl["q"], wl["w"], wl["k_payload"][s0:s1], wl["k_scale"][s0:s1],
                               a.K, wl["ks"], wl["ke"], s0, scorer=a.scorer)
            for s0, s1 in zip(starts[:-1], starts[1:], strict=True)]  # fmt: skip
    floor = union_floor(tops, a.K)
    prune = []
    for r, (s0, s1) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        lo, hi = _local(wl["ks"], wl["ke"], s0, s1 - s0, cp)
        kp, ksc = wl["k_payload"][s0:s1], wl["k_scale"][s0:s1]
        prune += [dict(p, shard=r) for p in _pruning_local(wl, a, kp, ksc, lo, hi, floor)]
    return {
        "ids": {"sharded_topk == dense_topk (whole context)": bool(cp.array_equal(got, want))},
        "pruning": prune,
    }


def _spawn(a) -> dict:
    import socket
    import tempfile

    import cupy as cp
    import torch.multiprocessing as mp

    n = cp.cuda.runtime.getDeviceCount()
    if a.ranks > n:
        raise ValueError(f"ranks: {a.ranks} ranks need {a.ranks} GPUs, {n} visible")
    with socket.socket() as sk:  # a free port for the ranks' rendezvous
        sk.bind(("127.0.0.1", 0))
        a.port = sk.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(a, tmp), nprocs=a.ranks, join=True,
                           start_method="spawn")  # fmt: skip
        return json.loads((Path(tmp) / "result.json").read_text())


def _timed(fn, reps: int, warm: int, dist) -> float:
    """Median over ``reps`` calls (after ``warm``) of the slowest rank's CUDA-event time of
    one call of ``fn``; a barrier before each call."""
    import cupy as cp
    import torch

    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        dist.barrier()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        t = torch.tensor([cp.cuda.get_elapsed_time(s, e)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ts.append(float(t.item()))
    return statistics.median(ts)


def _rank(rank: int, a, tmp: str) -> None:
    import cupy as cp
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(a.port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=a.ranks,
                            device_id=torch.device("cuda", rank))  # fmt: skip
    try:
        with cp.cuda.Device(rank), cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            res = _rank_run(rank, a, dist)
        if rank == 0:
            (Path(tmp) / "result.json").write_text(json.dumps(res, default=str))
    finally:
        dist.destroy_process_group()


def _rank_run(rank: int, a, dist) -> dict:
    import cupy as cp

    from dosa_cupy import dense_topk, dosa_topk
    from dosa_cupy.shards import (
        _local,
        _Ranks,
        distributed_topk,
        merge_records,
        selection_records,
        shard_seed_records,
        shard_starts,
        union_floor,
    )

    wl = _workload(a, rank)
    whole = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], a.K, wl["ks"], wl["ke"])
    starts = shard_starts(a.N, a.ranks).tolist()
    s0, s1 = starts[rank], starts[rank + 1]
    kp, ksc = wl["k_payload"][s0:s1], wl["k_scale"][s0:s1]
    lo, hi = _local(wl["ks"], wl["ke"], s0, s1 - s0, cp)
    ranks = _Ranks(None, cp)
    opts = dict(scorer=a.scorer)
    times, ids = {}, {}

    def on_rank0(fn):
        def call():
            if rank == 0:
                fn()

        return call

    # the exact sharded routes first (their ids), then the times
    d_ids = distributed_topk(wl["q"], wl["w"], kp, ksc, a.K, wl["ks"], wl["ke"], s0, **opts)

    def sharded_dense():
        local = dense_topk(wl["q"], wl["w"], kp, ksc, a.K, lo, hi, check=False, **opts)
        rec = selection_records(wl["q"], wl["w"], kp, ksc, a.K, lo, hi, local, s0, a.scorer)
        return merge_records(ranks.gather(rec), a.K, cp)

    sd_ids = sharded_dense()
    if rank == 0:
        want = dense_topk(*whole, **opts)
        one = dosa_topk(*whole, **opts)
        ids["sharded_dosa == dense_topk (whole context)"] = bool(cp.array_equal(d_ids, want))
        ids["sharded_dense == dense_topk"] = bool(cp.array_equal(sd_ids, want))
        ids["one_gpu_dosa == dense_topk"] = bool(cp.array_equal(one, want))
    times["one_gpu_dosa"] = _timed(on_rank0(lambda: dosa_topk(*whole, **opts)), a.reps, a.warm,
                                   dist)  # fmt: skip
    times["one_gpu_dense"] = _timed(on_rank0(lambda: dense_topk(*whole, **opts)), a.reps,
                                    a.warm, dist)  # fmt: skip
    times["sharded_dosa"] = _timed(
        lambda: distributed_topk(wl["q"], wl["w"], kp, ksc, a.K, wl["ks"], wl["ke"], s0, **opts),
        a.reps, a.warm, dist,
    )  # fmt: skip
    times["sharded_dense"] = _timed(sharded_dense, a.reps, a.warm, dist)
    peer = None if a.no_peers else _deepgemm_route(wl, a, kp, ksc, lo, hi, s0)
    if peer is not None:
        times["sharded_deepgemm"] = _timed(peer, a.reps, a.warm, dist)
        peer_ids = peer()  # on every rank: the route's collectives
        if rank == 0:
            from .peers import set_overlap

            ov = set_overlap(peer_ids, want, cp)
            ids["sharded_deepgemm vs dense_topk (sets)"] = (
                f"overlap min {ov['overlap_min']:.4f}, pooled {ov['overlap_pooled']:.4f}"
            )
    top = shard_seed_records(wl["q"], wl["w"], kp, ksc, a.K, wl["ks"], wl["ke"], s0, **opts)
    floor = union_floor(ranks.gather(top), a.K)  # the shared floor of distributed_topk
    coll = _collective_times(a, ranks, dist)
    prune = [dict(p, shard=rank) for p in _pruning_local(wl, a, kp, ksc, lo, hi, floor)]
    gathered = [None] * a.ranks
    dist.all_gather_object(gathered, prune)
    return {
        "times_ms": times,
        "collectives": coll,
        "pruning": [p for g in gathered for p in g],
        "ids": ids,
    }


def _pruning_local(wl, a, kp, ksc, lo, hi, floor) -> list:
    """A shard's pruning: dosa_topk's statistics on the shard (keys kp, ksc; local ranges
    lo, hi) with its own τ and with the shared ``floor`` — [] for an empty shard."""
    import cupy as cp
    import numpy as np

    from dosa_cupy import dosa_topk

    if kp.shape[0] == 0:
        return []
    args = (wl["q"], wl["w"], kp, ksc, a.K, lo, hi)
    kw = dict(return_stats=True, route="dosa", scorer=a.scorer)
    _, own = dosa_topk(*args, **kw)
    _, shared = dosa_topk(*args, tau_floor=floor, **kw)
    return [dict(
        keys=int(kp.shape[0]), screened=int(np.sum(own.screened)),
        survivors_own=int(np.sum(own.survivors)), survivors_shared=int(np.sum(shared.survivors)),
        raised=int(np.sum(cp.asnumpy(floor) > own.tau)),
    )]  # fmt: skip


def _collective_times(a, ranks, dist) -> list:
    """Each collective of distributed_topk alone, at its size: median ms of ``reps`` calls
    (the slowest rank's)."""
    import cupy as cp

    sz = collective_sizes(a.Qn, a.K)
    rec = cp.zeros((a.Qn, a.K), dtype=cp.uint64)
    calls = {
        "flag_allreduce": lambda: ranks.agreed_max(None, None, 0, cp.float32),
        "seed_allgather": lambda: ranks.gather(rec),
        "records_allgather": lambda: ranks.gather(rec),
    }
    return [dict(name=k, bytes=sz[k], ms=_timed(f, a.reps, a.warm, dist)) for k, f in calls.items()]


def _deepgemm_route(wl, a, kp, ksc, lo, hi, s0):
    """The peer's sharded route (DeepGEMM logits of the shard + torch.topk, the union's
    torch.topk) as a call returning CuPy ids [Qn, K], or None without deep_gemm."""
    try:
        import deep_gemm  # noqa: F401
    except Exception:
        return None
    import cupy as cp
    import torch
    import torch.distributed as dist

    from .peers import discover

    logits = discover(True).logits
    n = int(kp.shape[0])  # ≥ K (parse_args): the same [Qn, K] lists on every rank
    sub = max(1, min(a.Qn, LOGITS_BYTES // max(1, 4 * n)))

    def call():
        vals, idx = [], []
        for q0 in range(0, a.Qn, sub):
            rows = slice(q0, q0 + sub)
            c = dict(q=wl["q"][rows], w=wl["w"][rows], kp=kp, ksc=ksc, ks=lo[rows], ke=hi[rows])
            v, i = torch.topk(logits(c), a.K, 1)
            vals.append(v)
            idx.append(torch.where(torch.isneginf(v), -1, i + s0))  # not visible: −1
        v, i = torch.cat(vals), torch.cat(idx)
        vs = [torch.empty_like(v) for _ in range(dist.get_world_size())]
        ix = [torch.empty_like(i) for _ in range(dist.get_world_size())]
        dist.all_gather(vs, v)
        dist.all_gather(ix, i)
        top = torch.topk(torch.cat(vs, 1), a.K, 1).indices
        return cp.from_dlpack(torch.gather(torch.cat(ix, 1), 1, top))

    return call
