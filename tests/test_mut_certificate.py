"""The float64 certificate at extreme magnitudes, its rounding allowance as documented,
and the plan's rules, all on fixed inputs (docs/mutation.md, clusters 1 and 6).

Squares of float64 numbers underflow below about 2^-511 and overflow above 2^511, and
products of keys and heads reach the subnormal range long before that; the hypothesis
strategies of test_certificate stop near 2^-530 and only the ``nightly`` profile draws
enough of them.  These tests walk keys and heads deterministically through the subnormal
range, 2^-600 … 2^-500 and up to 2^600, so every underflow-safety step (power-of-two
scaling in ``safe_norm``, ``joint_allowance`` and ``build_plan``; the absolute underflow
term of ``rounding_allowance``) is exercised on every run.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from dosa_ref import build_plan, score_keys, upper_bound
from dosa_ref.certificate import KeySummary, positive_allowance, rounding_allowance
from dosa_ref.plan import (
    PlanOptions,
    activation_frequency,
    choose_retained,
    coordinate_groups,
    joint_allowance,
    pow2_exponent,
    safe_norm,
)

EXPONENTS = (-1074, -1072, -1060, -1040, -1000, -700, -600, -540, -520, -300, 0, 300, 500, 600)
ALL_OPTIONS = [
    PlanOptions(allowance=a, neg_aggregate=n, pos_projection=pp, groups=g)
    for a in ("triangle", "joint", "grouped")
    for n in ("majority", "all", "none")
    for pp in (True, False)
    for g in (1, 3)
]


def test_safe_norm_is_exact_at_every_magnitude():
    """‖(3, 4)·2^e‖ = 5·2^e exactly, from subnormal 3·2^-1074 to 2^1000 (plain squares
    underflow to 0 or overflow to inf)."""
    for e in (-1074, -1073, -1070, -1060, -1000, -600, -520, 0, 520, 600, 1000, 1020):
        x = np.ldexp(np.array([3.0, 4.0]), e)
        assert safe_norm(x) == np.ldexp(5.0, e), e
        rows = np.ldexp(np.array([[3.0, 4.0, 0.0], [0.0, 5.0, 12.0]]), e)
        np.testing.assert_array_equal(safe_norm(rows, axis=1), np.ldexp([5.0, 13.0], e))
        np.testing.assert_array_equal(safe_norm(rows.T, axis=0), np.ldexp([5.0, 13.0], e))
    assert safe_norm(np.zeros(3)) == 0.0 and safe_norm(np.zeros((0, 4)), axis=0).shape == (4,)
    np.testing.assert_array_equal(safe_norm(np.zeros((2, 0)), axis=1), [0.0, 0.0])
    assert pow2_exponent(np.array([0.75, -3.0])) == 2 and pow2_exponent(np.zeros(2)) == 0
    ks = KeySummary(np.ldexp(np.array([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 5.0, 12.0]]), -1060))
    np.testing.assert_array_equal(ks.norm, np.ldexp([5.0, 13.0], -1060))
    np.testing.assert_array_equal(
        ks.group_norms(np.array([0, 2, 4])), np.ldexp([[5.0, 0.0], [0.0, 13.0]], -1060)
    )
    np.testing.assert_array_equal(ks.slice(1, 2).group_norms(np.array([0, 2, 4])),
                                  np.ldexp([[0.0, 13.0]], -1060))  # fmt: skip
    np.testing.assert_array_equal(ks.l1, np.ldexp([7.0, 17.0], -1060))


def test_joint_allowance_is_homogeneous_at_extreme_scales():
    rng = np.random.default_rng(0)
    u = rng.standard_normal((4, 6))
    j = joint_allowance(u)
    for e in (-1000, -900, -600, 300, 600, 900):
        assert joint_allowance(np.ldexp(u, e)) == np.ldexp(j, e), e
    assert joint_allowance(np.ldexp(u, -1068)) == pytest.approx(np.ldexp(j, -1068), rel=1e-2)
    # exact small cases: ½(‖Σu‖ + sqrt(Σ|u_h·u_l|))
    assert joint_allowance(np.array([[3.0, 0.0], [0.0, 4.0]])) == 0.5 * (5.0 + 5.0)
    assert joint_allowance(np.array([[1.0, 0.0], [-1.0, 0.0]])) == 0.5 * (0.0 + 2.0)


def _problem(seed, H=5, D=6, n=40):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H, D)) + rng.standard_normal(D)
    w = -np.abs(rng.standard_normal(H))
    w[:2] *= -1
    k = rng.standard_normal((n, D)) + 0.7 * q[0]
    return q, w, k


@pytest.mark.parametrize("e", EXPONENTS)
def test_bound_dominates_for_keys_at_every_magnitude(e):
    """s ≤ U (computed score, rounding-safe bound) with keys scaled by 2^e: logits and
    their products underflow (e ≤ -1000), squares underflow (e ≤ -512) or overflow
    (e ≥ 512); U stays finite."""
    for seed in range(3):
        q, w, k0 = _problem(seed)
        k = np.ldexp(k0, e)
        p = activation_frequency(q, k0)
        s = score_keys(q, w, k)
        for opt in ALL_OPTIONS[::3] + [ALL_OPTIONS[1]]:
            for r in (1, 2, 3):
                plan = build_plan(q, w, p, r, opt)
                for form in ("base", "abs"):
                    U = upper_bound(plan, k, form, "up", q, w)
                    assert np.all(np.isfinite(U)), (e, seed, form)
                    assert np.all(U >= s), (e, seed, r, form, opt)


@pytest.mark.parametrize("e", EXPONENTS)
def test_bound_dominates_for_heads_at_every_magnitude(e):
    """The same with one omitted positive head (and one negative head) scaled by 2^e beside
    heads of magnitude 1: the plan works per head at its own power-of-two scale."""
    for seed in range(3):
        q, w, k = _problem(seed)
        q = q.copy()
        q[1] = np.ldexp(q[1], e)  # omitted positive head (r = 1 retains head 0)
        q[3] = np.ldexp(q[3], e)
        p = activation_frequency(q, k)
        s = score_keys(q, w, k)
        for opt in ALL_OPTIONS[::2]:
            plan = build_plan(q, w, p, 1, opt)
            for form in ("base", "abs"):
                U = upper_bound(plan, k, form, "up", q, w)
                assert np.all(np.isfinite(U)) and np.all(U >= s), (e, seed, form, opt)


@pytest.mark.parametrize("e", [-560, -600, -1000])
def test_tiny_omitted_head_keeps_its_allowance(e):
    """A positive head 2^e below the retained one, orthogonal to it, and a key along the
    tiny head: s = 2^e·‖k‖ comes entirely from E_P‖k‖ (a lost allowance means U < s)."""
    q = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, -1.0]])
    q[1] = np.ldexp(q[1], e)
    w = np.array([1.0, 1.0, -1.0])
    k = np.array([[0.0, 1.0, 0.5], [0.0, 1.0, 0.0], [0.0, 1.0, -2.0]])
    for opt in ALL_OPTIONS:
        plan = build_plan(q, w, np.full(3, 0.5), 1, opt)
        np.testing.assert_array_equal(plan.R, [0])
        np.testing.assert_array_equal(plan.P, [1])
        assert plan.E_P == pytest.approx(np.ldexp(np.sqrt(1.25), e), rel=1e-15)
        assert plan.E_P_joint == pytest.approx(plan.E_P, rel=1e-15)
        s = score_keys(q, w, k)
        assert s[0] > 0
        for form in ("base", "abs"):
            U = upper_bound(plan, k, form, "up", q, w)
            assert np.all(U >= s), (e, opt, form)
            Ue = upper_bound(plan, k, form, "none")
            assert np.all(Ue >= s - 1e-12 * np.abs(s)), (e, opt, form)


def test_anchor_projection_follows_prop1():
    """Prop. 1/5: an omitted positive head is projected on the retained head maximising
    [q_h·q_j]_+/‖q_j‖ with β = [q_h·q_j]_+/‖q_j‖², d_h = q_h − βq_j, w̃_j = w_j + w_hβ — also
    when the correlation is weak (ratio < 1) and at mixed magnitudes."""
    for e in (0, -600, 400):
        q = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.3, 1.0, 0.0], [-0.5, 0.0, 1.0]])
        q[2] = np.ldexp(q[2], e)
        w = np.array([2.0, 1.5, 0.5, 0.25])
        opt = PlanOptions(allowance="triangle")
        plan = build_plan(q, w, np.full(4, 0.5), 2, opt, R=np.array([0, 1]))
        np.testing.assert_array_equal(plan.R, [0, 1])
        np.testing.assert_array_equal(plan.P, [2, 3])
        # head 2 (q = (0.3, 1, 0)·2^e): [q·q_0]/‖q_0‖ = 0.3·2^e < [q·q_1]/‖q_1‖ = 2^e → anchor 1
        assert plan.anchor[0] == 1 and plan.beta[0] == pytest.approx(np.ldexp(1.0, e))
        np.testing.assert_allclose(plan.d[0], np.ldexp([0.3, 0.0, 0.0], e), rtol=1e-15)
        # head 3: negative correlation with head 0, none with head 1: no anchor
        assert plan.anchor[1] == -1 and plan.beta[1] == 0.0
        np.testing.assert_array_equal(plan.d[1], q[3])
        np.testing.assert_allclose(plan.w_fold, [2.0, 1.5 + 0.5 * np.ldexp(1.0, e)])
        assert plan.E_P == pytest.approx(0.5 * np.ldexp(0.3, e) + 0.25 * np.sqrt(1.25))
    # weak correlation (scaled ratio < 1): still projected
    q = np.array([[1.0, 0.0, 0.0], [0.3, 1.0, 0.0]])
    plan = build_plan(q, np.array([1.0, 1.0]), np.full(2, 0.5), 1, R=np.array([0]))
    assert plan.anchor[0] == 0 and plan.beta[0] == pytest.approx(0.3, rel=1e-15)
    off = PlanOptions(pos_projection=False)
    off = build_plan(q, np.array([1.0, 1.0]), np.full(2, 0.5), 1, off, R=np.array([0]))
    assert off.anchor[0] == -1 and off.beta[0] == 0.0 and off.E_P == pytest.approx(np.sqrt(1.09))


def test_negative_aggregate_and_aux_row():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]])
    w = np.array([1.0, -1.0, -0.5, -2.0])
    p = np.array([0.5, 0.5, 0.4, 0.9])
    for agg, A in (("majority", [1, 3]), ("all", [1, 2, 3]), ("none", [])):
        plan = build_plan(q, w, p, 1, PlanOptions(neg_aggregate=agg))
        np.testing.assert_array_equal(plan.A, A)
        want = (np.abs(w[A])[:, None] * q[A]).sum(axis=0) if A else np.zeros(2)
        np.testing.assert_array_equal(plan.a_A, want)
        np.testing.assert_array_equal(plan.V, want - 0.5 * plan.w_fold @ plan.q_R)
    plan = build_plan(q, w, p, 1, R=np.array([0]), A=np.array([2, 0, 9]))
    np.testing.assert_array_equal(plan.A, [2])  # A ∩ N


def test_choose_retained_rule():
    """docs/method.md §3: all positive heads when |H+| ≤ r, then negative heads by
    |w_h|‖q_h‖·min(p_h, 1 − p_h) (or |w_h|‖q_h‖), ties to the lower index; else the r
    strongest positive heads by w_h‖q_h‖."""
    q = np.array([[1.0, 0], [2.0, 0], [3.0, 0], [1.0, 0], [1.0, 0], [0.5, 0]])
    w = np.array([1.0, -1.0, -1.0, -3.0, 2.0, -4.0])
    p = np.array([0.5, 0.5, 0.1, 0.5, 0.5, 0.5])
    # priorities: h1 2·0.5 = 1.0, h2 3·0.1 = 0.3, h3 3·0.5 = 1.5, h5 2·0.5 = 1.0
    np.testing.assert_array_equal(choose_retained(q, w, p, 2, "activation"), [0, 4])
    np.testing.assert_array_equal(choose_retained(q, w, p, 3, "activation"), [0, 3, 4])
    np.testing.assert_array_equal(choose_retained(q, w, p, 4, "activation"), [0, 1, 3, 4])
    np.testing.assert_array_equal(choose_retained(q, w, p, 5, "activation"), [0, 1, 3, 4, 5])
    # strength: h1 2, h2 3, h3 3, h5 2
    np.testing.assert_array_equal(choose_retained(q, w, p, 3, "strength"), [0, 2, 4])
    np.testing.assert_array_equal(choose_retained(q, w, p, 5, "strength"), [0, 1, 2, 3, 4])
    # more positive heads than r: strongest w‖q‖, ties to the lower index
    wp = np.array([1.0, 1.0, 0.5, 3.0, 0.5, 0.0])
    np.testing.assert_array_equal(choose_retained(q, wp, p, 1, "activation"), [3])
    np.testing.assert_array_equal(choose_retained(q, wp, p, 2, "activation"), [1, 3])
    np.testing.assert_array_equal(choose_retained(q, wp, p, 3, "activation"), [1, 2, 3])
    np.testing.assert_array_equal(choose_retained(q, wp, p, 4, "strength"), [0, 1, 2, 3])


def test_activation_frequency_and_groups():
    q = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    k = np.array([[1.0, 1.0], [2.0, -1.0], [0.0, 0.0], [-1.0, 3.0]])
    np.testing.assert_array_equal(activation_frequency(q, k), [0.5, 0.25, 0.5])
    np.testing.assert_array_equal(activation_frequency(q, k[:0]), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(coordinate_groups(10, 3), [0, 3, 7, 10])
    np.testing.assert_array_equal(coordinate_groups(2, 5), [0, 1, 2])
    np.testing.assert_array_equal(coordinate_groups(4, 0), [0, 4])


def test_rounding_allowance_is_the_documented_formula():
    """4·n_op·u·M·(1 + 8·n_op·u) + (D+4)(H+G+4)(1 + Σ|w| + Σ|w̃|)(1 + ‖k‖_1)·2^-1070 with
    n_op = D + H + G + 8 and M(k) = (Σ_h|w_h||q_h| + Σ_j|w̃_j||q_j| + |a_A| + |V|)·|k| +
    (Σ_h|w_h|‖q_h‖ + Σ_g c_g)‖k‖ (certificate.rounding_allowance docstring)."""
    u = 2.0**-53
    for seed in range(3):
        q, w, k = _problem(seed)
        k[0] = np.ldexp(k[0], -1050)  # the absolute term dominates here
        H, D = q.shape
        for opt, r in [(o, 2) for o in ALL_OPTIONS[::4]] + [(ALL_OPTIONS[0], H - 1)]:
            # r = H − 1 retains negative heads too: w̃ has negative entries, Σ|w̃| ≠ Σw̃
            plan = build_plan(q, w, activation_frequency(q, k), r, opt)
            c = plan.positive_coefficients()
            G = c.size
            n_op = D + H + G + 8
            env = np.abs(w) @ np.abs(q) + np.abs(plan.w_fold) @ np.abs(plan.q_R)
            env = env + np.abs(plan.a_A) + np.abs(plan.V)
            mag = np.abs(w) @ np.linalg.norm(q, axis=1) + c.sum()
            M = np.abs(k) @ env + mag * np.linalg.norm(k, axis=1)
            wsum = 1.0 + np.abs(w).sum() + np.abs(plan.w_fold).sum()
            l1 = np.abs(k).sum(axis=1)
            want = 4 * n_op * u * M * (1 + 8 * n_op * u)
            want = want + (D + 4) * (H + G + 4) * wsum * (1 + l1) * 2.0**-1070
            got = rounding_allowance(plan, q, w, k)
            np.testing.assert_allclose(got, want, rtol=2e-15, atol=0)  # 8·n_op·u ≈ 2e-14
            assert np.all(got > 0)
            base = upper_bound(plan, k, "base", "none")
            np.testing.assert_array_equal(upper_bound(plan, k, "base", "up", q, w), base + got)
            ks = KeySummary(k)
            np.testing.assert_array_equal(rounding_allowance(plan, q, w, k, ks), got)
            np.testing.assert_array_equal(positive_allowance(plan, k, ks),
                                          positive_allowance(plan, k))  # fmt: skip


def test_bound_forms_equal_their_formulas():
    q, w, k = _problem(4)
    plan = build_plan(q, w, activation_frequency(q, k), 2, PlanOptions(allowance="joint"))
    x = k @ plan.q_R.T
    allow = plan.positive_coefficients()[0] * safe_norm(k, axis=1)
    base = np.maximum(x, 0) @ plan.w_fold - np.maximum(k @ plan.a_A, 0) + allow
    ab = 0.5 * (np.abs(x) @ plan.w_fold) - k @ plan.V + allow
    np.testing.assert_allclose(upper_bound(plan, k, "base", "none"), base, rtol=1e-13)
    np.testing.assert_allclose(upper_bound(plan, k, "abs", "none"), ab, rtol=1e-13)
    assert F(float(min(plan.E_P, plan.E_P_joint))) == F(float(plan.positive_coefficients()[0]))
    with pytest.raises(ValueError, match="q_t"):
        upper_bound(plan, k, "base", "up")
