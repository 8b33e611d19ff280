"""The scorer's domain (docs/method.md §1 "The scorer's domain"): where a visible score is not
finite in float64, every route raises the brute force's own ValueError; elsewhere every
route returns the brute force's ids.

Properties drive the scores past float64 with scale factors up to 10^±320 on q, w and k
(products past DBL_MAX, 0·inf, inf − inf, −inf from negative weights) on every route of
the reference: ``dosa_topk`` under each seed strategy and with explicit seeds,
``fp8_topk`` against ``topk_check``, and the decode selector against the brute force.
Examples pin the issue's case, a −inf score, and an envelope that proves nothing while
every score is finite (the query is scored in full and its ids are exact).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dosa_ref import DecodeSelector, dosa_topk, fp8_topk, index_scores, topk_ids
from dosa_ref.fp8 import quantize_keys
from dosa_ref.pipeline import topk_check
from dosa_ref.scorer import ENVELOPE_MAX, SCORE_OVERFLOW, finite_envelope, key_amax, score_keys
from dosa_ref.workloads import make_workload

STRATEGIES = ("anchor", "local", "certificate", "local+anchor+certificate")
EXPONENTS = (-320, -160, 0, 4, 8, 100, 150, 154, 160, 200, 300, 304, 308)


def _outcome(fn):
    """("ids", array) or ("raises", message) for a ValueError; anything else propagates."""
    try:
        with np.errstate(all="ignore"):
            return "ids", np.asarray(fn())
    except ValueError as e:
        return "raises", str(e)


def _same(brute, got, route: str) -> None:
    assert got[0] == brute[0], f"{route}: {got[0]} where the brute force {brute[0]}: {got[1]}"
    if brute[0] == "raises":
        assert got[1] == brute[1] == SCORE_OVERFLOW, route
    else:
        np.testing.assert_array_equal(got[1], brute[1], err_msg=route)


def _workload(seed: int, N: int = 96, Qn: int = 4):
    wl = make_workload("calibrated", Qn, N, H=8, seed=seed)
    as64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    return as64(wl.q), as64(wl.w), as64(wl.k), wl.ks, wl.ke


def _scale(a: np.ndarray, e: int) -> np.ndarray:
    """``a`` times 10^e (the power split so no factor overflows), an entry past DBL_MAX
    clamped to ±DBL_MAX (inputs are finite; their products are what overflows)."""
    with np.errstate(all="ignore"):
        f = np.float64(10.0 ** (e // 2)) * np.float64(10.0 ** (e - e // 2))
        out = a * f
    return np.where(np.isfinite(out), out, np.sign(a) * np.finfo(np.float64).max)


scale_exps = st.tuples(*(st.sampled_from(EXPONENTS) for _ in range(3)))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(exps=scale_exps, seed=st.integers(0, 3), K=st.sampled_from((5, 16)))
def test_every_route_agrees_with_the_brute_force_past_float64(exps, seed, K):
    q, w, k, ks, ke = _workload(seed)
    eq, ew, ek = exps
    q, w, k = _scale(q, eq), _scale(w, ew), _scale(k, ek)
    brute = _outcome(lambda: topk_ids(index_scores(q, w, k, ks, ke), K))
    for strat in STRATEGIES:
        got = _outcome(lambda s=strat: dosa_topk(q, w, k, K, ks, ke, seeds=s).ids)
        _same(brute, got, f"dosa_topk seeds={strat}")
    seeds = np.tile(np.arange(0, 96, 7, dtype=np.int64), (q.shape[0], 1))
    got = _outcome(lambda: dosa_topk(q, w, k, K, ks, ke, seed_ids=seeds).ids)
    _same(brute, got, "dosa_topk seed_ids")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(eq=st.sampled_from(EXPONENTS), ew=st.sampled_from(EXPONENTS), seed=st.integers(0, 3))
def test_fp8_route_agrees_with_full_scoring_past_float64(eq, ew, seed):
    q, w, k, ks, ke = _workload(seed)
    payload, scale = quantize_keys(k)
    q, w = _scale(q, eq), _scale(w, ew)
    brute = _outcome(lambda: topk_check(q, w, payload, scale, 5, ks, ke))
    got = _outcome(lambda: fp8_topk(q, w, payload, scale, 5, ks, ke).ids)
    _same(brute, got, "fp8_topk")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(eq=st.sampled_from(EXPONENTS), ew=st.sampled_from(EXPONENTS), seed=st.integers(0, 3))
def test_decode_agrees_with_the_brute_force_past_float64(eq, ew, seed):
    q, w, k, _, _ = _workload(seed, Qn=2)
    q, w = _scale(q, eq), _scale(w, ew)
    qd, wd = q[:, None], w[:, None]  # [B = 2, next_n = 1, H, D]
    ke = np.array([[60], [96]])
    brute = _outcome(
        lambda: np.stack(
            [
                topk_ids(index_scores(q[b : b + 1], w[b : b + 1], k, None, ke[b]), 8)
                for b in range(2)
            ]
        )  # fmt: skip
    )
    got = _outcome(lambda: DecodeSelector(K=8).step(qd, wd, k, ke=ke).ids)
    _same(brute, got, "DecodeSelector.step")


def test_the_reported_case_raises_on_both_paths():
    q, w, k, ks, ke = _workload(0, N=50, Qn=5)
    q, w = q * 1e8, w * 1e304
    with np.errstate(all="ignore"):
        for fn in (
            lambda: topk_ids(index_scores(q, w, k, ks, ke), 5),
            lambda: dosa_topk(q, w, k, 5, ks, ke),
        ):
            with pytest.raises(ValueError, match="overflows float64"):
                fn()


def test_a_negative_infinite_score_raises():
    """−inf from negative weights is not 'invisible': index_scores raises, so topk_ids can
    never read an overflowed visible key as a missing one."""
    q = np.ones((1, 2, 4))
    w = np.array([[-1e308, -1e308]])
    k = np.full((20, 4), 1e10)
    with np.errstate(all="ignore"):
        with pytest.raises(ValueError, match="overflows float64"):
            index_scores(q, w, k)
        with pytest.raises(ValueError, match="overflows float64"):
            dosa_topk(q, w, k, 3)


def test_a_query_the_envelope_cannot_prove_is_scored_in_full_and_exact():
    """One coordinate of q near DBL_MAX that no key touches: the envelope exceeds 2^1022,
    every score is finite, the query is scored in full (recovered) and its ids are exact."""
    rng = np.random.default_rng(3)
    q, w, k = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 4)), rng.random((400, 6))
    k[:, 0] = 0.0
    q[1, 2, 0] = 1.7e308
    assert not finite_envelope(q[1], w[1], key_amax(k))
    assert finite_envelope(q[0], w[0], key_amax(k))
    ref = topk_ids(index_scores(q, w, k), 16)
    res = dosa_topk(q, w, k, 16)
    np.testing.assert_array_equal(res.ids, ref)
    assert res.stats.recovered.tolist() == [False, True, False]
    assert res.stats.scored[1] == 400


def test_envelope_edge_cases():
    q, w = np.ones((2, 4)), np.ones(2)
    assert finite_envelope(q, w, 0.0)  # no key can score anything but 0
    assert finite_envelope(q, w, ENVELOPE_MAX / 8)  # E = 8 · amax, exactly the threshold
    assert not finite_envelope(q, w, np.nextafter(ENVELOPE_MAX / 8, np.inf))
    assert not finite_envelope(q, w, np.inf)
    assert not finite_envelope(np.full((2, 4), np.finfo(np.float64).max), w, 1.0)
    with pytest.raises(ValueError, match="overflows float64"):
        score_keys(np.full((1, 2), 1e200), np.ones(1), np.full((1, 2), 1e200))
    assert score_keys(np.full((1, 2), -1e200), np.ones(1), np.full((1, 2), 1e200)).tolist() == [
        0.0
    ]  # a dot at −inf: its ReLU is the exact 0, no error
