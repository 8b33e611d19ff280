"""Tie-aware rejection and zero plateaus (docs/method.md §7 "Tie-aware rejection and zero
plateaus"; proofs/zero_plateau.py): exactness against brute force on workloads where most
keys score exactly 0, the edge cases of the K-th seed record (τ, j), and checks that fail
when the rule is switched off or mutated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dosa_ref.pipeline as pipeline
from dosa_ref import dosa_topk, fp8_topk, index_scores, topk_ids
from dosa_ref.fp8 import quantize_keys
from dosa_ref.pipeline import topk_check
from dosa_ref.screen import ScreenRule, zero_plateau
from proofs import _gen
from proofs import zero_plateau as proof


def _ref(q, w, k, K, ks=None, ke=None):
    return topk_ids(index_scores(q, w, k, ks, ke), K)


def _two_heads(keys_first: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query, heads q_0 = (−1, 0) with w = +1 and q_1 = (0, −1) with w = −1; key i is
    (keys_first[i], 0): it scores −keys_first[i] when that is positive, else exactly 0."""
    q = np.array([[[-1.0, 0.0], [0.0, -1.0]]])
    w = np.array([[1.0, -1.0]])
    k = np.stack([np.asarray(keys_first, dtype=np.float64), np.zeros(len(keys_first))], 1)
    return q, w, k


@settings(max_examples=25)
@given(
    seed=st.integers(0, 2**32 - 1),
    Qn=st.integers(1, 3),
    H=st.sampled_from([2, 3, 4, 6]),
    N=st.integers(20, 300),
    hot=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
    K=st.integers(1, 40),
    r_extra=st.integers(0, 2),
    buffer=st.sampled_from([1, 4, 65536]),
    seeds=st.sampled_from(["local", "local+certificate", "local+anchor", "certificate"]),
    form=st.sampled_from(["base", "abs"]),
)
def test_exact_on_zero_plateaus(seed, Qn, H, N, hot, K, r_extra, buffer, seeds, form):
    """Integer workloads where most keys score exactly 0 and the K-th score is often a tie
    at 0: ids equal brute force with the rule on (default) and off."""
    rng = np.random.default_rng(seed)
    q, w, k = proof.plateau_problem(rng, Qn, H, 5, N, hot)
    r = min(H - 1, max(1, H // 2) + r_extra)
    opt = dict(seeds=seeds, window=K // 2 + 3, sinks=2, cert_seeds=K, r=r, form=form)
    ref = _ref(q, w, k, K)
    on = dosa_topk(q, w, k, K, buffer=buffer, **opt)
    np.testing.assert_array_equal(on.ids, ref)
    off = dosa_topk(q, w, k, K, buffer=buffer, tie_reject=False, **opt)
    np.testing.assert_array_equal(off.ids, ref)
    np.testing.assert_array_equal(on.stats.survivors + on.stats.tie_rejected, off.stats.survivors)


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**32 - 1),
    H=st.integers(1, 5),
    D=st.integers(1, 6),
    kind=st.sampled_from(["int", "sparse", "unit", "huge", "tiny", "wide"]),
)
def test_plateau_certificate_is_sound(seed, H, D, kind):
    """Every key ``zero_plateau`` certifies has exact and canonical score ≤ 0 and every
    positive head's float dot ≤ 0 in each summation order tried (exact comparisons)."""
    rng = np.random.default_rng(seed)
    q = _gen.heads(rng, H, D, kind, "")
    w = _gen.weights(rng, H, "mixed", kind)
    k = np.concatenate([_gen.keys(rng, 10, D, kind, q), -q, -np.abs(q).sum(0, keepdims=True)])
    res = proof.check_plateau(q, w, k)
    assert res.ok, res.violations


def _boundary_case():
    """20 keys scoring 0 except key 14 (score 2); seeds 5, 9, 13 (all 0); K = 2, so the
    K-th seed record is (0, j = 9)."""
    first = np.ones(20)
    first[14] = -2.0
    q, w, k = _two_heads(first)
    return q, w, k, dict(seeds="explicit", seed_ids=np.array([[5, 9, 13]]), r=1)


def test_kth_record_boundary():
    """τ = 0 with K-th seed record (0, j = 9): zero keys below j survive (8 is kept),
    above j are rejected (10 is not), a positive key survives; ids stay exact."""
    q, w, k, kw = _boundary_case()
    res = dosa_topk(q, w, k, 2, **kw)
    np.testing.assert_array_equal(res.ids, _ref(q, w, k, 2))
    np.testing.assert_array_equal(res.ids[0], [14, 0])
    st_ = res.stats
    assert st_.tau[0] == 0.0 and not st_.dense[0]
    # survivors: 0..4, 6..8 (ids below j = 9, not seeds) and the positive key 14
    assert st_.survivors[0] == 9 and st_.tie_rejected[0] == 17 - 9
    rule = ScreenRule(0.0, np.array([5, 9, 13]), 0, 9, zero_plateau(q[0], w[0], k))
    U = np.full(20, 1.0)  # any bound ≥ s: the plateau keys get min(U, 0) = 0
    assert rule.survivors(U).tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 14]


