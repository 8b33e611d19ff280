"""A context split into contiguous key shards (dosa_ref/shards.py, docs/method.md §12
"Sharded contexts"): the merge of the shards' Top-K lists equals the Top-K of the whole
context bitwise — random regimes, ties across shard borders, empty shards, unequal sizes,
shards with fewer than K visible keys — against the brute-force oracle."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_ref.scorer import index_scores, topk_ids
from dosa_ref.shards import local_ranges, merge_topk, shard_starts, sharded_topk
from dosa_ref.workloads import make_workload


def _oracle(q, w, k, K, ks, ke, tau_floor=None):
    """The brute-force Top-K; as a shard's ``select`` it ignores the floor (a floor only
    lets a shard return less)."""
    return topk_ids(index_scores(q, w, k, ks, ke), K)


@pytest.mark.parametrize("regime", ["calibrated", "isotropic", "many_positive"])
@pytest.mark.parametrize("sizes", [[1000, 1000, 1000], [0, 2999, 1], [1500, 0, 1500], [7, 2993]])
def test_sharded_dosa_equals_the_whole_context(regime, sizes):
    wl = make_workload(regime, 8, 3000, 16, seed=5)
    K = 64
    want = _oracle(wl.q, wl.w, wl.k, K, wl.ks, wl.ke)
    got = sharded_topk(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, starts=shard_starts(3000, sizes=sizes))
    assert np.array_equal(got, want)


def test_ties_across_a_shard_border_keep_the_global_id_order():
    """Every key scores the same: the Top-K is the K smallest visible ids, whichever shard
    holds them (a border inside the tie, shards shorter than K)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 8))
    w = np.abs(rng.standard_normal((3, 4)))
    k = np.tile(rng.standard_normal((1, 8)), (50, 1))
    ks, ke = np.array([0, 10, 23]), np.array([50, 40, 30])
    for sizes in ([5, 5, 40], [23, 27], [1] * 50):
        got = sharded_topk(q, w, k, 12, ks, ke, starts=shard_starts(50, sizes=sizes),
                           select=_oracle)  # fmt: skip
        assert np.array_equal(got, _oracle(q, w, k, 12, ks, ke)), sizes


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 120),
    K=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 120), max_size=5),
    dup=st.booleans(),
)
def test_merge_is_exact_property(seed, n, K, cuts, dup):
    rng = np.random.default_rng(seed)
    Qn, H, D = 3, 3, 4
    q = rng.integers(-2, 3, (Qn, H, D)).astype(np.float64)  # small integers: many ties
    w = rng.integers(-2, 3, (Qn, H)).astype(np.float64)
    k = rng.integers(-2, 3, (n, D)).astype(np.float64)
    if dup:
        k[n // 2 :] = k[: n - n // 2]
    ks = rng.integers(0, n + 1, Qn)
    ke = np.maximum(ks, rng.integers(0, n + 1, Qn))
    starts = np.unique(np.clip(np.array([0, *cuts, n]), 0, n))
    got = sharded_topk(q, w, k, K, ks, ke, starts=starts, select=_oracle)
    assert np.array_equal(got, _oracle(q, w, k, K, ks, ke))


def test_helpers_and_their_errors():
    assert shard_starts(10, 3).tolist() == [0, 3, 7, 10]
    assert shard_starts(10, sizes=[0, 10]).tolist() == [0, 0, 10]
    lo, hi = local_ranges([0, 5, 9], [4, 8, 10], 4, 9)
    assert lo.tolist() == [0, 1, 5] and hi.tolist() == [0, 4, 5]
    ids = merge_topk([(np.array([[3, -1]]), np.array([[1.0, 9.0]])),
                      (np.array([[7, 8]]), np.array([[1.0, 2.0]]))], 3)  # fmt: skip
    assert ids.tolist() == [[8, 3, 7]]  # −1's score ignored; the tie at 1.0 by id
    for kw, name in (({"sizes": [3, 3]}, "sizes"), ({"shards": 0}, "shards"), ({}, "shards")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            shard_starts(10, **kw)
    q, w, k = np.ones((1, 1, 2)), np.ones((1, 1)), np.ones((4, 2))
    with pytest.raises(ValueError, match="^starts:"):
        sharded_topk(q, w, k, 2, starts=[0, 3, 2, 4])


def test_the_shared_floor_prunes_and_keeps_every_key_at_or_above_it():
    """A short shard screened against the long shard's τ (its own is lower) passes fewer
    keys, and every key of its exact Top-K whose score reaches the floor is returned."""
    from dosa_ref.pipeline import dosa_topk
    from dosa_ref.shards import local_ranges, shard_tau

    wl = make_workload("calibrated", 8, 20000, 16, seed=2)
    K, cut = 64, 8000
    opts = dict(r=14, auto_dense=False, seeds="local", window=256, sinks=0)
    floor = shard_tau(wl.q, wl.w, wl.k[cut:], K, wl.ks, wl.ke, cut)
    lo, hi = local_ranges(wl.ks, wl.ke, 0, cut)
    own = shard_tau(wl.q, wl.w, wl.k[:cut], K, wl.ks, wl.ke, 0, **opts)
    assert (floor > own).all()  # the long shard's seeds set the higher bound
    plain = dosa_topk(wl.q, wl.w, wl.k[:cut], K, lo, hi, **opts)
    floored = dosa_topk(wl.q, wl.w, wl.k[:cut], K, lo, hi, tau_floor=floor, **opts)
    assert (floored.stats.survivors <= plain.stats.survivors).all()
    assert floored.stats.survivors.sum() < plain.stats.survivors.sum()
    s = index_scores(wl.q, wl.w, wl.k[:cut], lo, hi)
    exact = topk_ids(s, K)
    for t in range(8):
        keep = exact[t][(exact[t] >= 0)]
        keep = keep[s[t, keep] >= floor[t]]
        assert np.array_equal(floored.ids[t, : keep.size], keep)


@pytest.mark.parametrize("bad", [np.zeros(3), np.array([0.0, np.nan] * 4), np.full(8, np.inf)])
def test_tau_floor_is_checked(bad):
    from dosa_ref.pipeline import dosa_topk

    wl = make_workload("calibrated", 8, 600, 16, seed=2)
    with pytest.raises(ValueError, match="^tau_floor:"):
        dosa_topk(wl.q, wl.w, wl.k, 16, wl.ks, wl.ke, tau_floor=bad)


def _decode_case(rng, tied=False):
    """Three requests of different cache lengths, next_n = 2, random or tied keys."""
    B, n, H, D = 3, 2, 8, 16
    lens = [700, 333, 41]
    if tied:  # every key of a request the same: the Top-K is the K smallest visible ids
        keys = [np.tile(rng.standard_normal((1, D)), (L, 1)) for L in lens]
    else:
        keys = [rng.standard_normal((L, D)) for L in lens]
    q = rng.standard_normal((B, n, H, D))
    w = rng.standard_normal((B, n, H))
    return q, w, keys, np.array(lens)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("starts", [[0, 350, 700], [0, 0, 40, 699, 700], [0, 333, 334, 800]])
def test_sharded_decode_equals_the_single_cache(tied, starts):
    """Decode over a sharded cache (shards' largest witness τ, each shard's compacted list,
    the exact merge) returns the single-cache selector's ids in every step, while the
    witnesses evolve — ties across shard borders, empty shards, shards past a cache's end."""
    from dosa_ref.decode import DecodeSelector
    from dosa_ref.shards import sharded_decode_step

    rng = np.random.default_rng(11 + int(tied))
    q, w, keys, lens = _decode_case(rng, tied)
    one, sh = DecodeSelector(K=24, history=2), DecodeSelector(K=24, history=2)
    for step in range(3):
        L = lens - (2 - step)  # the caches grow by one key per step
        ks = np.maximum(0, L[:, None] - 300) * np.ones((1, 2), np.int64)  # a sliding window
        want = one.step(q, w, keys, L, ks=ks)
        got = sharded_decode_step(sh, q, w, keys, L, ks=ks, starts=starts)
        assert np.array_equal(got.ids, want.ids), step
        assert np.all(got.stats.tau <= want.stats.tau_final)  # the floor is a lower bound
        assert np.all(got.stats.compacted >= np.minimum(24, got.stats.visible))
        for b in range(3):
            assert np.array_equal(sh.witnesses(b), one.witnesses(b))
        q = q + 0.1 * rng.standard_normal(q.shape)


def test_sharded_decode_checks_its_arguments():
    from dosa_ref.decode import DecodeSelector
    from dosa_ref.shards import sharded_decode_step

    q, w, keys, lens = _decode_case(np.random.default_rng(0))
    sel = DecodeSelector(K=8)
    with pytest.raises(ValueError, match="starts"):
        sharded_decode_step(sel, q, w, keys, lens, starts=[0, 100])  # ends before the caches
    with pytest.raises(ValueError, match="w"):
        sharded_decode_step(sel, q, w[:, :1], keys, lens)
    with pytest.raises(ValueError, match="ids"):
        sel.push(np.zeros((3, 8)))


@pytest.mark.parametrize("name,H,r", [("calibrated", 32, 14), ("h64", 64, 30)])
def test_emulated_screen_of_shards_with_the_shared_floor(name, H, r):
    """The CPU emulation of the GPU screen on each shard (``emulate.sharded_survival``): the
    bound holds on every shard with its own τ and with the shards' largest (0 violations),
    the shared floor never keeps more survivors than a shard's own τ, and one shard is the
    whole context with nothing raised."""
    from dosa_cupy.emulate import screen_survival, sharded_survival
    from dosa_ref.fp8 import quantize_keys, quantize_queries

    wl = make_workload(name, 8, 8192, H=H, seed=2)
    kp, ksc = quantize_keys(wl.k)
    q, w = quantize_queries(wl.q, wl.w)
    rows = sharded_survival(q, w, kp, ksc, 512, wl.ks, wl.ke, [0, 3000, 3000, 8192], r=r)
    assert [x["shard"] for x in rows] == [0, 2] and [x["keys"] for x in rows] == [3000, 5192]
    assert all(x["violations"] == 0 for x in rows)
    assert all(x["survivors_shared"] <= x["survivors_own"] <= x["screened"] for x in rows)
    assert rows[0]["raised"] > 0 and rows[0]["survivors_shared"] < rows[0]["survivors_own"]
    (one,) = sharded_survival(q, w, kp, ksc, 512, wl.ks, wl.ke, [0, 8192], r=r)
    whole = screen_survival(q, w, kp, ksc, 512, wl.ks, wl.ke, r=r)
    assert one["raised"] == 0 and one["survivors_own"] == one["survivors_shared"]
    assert one["survivors_own"] == whole["survivors"] and one["screened"] == whole["screened"]


@pytest.mark.parametrize("name", ["calibrated", "h64", "isotropic"])
def test_the_union_floor_is_a_valid_and_higher_floor(name):
    """``union_floor`` of the shards' seed lists: at least every shard's own τ (so at least
    their largest), at most the context's K-th score (the shards' seeds are distinct keys of
    it), and on one shard equal to that shard's τ."""
    from dosa_ref.shards import shard_seed_top, shard_tau, union_floor

    wl = make_workload(name, 6, 3000, None if name == "h64" else 16, seed=4)
    K = 48
    starts = [0, 700, 700, 2100, 3000]
    tops = [shard_seed_top(wl.q, wl.w, wl.k[a:b], K, wl.ks, wl.ke, a)
            for a, b in zip(starts[:-1], starts[1:], strict=True)]  # fmt: skip
    floor = union_floor(tops, K)
    kth = np.sort(index_scores(wl.q, wl.w, wl.k, wl.ks, wl.ke), axis=1)[:, -K]
    assert (floor <= kth).all()
    assert (floor >= np.max([t[:, -1] for t in tops], axis=0)).all()
    assert (floor > np.max([t[:, -1] for t in tops], axis=0)).any()  # strictly higher somewhere
    one = shard_tau(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, 0)
    assert np.array_equal(union_floor([shard_seed_top(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, 0)], K),
                          one)  # fmt: skip
    assert np.isneginf(union_floor([t[:, :5] for t in tops[:1]], K)).all()  # fewer than K
