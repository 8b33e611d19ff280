"""Numerical certificate (dosa_ref.numeric): outward rounding, the error model, and the
dominance s^ref ≤ U^num on adversarial FP8 inputs, checked in exact rationals and against
a simulation of the truncating FP8 tensor-core arithmetic; fp8_topk exactness."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import problems

from dosa_ref.error_model import Arithmetic, ErrorModel, simulate_dot, simulate_scorer
from dosa_ref.fp8 import dequantize, e4m3_values, key_rms, quantize_keys, quantize_queries
from dosa_ref.margins import exact_margin, model_coefficients_exact
from dosa_ref.numeric import (
    build_fp8_plan,
    default_plan,
    fp8_bounds,
    screen_bound,
    screen_values,
    simulate_screen,
)
from dosa_ref.pipeline import fp8_topk, topk_check
from dosa_ref.plan import PlanOptions
from dosa_ref.rounding import (
    add_down,
    add_up,
    div_up,
    f32_add_ru,
    f32_mul_ru,
    f32_up,
    matmul_enclose,
    mul_down,
    mul_up,
    norm_up,
    sqrt_up,
    sum_up,
)
from dosa_ref.scorer import score_keys
from proofs.gpu_screen_epilogue import round_f32  # the exact fp32 rounding of a rational

F = Fraction
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
small = st.floats(-1e150, 1e150, allow_nan=False)


# ------------------------------------------------------------------ outward primitives


@settings(deadline=None)
@given(small, small)
def test_directed_primitives_enclose_exact(a, b):
    ex_add, ex_mul = F(a) + F(b), F(a) * F(b)
    assert F(float(add_down(a, b))) <= ex_add <= F(float(add_up(a, b)))
    assert F(float(mul_down(a, b))) <= ex_mul <= F(float(mul_up(a, b)))
    if b != 0:
        qd = float(div_up(a, b))
        assert qd == np.inf or F(qd) >= F(a) / F(b)
    x = abs(a)
    assert F(float(sqrt_up(x))) ** 2 >= F(x)
    y = float(f32_up(a))
    assert y == np.inf or (F(y) >= F(a) and float(np.float32(y)) == y)


f32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(deadline=None, max_examples=400)
@given(f32s, f32s, st.integers(-160, 40))
def test_f32_round_up_operations_are_correctly_rounded(a, b, shift):
    """``f32_add_ru`` / ``f32_mul_ru`` (the fp32 guard's operations, PTX add.rp / mul.rp
    without .ftz): the smallest float32 at or above the exact sum and product, subnormals
    and the range's end included (b scaled by 2^shift reaches every exponent gap)."""
    b = float(np.float32(b * 2.0**shift)) if np.isfinite(np.float32(b * 2.0**shift)) else b
    fa, fb = np.float32(a), np.float32(b)
    got_add = float(f32_add_ru(fa, fb))
    got_mul = float(f32_mul_ru(fa, fb))
    want_add = round_f32(F(float(fa)) + F(float(fb)), up=True)
    want_mul = round_f32(F(float(fa)) * F(float(fb)), up=True)
    assert got_add == want_add or (got_add == 0 and want_add == 0)
    assert got_mul == want_mul or (got_mul == 0 and want_mul == 0)