def test_kth_record_from_a_positive_seed():
    """K-th seed record above 0 (τ = 1): the zero keys are rejected with or without the
    rule (their U is only the rounding allowance, far below 1); nothing is tie-rejected."""
    first = np.ones(30)
    first[[3, 20, 25]] = [-2.0, -3.0, -1.0]
    q, w, k = _two_heads(first)
    kw = dict(seeds="explicit", seed_ids=np.array([[20, 25]]), r=1)
    on = dosa_topk(q, w, k, 2, **kw)
    off = dosa_topk(q, w, k, 2, tie_reject=False, **kw)
    for res in (on, off):
        np.testing.assert_array_equal(res.ids, _ref(q, w, k, 2))
    assert on.stats.tau[0] == 1.0
    assert on.stats.survivors[0] == off.stats.survivors[0] == 1  # key 3 (score 2 > τ)
    assert on.stats.tie_rejected[0] == 0


def test_all_keys_zero():
    """Every score 0: the Top-K is the first K ids; the rule keeps only keys below j."""
    q, w, k = _two_heads(np.ones(50))
    K = 4
    seed_ids = np.array([[10, 11, 20, 30, 40]])
    res = dosa_topk(q, w, k, K, seeds="explicit", seed_ids=seed_ids, r=1)
    np.testing.assert_array_equal(res.ids[0], np.arange(K))
    assert res.stats.survivors[0] == 10 + 8 + 9  # ids 0..9, 12..19, 21..29: below j = 30
    off = dosa_topk(q, w, k, K, seeds="explicit", seed_ids=seed_ids, r=1, tie_reject=False)
    np.testing.assert_array_equal(off.ids[0], np.arange(K))
    assert off.stats.survivors[0] == 45


def test_k_above_visible_pads():
    """K > |Ω|: the dense route pads with −1, with and without the rule; fewer seeds than
    K: the dense route after seeding uses the tie-aware buffer, still exact."""
    q, w, k = _two_heads(np.ones(12))
    ks, ke = np.array([2]), np.array([9])
    for tie in (True, False):
        res = dosa_topk(q, w, k, 10, ks, ke, tie_reject=tie)
        np.testing.assert_array_equal(res.ids, _ref(q, w, k, 10, ks, ke))
        assert res.ids[0, 7:].tolist() == [-1, -1, -1]
        kw = dict(seeds="explicit", seed_ids=np.array([[7, 8]]), r=1, buffer=1, tie_reject=tie)
        res = dosa_topk(q, w, k, 4, ks, ke, **kw)
        assert res.stats.dense[0]
        np.testing.assert_array_equal(res.ids[0], [2, 3, 4, 5])


