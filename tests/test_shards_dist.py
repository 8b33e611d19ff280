"""``dosa_ref.shards.distributed_topk`` on torch.distributed (gloo, CPU): 2 and 4 ranks, each
holding one contiguous shard (unequal sizes, an empty shard, shards shorter than K), return
on every rank the ids of the whole context's Top-K — bitwise the single-process oracle's —
on every regime (dosa_ref's, the trained one included, and the GPU bench's recipes) and on
a context of tied scores across shard borders; and
``distributed_decode_step``: decode steps over a sharded cache equal the single cache's."""

import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed engine is torch.distributed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from dosa_ref.scorer import index_scores, topk_ids  # noqa: E402
from dosa_ref.shards import distributed_topk, shard_starts  # noqa: E402
from dosa_ref.workloads import make_workload  # noqa: E402

K = 48
# name: (keys, shard sizes per rank count); every regime dosa_ref.workloads makes (the
# trained one: a real encoder over real text), the GPU bench's recipes (dosa_cupy.workload:
# gaussian, structured, equal, adversarial) in numpy, and a context of tied scores
CASES = {
    "calibrated": (2000, {2: [1200, 800], 4: [0, 700, 1290, 10]}),
    "isotropic": (1500, {2: [20, 1480], 4: [375, 375, 375, 375]}),
    "many_positive": (1200, {2: [600, 600], 4: [100, 500, 0, 600]}),
    "h64": (1000, {2: [999, 1], 4: [250, 250, 250, 250]}),
    "trained": (1500, {2: [700, 800], 4: [40, 0, 1000, 460]}),
    "gaussian": (1200, {2: [1100, 100], 4: [300, 300, 300, 300]}),
    "structured": (1200, {2: [601, 599], 4: [0, 0, 47, 1153]}),
    "equal": (400, {2: [200, 200], 4: [1, 48, 300, 51]}),
    "adversarial": (1000, {2: [500, 500], 4: [250, 0, 500, 250]}),
    "ties": (300, {2: [150, 150], 4: [7, 0, 263, 30]}),
}
_RECIPES = ("gaussian", "structured", "equal", "adversarial")


def _recipe(name, Qn, N, H=16, D=16, seed=4):
    """dosa_cupy.workload's GPU recipes in numpy (float keys; causal ranges): i.i.d.
    gaussian; keys on a few topic directions with heavy-tailed loadings (structured);
    one key repeated (equal: every score tied); tiny keys with one huge coordinate each
    (adversarial)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((8, D))
    topics /= np.linalg.norm(topics, axis=1, keepdims=True)
    if name == "gaussian":
        k, q, w = (rng.standard_normal(s) for s in ((N, D), (Qn, H, D), (Qn, H)))
    else:
        load = rng.exponential(1.0, (N, 8)) ** 2 * (rng.random((N, 8)) < 0.3)
        k = rng.standard_normal((N, D)) + 1.5 * load @ topics
        if name == "adversarial":
            k *= 1e-3
            k[np.arange(N), rng.integers(0, D, N)] = 30.0 * (1 + rng.random(N))
        if name == "equal":
            k = np.tile(k[:1], (N, 1))
        t = rng.integers(0, 8, Qn)
        q = 0.6 * rng.standard_normal((Qn, H, D))
        q += (rng.random((Qn, H, 1)) + 0.2) * topics[t][:, None, :] * 3
        w = np.where(rng.random((Qn, H)) < 0.75, 1.0, -1.0) * (0.2 + rng.random((Qn, H)))
    ke = np.arange(N - Qn + 1, N + 1)
    return q, w, k, np.zeros(Qn, np.int64), ke


def _case(name):
    n = CASES[name][0]
    if name == "ties":  # every key the same: the Top-K is the K smallest visible ids
        rng = np.random.default_rng(3)
        q, w = rng.standard_normal((5, 8, 16)), np.abs(rng.standard_normal((5, 8)))
        k = np.tile(rng.standard_normal((1, 16)), (n, 1))
        ks, ke = np.array([0, 40, 140, 149, 0]), np.array([300, 200, 160, 151, 5])
        return q, w, k, ks, ke
    if name in _RECIPES:
        return _recipe(name, 6, n)
    H = {"h64": None, "trained": 32}.get(name, 16)
    wl = make_workload(name, 6, n, H, seed=9)
    return wl.q, wl.w, wl.k, wl.ks, wl.ke


def _spawn(fn, world, args, tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, *args, str(tmp_path / "store"), str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")  # fmt: skip
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} ranks did not finish in 240 s")


def _worker(rank, world, name, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        c = np.load(Path(out) / "case.npz")  # made once, by the test
        q, w, k, ks, ke = (c[x] for x in ("q", "w", "k", "ks", "ke"))
        starts = shard_starts(k.shape[0], sizes=CASES[name][1][world])
        s0, s1 = int(starts[rank]), int(starts[rank + 1])
        ids = distributed_topk(q, w, k[s0:s1], K, ks, ke, s0)
        np.save(Path(out) / f"rank{rank}.npy", ids)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_ranks_return_the_single_process_ids(name, world, tmp_path):
    q, w, k, ks, ke = _case(name)
    np.savez(tmp_path / "case.npz", q=q, w=w, k=k, ks=ks, ke=ke)
    _spawn(_worker, world, (name,), tmp_path)
    want = topk_ids(index_scores(q, w, k, ks, ke), K)
    for r in range(world):
        got = np.load(tmp_path / f"rank{r}.npy")
        assert np.array_equal(got, want), (name, world, r)


DECODE_STARTS = {2: [0, 200, 10**6], 3: [0, 41, 41, 10**6]}  # rank r holds [s_r, s_{r+1})


def _decode_case():
    rng = np.random.default_rng(5)
    lens = np.array([500, 120, 41])
    keys = [rng.standard_normal((L, 16)) for L in lens]
    keys[1][:] = keys[1][:1]  # request 1: every key tied, across the shard border
    q, w = rng.standard_normal((3, 2, 8, 16)), rng.standard_normal((3, 2, 8))
    return q, w, keys, lens


def _decode_worker(rank, world, store, out):
    from dosa_ref.decode import DecodeSelector
    from dosa_ref.shards import distributed_decode_step

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        q, w, keys, lens = _decode_case()
        s0, s1 = DECODE_STARTS[world][rank], DECODE_STARTS[world][rank + 1]
        sel = DecodeSelector(K=16, history=2)
        steps = []
        for step in range(3):
            L = lens - (2 - step)
            shard = [kb[min(s0, Lb) : min(s1, Lb)] for kb, Lb in zip(keys, L, strict=True)]
            steps.append(distributed_decode_step(sel, q + step, w, shard, s0, L))
        np.save(Path(out) / f"rank{rank}.npy", np.stack(steps))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_decode_over_a_sharded_cache_equals_one_cache(world, tmp_path):
    from dosa_ref.decode import DecodeSelector

    _spawn(_decode_worker, world, (), tmp_path)
    q, w, keys, lens = _decode_case()
    sel = DecodeSelector(K=16, history=2)
    want = np.stack([sel.step(q + step, w, [kb[: L] for kb, L in zip(keys, lens - (2 - step),
                                                                      strict=True)],
                              lens - (2 - step)).ids for step in range(3)])  # fmt: skip
    for r in range(world):
        assert np.array_equal(np.load(tmp_path / f"rank{r}.npy"), want), (world, r)