@settings(deadline=None)
@given(st.lists(small, min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_sums_dots_norms_enclose_exact(xs, seed):
    x = np.array(xs)
    assert F(float(sum_up(x))) >= sum(F(v) for v in xs)
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(x.size) * 10.0 ** rng.integers(-300, 150)
    lo, hi = matmul_enclose(x[None, :], y[:, None])
    ex = sum(F(a) * F(b) for a, b in zip(x, y, strict=True))
    assert F(float(lo[0, 0])) <= ex <= F(float(hi[0, 0]))
    m = np.abs(x)
    assert F(float(norm_up(m))) ** 2 >= sum(F(v) ** 2 for v in m)


# ------------------------------------------------------------------ error model


def test_error_model_fields_and_roundtrip():
    m = ErrorModel()
    assert m == ErrorModel.hopper_fp8()
    assert m.screen.accumulator == "truncating" and m.screen.kept_bits == 17
    assert ErrorModel.from_dict(m.to_dict()) == m
    for bad in (
        dict(accumulator="fp16"),
        dict(epilogue="bf16"),
        dict(kept_bits=0),
        dict(underflow=-1.0),
        dict(accumulator="exact", exact_products=False),
    ):
        with pytest.raises(ValueError):
            Arithmetic(**bad)
    with pytest.raises(ValueError, match="dot_length"):
        Arithmetic(dot_length=8).length(16)
    g = [Arithmetic(kept_bits=W).dot_relative_error(128) for W in (13, 15, 17)]
    assert g[0] > g[1] > g[2] > 0
    # D = 128: S = 4 steps, θ ≈ 33·2^-13 → γ = Sθ/(1 − Sθ) ≈ 0.0164
    assert 0.0162 < g[0] < 0.0165


@pytest.mark.parametrize("model", [ErrorModel(), ErrorModel.ieee_fp32(), ErrorModel.cpu_fp64()])
def test_float_coefficients_dominate_exact_ones(model):
    for D, H, r in ((128, 32, 16), (7, 3, 1)):
        ex = model_coefficients_exact(model, D, H, r)
        fl_s = model.screen_coefficients(D, r)
        fl_r = model.scorer_coefficients(D, H)
        for a, b in zip(fl_s, ex["screen"], strict=True):
            assert F(a) >= b
        for a, b in zip(fl_r, ex["scorer"], strict=True):
            assert F(a) >= b


def _e4m3_wide(rng, n, lo=-9, hi=8):
    v = rng.integers(8, 16, n) / 8.0 * 2.0 ** rng.integers(lo, hi + 1, n)
    v = np.clip(v * rng.choice([-1.0, 1.0], n), -448, 448)
    return e4m3_values(quantize_keys(v[None, :] * 0 + v[None, :], "amax")[0][0]) * 0 + v


@settings(deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([13, 17]), st.integers(1, 130))
def test_simulated_truncating_dot_within_model(seed, W, n):
    rng = np.random.default_rng(seed)
    a = e4m3_values(rng.integers(0, 0x7F, n).astype(np.uint8)) * rng.choice([-1, 1], n)
    B = e4m3_values(rng.integers(0, 0x7F, (6, n)).astype(np.uint8))
    B[0, :] = 0
    B[1, : min(n, 3)] = 448.0  # a few huge products beside small ones
    ar = Arithmetic(kept_bits=W)
    got = simulate_dot(a, B, ar)
    g = F(ar.dot_relative_error(n))
    for i in range(B.shape[0]):
        ex = sum(F(float(x)) * F(float(y)) for x, y in zip(a, B[i], strict=True))
        ab = sum(abs(F(float(x)) * F(float(y))) for x, y in zip(a, B[i], strict=True))
        assert abs(F(float(got[i])) - ex) <= g * ab


def test_truncation_worst_case_witness():
    # k products just below the window beside a large accumulator all vanish (docs/numerics.md).
    W = 13
    c0 = 256.0
    small = 2.0 ** (8 - W) * 0.9375
    a = np.full(32, small)
    got = simulate_dot(a, np.ones((1, 32)), Arithmetic(kept_bits=W), c0=c0)
    assert got[0] == c0  # every product lost
    loss = F(32) * F(small)
    theta = F(Arithmetic(kept_bits=W).step_theta())
    assert loss <= theta * (F(c0) + 32 * F(small))  # the per-step bound holds …
    assert loss >= theta * (F(c0) + 32 * F(small)) * F(9, 10)  # … and is nearly attained


# ------------------------------------------------------------------ dominance fuzz

KEY_KINDS = ("normal", "cancel", "saturated", "subnormal", "clamp", "huge", "tiny", "spiky")


def make_keys(rng, kind, n, D, q):
    k = rng.standard_normal((n, D))
    if kind == "cancel":
        # combinations of head directions with alternating signs: large head logits that
        # cancel inside the aggregate and between heads
        c = rng.choice([-1.0, 1.0], (n, q.shape[0])) * rng.integers(1, 4, (n, q.shape[0]))
        k = c @ q + 1e-3 * k
    elif kind == "saturated":
        k = np.sign(k) * 3.0  # every coordinate maps to ±448
        k[:, 0] *= 1.0 + 2.0**-6  # … and a 465-like overshoot before clipping
    elif kind == "subnormal":
        k *= 1e-3
        k[:, 0] = 1e2  # one dominant coordinate: the rest become e4m3 subnormals / zero
    elif kind == "clamp":
        k *= 1e-7  # amax below the 1e-4 clamp
    elif kind == "huge":
        k *= 1e30
    elif kind == "tiny":
        k *= 1e-30
    elif kind == "spiky":
        k = k * (rng.random((n, D)) < 0.2) * 10.0 ** rng.integers(-3, 3, (n, D))
    return k


@st.composite
def fp8_case(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    H = draw(st.integers(2, 6))
    D = draw(st.sampled_from([4, 7, 16, 33, 48]))
    n = draw(st.integers(1, 10))
    kind = draw(st.sampled_from(KEY_KINDS))
    qkind = draw(st.sampled_from(["fp8", "float", "tiny", "huge"]))
    wkind = draw(st.sampled_from(["dsa", "pos", "mixed", "ties"]))
    q = rng.standard_normal((H, D))
    if rng.random() < 0.5:
        q += rng.standard_normal(D)  # correlated heads
    w = rng.standard_normal(H)
    if wkind == "dsa":
        w = -np.abs(w)
        w[0] = abs(w[0])
    elif wkind == "pos":
        w = np.abs(w)
    elif wkind == "ties":
        # 1 + 2^-24 is a float32 tie: ω rounds to even (when σ is a power of two)
        w = np.where(rng.random(H) < 0.5, 1.0, -1.0) * (1.0 + 2.0**-24)
    if qkind == "fp8":
        qp, wf = quantize_queries(q[None], w[None], draw(st.sampled_from(["amax", "ue8m0"])))
        q, w = e4m3_values(qp[0]), wf[0].astype(np.float64)
        if wkind == "ties":
            w = np.where(w > 0, 1.0, -1.0) * (1.0 + 2.0**-24)
    elif qkind == "tiny":
        q = q * 1e-100
    elif qkind == "huge":
        q = q * 1e30
    k = make_keys(rng, kind, n, D, q)
    fmt = draw(st.sampled_from(["amax", "ue8m0"]))
    payload, scale = quantize_keys(k, fmt)
    r = draw(st.integers(1, H))
    opts = PlanOptions(
        allowance=draw(st.sampled_from(["triangle", "joint", "grouped"])),
        neg_aggregate=draw(st.sampled_from(["majority", "all", "none"])),
        groups=draw(st.sampled_from([1, 2, 4])),
    )
    form = draw(st.sampled_from(["base", "abs"]))
    W = draw(st.sampled_from([13, 17]))
    return dict(
        q=q,
        w=w,
        payload=payload,
        scale=scale,
        r=r,
        opts=opts,
        form=form,
        W=W,
        qkind=qkind,
        kind=kind,
    )


@settings(deadline=None)
@given(fp8_case())
def test_dominance_exact_and_simulated(case):
    q, w, payload, scale = case["q"], case["w"], case["payload"], case["scale"]
    model = ErrorModel.hopper_fp8(case["W"])
    kbar = e4m3_values(payload)
    plan = default_plan(q, w, kbar, case["r"], case["opts"])
    fplan = build_fp8_plan(plan, q, w, model, case["form"])
    rho = key_rms(payload)
    U = screen_bound(fplan, kbar, scale, rho)
    s_ref = score_keys(q, w, dequantize(payload, scale))
    assert np.all(U >= s_ref)  # computed dominance (CPU arithmetic)
    if not fplan.valid:
        assert np.all(U == np.inf)
        return
    for i in range(kbar.shape[0]):
        ex = exact_margin(fplan, q, w, kbar[i], scale[i], rho[i], model, U[i], s_ref[i])
        assert ex["margin"] >= 0, (i, float(ex["margin"]))
        assert ex["computed_margin"] >= 0
    if case["qkind"] == "fp8":
        # The GPU-like arithmetic the model allows: truncating dots + fp32 epilogues.
        s_sim = simulate_scorer(q, w, kbar, scale, model.scorer)
        uh = simulate_screen(fplan, kbar, model.screen)
        U_sim = screen_bound(fplan, kbar, scale, rho, Uhat=uh)
        assert np.all(U_sim >= s_sim)


def test_missing_arithmetic_allowance_is_caught():
    """Without the model's allowance (ErrorModel.exact) a truncating scorer beats U^num on
    a crafted key — the dominance checks above can fail."""
    W = 13
    q = np.zeros((2, 64))
    q[0, 0] = 16.0
    q[0, 1:33] = -(2.0**-5)  # 32 negative products just under the window: truncated to 0
    q[1, :] = 1.0
    w = np.array([1.0, -(2.0**-20)])
    k = np.zeros((1, 64))
    k[0, 0] = 16.0
    k[0, 1:33] = 2.0**-5 * 16.0 / 15.0
    payload, scale = quantize_keys(k)
    kbar = e4m3_values(payload)
    plan = default_plan(q, w, kbar, 2)
    s_sim = simulate_scorer(q, w, kbar, scale, Arithmetic(kept_bits=W))
    bad = build_fp8_plan(plan, q, w, ErrorModel.exact(), "base")
    good = build_fp8_plan(plan, q, w, ErrorModel.hopper_fp8(W), "base")
    rho = key_rms(payload)
    U_bad = screen_bound(bad, kbar, scale, rho)
    U_good = screen_bound(good, kbar, scale, rho)
    assert s_sim[0] > U_bad[0]  # violation without the allowance
    assert s_sim[0] <= U_good[0]


def test_invalid_scales_and_plans_disable_pruning():
    rng = np.random.default_rng(5)
    Qn, H, D, N, K = 2, 4, 8, 300, 5
    q = rng.standard_normal((Qn, H, D))
    w = -np.abs(rng.standard_normal((Qn, H)))
    w[:, 0] *= -1
    payload, scale = quantize_keys(rng.standard_normal((N, D)))
    scale = scale.copy()
    scale[[3, 7]] = [0.0, -scale[7]]  # non-positive scales: valid keys, no pruning
    res = fp8_topk(q, w, payload, scale, K, r=2, seeds="local", window=20)
    np.testing.assert_array_equal(res.ids, topk_check(q, w, payload, scale, K))
    B = fp8_bounds(q, w, payload, scale)
    assert np.all(B.U[:, [3, 7]] == np.inf)
    bad = scale.copy()
    bad[1] = np.nan
    with pytest.raises(ValueError, match="scale"):
        fp8_topk(q, w, payload, bad, K)
    assert np.all(fp8_bounds(q, w, payload, bad).U[:, 1] == np.inf)
    bp = payload.copy()
    bp[2, 0] = 0x7F
    with pytest.raises(ValueError, match="payload"):
        fp8_topk(q, w, bp, scale, K)
    assert np.all(fp8_bounds(q, w, bp, scale).U[:, 2] == np.inf)
    # ω overflows float32 → invalid plan → full-domain recovery, still exact
    w2 = w * 1e45
    res2 = fp8_topk(q, w2, payload, scale, K, r=2, seeds="local", window=20)
    assert res2.stats.recovered.all()
    np.testing.assert_array_equal(res2.ids, topk_check(q, w2, payload, scale, K))


@settings(deadline=None)
@given(
    problems(max_n=150),
    st.sampled_from(["amax", "ue8m0"]),
    st.booleans(),
    st.sampled_from(["base", "abs"]),
)
def test_fp8_topk_equals_full_scoring(prob, fmt, fp8q, form):
    q, w, k, K, ks, ke = prob
    payload, scale = (
        quantize_keys(k, fmt)
        if k.shape[0]
        else (np.zeros((0, k.shape[1]), np.uint8), np.zeros(0, np.float32))
    )
    if fp8q and np.max(np.abs(q), initial=0) < 1e30:
        qp, wf = quantize_queries(q, np.clip(w, -1e30, 1e30), fmt)
        q, w = e4m3_values(qp), wf.astype(np.float64)
    res = fp8_topk(
        q, w, payload, scale, K, ks, ke, form=form, window=8, sinks=2, cert_seeds=4, n_anchors=1
    )
    np.testing.assert_array_equal(res.ids, topk_check(q, w, payload, scale, K, ks, ke))


def test_fp8_topk_prunes_and_reports_guard_cost():
    rng = np.random.default_rng(11)
    Qn, H, D, N, K = 3, 16, 64, 4000, 32
    base = rng.standard_normal(D)
    q = 0.6 * base + rng.standard_normal((Qn, H, D))
    w = -np.abs(rng.standard_normal((Qn, H)))
    w[:, :2] *= -1
    qp, wf = quantize_queries(q, w)
    q, w = e4m3_values(qp), wf.astype(np.float64)
    k = rng.standard_normal((N, D)) + 2.0 * base / np.linalg.norm(base)
    payload, scale = quantize_keys(k)
    res = fp8_topk(q, w, payload, scale, K, error_model=ErrorModel.hopper_fp8(17))
    np.testing.assert_array_equal(res.ids, topk_check(q, w, payload, scale, K))
    T = res.stats.totals()
    assert T["survival"] < 1.0 and T["survival"] >= T["survival_exact"]
    st_ = res.stats  # the shared work accounting (dosa_ref.options.STATS)
    np.testing.assert_array_equal(st_.scored, st_.seeds + st_.cert_seeds + st_.refined)
    assert 0.0 < T["scored_fraction"] < T["work_ratio"]
    assert "guard_cost_pp" in T
    fp = res.plans[0]
    ka = fp.kernel_arrays()
    assert ka["q_payload"].dtype == np.uint8 and ka["q_payload"].shape == (fp.r, D)
    assert ka["omega"].dtype == np.float32 and ka["aux_scale"].dtype == np.float32
    assert ka["aux_payload"].shape == (2, D) and isinstance(ka["C"], np.float32)
    # Û from the CPU equals the exact screening value up to float64 rounding
    kb = e4m3_values(payload[:50])
    np.testing.assert_allclose(
        screen_values(fp, kb),
        simulate_screen(fp, kb, Arithmetic(accumulator="exact", epilogue="exact", underflow=0.0)),
        rtol=1e-6,
        atol=1e-3,
    )


def test_e4m3_squares_are_exact_integer_units():
    """docs/method.md §8 "ρ from integer squares": every e4m3 code's square is an integer
    number of 2^-18 units (``emulate.e4m3_sq_units``, the mirror of prepare.cu's), equal to
    the float64 square of its value; a NaN code counts as (8 + 7)·2^5, as the kernels decode
    it; 128 of the largest sum below 2^53, so the int64 sum converts to float64 exactly."""
    from dosa_cupy.emulate import e4m3_sq_units

    codes = np.arange(256, dtype=np.uint8)
    units = e4m3_sq_units(codes)
    v = e4m3_values(codes)
    ok = ~np.isnan(v)
    assert np.array_equal(units[ok].astype(np.float64) * 2.0**-18, v[ok] ** 2)
    assert (units[~ok] == 480**2 * 2**18).all()
    assert int(units.max()) * 128 < 2**53
