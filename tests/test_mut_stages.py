"""Rules of the stage modules (cost, seeds, screen, prepare, pipeline) and of the outward
primitives that the first mutation run on the restructured layout showed unchecked
(docs/mutation.md, "Results on the stage layout").  Every input is fixed.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from strategies import repick_problem

from dosa_ref import cost as cost_mod
from dosa_ref import pipeline as pipeline_mod
from dosa_ref.certificate import upper_bound
from dosa_ref.error_model import Arithmetic, ErrorModel
from dosa_ref.fp8 import e4m3_values, quantize_keys, quantize_queries, quantize_rows
from dosa_ref.numeric import build_fp8_plan, default_plan
from dosa_ref.pipeline import DosaStats
from dosa_ref.plan import PlanOptions, activation_frequency, build_plan
from dosa_ref.prepare import QueryContext, prepare_chunk
from dosa_ref.rounding import gamma_up, norm_up
from dosa_ref.scorer import score_keys, topk_ids
from dosa_ref.screen import zero_plateau
from dosa_ref.seeds import SeedSet, add_certificate_seeds, anchor_queries


def _cost_problem(H=12, D=8, seed=3):
    rng = np.random.default_rng(seed)
    q_t = rng.standard_normal((H, D)) + rng.standard_normal(D)
    w_t = -np.abs(rng.standard_normal(H))
    w_t[:3] *= -1
    ks = rng.standard_normal((64, D)) + 0.5 * q_t[0]
    return q_t, w_t, ks, activation_frequency(q_t, ks)


@pytest.mark.parametrize("form", ["base", "abs"])
def test_choose_r_reports_its_estimate_and_its_cost(form):
    """RChoice: est_survival = m at the chosen r, est_work = f + (1 − f)((r + d_a)/H + m)
    and sample_work = Σ_r n (r + d_a)/H over the r tried (docs/method.md §6 "Cost");
    without a finite τ nothing is sampled (sample_work 0, nan estimates)."""
    q_t, w_t, ks, p = _cost_problem()
    H, n, d_a, popt, f = q_t.shape[0], ks.shape[0], 2 if form == "base" else 1, PlanOptions(), 0.25
    U1 = upper_bound(build_plan(q_t, w_t, p, 1, popt), ks, form, "up", q_t, w_t)
    tau = float(np.sort(U1)[40])
    ch = cost_mod.choose_r(q_t, w_t, p, tau, ks, popt, form, f)
    rs = range(1, H, max(1, -(-H // 16)))
    assert ch.sample_work == pytest.approx(sum(n * (r + d_a) / H for r in rs), rel=1e-12)
    U = upper_bound(build_plan(q_t, w_t, p, ch.r, popt), ks, form, "up", q_t, w_t)
    m = float(np.mean(U >= tau))
    assert ch.est_survival == m and ch.f == f
    assert ch.est_work == pytest.approx(f + (1 - f) * ((ch.r + d_a) / H + m), rel=1e-12)
    for t in (np.inf, np.nan):
        none = cost_mod.choose_r(q_t, w_t, p, t, ks, popt, form, f)
        assert none.sample_work == 0.0 and np.isnan(none.est_work) and not none.dense


def test_error_model_accepts_the_smallest_valid_parameters():
    """kept_bits = k_step = 1 is a valid (if useless) accumulator; 0 is not."""
    a = Arithmetic(kept_bits=1, k_step=1)
    assert a.step_theta() > 1.0 and a.dot_relative_error(4) == np.inf
    for bad in ({"kept_bits": 0}, {"k_step": 0}):
        with pytest.raises(ValueError, match="kept_bits"):
            Arithmetic(**bad)


def test_truncating_accumulator_with_rounded_products():
    """Inexact products (exact_products=False) widen γ to (1 + γ)(1 + 2^-23) − 1, exactly
    dominated, over a grid of step counts."""
    for W in (13, 17, 24):
        a = Arithmetic(kept_bits=W, k_step=32)
        b = Arithmetic(kept_bits=W, k_step=32, exact_products=False)
        for n in (1, 32, 33, 128, 1000):
            g, gb = F(a.dot_relative_error(n)), F(b.dot_relative_error(n))
            assert gb >= (1 + g) * (1 + F(1, 2**23)) - 1, (W, n)
            assert gb <= (1 + g) * (1 + F(1, 2**23)) - 1 + F(1, 2**48), (W, n)


def test_gamma_up_at_the_edge_nu_equal_one():
    """n·u rounded up to exactly 1.0 (n = 2^53 − 1, u = 2^-53): γ is +inf, never negative."""
    assert gamma_up(2**53 - 1, 2.0**-53) == np.inf
    assert gamma_up(2**53 - 2, 2.0**-53) > 2.0**50


def test_norm_up_of_subnormal_results():
    """A subnormal norm is rounded up, not to nearest: ‖(2^-1074, 2^-1074)‖ = √2·2^-1074
    → 2·2^-1074."""
    for n in (2, 5, 7):
        got = F(float(norm_up(np.full(n, 2.0**-1074))))
        assert got**2 >= n * F(2.0**-1074) ** 2, n


def test_quantize_rows_rejects_empty_rows():
    with pytest.raises(ValueError, match="D >= 1"):
        quantize_rows(np.zeros((3, 0)), name="x")
    with pytest.raises(ValueError, match="keys"):
        quantize_rows(np.zeros((2, 0)), name="keys")


def test_fp8_topk_rejects_a_scale_of_the_wrong_shape():
    rs = np.random.default_rng(0)
    payload, scale = quantize_keys(rs.standard_normal((6, 4)))
    q, w = np.ones((1, 2, 4)), np.ones((1, 2))
    for bad in (scale[:5], scale[:, None], scale.astype(np.float64)[:4]):
        with pytest.raises(ValueError, match=r"scale: expected float \[N=6\]"):
            pipeline_mod.fp8_topk(q, w, payload, bad, 2)


def test_topk_ids_rejects_one_dimensional_scores():
    with pytest.raises(ValueError, match="scores"):
        topk_ids(np.array([1.0, 2.0]), 1)


def test_anchor_queries_and_single_certificate_seed():
    """One anchor is query 0; one certificate seed is the key of largest bound."""
    np.testing.assert_array_equal(anchor_queries(5, 1), [0])
    np.testing.assert_array_equal(anchor_queries(5, 2), [0, 4])
    assert anchor_queries(5, 0).size == 0 and anchor_queries(0, 3).size == 0
    rng = np.random.default_rng(1)
    q, w, k = rng.standard_normal((3, 4)), rng.standard_normal(3), rng.standard_normal((30, 4))
    a, b = 5, 25
    chunk = prepare_chunk(q[None], w[None], k, 3, [a], [b], {})
    ctx = QueryContext(0, a, b, chunk.q[0], chunk.w[0], chunk, DosaStats(1))
    U = np.zeros(b - a)
    U[7] = 1.0  # key a + 7
    S = np.array([5, 6])
    got = add_certificate_seeds(ctx, U, SeedSet(S, score_keys(q, w, k[S])), 1)
    np.testing.assert_array_equal(got.ids, [5, 6, 12])
    assert add_certificate_seeds(ctx, U, SeedSet(S, score_keys(q, w, k[S])), 0).ids.size == 2


def test_zero_plateau_margin_is_the_documented_one():
    """D = 2, q = (1, 1), k = (1, −b): x̂ = 1 − b and m = 1 + b; certified iff
    x̂ + 2γ_2 m + 4·2^-1074 ≤ 0 with γ_2 for u = 2^-53 (docs/method.md §7 "Tie-aware
    rejection and zero plateaus").  (b − 1)/(1 + b) = 1.5·2^-52 lies below 2γ_2 ≈ 2^-51:
    not certified; 2^-45 is: certified."""
    q_t, w_t = np.array([[1.0, 1.0]]), np.array([1.0])
    for b, want in ((1.0 + 3 * 2.0**-52, False), (1.0 + 2.0**-44, True), (1.0, False)):
        got = zero_plateau(q_t, w_t, np.array([[1.0, -b]]))
        assert bool(got[0]) == want, b


def test_aux_scales_stay_below_the_fp32_overflow():
    """σ_m are fp32 powers of two: at most 2^127 even when the aggregate is far larger
    (2^128 is +inf in fp32; docs/numerics.md)."""
    q = np.array([[1.0, 0.5, 0.0, 0.0], [0.3, -1.0, 0.7, 0.1], [0.2, 0.1, -0.4, 1.0]])
    for mag in (1e40, 1e42, 1e44):
        w = np.array([1.0, -mag, -mag * 0.3])
        plan = default_plan(q, w, np.ones((2, 4)), 1, PlanOptions(neg_aggregate="all"))
        fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
        for s in fp.aux_scale:
            assert np.isfinite(s) and float(s) <= 2.0**127, (mag, s)


def test_activation_frequency_uses_every_seed(monkeypatch):
    """p of docs/method.md §3 is taken on the seeds' keys (all of them when |S| ≤ 1024)."""
    seen = []
    orig = pipeline_mod.activation_frequency

    def spy(q_t, k_sample):
        seen.append(k_sample.copy())
        return orig(q_t, k_sample)

    monkeypatch.setattr(pipeline_mod, "activation_frequency", spy)
    rng = np.random.default_rng(5)
    q, w, k = (
        rng.standard_normal((1, 6, 4)),
        rng.standard_normal((1, 6)),
        rng.standard_normal((80, 4)),
    )
    pipeline_mod.dosa_topk(q, w, k, 3, seeds="local", window=10, sinks=2, r=2)
    S = np.r_[0:2, 70:80]
    assert len(seen) == 1
    np.testing.assert_array_equal(np.sort(seen[0], axis=0), np.sort(k[S], axis=0))


def test_positive_enclosure_is_tight_at_normal_scales():
    """E_g^+ stays within 2^-30 (relative) of the exact allowance min(triangle, joint) for
    heads at ordinary magnitudes: the interval midpoint/radius form of the Gram enclosure
    only widens by rounding (docs/numerics.md)."""
    import mpmath
    from test_mut_numeric import _exact_allowances, _random_plan_cases

    n = 0
    for q, w, opt in _random_plan_cases(120, seed=3):
        if not 2.0**-200 < np.max(np.abs(q)) < 2.0**200:
            continue
        plan = default_plan(q, w, np.ones((2, q.shape[1])), 1, opt)
        fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
        gb = plan.allowance_groups()
        tri, joint = _exact_allowances(plan, q, w, gb)
        for g in range(gb.size - 1):
            want = tri[g] if opt.allowance == "triangle" else min(tri[g], joint[g])
            got = mpmath.mpf(float(fp.E_plus[g]))
            assert got <= want * (1 + mpmath.mpf(2) ** -30) + mpmath.mpf(2) ** -1000, (g, opt)
            n += want > 0
    assert n > 20


def test_queries_fold_into_fp8_values():
    """quantize_queries gives e4m3 payloads whose values times the folded weights stay
    finite (sanity for the fixed inputs above)."""
    qp, wf = quantize_queries(np.ones((1, 2, 4)), np.ones((1, 2)))
    assert np.all(np.isfinite(e4m3_values(qp))) and np.all(np.isfinite(wf))


def test_scorer_terms_of_the_guard_dominate_their_formulas():
    """ε_raw^ref = dabs_ref·Σ|w_h| and ε_out = eabs_ref·(Σ|w_h| + 2H + 1) (payload units,
    docs/numerics.md) are upper bounds of the exact expressions, here with 32 large weights
    whose float sum is inexact (a lower-rounded Σ|w| would fall short by several ulps)."""
    rs = np.random.default_rng(2)
    H, D = 32, 16
    q = rs.standard_normal((H, D))
    w = (1e6 + rs.random(H) * 1e5) * np.where(rs.random(H) < 0.5, 1.0, -1.0)
    w[0] = abs(w[0])
    model = ErrorModel()
    plan = default_plan(q, w, rs.standard_normal((8, D)), 4, PlanOptions(neg_aggregate="all"))
    fp = build_fp8_plan(plan, q, w, model, "base")
    _, dabs_r, eabs_r = model.scorer_coefficients(D, H)
    sw = sum(abs(F(float(x))) for x in w)
    assert eabs_r > 0 and dabs_r > 0
    assert F(fp.eps_parts["raw_scorer"]) >= F(dabs_r) * sw
    assert F(fp.eps_out) >= F(eabs_r) * (sw + 2 * H + 1)


def test_plan_screens_only_with_omitted_heads():
    """Plan.screens is False exactly when every nonzero head is retained (P and N empty)."""
    q = np.eye(3, 4)
    p = np.full(3, 0.5)
    assert not build_plan(q, np.array([1.0, -1.0, 0.0]), p, 2).screens
    assert build_plan(q, np.array([1.0, -1.0, 0.5]), p, 2).screens
    assert build_plan(q, np.array([1.0, -1.0, -0.5]), p, 2).screens


def test_choose_r_goes_dense_when_the_cost_is_exactly_one():
    """H = 4, base form, r = 1: (1 + 2)/4 + m with m = 1/4 (one sample key of four at
    U ≥ τ) is exactly 1: screening would not pay, so the query is scored densely."""
    from dosa_ref.plan import choose_retained  # noqa: F401  (plan rules used below)

    rng = np.random.default_rng(8)
    q_t = rng.standard_normal((4, 6))
    w_t = np.array([1.0, -0.5, 0.7, -0.3])
    ks = rng.standard_normal((4, 6))
    p, popt = activation_frequency(q_t, ks), PlanOptions()
    costs = {}
    for r in (1, 2, 3):
        U = upper_bound(build_plan(q_t, w_t, p, r, popt), ks, "base", "up", q_t, w_t)
        costs[r] = U
    tau = float(np.max(costs[1]))
    assert np.sum(costs[1] >= tau) == 1
    ch = cost_mod.choose_r(q_t, w_t, p, tau, ks, popt, "base", 0.5)
    assert ch.r == 1 and ch.est_survival == 0.25 and ch.dense
    assert ch.est_work == 0.5 + 0.5 * 1.0


def test_fp8_inputs_of_the_wrong_shape():
    """Each shape error is reported by the check that names it (ValueError naming the
    argument and what was expected)."""
    with pytest.raises(ValueError, match="k: expected 2 dimensions"):
        quantize_keys(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="w: expected 2 dimensions"):
        quantize_queries(np.ones((2, 3, 4)), np.ones((2, 3, 1)))
    with pytest.raises(ValueError, match=r"w: expected shape \(2, 3\) to match q"):
        quantize_queries(np.ones((2, 3, 4)), np.ones((2, 4)))


def test_retained_rows_and_folded_weights_are_stored_exactly():
    """Rows that are e4m3 values already are stored exactly (the power-of-two scale wins,
    residual 0), and ω_j = fl32(c_j·q_scale_j) with c_j = w_j (base) or ½w_j (abs) when
    nothing is folded into row j (no projection)."""
    rs = np.random.default_rng(4)
    H, D = 6, 16
    qp, wf = quantize_queries(rs.standard_normal((1, H, D)), rs.standard_normal((1, H)))
    q, w = e4m3_values(qp[0]), wf[0].astype(np.float64)
    opt = PlanOptions(pos_projection=False, neg_aggregate="all")
    plan = default_plan(q, w, rs.standard_normal((8, D)), 3, opt)
    assert np.all(plan.anchor < 0)
    for form, half in (("base", 1.0), ("abs", 0.5)):
        fp = build_fp8_plan(plan, q, w, ErrorModel(), form)
        for j, h in enumerate(plan.R):
            rec = e4m3_values(fp.q_payload[j]) * fp.q_scale[j]
            np.testing.assert_array_equal(rec, q[h])
            assert fp.omega[j] == np.float32(half * w[h] * fp.q_scale[j]), (form, j)


def test_choose_retained_keeps_positive_heads_once_and_ranks_by_min_p():
    """Positive heads with weights below 1 are positive heads (kept once); a negative head
    is ranked by |w|‖q‖·min(p, 1 − p), so p = 0.9 ranks below p = 0.3."""
    from dosa_ref.plan import choose_retained

    q = np.eye(4, 5)
    w = np.array([0.9, -0.1, 0.5, -0.2])
    p = np.full(4, 0.5)
    np.testing.assert_array_equal(choose_retained(q, w, p, 3), [0, 2, 3])
    w2 = np.array([1.0, -1.0, -1.0])
    p2 = np.array([0.5, 0.9, 0.3])
    np.testing.assert_array_equal(choose_retained(np.eye(3, 4), w2, p2, 2), [0, 2])


def test_subnormal_beta_means_no_projection():
    """An omitted head parallel to a retained one but 2^-1100 times smaller: β would be
    subnormal (or 0), so it is not projected (anchor −1, β = 0) and its allowance stays
    its own norm (docs/method.md §3; plan.py keeps β only where it is normal)."""
    q = np.zeros((3, 4))
    q[0] = np.ldexp(np.array([1.0, 2.0, 0.0, 0.0]), 40)
    q[1] = np.ldexp(np.array([1.0, 2.0, 0.0, 0.0]), -1060)
    q[2] = [0.0, 0.0, 1.0, 0.0]
    w = np.array([1.0, 1.0, -1.0])
    plan = build_plan(q, w, np.full(3, 0.5), 1, PlanOptions(allowance="triangle"), R=[0])
    assert list(plan.P) == [1]
    assert plan.anchor[0] == -1 and plan.beta[0] == 0.0
    assert F(plan.E_P) ** 2 >= sum(F(float(x)) ** 2 for x in q[1]) > 0


def test_auto_r_is_picked_again_at_the_raised_threshold(monkeypatch):
    """Certificate seeds raise τ; with r = "auto" the cost model is asked again at the new
    τ (docs/method.md §7), and the last τ it saw is the screening threshold."""
    taus = []
    orig = pipeline_mod.choose_r

    def spy(q_t, w_t, p, tau, *a, **kw):
        taus.append(tau)
        return orig(q_t, w_t, p, tau, *a, **kw)

    monkeypatch.setattr(pipeline_mod, "choose_r", spy)
    q, w, k = repick_problem(6)
    res = pipeline_mod.dosa_topk(q, w, k, 4, seeds="local,certificate", window=8, sinks=0)
    st = res.stats
    assert st.cert_seeds[0] > 0 and not st.dense[0]
    assert len(taus) == 2 and taus[1] > taus[0] and taus[1] == st.tau[0]


def test_no_explicit_seeds_are_counted_without_the_explicit_strategy():
    rng = np.random.default_rng(9)
    q, w, k = (
        rng.standard_normal((2, 4, 6)),
        rng.standard_normal((2, 4)),
        rng.standard_normal((90, 6)),
    )
    st = pipeline_mod.dosa_topk(q, w, k, 3, seeds="local", window=6, r=2).stats
    assert np.all(st.explicit_seeds == 0)
    ids = np.array([[40, 41, 89], [50, 51, 52]])  # 89 is a local seed already
    st = pipeline_mod.dosa_topk(
        q, w, k, 3, seeds="local,explicit", seed_ids=ids, window=6, r=2
    ).stats
    np.testing.assert_array_equal(st.explicit_seeds, [2, 3])


def test_rows_of_constant_magnitude_keep_the_power_of_two_scale():
    """|q_jd| = 3 for every d: both candidate scales (2^-7 and 3/448) reproduce the row,
    with residual 0; the tie goes to the power of two, which keeps ω_j's product exact."""
    q = np.array([[3.0, -3.0, 3.0, 3.0], [1.0, 0.5, -0.25, 2.0], [0.0, 1.0, 0.0, -1.0]])
    w = np.array([2.0, 0.5, -0.5])
    plan = default_plan(q, w, np.ones((2, 4)), 2, PlanOptions(pos_projection=False))
    assert 0 in plan.R
    fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
    j = int(np.flatnonzero(plan.R == 0)[0])
    assert fp.q_scale[j] == 2.0**-7
    np.testing.assert_array_equal(e4m3_values(fp.q_payload[j]) * fp.q_scale[j], q[0])


def test_zero_residual_group_has_zero_allowance():
    """An omitted positive head that is zero on the second half of the coordinates: in
    that group there is nothing to allow for: E_g^+ is at most a few subnormal quanta
    (outward steps of 2^-1074), not the ~2^-536 of a triangle term over a zero row."""
    q = np.array([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.3, 0.7, 0.2, 0.0, 0.0, 0.0]])
    w = np.array([2.0, 1.0])
    opt = PlanOptions(allowance="grouped", groups=2, pos_projection=False)
    plan = build_plan(q, w, np.full(2, 0.5), 1, opt, R=[0])
    fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
    assert list(plan.allowance_groups()) == [0, 3, 6]
    assert fp.E_plus[0] > 0 and fp.E_plus[1] <= 2.0**-1000


def test_fp8_scales_are_float32_after_preparation():
    """A float64 scale array is accepted and rounded to the float32 scales the keys are
    defined by (docs/numerics.md: k_i = α_i k̄_i with α_i fp32)."""
    from dosa_ref.prepare import prepare_fp8

    rs = np.random.default_rng(3)
    payload, scale = quantize_keys(rs.standard_normal((6, 4)))
    s64 = scale.astype(np.float64) * (1.0 + 2.0**-40)  # not float32 values
    q, w = np.ones((1, 2, 4)), np.ones((1, 2))
    chunk, keys = prepare_fp8(q, w, payload, s64, 2, None, None, {})
    assert keys.scale.dtype == np.float32
    np.testing.assert_array_equal(keys.scale, s64.astype(np.float32))
