"""Decode over a sharded paged cache on the GPU path (``dosa_cupy.shards``: ``DecodeShard``,
``sharded_decode_step``, ``distributed_decode_step``; docs/method.md §12 "Sharded
contexts").

CPU tests (run anywhere):
  * the numpy backend (both scorers' bits): a step over page-aligned shards — two, many, an
    empty one, one past every cache, a border inside a step's last next_n tokens — returns
    the single cache's ids every step of walks with growing contexts, histories and
    overflows; so does a cache whose keys are all equal (ties across the borders);
  * the device backend's host code with decode.cu emulated (``fake_cupy``: score codes as
    the floor, the selection's records re-scored by the witness kernel, global records and
    the merge of ``shards.merge_records``) — the same;
  * two and three ranks on gloo (``distributed_decode_step``, numpy backend), each rank
    holding only its pages, return the single cache's ids on every rank; a rank's bad
    block table raises a ValueError on every rank;
  * bad shard boundaries raise a ValueError naming the argument.
GPU test: the device backend on one GPU (every shard in one process) == the single cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_support import gpu
from test_gpu_decode import PagedCache, _queries, fake_cupy  # noqa: F401

from dosa_cupy import decode as dec
from dosa_cupy import shards

PAGE = dec.PAGE


def _walk(starts, B, n, H, K, *, history=2, buffer=None, scorer="f16", backend="numpy",
          seed=0, steps=5, tied=False, still=False, xp=np):  # fmt: skip
    """Steps of a walk on one cache and on its shards ``starts``: both ids, every step.
    ``still``: the same queries and lengths every step — the witnesses are then the exact
    Top-K, τ the K-th score itself, and a threshold that drops a key at τ drops a winner."""
    cache = PagedCache(B, 6 * PAGE, seed=seed)
    if tied:  # every key of the cache equal: the Top-K is the K smallest visible ids
        cache.kv[:] = cache.kv[:1, :1]
        cache.scale[:] = cache.scale[0, 0]
    rs = cache.rs
    opts = dict(history=history, buffer=buffer, backend=backend, scorer=scorer)
    one = dec.DecodeSelectorGPU(K, **opts)
    sels = [dec.DecodeSelectorGPU(K, **opts) for _ in range(len(starts) - 1)]
    L = rs.integers(1, 3 * PAGE, B).astype(np.int32)
    L[0] = 2 * PAGE + 1  # a border (128) inside the last next_n = 2 tokens
    qf = rs.standard_normal((B, n, H, 128))
    dev = (lambda a: xp.asarray(a)) if xp is not np else (lambda a: a)
    qp, wq = _queries(rs, qf, n, H)
    for step in range(steps):
        if step and not still:
            qp, wq = _queries(rs, qf, n, H)
        args = [dev(a) for a in (qp, wq, cache.kv, cache.scale, cache.block_table, L)]
        want = one.step(*args).ids
        got = shards.sharded_decode_step(sels, *args, starts)
        assert got.dtype == np.int64 and tuple(got.shape) == (B, n, K)
        assert bool((xp.asarray(got) == xp.asarray(want)).all()), (starts, step)
        if not still:
            L = np.minimum(L + rs.integers(0, 70, B), cache.max_blocks * PAGE).astype(np.int32)


STARTS = {
    "two": [0, 2 * PAGE, 10**6],
    "many": [0, PAGE, 2 * PAGE, 3 * PAGE, 4 * PAGE, 6 * PAGE],
    "empty": [0, PAGE, PAGE, 5 * PAGE, 10**6],  # an empty shard, and one past every cache
    "one": [0, 6 * PAGE],
}


@pytest.mark.parametrize("name", sorted(STARTS))
@pytest.mark.parametrize(
    "B,n,H,K,history,buffer,scorer",
    [
        (3, 2, 20, 16, 2, None, "f16"),
        (2, 1, 32, 40, 1, 5, "f16"),  # a small buffer: the exact extension on some shards
        (2, 2, 64, 8, 2, None, "fp8"),
        (1, 1, 40, 12, 0, None, "fp8"),  # no history: τ = −inf on every shard
    ],
)
def test_numpy_sharded_step_equals_one_cache(name, B, n, H, K, history, buffer, scorer):
    _walk(STARTS[name], B, n, H, K, history=history, buffer=buffer, scorer=scorer,
          seed=B + n + H + K)  # fmt: skip


@pytest.mark.parametrize("scorer", ["f16", "fp8"])
def test_ties_across_shard_borders(scorer):
    _walk(STARTS["many"], 2, 2, 16, 24, scorer=scorer, tied=True, seed=3)


@pytest.mark.parametrize("scorer", ["f16", "fp8"])
def test_a_key_at_the_floor_is_kept(scorer):
    _walk(STARTS["two"], 3, 2, 32, 16, scorer=scorer, still=True, steps=3, seed=4)


@pytest.mark.parametrize("name", ["two", "empty"])
@pytest.mark.parametrize("B,n,H,buffer", [(3, 2, 20, None), (2, 1, 33, 3)])
def test_device_host_code_with_emulated_kernels(fake_cupy, monkeypatch, name, B, n, H, buffer):  # noqa: F811
    """The device backend's sharded step (score codes, the witness kernel's records of the
    selection, global records, merge_records) with decode.cu emulated on the CPU."""
    import dosa_cupy.dense as dense_mod
    import dosa_cupy.select as select_mod

    monkeypatch.setattr(shards, "cupy_or_raise", dec.cupy_or_raise)
    monkeypatch.setattr(select_mod, "cupy_or_raise", dec.cupy_or_raise)
    monkeypatch.setattr(select_mod, "select_records", dense_mod.select_records)  # the fake
    _walk(STARTS[name], B, n, H, 16, buffer=buffer, backend="cupy", seed=B * n + H)
    _walk(STARTS[name], B, n, H, 16, buffer=buffer, backend="cupy", seed=7, still=True, steps=3)
    assert "decode_witness_dedup" in fake_cupy.calls
    assert any(c.startswith("decode_witness_mt") for c in fake_cupy.calls)


@pytest.mark.parametrize("scorer", ["f16", "fp8"])
def test_the_shards_floor_is_the_single_caches_tau(scorer):
    """The K-th of the union of the shards' witnesses (disjoint, distinct) is the single
    cache's witness τ, every row of every step."""
    starts = STARTS["empty"]
    B, n, H, K = 3, 2, 24, 16
    cache = PagedCache(B, 6 * PAGE, seed=9)
    rs = cache.rs
    opts = dict(history=2, backend="numpy", scorer=scorer)
    one = dec.DecodeSelectorGPU(K, **opts)
    sels = [dec.DecodeSelectorGPU(K, **opts) for _ in range(len(starts) - 1)]
    L = np.array([2 * PAGE + 1, 90, 5 * PAGE], np.int32)
    qf = rs.standard_normal((B, n, H, 128))
    for step in range(4):
        q, w = _queries(rs, qf, n, H)
        args = (q, w, cache.kv, cache.scale, cache.block_table, L)
        parts = []
        for sel, s0, s1 in zip(sels, starts[:-1], starts[1:], strict=True):
            bt = cache.block_table[:, s0 // PAGE : max(s0 // PAGE + 1, -(-s1 // PAGE))]
            bt = bt if bt.shape[1] else np.zeros((B, 1), np.int32)
            parts.append(shards.DecodeShard(sel, q, w, cache.kv, cache.scale, bt, L, s0, s1))
        floor = sels[0].ops.union_floor([sh.top() for sh in parts], K)
        want = one.step(*args)
        assert np.array_equal(floor.reshape(B, n), want.stats.tau), step
        got = shards.sharded_decode_step(sels, *args, starts)  # the same histories next
        assert np.array_equal(got, want.ids)
        L = np.minimum(L + 30, 6 * PAGE).astype(np.int32)


def test_bad_shards_raise():
    sel = dec.DecodeSelectorGPU(4, backend="numpy")
    cache = PagedCache(1, 4 * PAGE, seed=1)
    q, w = _queries(cache.rs, cache.rs.standard_normal((1, 1, 8, 128)), 1, 8)
    args = (q, w, cache.kv, cache.scale, cache.block_table, np.array([100], np.int32))
    for starts in ([0, 100, 10**6], [64, 10**6], [0, 128, 64, 10**6], [0, 128]):
        with pytest.raises(ValueError, match="^starts:"):
            shards.sharded_decode_step([sel, sel], *args, starts)
    with pytest.raises(ValueError, match="^sels:"):
        shards.sharded_decode_step([sel], *args, [0, 64, 10**6])
    with pytest.raises(ValueError, match="^start:"):
        shards.DecodeShard(sel, *args, -1)
    with pytest.raises(ValueError, match="^stop:"):
        shards.DecodeShard(sel, *args, 64, 10)
    with pytest.raises(ValueError, match="^ends:"):  # decreasing along a request's rows
        q2, w2 = np.concatenate([q, q], axis=1), np.concatenate([w, w], axis=1)
        sel.begin(q2, w2, *args[2:], ends=np.array([[50, 40]]))


def test_a_shard_without_stop_ends_where_its_table_does():
    """stop None: the shard's tokens end with its block table (a shard that is not the last
    holds 64·max_blocks tokens of a longer request), and its ids equal a stop given."""
    cache = PagedCache(1, 4 * PAGE, seed=6)
    q, w = _queries(cache.rs, cache.rs.standard_normal((1, 1, 8, 128)), 1, 8)
    L = np.array([3 * PAGE + 5], np.int32)
    bt = cache.block_table[:, :2].copy()  # the first 128 tokens of a 197-token request
    got = []
    for stop in (None, 2 * PAGE):
        sel = dec.DecodeSelectorGPU(4, history=0, backend="numpy")
        sh = shards.DecodeShard(sel, q, w, cache.kv, cache.scale, bt, L, 0, stop)
        assert int(sh.d["lengths"][0]) == 2 * PAGE and int(sh.d["ke"][0]) == 2 * PAGE
        got.append(sh.candidates(sel.ops.union_floor([sh.top()], 4)))
    assert np.array_equal(got[0][0], got[1][0]) and got[0][0].max() < 2 * PAGE


@gpu
def test_gpu_sharded_step_equals_one_cache():
    import cupy as cp

    for name in ("two", "empty"):
        _walk(STARTS[name], 3, 2, 64, 64, backend="cupy", seed=5, xp=cp)


def _two_gpus() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() >= 2
    except Exception:
        return False


@pytest.mark.skipif(not _two_gpus(), reason="needs two GPUs (nvidia-h200-x2)")
def test_distributed_decode_on_two_gpus_equals_one_cache(tmp_path):
    """Two ranks over NCCL (one process each, the device backend): every step of a walk,
    every rank returns the single cache's ids."""
    import os
    import subprocess
    import sys
    import textwrap

    tests = Path(__file__).resolve().parent
    script = tmp_path / "two_ranks.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(tests)!r})
        import numpy as np, torch, torch.distributed as dist, cupy as cp
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(rank)
        cp.cuda.Device(rank).use()
        dist.init_process_group("nccl")
        from test_gpu_decode import PagedCache, _queries
        from dosa_cupy import decode as dec, shards
        cache = PagedCache(3, 40 * 64, seed=2)
        rs = cache.rs
        one = dec.DecodeSelectorGPU(64, history=2)
        sel = dec.DecodeSelectorGPU(64, history=2)
        s0, s1 = (0, 17 * 64) if rank == 0 else (17 * 64, None)
        bt = cache.block_table[:, s0 // 64 : None if s1 is None else s1 // 64].copy()
        L = np.array([17 * 64 + 1, 300, 40 * 64 - 5], np.int32)
        qf = rs.standard_normal((3, 2, 64, 128))
        ok = True
        for step in range(4):
            q, w = _queries(rs, qf, 2, 64)
            dev = [cp.asarray(x) for x in (q, w, cache.kv, cache.scale)]
            want = one.step(*dev, cp.asarray(cache.block_table), cp.asarray(L)).ids
            got = shards.distributed_decode_step(sel, *dev, cp.asarray(bt), cp.asarray(L), s0, s1)
            ok &= bool(cp.array_equal(got, want))
            L = np.minimum(L + 1, 40 * 64).astype(np.int32)
        dist.destroy_process_group()
        sys.exit(0 if ok else 1)
    """)
    )
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29534", "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(script)],
                              env={**os.environ, **env, "RANK": str(r)})
             for r in range(2)]  # fmt: skip
    assert [p.wait(timeout=600) for p in procs] == [0, 0]


# ---- two and three ranks on gloo (numpy backend) --------------------------------------

torch = pytest.importorskip("torch", reason="the distributed engine is torch.distributed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from test_shards_dist import _spawn  # noqa: E402  (the ranks' launcher, one for both files)

RANK_STARTS = {2: [0, 2 * PAGE, None], 3: [0, PAGE, 4 * PAGE, None]}  # rank r: [s_r, s_{r+1})
K_DIST, H_DIST, STEPS = 16, 24, 4


def _dist_walk():
    """The walk's inputs per step: (q, w, lengths), and the cache (B 3, next_n 2)."""
    cache = PagedCache(3, 6 * PAGE, seed=21)
    rs = cache.rs
    L = np.array([2 * PAGE + 1, 40, 3 * PAGE], np.int32)
    qf = rs.standard_normal((3, 2, H_DIST, 128))
    out = []
    for _ in range(STEPS):
        q, w = _queries(rs, qf, 2, H_DIST)
        out.append((q, w, L.copy()))
        L = np.minimum(L + rs.integers(0, 70, 3), cache.max_blocks * PAGE).astype(np.int32)
    return cache, out


def _rank_worker(rank, world, bad, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        cache, steps = _dist_walk()
        s0, s1 = RANK_STARTS[world][rank], RANK_STARTS[world][rank + 1]
        bt = cache.block_table[:, s0 // PAGE : None if s1 is None else s1 // PAGE].copy()
        if bad and rank == world - 1:
            bt[:] = -5  # this rank's pages point outside its cache
        sel = dec.DecodeSelectorGPU(K_DIST, history=2, backend="numpy")
        ids = []
        for q, w, L in steps:
            try:
                ids.append(shards.distributed_decode_step(sel, q, w, cache.kv, cache.scale, bt,
                                                          L, s0, s1))  # fmt: skip
            except ValueError as e:
                (Path(out) / f"rank{rank}.err").write_text(str(e))
                return
        np.save(Path(out) / f"rank{rank}.npy", np.stack(ids))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_return_the_single_cache_ids(world, tmp_path):
    _spawn(_rank_worker, world, (False,), tmp_path)
    cache, steps = _dist_walk()
    one = dec.DecodeSelectorGPU(K_DIST, history=2, backend="numpy")
    want = np.stack([one.step(q, w, cache.kv, cache.scale, cache.block_table, L).ids
                     for q, w, L in steps])  # fmt: skip
    for r in range(world):
        assert np.array_equal(np.load(tmp_path / f"rank{r}.npy"), want), (world, r)


def test_a_rank_with_bad_input_raises_on_every_rank(tmp_path):
    _spawn(_rank_worker, 2, (True,), tmp_path)
    assert (tmp_path / "rank1.err").read_text().startswith("block_table:")
    assert "another rank" in (tmp_path / "rank0.err").read_text()