def test_rule_rejects_most_plateau_keys():
    """On a plateau workload (89 % of the keys score exactly 0, K-th score 0) the rule must
    cut survival sharply (this fails if the rule is disabled), ids exact both ways.  How
    much it cuts depends on j, the K-th seed record's id: 128 sinks put j near 128."""
    rng = np.random.default_rng(7)
    q, w, k = proof.plateau_problem(rng, 4, 8, 16, 8192, 0.01)
    K = 128
    ref = _ref(q, w, k, K)
    surv = {}
    for sinks in (16, 128):
        opt = dict(seeds="local+certificate", window=256, cert_seeds=256, r=5, sinks=sinks)
        on = dosa_topk(q, w, k, K, **opt)
        off = dosa_topk(q, w, k, K, tie_reject=False, **opt)
        np.testing.assert_array_equal(on.ids, ref)
        np.testing.assert_array_equal(off.ids, ref)
        assert on.stats.kept.sum() <= off.stats.kept.sum()
        assert on.stats.tie_rejected.sum() == off.stats.survivors.sum() - on.stats.survivors.sum()
        surv[sinks] = (on.stats.survival, off.stats.survival)
    print(f"\n[zero plateau] survival (rule on, off): sinks 16 {surv[16]}, sinks 128 {surv[128]}")
    assert surv[16][1] > 0.8 and surv[128][1] > 0.8
    assert surv[16][0] < 0.6 * surv[16][1]
    assert surv[128][0] < 0.05


def test_fp8_path_on_plateaus():
    """fp8_topk uses the same rule (the canonical scorer reads the dequantized keys):
    ids equal brute force on and off; the guard's exact-arithmetic survivors follow it."""
    rng = np.random.default_rng(3)
    q, w, k = proof.plateau_problem(rng, 3, 6, 8, 1500, 0.02)
    payload, scale = quantize_keys(k)
    K = 40
    ref = topk_check(q, w, payload, scale, K)
    opt = dict(seeds="local", window=64, sinks=48, r=4)  # sinks put j low (§7)
    on = fp8_topk(q, w, payload, scale, K, **opt)
    off = fp8_topk(q, w, payload, scale, K, tie_reject=False, **opt)
    np.testing.assert_array_equal(on.ids, ref)
    np.testing.assert_array_equal(off.ids, ref)
    assert on.stats.tie_rejected.sum() > 0
    assert np.all(on.stats.survivors_exact <= off.stats.survivors_exact)
    assert on.stats.survival < off.stats.survival


def test_option_validation():
    q, w, k = _two_heads(np.ones(12))
    with pytest.raises(ValueError, match="tie_reject"):
        dosa_topk(q, w, k, 2, tie_reject="yes")


def _mutant_survivors(self, U):
    """The planted mutant: reject every U = τ (`>` replaced by `>=` on the ids)."""
    if self.plateau is not None:
        U = np.where(self.plateau, np.minimum(U, 0.0), U)
    alive = U > self.tau
    alive[self.seed_ids - self.a] = False
    return self.a + np.flatnonzero(alive)


def test_exactness_check_catches_a_mutant(monkeypatch):
    """The exactness checks above can fail: with U = τ rejected regardless of the id, the
    boundary example loses the required zero keys below j."""
    monkeypatch.setattr(pipeline.ScreenRule, "survivors", _mutant_survivors)
    q, w, k, kw = _boundary_case()
    assert not np.array_equal(dosa_topk(q, w, k, 2, **kw).ids, _ref(q, w, k, 2))


def test_uncertified_plateau_is_caught(monkeypatch):
    """Dropping the certification (every key treated as a plateau key) loses positive keys."""
    monkeypatch.setattr(pipeline, "zero_plateau", lambda q, w, k: np.ones(k.shape[0], bool))
    q, w, k, kw = _boundary_case()
    assert not np.array_equal(dosa_topk(q, w, k, 2, **kw).ids, _ref(q, w, k, 2))


@pytest.mark.parametrize("mutate", proof.MUTANTS)
def test_proof_can_fail(mutate):
    """The proof's witnesses: τ = 0 with j = 6 and required zero keys below it."""
    s = np.zeros(9)
    s[4] = 1.0
    ok = proof.check(s, s, S=[0, 4, 6], K=3)
    assert ok.ok and ok.tight_attained
    bad = proof.check(s, s, S=[0, 4, 6], K=3, mutate=mutate)
    assert not bad.ok and any("in TopK" in v for v in bad.violations)


@pytest.mark.parametrize("mutate", ["no_allowance", "uncertified"])
def test_plateau_proof_can_fail(mutate):
    q, w, k = proof.cancellation_witness()
    assert proof.check_plateau(q, w, k).ok
    assert not proof.check_plateau(q, w, k, mutate=mutate).ok
