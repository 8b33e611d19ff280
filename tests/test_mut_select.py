"""Strict rejection, surviving ties and the seed / buffer rules of Algorithm 1, end to end
and deterministically (docs/mutation.md, clusters 3 and 6).

Every bound the library computes carries a positive rounding allowance, so U = τ never
happens on real inputs and ``U < τ`` (reject) cannot be told from ``U ≤ τ``.  Here the
bound is replaced (pytest's monkeypatch) by the exact computed score itself — the tightest
valid certificate, U_i = s_i — so a key tied with τ has U = τ exactly and must survive
(docs/method.md §7: strict rejection, equality survives; selection order score desc, id
asc).  The tie-aware rule (option ``tie_reject``, docs/method.md §7 "Tie-aware rejection
and zero plateaus") rejects a key at U = τ only when its id is above the K-th seed
record's; every tie below is checked with the rule on and off.

The bound is patched where the per-query loop looks it up: ``dosa_ref.screen`` (the
float64 ``upper_bound`` of ``Float64Bound`` and the FP8 ``screen_bound`` of ``FP8Bound``)
and ``dosa_ref.cost`` (the cost model's ``upper_bound``).
"""

from __future__ import annotations

import numpy as np
import pytest

from dosa_ref import cost as cost_mod
from dosa_ref import index_scores, score_keys, topk_ids, topk_of
from dosa_ref import pipeline as pipeline_mod
from dosa_ref import screen as screen_mod
from dosa_ref import select as select_mod
from dosa_ref.certificate import upper_bound
from dosa_ref.fp8 import dequantize, e4m3_values
from dosa_ref.pipeline import DosaStats, dosa_topk
from dosa_ref.plan import PlanOptions, activation_frequency, build_plan
from dosa_ref.prepare import QueryContext, prepare_chunk
from dosa_ref.seeds import (
    SeedSet,
    add_certificate_seeds,
    anchor_pool,
    explicit_seeds,
    kth_score,
    local_seeds,
)

# Scores s_i = [k_i,0]_+ (head 0, weight 1; head 1 has weight 0): key 0 ties with the
# local seeds 9 and 10 at τ = 2 and beats them on id.
SCORES = np.array([2.0, 1.0, 0.0, -1.0, 0.5, 0.0, 1.5, 0.0, 1.0, 2.0, 2.0, 5.0])


def _tie_problem(Qn=1):
    q = np.tile(np.array([[[1.0, 0.0], [0.0, 1.0]]]), (Qn, 1, 1))
    w = np.tile(np.array([[1.0, 0.0]]), (Qn, 1))
    k = np.stack([SCORES, np.zeros_like(SCORES)], axis=1)
    return q, w, k


def _exact_bound(plan, k, form="base", rounding="up", q_t=None, w_t=None, ksum=None):
    return score_keys(q_t, w_t, k)


@pytest.mark.parametrize("tie_reject", [False, True])
@pytest.mark.parametrize("buffer", [1, 2, 100])
def test_key_tied_with_tau_survives_screening(monkeypatch, buffer, tie_reject):
    """Key 0 (s = τ = 2, id 0 below the K-th seed record (2, 10)) survives either rule."""
    monkeypatch.setattr(screen_mod, "upper_bound", _exact_bound)
    q, w, k = _tie_problem()
    K = 3
    res = dosa_topk(
        q, w, k, K, seeds="local", window=3, sinks=0, r=1, buffer=buffer, tie_reject=tie_reject
    )
    want = topk_ids(index_scores(q, w, k), K)
    np.testing.assert_array_equal(want, [[11, 0, 9]])
    np.testing.assert_array_equal(res.ids, want)
    st = res.stats
    assert st.tau[0] == 2.0 and st.tau_final[0] == 2.0
    assert st.survivors[0] == 1 and st.screened[0] == 9  # only key 0 has U ≥ τ
    assert st.kept[0] == 1 and not st.dense[0] and not st.recovered[0]
    assert st.tie_rejected[0] == 0


@pytest.mark.parametrize("tie_reject", [False, True])
def test_keys_below_tau_are_rejected(monkeypatch, tie_reject):
    """With U = s, every key strictly below τ is pruned (the rejection is not vacuous)."""
    monkeypatch.setattr(screen_mod, "upper_bound", _exact_bound)
    q, w, k = _tie_problem()
    res = dosa_topk(q, w, k, 2, seeds="local", window=2, sinks=0, r=1, tie_reject=tie_reject)
    np.testing.assert_array_equal(res.ids, [[11, 0]])
    assert res.stats.tau[0] == 2.0 and res.stats.survivors[0] == 2  # keys 0 and 9


