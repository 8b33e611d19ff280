"""Sharded contexts on the GPU (dosa_cupy.shards, docs/method.md §12; the reference is
dosa_ref.shards, tests/test_shards.py and tests/test_shards_dist.py).

CPU tests: the merge of the shards' records (``global_records``, ``merge_records``, with
numpy) equals the brute-force Top-K of the whole context under (score desc, global id asc) —
ties across shard borders, empty shards, rows with fewer than K keys; the ``tau_floor``
option's device conversion (``seeds.device_tau_floor``, numpy for CuPy) rounds a float64
floor down to fp32 and names the option on bad input.
GPU tests: ``sharded_topk`` (every shard in one process) equals ``dense_topk`` on regimes
with ties, for equal, unequal and empty shards, on both scorers; ``dosa_topk`` with a floor
keeps every key of the Top-K whose score is at least the floor; with two or more GPUs,
``distributed_topk`` over NCCL equals one GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu, needs_sm90a, numpy_as_cupy

from dosa_cupy import seeds as seeds_mod
from dosa_cupy import shards
from dosa_cupy.emulate import make_records
from dosa_ref.scorer import topk_of

_records = make_records  # uint64 records code(s) << 32 | ~id (record.cuh make_record)


@pytest.mark.parametrize("sizes", [(40, 60), (0, 100), (33, 0, 67), (1, 1, 98)])
def test_merge_of_shard_records_equals_brute_force(sizes):
    """Each shard's list = its own Top-K as records of shard ids (in scrambled slots, then
    relabelled to global ids); the merge's ids equal the brute-force Top-K of the whole
    context, ties broken by global id across shard borders."""
    rs = np.random.default_rng(sum(sizes) + len(sizes))
    Qn, K, N = 6, 8, sum(sizes)
    s = rs.integers(-3, 4, (Qn, N)).astype(np.float32)  # many ties
    s[1] = 0.5  # every key tied
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for s0, s1 in zip(starts[:-1], starts[1:], strict=True):
        rec = np.zeros((Qn, K + 3), np.uint64)
        cnt = np.zeros(Qn, np.int64)
        for t in range(Qn):
            loc = np.arange(s1 - s0)
            top, sc = topk_of(s[t, s0:s1].astype(np.float64), loc, K)
            perm = rs.permutation(top.size)  # records arrive in any order
            rec[t, : top.size] = _records(s[t, s0 + top[perm]], top[perm])
            rec[t, top.size :] = rs.integers(0, 2**63, K + 3 - top.size, dtype=np.uint64)
            cnt[t] = top.size
        parts.append(shards.global_records(rec, cnt, int(s0), np))
    got = shards.merge_records(parts, K, np)
    for t in range(Qn):
        want, _ = topk_of(s[t].astype(np.float64), np.arange(N), K)
        assert np.array_equal(got[t, : want.size], want), t
        assert np.all(got[t, want.size :] == -1)
    assert got.shape == (Qn, K) and got.dtype == np.int64


def test_merge_pads_rows_with_fewer_keys_than_k():
    parts = [shards.global_records(_records([1.0, 2.0], [0, 1])[None], np.array([2]), 7, np)]
    got = shards.merge_records(parts, 5, np)
    assert got.tolist() == [[8, 7, -1, -1, -1]]


@pytest.fixture
def numpy_for_cupy(monkeypatch):
    from dosa_cupy import prepare

    shim = numpy_as_cupy()
    shim.ndarray = np.ndarray
    monkeypatch.setattr(seeds_mod, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(prepare, "cupy_or_raise", lambda: shim)
    return shim


def test_tau_floor_rounds_down_and_names_the_option(numpy_for_cupy):
    x = np.array([0.1, -0.1, 1.0, -np.inf, 3.0000001], np.float64)
    f = seeds_mod.device_tau_floor(x, 5)
    assert f.dtype == np.float32 and np.all(f.astype(np.float64) <= x)
    assert np.all(np.nextafter(f, np.float32(np.inf)).astype(np.float64) > x)  # the nearest
    assert f[2] == 1.0 and f[3] == -np.inf
    assert seeds_mod.device_tau_floor(None, 5) is None
    f32 = np.array([0.25, -1.5], np.float32)
    assert np.array_equal(seeds_mod.device_tau_floor(f32, 2), f32)
    for bad in (np.zeros(4), np.zeros(5, np.int32), np.array([0.0, np.nan, 0, 0, 0]),
                np.array([0.0, np.inf, 0, 0, 0])):  # fmt: skip
        with pytest.raises(ValueError, match="^tau_floor:"):
            seeds_mod.device_tau_floor(bad, 5)


def test_tau_floor_is_an_option_and_not_capturable():
    from dosa_cupy.capture import PrefillSelectorGPU
    from dosa_cupy.options import OPTIONS, check_options

    assert OPTIONS["tau_floor"] is None
    assert check_options({"tau_floor": np.zeros(3)})["tau_floor"] is not None
    with pytest.raises(ValueError, match="^tau_floor:"):
        PrefillSelectorGPU(8, tau_floor=np.zeros(3))


REFUSED = [("tau_floor", np.zeros(3)), ("seed_ids", np.zeros((3, 2))), ("return_stats", True),
           ("debug_bounds", True)]  # fmt: skip


@pytest.mark.parametrize("name,value", REFUSED)
def test_sharded_calls_refuse_what_they_set_or_cannot_carry(name, value):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        shards._check_sharded_options({name: value})
    shards._check_sharded_options({"route": "dosa", "return_stats": False, "seed_ids": None})


# ---- GPU --------------------------------------------------------------------------------


def _args(regime, H, Qn=96, N=9000, K=128, seed=3):
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload(regime, Qn, N, H, seed=seed)
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


STARTS = [None, [0, 3000, 3000, 9000], [0, 64, 5000, 9000]]  # halves; an empty shard; uneven


@pytest.mark.parametrize("starts", STARTS, ids=["halves", "empty", "uneven"])
@pytest.mark.parametrize("regime", ["calibrated", "ties", "equal"])
@gpu
def test_sharded_topk_equals_dense(regime, starts):
    import dosa_cupy

    a = _args(regime, 32)
    dense = dosa_cupy.dense_topk(*a)
    got = shards.sharded_topk(*a[:5], a[5], a[6], starts=starts, route="dosa")
    assert cp.array_equal(got, dense), (regime, starts)


@pytest.mark.parametrize("regime", ["calibrated", "ties"])
@needs_sm90a
@gpu
def test_sharded_topk_equals_dense_fp8(regime):
    import dosa_cupy

    a = _args(regime, 64, seed=5)
    dense = dosa_cupy.dense_topk(*a, scorer="fp8")
    for starts in STARTS:
        got = shards.sharded_topk(*a[:5], a[5], a[6], starts=starts, scorer="fp8", route="dosa")
        assert cp.array_equal(got, dense), (regime, starts)


@gpu
def test_tau_floor_keeps_every_key_at_or_above_it():
    """With a floor at each query's true K/2-th score (a valid lower bound on its K-th), the
    ids whose score is at least the floor are exactly the dense route's such ids."""
    import dosa_cupy

    a = _args("calibrated", 32, seed=9)
    K = a[4]
    dense = dosa_cupy.dense_topk(*a)
    lg = dosa_cupy.dense_logits(*a[:4], a[5], a[6])
    s_dense = cp.take_along_axis(lg, cp.maximum(dense, 0), axis=1)
    floor = s_dense[:, K // 2].astype(cp.float32)
    ids = dosa_cupy.dosa_topk(*a, route="dosa", tau_floor=floor)
    s_ids = cp.take_along_axis(lg, cp.maximum(ids, 0), axis=1)
    keep = s_dense >= floor[:, None]
    assert cp.array_equal(cp.where(keep, dense, -2), cp.where(s_ids >= floor[:, None], ids, -2))


@pytest.mark.skipif(cp is None or cp.cuda.runtime.getDeviceCount() < 2,
                    reason="needs two GPUs (nvidia-h200-x2)")  # fmt: skip
def test_distributed_topk_on_two_gpus_equals_one(tmp_path):
    """Two ranks over NCCL (one process each), 40,000 keys split unevenly: every rank returns
    the single GPU's ids."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "two_ranks.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        import numpy as np, torch, torch.distributed as dist, cupy as cp
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(rank)
        cp.cuda.Device(rank).use()
        dist.init_process_group("nccl")
        import dosa_cupy
        from dosa_cupy import shards
        from dosa_cupy.workload import make_gpu_workload
        wl = make_gpu_workload("calibrated", 128, 40000, 64, seed=1)
        a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
        want = dosa_cupy.dense_topk(*a)
        s0, s1 = (0, 17000) if rank == 0 else (17000, 40000)
        got = shards.distributed_topk(a[0], a[1], a[2][s0:s1], a[3][s0:s1], 256, a[5], a[6],
                                      s0, route="dosa")
        ok = bool(cp.array_equal(got, want))
        dist.destroy_process_group()
        sys.exit(0 if ok else 1)
    """)
    )
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "WORLD_SIZE": "2"}
    import os

    procs = [subprocess.Popen([sys.executable, str(script)], env={**os.environ, **env,
                                                                  "RANK": str(r)})
             for r in range(2)]  # fmt: skip
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
