"""The selection statistics are what ``dosa_ref.options.SelectStats`` defines: every
fraction lies in [0, 1] where it is defined and is nan (printed "-") exactly where it is a
0/0, on generated problems and on the edge cases (every query dense; K larger than N)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import problems, selection_options

from dosa_ref import dosa_topk
from dosa_ref.options import SelectStats
from dosa_ref.workloads import make_workload

FRACTIONS = (
    "survival",
    "pruning",
    "scored_fraction",
    "anchor_scored_fraction",
    "positive_projection_rows",
)

# small windows and few seeds: most problems screen some keys
OPTS = selection_options(window=16, n_anchors=4, cert_seeds=16)


def check_totals(st_: SelectStats) -> dict:
    """The invariants of the statistics' definitions; returns ``totals()``."""
    T = st_.totals()
    vis, screened = int(st_.visible.sum()), int(st_.screened.sum())
    for name in FRACTIONS:
        v = T[name]
        assert isinstance(v, float), name
        assert math.isnan(v) or 0.0 <= v <= 1.0, (name, v)
    # nan exactly where the definition is a 0/0
    assert math.isnan(T["survival"]) == (screened == 0)
    assert math.isnan(T["pruning"]) == (screened == 0)
    for name in ("scored_fraction", "anchor_scored_fraction", "work_ratio"):
        assert math.isnan(T[name]) == (vis == 0), name
    if screened:
        assert T["survival"] + T["pruning"] == pytest.approx(1.0)
    if vis:
        assert T["work_ratio"] >= T["scored_fraction"] >= 0.0  # a ratio: may exceed 1
    # the reference scores each key at most once per query, and screens only visible keys
    assert np.all(st_.scored <= st_.visible) and np.all(st_.survivors <= st_.screened)
    assert np.all(st_.screened <= st_.visible)
    return T


@given(problems(max_q=4, max_n=150, max_k=8), OPTS)
def test_fractions_lie_in_the_unit_interval(prob, opts):
    """Adversarial values and ranges (tests/strategies.py): ties, empty rows, H = 1."""
    q, w, k, K, ks, ke = prob
    res = dosa_topk(q, w, k, K, ks, ke, **opts)
    check_totals(res.stats)


@given(
    st.sampled_from(("calibrated", "isotropic", "many_positive")),
    st.integers(1, 4),
    st.integers(40, 400),
    st.integers(2, 8),
    st.integers(1, 48),
    st.integers(0, 2**16),
    OPTS,
)
def test_fractions_on_generated_workloads(regime, Qn, N, H, K, seed, opts):
    """DSA-like workloads (dosa_ref.workloads), where most queries are screened."""
    wl = make_workload(regime, min(Qn, N), N, H=H, D=16, seed=seed)
    res = dosa_topk(wl.q, wl.w, wl.k, K, wl.ks, wl.ke, **opts)
    check_totals(res.stats)


@pytest.mark.parametrize("seeds", ["local", "anchor", "certificate", "local+anchor+certificate"])
def test_the_demos_small_case(seeds):
    """``dosa demo --queries 4 --keys 1000 --K 64``: every query an anchor (4 anchors), so
    the old (scored + anchor_scored) / visible printed 200 %."""
    wl = make_workload("calibrated", 4, 1000, H=8)
    res = dosa_topk(wl.q, wl.w, wl.k, 64, wl.ks, wl.ke, seeds=seeds)
    T = check_totals(res.stats)
    assert T["scored_fraction"] <= 1.0
    if "anchor" in seeds:  # n_anchors = 4 = Qn: every query's visible keys, once
        assert T["anchor_scored"] == T["visible"] and T["anchor_scored_fraction"] == 1.0
    else:
        assert T["anchor_scored"] == 0 and T["anchor_scored_fraction"] == 0.0


def test_all_queries_dense_when_visible_at_most_K():
    """|Ω| ≤ K: every query scored densely, nothing screened: survival and pruning are
    undefined (nan), every visible key is fully scored."""
    wl = make_workload("calibrated", 3, 50, H=4)
    res = dosa_topk(wl.q, wl.w, wl.k, 64, wl.ks, wl.ke)
    st_ = res.stats
    assert st_.dense.all() and int(st_.screened.sum()) == 0
    T = check_totals(st_)
    assert math.isnan(T["survival"]) and math.isnan(T["pruning"])
    assert T["scored_fraction"] == 1.0


def test_K_larger_than_N():
    """K > N: the ids pad with −1; the fractions stay defined where keys are visible."""
    wl = make_workload("calibrated", 2, 20, H=4)
    res = dosa_topk(wl.q, wl.w, wl.k, 100, wl.ks, wl.ke)
    assert (res.ids[:, 20:] == -1).all()
    T = check_totals(res.stats)
    assert T["scored_fraction"] == 1.0 and math.isnan(T["survival"])


def test_nothing_visible():
    """Empty ranges: every ratio over Σ visible is a 0/0 (nan), never 0 or inf."""
    rng = np.random.default_rng(0)
    q, w, k = (
        rng.standard_normal((2, 4, 8)),
        rng.standard_normal((2, 4)),
        rng.standard_normal((30, 8)),
    )
    ks = ke = np.array([5, 9])
    res = dosa_topk(q, w, k, 4, ks, ke)
    T = check_totals(res.stats)
    assert all(
        math.isnan(T[n]) for n in ("scored_fraction", "anchor_scored_fraction", "work_ratio")
    )


def test_rescorings_are_work_not_keys():
    """A package that re-scores keys (``dosa_cupy``: overflow extensions, recoveries) counts
    them in ``scored``: the fraction of keys stays ≤ 1, the work ratio carries them."""
    n = 3
    st_ = SelectStats(
        Qn=n, visible=np.full(n, 100), scored=np.array([100, 250, 40]), anchor_scored=100
    )
    assert st_.scored_fraction == pytest.approx((100 + 100 + 40) / 300)
    assert st_.anchor_scored_fraction == pytest.approx(100 / 300)
    assert st_.work_ratio == pytest.approx((390 + 100) / 300)
    check_totals_keys = set(st_.totals())
    assert {"scored_fraction", "anchor_scored_fraction", "work_ratio"} <= check_totals_keys