@pytest.mark.parametrize("tie_reject", [False, True])
def test_fp8_key_tied_with_tau_survives(monkeypatch, tie_reject):
    """The FP8 route (pipeline.fp8_topk) with U^num replaced by the exact score."""
    q, w, k = _tie_problem()
    payload = np.zeros(k.shape, np.uint8)
    payload[:, 0] = np.array([0x40, 0x38, 0, 0xB8, 0x30, 0, 0x3C, 0, 0x38, 0x40, 0x40, 0x4A])
    scale = np.ones(k.shape[0], np.float32)
    kd = dequantize(payload, scale)
    np.testing.assert_array_equal(kd[:, 0], SCORES)

    def exact_num(fplan, kbar, scale_, rho, Uhat=None):
        return score_keys(q[0], w[0], kbar * scale_[:, None].astype(np.float64))

    monkeypatch.setattr(screen_mod, "screen_bound", exact_num)
    res = pipeline_mod.fp8_topk(
        q, w, payload, scale, 3, seeds="local", window=3, sinks=0, r=1, tie_reject=tie_reject
    )
    np.testing.assert_array_equal(res.ids, [[11, 0, 9]])
    assert res.tau[0] == 2.0 and res.stats.survivors[0] == 1
    assert np.array_equal(e4m3_values(payload)[:, 0], SCORES)


@pytest.mark.parametrize("tie_reject", [False, True])
def test_buffer_keeps_records_tied_with_tau(tie_reject):
    """CandidateBuffer.offer writes s ≥ τ (ties included; with ``tie_reject`` only ties
    below the K-th record's id) and merges exactly when full."""
    seeds_ids = np.array([9, 10, 11])
    buf = select_mod.CandidateBuffer(3, 1, seeds_ids, SCORES[seeds_ids], tie_reject)
    assert buf.kth_id == 10
    assert buf.tau == 2.0
    buf.offer(np.array([0, 1, 6]), SCORES[[0, 1, 6]])
    assert buf.kept == 1 and buf.overflows == 0 and buf.size == 1
    ids, sc = buf.result()
    np.testing.assert_array_equal(ids, [11, 0, 9])
    np.testing.assert_array_equal(sc, [5.0, 2.0, 2.0])
    # capacity 1 and two tied records: one overflow merge, still exact
    buf = select_mod.CandidateBuffer(2, 1, np.array([11, 10]), np.array([5.0, 2.0]), tie_reject)
    buf.offer(np.array([0, 9]), np.array([2.0, 2.0]))
    # after the merge the K-th record is (2, 0): the tie-aware buffer drops (2, 9)
    assert buf.overflows == 1 and buf.kept == (1 if tie_reject else 2)
    ids, _ = buf.result()
    np.testing.assert_array_equal(ids, [11, 0])


def test_topk_of_and_kth_score_with_ties():
    s = np.array([3.0, 1.0, 3.0, 2.0, 2.0, 2.0])
    ids = np.array([5, 4, 3, 2, 1, 0])
    top, sc = topk_of(s, ids, 4)
    np.testing.assert_array_equal(top, [3, 5, 0, 1])
    np.testing.assert_array_equal(sc, [3.0, 3.0, 2.0, 2.0])
    top, _ = topk_of(s, ids, 6)
    np.testing.assert_array_equal(top, [3, 5, 0, 1, 2, 4])
    top, _ = topk_of(s, ids, 9)
    assert top.size == 6
    assert kth_score(s, 4) == 2.0 and kth_score(s, 6) == 1.0 and kth_score(s, 1) == 3.0
    assert kth_score(s, 7) == -np.inf and kth_score(s[:0], 1) == -np.inf


def test_seed_rules():
    np.testing.assert_array_equal(local_seeds(3, 20, 5, 2), [3, 4, 15, 16, 17, 18, 19])
    np.testing.assert_array_equal(local_seeds(3, 6, 10, 10), [3, 4, 5])
    np.testing.assert_array_equal(local_seeds(3, 10, 0, 0), np.zeros(0))
    np.testing.assert_array_equal(local_seeds(3, 10, 1, 1), [3, 9])
    ids = np.array([[9, -1, 3, 3, 12, 4, 2]])
    np.testing.assert_array_equal(explicit_seeds(ids, 3, 12), [3, 4, 9])
    assert explicit_seeds(ids, 3, 12).dtype == np.int64
    rng = np.random.default_rng(0)
    Qn, H, D, N, K = 5, 3, 4, 40, 3
    q = rng.standard_normal((Qn, H, D))
    w = rng.standard_normal((Qn, H))
    k = rng.standard_normal((N, D))
    ks = np.array([0, 0, 5, 10, 20])
    ke = np.array([10, 20, 25, 40, 40])
    pool = anchor_pool(q, w, k, ks, ke, K, 2)  # anchors: queries 0 and 4
    want = np.union1d(
        topk_ids(index_scores(q[[0]], w[[0]], k, ks[[0]], ke[[0]]), K),
        topk_ids(index_scores(q[[4]], w[[4]], k, ks[[4]], ke[[4]]), K),
    )
    np.testing.assert_array_equal(pool, want)
    pool3 = anchor_pool(q, w, k, ks, ke, K, 3)  # anchors 0, 2, 4
    want3 = np.union1d(want, topk_ids(index_scores(q[[2]], w[[2]], k, ks[[2]], ke[[2]]), K))
    np.testing.assert_array_equal(pool3, want3)
    assert anchor_pool(q, w, k, ks, ke, K, 0).size == 0


