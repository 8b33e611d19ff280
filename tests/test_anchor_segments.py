"""The anchor pool by segments (option ``anchor_segments``, docs/method.md §2): each anchor
contributes its exact Top-K within each of S segments of the keys.

CPU tests: the segments (``dosa_ref.seeds.anchor_segments_of``) tile the keys; the pool of S
segments holds the pool of one (a key of an anchor's Top-K is in the Top-K of its segment)
and is each segment's brute-force Top-K; ``dosa_ref.dosa_topk`` stays exact and its τ never
falls; the GPU host code's ``seeds.segment_select`` (numpy standing in for CuPy, a
brute-force selection for the kernel) returns the reference's per-segment Top-K, ranges
clipped at the segments; the option is checked on both sides (ValueError naming it).
GPU test: ``dosa_topk(anchor_segments=4)`` == the dense route on two regimes and both
scorers.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu

from dosa_cupy import options as cupy_options
from dosa_cupy.seeds import segment_select
from dosa_ref.pipeline import dosa_topk
from dosa_ref.scorer import index_scores, topk_ids, topk_of
from dosa_ref.seeds import anchor_pool, anchor_queries, anchor_segments_of
from dosa_ref.workloads import make_workload


@pytest.mark.parametrize("N,S", [(10, 1), (10, 3), (1000, 7), (5, 8), (4096, 4)])
def test_segments_tile_the_keys(N, S):
    c = anchor_segments_of(N, S)
    assert c[0] == 0 and c[-1] == N and len(c) == S + 1 and (np.diff(c) >= 0).all()
    assert (np.diff(c)[:-1] == -(-N // S)).all() or N < S


@pytest.mark.parametrize("S", [2, 3, 8])
def test_the_pool_of_segments_holds_the_pool_and_each_segments_top_k(S):
    wl = make_workload("calibrated", 6, 1500, 16, seed=3)
    K = 40
    one = anchor_pool(wl.q, wl.w, wl.k, wl.ks, wl.ke, K, 3)
    seg = anchor_pool(wl.q, wl.w, wl.k, wl.ks, wl.ke, K, 3, S)
    assert np.isin(one, seg).all() and seg.size > one.size
    cuts = anchor_segments_of(wl.k.shape[0], S)
    want = []
    for t in anchor_queries(6, 3):
        s = index_scores(wl.q[t : t + 1], wl.w[t : t + 1], wl.k, wl.ks[t : t + 1],
                         wl.ke[t : t + 1])[0]  # fmt: skip
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            ok = np.isfinite(s[a:b])
            ids = np.arange(a, b)[ok]
            want.append(topk_of(s[a:b][ok], ids, K)[0])
    assert np.array_equal(seg, np.unique(np.concatenate(want)))


@pytest.mark.parametrize("name", ["calibrated", "h64", "many_positive"])
def test_reference_stays_exact_and_tau_never_falls(name):
    wl = make_workload(name, 8, 3000, None if name == "h64" else 16, seed=5)
    K = 64
    want = topk_ids(index_scores(wl.q, wl.w, wl.k, wl.ks, wl.ke), K)
    opts = dict(auto_dense=False, r=6, seeds="local+anchor", window=64)
    one = dosa_topk(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, **opts)
    seg = dosa_topk(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, anchor_segments=6, **opts)
    assert np.array_equal(one.ids, want) and np.array_equal(seg.ids, want)
    assert (seg.stats.tau >= one.stats.tau).all() and (seg.stats.seeds >= one.stats.seeds).all()
    assert (seg.stats.tau > one.stats.tau).any()


def _brute_select(rows, K, ks, ke):
    """select_rows' contract on the host: int32 [n, K] Top-K of rows[i, ks[i]:ke[i]]."""
    out = np.full((rows.shape[0], K), -1, np.int32)
    for i in range(rows.shape[0]):
        a, b = int(ks[i]), int(ke[i])
        top, _ = topk_of(rows[i, a:b].astype(np.float64), np.arange(a, b), K)
        out[i, : top.size] = top
    return out


@pytest.mark.parametrize("N,S,K", [(1000, 4, 30), (1003, 5, 7), (64, 8, 16), (300, 1, 20)])
def test_segment_select_is_the_reference_pool(N, S, K):
    """The GPU path's per-segment selection over a padded logits view: every anchor row's
    ids are its Top-K within each segment, its range [ks, ke) respected."""
    rng = np.random.default_rng(N + S)
    n = 3
    lg = rng.standard_normal((n, N)).astype(np.float32)
    lg[1, 5:9] = lg[1, 4]  # ties inside a segment
    ks = np.array([0, 37, 0], np.int32)
    ke = np.array([N, N - 11, N // 3], np.int32)
    vis = (np.arange(N)[None] >= ks[:, None]) & (np.arange(N)[None] < ke[:, None])
    lg = np.where(vis, lg, -np.inf).astype(np.float32)
    got = segment_select(lg, K, ks, ke, S, _brute_select, np)
    assert got.dtype == np.int32 and got.shape == (n, S * K)
    cuts = anchor_segments_of(N, S)
    for i in range(n):
        want = []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            lo, hi = max(a, ks[i]), min(b, ke[i])
            top = []
            if hi > lo:
                top = topk_of(lg[i, lo:hi].astype(np.float64), np.arange(lo, hi), K)[0]
            want.append(np.concatenate([top, -np.ones(K - len(top), np.int64)]))
        assert np.array_equal(got[i], np.concatenate(want)), i


def test_the_option_is_checked():
    wl = make_workload("calibrated", 2, 100, 16, seed=1)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="^anchor_segments:"):
            dosa_topk(wl.q, wl.w, wl.k, 4, wl.ks, wl.ke, anchor_segments=bad)
        with pytest.raises(ValueError, match="^anchor_segments:"):
            cupy_options.check_options({"anchor_segments": bad})
    assert cupy_options.check_options({"anchor_segments": 3})["anchor_segments"] == 3


@gpu
@pytest.mark.parametrize("scorer", ["f16", "fp8"])
@pytest.mark.parametrize("regime", ["calibrated", "structured"])
def test_gpu_dosa_with_segments_equals_dense(scorer, regime):
    import dosa_cupy
    from dosa_cupy.scorer import fp8_available
    from dosa_cupy.workload import make_gpu_workload

    if scorer == "fp8" and not fp8_available():
        pytest.skip("the FP8 scorer needs sm_90a")
    wl = make_gpu_workload(regime, 96, 40000, 64, seed=2)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*a, scorer=scorer)
    for S in (2, 5):
        got = dosa_cupy.dosa_topk(*a, route="dosa", anchor_segments=S, scorer=scorer)
        assert cp.array_equal(got, dense), (regime, scorer, S)
