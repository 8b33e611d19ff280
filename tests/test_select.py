"""Exactness of Algorithm 1 (Theorem 1): dosa_topk ids equal brute-force Top-K, tie order
included, for every seed strategy, buffer capacities down to 1, short and empty rows."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import problems, selection_options

from dosa_ref import dosa_topk, index_scores, score_keys, topk_ids

OPTS = selection_options(
    window=40,
    n_anchors=3,
    cert_seeds=40,
    form=st.sampled_from(("base", "abs")),
    refine_batch=st.integers(1, 50),
    neg_aggregate=st.sampled_from(("majority", "all", "none")),
    neg_priority=st.sampled_from(("activation", "strength")),
    pos_projection=st.booleans(),
    allowance=st.sampled_from(("triangle", "joint", "grouped")),
)


@given(problems(), OPTS)
def test_dosa_equals_brute_force(prob, opts):
    q, w, k, K, ks, ke = prob
    ref = topk_ids(index_scores(q, w, k, ks, ke), K)
    res = dosa_topk(q, w, k, K, ks, ke, **opts)
    assert res.ids.dtype == np.int64 and res.ids.shape == ref.shape
    np.testing.assert_array_equal(res.ids, ref)


@given(problems(max_n=200), st.integers(0, 2**31))
def test_explicit_seeds_any_ids(prob, seed):
    """Any explicit seed list (duplicates, ids outside the visible range, −1 pads) is safe,
    with or without other strategies; ids outside [−1, N) are rejected (``seed_ids``)."""
    q, w, k, K, ks, ke = prob
    N = k.shape[0]
    rng = np.random.default_rng(seed)
    ids = rng.integers(-1, N, size=(q.shape[0], 3 * K))
    ref = topk_ids(index_scores(q, w, k, ks, ke), K)
    res = dosa_topk(q, w, k, K, ks, ke, seeds="explicit", seed_ids=ids, buffer=K)
    np.testing.assert_array_equal(res.ids, ref)
    res = dosa_topk(q, w, k, K, ks, ke, seeds="local", seed_ids=ids, window=3, r=1)
    np.testing.assert_array_equal(res.ids, ref)
    for bad in (N, -2):
        with pytest.raises(ValueError, match="seed_ids"):
            dosa_topk(q, w, k, K, ks, ke, seed_ids=np.full((q.shape[0], 1), bad))


def _problem(seed=0, Qn=4, H=8, D=16, N=3000, neg=0.85):
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal(D)
    k = rng.standard_normal((N, D)) * 0.5 + mu
    q = rng.standard_normal((Qn, H, D))
    w = np.abs(rng.standard_normal((Qn, H))) * np.where(rng.random((Qn, H)) < neg, -1, 1)
    return q, w, k


def test_screening_prunes_and_stays_exact():
    """On a DSA-like problem screening must reject most keys (a test that fails if the
    certificate stops pruning) and the result must stay exact."""
    q, w, k = _problem()
    K = 64
    ref = topk_ids(index_scores(q, w, k), K)
    res = dosa_topk(q, w, k, K, seeds="local+anchor", window=128)
    np.testing.assert_array_equal(res.ids, ref)
    assert res.stats.survival < 0.5
    assert res.stats.totals()["recovered"] == 0


def test_all_ties_keep_tied_keys_by_id():
    """All scores equal: every key survives (equality survives), ids ascending win.  With
    r="auto" the cost model sees m = 1 and scores densely; a fixed r screens."""
    q = np.ones((2, 3, 4))
    w = np.array([[1.0, -0.5, 0.25], [-1.0, -1.0, 1.0]])
    k = np.ones((100, 4))
    for r in ("auto", 1):
        for buf in (1, 7, 10, 1000):
            res = dosa_topk(q, w, k, 10, seeds="local", buffer=buf, window=12, r=r)
            np.testing.assert_array_equal(res.ids, np.tile(np.arange(10), (2, 1)))
    assert res.stats.survivors.sum() == res.stats.screened.sum() == 2 * (100 - 12 - 16)


def test_overflow_merges_exactly():
    q, w, k = _problem(seed=1, neg=0.5)
    K = 32
    ref = topk_ids(index_scores(q, w, k), K)
    res = dosa_topk(q, w, k, K, seeds="local", window=40, buffer=K, refine_batch=7)
    np.testing.assert_array_equal(res.ids, ref)
    assert res.stats.overflows.sum() > 0


def test_short_and_empty_rows_pad():
    q, w, k = _problem(Qn=3, N=50)
    ks = np.array([0, 10, 20])
    ke = np.array([0, 15, 50])
    res = dosa_topk(q, w, k, 8, ks, ke)
    assert np.all(res.ids[0] == -1)
    assert np.all(res.ids[1, 5:] == -1) and np.all(res.ids[1, :5] >= 10)
    np.testing.assert_array_equal(res.ids, topk_ids(index_scores(q, w, k, ks, ke), 8))


@pytest.mark.parametrize("H,r", [(1, "auto"), (4, 4), (4, 9)])
def test_no_screening_cases_score_fully(H, r):
    q, w, k = _problem(H=H, N=500)
    res = dosa_topk(q, w, k, 16, r=r)
    assert res.stats.dense.all()
    np.testing.assert_array_equal(res.ids, topk_ids(index_scores(q, w, k), 16))


def test_nonfinite_bound_recovers():
    """Keys so large that U overflows to inf: the query is recovered over the full
    domain (C.3), still exact."""
    q, w, k = _problem(N=400)
    k = k.copy()
    k[7] = 1e305
    res = dosa_topk(q, w, k, 16, window=20)
    assert res.stats.recovered.any()
    with np.errstate(over="ignore", invalid="ignore"):
        ref = topk_ids(index_scores(q, w, k), 16)
    np.testing.assert_array_equal(res.ids, ref)


def test_canonical_scorer_is_position_independent():
    """The CPU exactness contract compares ids bitwise, so a key's float64 score must not
    depend on which keys are scored with it (seed, survivor, or full matrix)."""
    rng = np.random.default_rng(5)
    for D, H in ((3, 1), (128, 32), (128, 64)):
        k = rng.standard_normal((9000, D))
        q = rng.standard_normal((H, D))
        w = rng.standard_normal(H)
        full = score_keys(q, w, k)
        for m in (1, 3, 17, 4095, 4097, 5000):
            idx = rng.permutation(9000)[:m]
            np.testing.assert_array_equal(score_keys(q, w, k[idx]), full[idx])
        np.testing.assert_array_equal(score_keys(q, w, k[1234:5678]), full[1234:5678])


def test_stats_are_consistent():
    q, w, k = _problem(seed=2)
    res = dosa_topk(q, w, k, 64, slack_sample=64)
    st_ = res.stats
    assert np.all(st_.survivors <= st_.screened)
    assert np.all(st_.kept <= st_.refined)
    assert np.all(st_.tau <= st_.tau_final)
    assert np.all(st_.tau_gap[np.isfinite(st_.tau_gap)] >= 0)
    assert set(st_.slack) == {"positive", "missed_negative", "cancellation", "total"}
    t = st_.totals()
    assert 0.0 <= t["pruning"] <= 1.0


def test_cost_model_scores_densely_when_screening_cannot_pay():
    """All scores tie, so every bound survives (m = 1): r="auto" scores densely
    (docs/method.md §6 "Cost") and says why; ids stay exact."""
    q = np.ones((2, 8, 4))
    w = -np.ones((2, 8))
    k = np.ones((300, 4))
    res = dosa_topk(q, w, k, 10, seeds="local", window=20, sinks=0)
    st_ = res.stats
    np.testing.assert_array_equal(res.ids, topk_ids(index_scores(q, w, k), 10))
    assert st_.dense.all() and np.all(st_.est_work >= 1.0) and np.all(st_.est_survival == 1.0)
    assert np.all(st_.screened == 0) and np.all(st_.r == 0)
    np.testing.assert_array_equal(st_.scored, st_.visible)  # seeds are not scored twice
    res = dosa_topk(q, w, k, 10, seeds="local", window=20, sinks=0, auto_dense=False)
    assert not res.stats.dense.any() and np.all(res.stats.survivors == res.stats.screened)
    np.testing.assert_array_equal(res.ids, topk_ids(index_scores(q, w, k), 10))


def test_work_accounting():
    """The fully scored fraction counts seeds, certificate seeds and refinement (the keys
    scored for the selection), the anchor queries' full scoring is its own fraction, the
    work ratio adds both and the bound work; the cost model's estimate says screening pays
    where it ran."""
    q, w, k = _problem(seed=3, Qn=6, N=4000)
    res = dosa_topk(q, w, k, 32, window=64, cert_seeds=64, n_anchors=2)
    st_ = res.stats
    np.testing.assert_array_equal(res.ids, topk_ids(index_scores(q, w, k), 32))
    np.testing.assert_array_equal(st_.visible, 4000)
    assert st_.anchor_scored == 2 * 4000
    screened = ~st_.dense
    assert screened.any()
    np.testing.assert_array_equal(
        st_.scored[screened], (st_.seeds + st_.cert_seeds + st_.refined)[screened]
    )
    np.testing.assert_array_equal(st_.refined[screened], st_.survivors[screened])
    assert np.all(st_.est_work[screened] < 1.0) and np.all(st_.bound_work[screened] > 0)
    t = st_.totals()
    vis = st_.visible.sum()
    assert t["scored_fraction"] == pytest.approx(np.minimum(st_.scored, st_.visible).sum() / vis)
    assert t["anchor_scored_fraction"] == pytest.approx(st_.anchor_scored / vis)
    work = st_.scored.sum() + st_.anchor_scored + st_.bound_work.sum()
    assert t["work_ratio"] == pytest.approx(work / vis)


def test_default_seeds_scale_with_K():
    from dosa_ref.options import SelectOptions, default_cert_seeds, default_window

    assert default_window(16) == 2048 and default_window(4096) == 8192
    assert default_window(4096, "local+anchor") == 2048
    assert default_cert_seeds(16) == 2048 and default_cert_seeds(4096) == 4096
    assert SelectOptions(seeds="local").window_for(2048) == 4096
    assert SelectOptions(seeds="local", window=5).window_for(2048) == 5
    assert SelectOptions().cert_seeds_for(8192) == 8192