def test_certificate_seeds_score_the_largest_bounds():
    """The m largest-U visible keys are added to S (without duplicates) with exact scores."""
    rng = np.random.default_rng(1)
    H, D, N = 3, 4, 30
    q = rng.standard_normal((H, D))
    w = rng.standard_normal(H)
    k = rng.standard_normal((N, D))
    a, b = 5, 25
    chunk = prepare_chunk(q[None], w[None], k, 3, [a], [b], {})
    ctx = QueryContext(0, a, b, chunk.q[0], chunk.w[0], chunk, DosaStats(1))
    U = np.arange(b - a, dtype=np.float64)[::-1] * 1.0  # key a has the largest bound
    S = np.array([5, 7])
    seeds = SeedSet(S, score_keys(q, w, k[S]), 1)
    got = add_certificate_seeds(ctx, U, seeds, 4)
    S2, s2 = got.ids, got.scores
    np.testing.assert_array_equal(np.sort(S2), [5, 6, 7, 8])
    np.testing.assert_array_equal(s2, score_keys(q, w, k[S2]))
    assert got.explicit == 1
    S3 = add_certificate_seeds(ctx, U, seeds, 100).ids
    np.testing.assert_array_equal(np.sort(S3), np.arange(a, b))


def _reference_r(q_t, w_t, p, tau, ks, popt, form):
    """docs/method.md §6 cost model: argmin over r = 1, 1+s, ... < H (s = ⌈H/16⌉) of
    (r + d_a)/H + mean(U ≥ τ), ties to the smaller r; ⌊H/2⌋ without a finite τ.
    Returns (r, dense): dense when the best cost is ≥ 1 (screening would not pay)."""
    H = q_t.shape[0]
    if not np.isfinite(tau) or ks.shape[0] == 0:
        return max(1, H // 2), False
    d_a = 2 if form == "base" else 1
    costs = []
    for r in range(1, H, max(1, -(-H // 16))):
        U = upper_bound(build_plan(q_t, w_t, p, r, popt), ks, form, "up", q_t, w_t)
        costs.append(((r + d_a) / H + float(np.mean(U >= tau)), r))
    best = min(costs)
    return best[1], best[0] >= 1.0


@pytest.mark.parametrize("H", [5, 20, 40])
@pytest.mark.parametrize("form", ["base", "abs"])
def test_choose_r_follows_the_cost_model(H, form):
    """τ is taken equal to computed bounds, so U = τ occurs and counts as a survivor."""
    rng = np.random.default_rng(H)
    D = 8
    q_t = rng.standard_normal((H, D)) + rng.standard_normal(D)
    w_t = -np.abs(rng.standard_normal(H))
    w_t[:3] *= -1
    ks = rng.standard_normal((64, D)) + 0.5 * q_t[0]
    popt = PlanOptions()
    p = activation_frequency(q_t, ks)
    taus = [np.inf, -np.inf, np.nan]
    for r in (1, 2, 3, H // 2):
        U = upper_bound(build_plan(q_t, w_t, p, r, popt), ks, form, "up", q_t, w_t)
        taus += list(np.sort(U)[[8, 32, 56]])
    got = [cost_mod.choose_r(q_t, w_t, p, t, ks, popt, form) for t in taus]
    want = [_reference_r(q_t, w_t, p, t, ks, popt, form) for t in taus]
    assert [(c.r, c.dense) for c in got] == want
    empty = cost_mod.choose_r(q_t, w_t, p, 1.0, ks[:0], popt, form)
    assert empty.r == max(1, H // 2) and not empty.dense


def test_topk_ids_rejects_nan_and_plus_inf():
    s = np.array([[1.0, -np.inf, 2.0]])
    np.testing.assert_array_equal(topk_ids(s, 2), [[2, 0]])
    for bad in (np.nan, np.inf):
        s2 = s.copy()
        s2[0, 1] = bad
        with pytest.raises(ValueError, match="scores"):
            topk_ids(s2, 2)
    with pytest.raises(ValueError, match="scores"):
        topk_ids(np.array([[np.nan, np.inf]]), 1)
