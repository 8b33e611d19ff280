"""The numerical certificate's assembly checked on the values the functions return, in
exact rationals (docs/mutation.md, clusters 2 and 6).

``screen_bound`` must return an upper bound of α(Û + ρC + ε_raw) + ε_out for the very
Û, ρ, α it is given (every term, every rounding direction): the dominance tests elsewhere
rebuild this sum from the kernel arrays, so a term dropped inside ``screen_bound`` would
only show through pruning.  The error model's float coefficients must dominate their
exact values and stay within a few ulps of them; the outward primitives must stay
outward on long sums and on float32 input.  All inputs are fixed (no luck involved).
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from dosa_ref.error_model import Arithmetic, ErrorModel
from dosa_ref.fp8 import e4m3_values, key_rms, quantize_keys, quantize_queries
from dosa_ref.margins import model_coefficients_exact
from dosa_ref.numeric import build_fp8_plan, default_plan, screen_bound, screen_values
from dosa_ref.plan import PlanOptions
from dosa_ref.rounding import f32_up, gamma_up, matmul_abs_up, matmul_enclose, norm_up, sum_up

MODELS = {
    "hopper": ErrorModel(),
    "hopper13": ErrorModel.hopper_fp8(13),
    "fp32": ErrorModel.ieee_fp32(),
    "cpu": ErrorModel.cpu_fp64(),
    "exact": ErrorModel.exact(),
}


def _query(seed=1, H=6, D=48, scale_fmt="amax"):
    rs = np.random.default_rng(seed)
    q = rs.standard_normal((1, H, D)) + rs.standard_normal(D)
    w = -np.abs(rs.standard_normal((1, H)))
    w[0, :2] *= -1
    qp, wf = quantize_queries(q, w, scale_fmt)
    return e4m3_values(qp[0]), wf[0].astype(np.float64)


def _keys(D, seed=2):
    rs = np.random.default_rng(seed)
    k = rs.standard_normal((12, D)) * 10.0 ** rs.integers(-6, 4, (12, 1))
    k[0] = 0.0  # ρ = 0, Û = 0: U = α ε_raw + ε_out only
    k[1] *= 1e-9  # amax below the 1e-4 clamp: tiny α
    payload, scale = quantize_keys(k)
    return e4m3_values(payload), scale, key_rms(payload)


def _plan(model, form, seed=1):
    q, w = _query(seed)
    kb, _, _ = _keys(q.shape[1])
    plan = default_plan(q, w, kb, 3, PlanOptions(neg_aggregate="all"))
    return build_fp8_plan(plan, q, w, model, form), q, w


@pytest.mark.parametrize("form", ["base", "abs"])
@pytest.mark.parametrize("name", list(MODELS))
def test_screen_bound_assembles_every_term(name, form):
    """U^num ≥ α(Û + ρC + ε_raw) + ε_out exactly, and by no more than a few ulps (each
    of the four operations widens by one ulp), on zero, clamped and ordinary keys."""
    fplan, q, w = _plan(MODELS[name], form)
    assert fplan.valid
    kb, alpha, rho = _keys(q.shape[1])
    uh = screen_values(fplan, kb)
    U = screen_bound(fplan, kb, alpha, rho)
    assert np.array_equal(U, screen_bound(fplan, kb, alpha, rho, Uhat=uh))
    # An arbitrary supplied Û (e.g. a GPU kernel's) is used as given.
    shifted = uh + np.linspace(-3.0, 3.0, uh.size)
    U2 = screen_bound(fplan, kb, alpha, rho, Uhat=shifted)
    for Uv, Uh in ((U, uh), (U2, shifted)):
        for i in range(kb.shape[0]):
            a, r = F(float(alpha[i])), F(float(rho[i]))
            inner = F(float(Uh[i])) + r * F(float(fplan.C)) + F(fplan.eps_raw)
            exact = a * inner + F(fplan.eps_out)
            got = F(float(Uv[i]))
            assert got >= exact, (name, form, i)
            slack = (
                8
                * 2.0**-52
                * (
                    abs(a) * (abs(F(float(Uh[i]))) + r * F(float(fplan.C)) + F(fplan.eps_raw))
                    + F(fplan.eps_out)
                )
            )
            assert got - exact <= slack + F(2.0**-1070), (name, form, i)
    # the zero key: only the absolute terms remain, both of them
    assert uh[0] == 0.0 and rho[0] <= 2.0**-140
    assert F(float(U[0])) >= F(float(alpha[0])) * F(fplan.eps_raw) + F(fplan.eps_out)
    if name in ("hopper", "fp32"):
        assert fplan.eps_raw > 0 and fplan.eps_out > 0  # flush-to-zero model: both matter


def test_screen_bound_invalid_keys_and_plans_never_prune():
    fplan, q, w = _plan(MODELS["hopper"], "base")
    kb, alpha, rho = _keys(q.shape[1])
    alpha = alpha.copy()
    rho = rho.copy()
    alpha[2], alpha[3], alpha[4], alpha[5] = 0.0, -1.0, np.nan, np.inf
    rho[6], rho[7], rho[9] = np.nan, -1.0, 0.0
    uh = screen_values(fplan, kb)
    uh[8] = np.nan
    with np.errstate(invalid="ignore"):
        U = screen_bound(fplan, kb, alpha, rho, Uhat=uh)
    assert np.all(U[2:9] == np.inf)
    assert np.all(np.isfinite(U[[0, 1, 9, 10, 11]]))  # ρ = 0 and tiny α are valid keys
    bad = build_fp8_plan(fplan.plan, q, w * 1e45, MODELS["hopper"], "base")
    assert not bad.valid
    assert np.all(screen_bound(bad, kb, alpha, rho) == np.inf)


# ------------------------------------------------------------------ primitives


def test_gamma_up_definition_and_edges():
    """γ_n = nu/(1 − nu) rounded up; γ_0 = 0 (no operation, no error); inf once nu ≥ 1."""
    assert gamma_up(0, 2.0**-53) == 0.0 and gamma_up(-3, 2.0**-24) == 0.0
    assert gamma_up(5, 0.0) == 0.0
    assert gamma_up(2**24, 2.0**-24) == np.inf and gamma_up(2**25, 2.0**-24) == np.inf
    for n in (1, 2, 3, 7, 100, 4097, 2**23):
        for u in (2.0**-24, 2.0**-53, 3.0 * 2.0**-30):
            g = F(gamma_up(n, u))
            ex = n * F(u) / (1 - n * F(u))
            assert ex <= g <= ex * (1 + F(1, 2**48)), (n, u)


def test_dot_error_coefficients_dominate_their_definitions():
    """Arithmetic.step_theta ≥ θ = (k+1)2^-W(1+2^-23) + 2^-23 and dot_relative_error ≥
    Sθ/(1 − Sθ) (S = ⌈n/k⌉), exactly, over a grid of W, k and n."""
    for W in (10, 13, 17, 20, 24):
        for k in (16, 32):
            a = Arithmetic(kept_bits=W, k_step=k)
            th = F(a.step_theta())
            ex_th = (k + 1) * F(1, 2**W) * (1 + F(1, 2**23)) + F(1, 2**23)
            assert ex_th <= th <= ex_th * (1 + F(1, 2**48))
            for n in (1, 7, 32, 33, 100, 128, 129, 1000, 4096):
                S = -(-n // k)
                if S * th >= 1:
                    assert a.dot_relative_error(n) == np.inf
                    continue
                g = F(a.dot_relative_error(n))
                assert g >= S * th / (1 - S * th), (W, k, n)
                assert g <= S * ex_th / (1 - S * ex_th) * (1 + F(1, 2**44)), (W, k, n)
                d = F(a.dot_absolute_error(n))
                assert d >= 2 * n * F(a.underflow) * (1 + g)


@pytest.mark.parametrize("name", list(MODELS))
def test_float_coefficients_are_tight(name):
    """The float coefficients dominate the exact ones (test_numeric) and stay close to
    them: within 2^-26 for the GPU models (the float64 evaluation of the same formula),
    within 60 % for the CPU float64 model (whose exact version is written tighter),
    and a zero exact coefficient stays (sub)zero, so no term is counted twice."""
    model = MODELS[name]
    rel = F(1, 2**26) if name in ("hopper", "hopper13", "fp32") else F(3, 5)
    for D, H, r in [(D, H, r) for D, H in ((128, 32), (7, 3), (48, 6)) for r in (1, 3, 5, 16)]:
        ex = model_coefficients_exact(model, D, H, r)
        for fl, exact in ((model.screen_coefficients(D, r), ex["screen"]),
                          (model.scorer_coefficients(D, H), ex["scorer"])):  # fmt: skip
            for a, b in zip(fl, exact, strict=True):
                assert b <= F(a) <= b * (1 + rel) + F(2.0**-1072), (name, D, H, r)


def test_matmul_bounds_on_long_sums_and_float32_input():
    """BLAS sums that lose a little on every addition (1 + many half-ulp terms) and float32
    operands: matmul_abs_up stays above and matmul_enclose around the exact product."""
    n = 2000
    a = np.full(n, 0.75 * 2.0**-53)
    a[0] = 1.0
    b = np.ones(n)
    ex = sum(F(float(x)) for x in a)
    assert F(float(matmul_abs_up(a[None, :], b[:, None])[0, 0])) >= ex
    lo, hi = matmul_enclose(a[None, :], b[:, None])
    assert F(float(lo[0, 0])) <= ex <= F(float(hi[0, 0]))
    lo, hi = matmul_enclose(-a[None, :], b[:, None])
    assert F(float(lo[0, 0])) <= -ex <= F(float(hi[0, 0]))
    rs = np.random.default_rng(0)
    A32 = (rs.random((3, 300)) + 1.0).astype(np.float32)
    B32 = (rs.random((300, 2)) / 3.0).astype(np.float32)
    up_ = matmul_abs_up(A32, B32)
    lo, hi = matmul_enclose(A32, -B32)
    assert up_.dtype == np.float64 and lo.dtype == np.float64
    for i in range(3):
        for j in range(2):
            ex = sum(F(float(x)) * F(float(y)) for x, y in zip(A32[i], B32[:, j], strict=True))
            assert F(float(up_[i, j])) >= ex
            assert F(float(lo[i, j])) <= -ex <= F(float(hi[i, j]))
    assert F(float(sum_up(a))) >= ex * 0 + sum(F(float(x)) for x in a)


def test_norm_up_at_extreme_magnitudes():
    """norm_up scales by a power of two: squares of 2^±600 neither underflow nor overflow
    (exact: ‖(3, 4)·2^e‖ = 5·2^e)."""
    for e in (-1074, -1070, -700, -600, -300, 0, 300, 600, 1000):
        m = np.ldexp(np.array([3.0, 4.0, 0.0]), e) if e > -1074 else np.array([2**-1074] * 3)
        got = F(float(norm_up(m)))
        ex2 = sum(F(float(x)) ** 2 for x in m)
        assert got**2 >= ex2, e
        assert got**2 <= ex2 * (1 + F(1, 2**40)) + F(2.0**-1070) ** 2 * 64, e
    M = np.ldexp(np.array([[3.0, 4.0], [5.0, 12.0]]), 700)
    got = norm_up(M, axis=1)
    assert F(float(got[0])) >= 5 * F(2**700) and F(float(got[1])) >= 13 * F(2**700)
    assert np.all(got <= np.array([5.0, 13.0]) * 2.0**700 * (1 + 1e-12))


def test_aux_scales_are_the_documented_powers_of_two():
    """σ_0 of the aux rows: a power of two with max|target|/σ in (224, 448] (the target
    is a_A for the base form), so the first row uses e4m3's full range."""
    for seed in range(6):
        for mag in (1e-30, 1e-3, 1.0, 7.0, 1e20):
            q, w = _query(seed)
            kb, _, _ = _keys(q.shape[1])
            plan = default_plan(q, w * mag, kb, 2, PlanOptions(neg_aggregate="all"))
            fp = build_fp8_plan(plan, q, w * mag, MODELS["hopper"], "base")
            amax = float(np.max(np.abs(plan.a_A)))
            if amax == 0:
                continue
            s = float(fp.aux_scale[0])
            assert np.frexp(s)[0] == 0.5  # a power of two
            assert 224.0 < amax / s <= 448.0 * (1 + 1e-12), (seed, mag, amax / s)
    # exact powers of two: 448·2^e maps to exactly 448
    q = np.zeros((3, 8))
    q[1, 0] = 448.0
    q[2, 0] = 1.0
    w = np.array([1.0, -1.0, 0.0])
    plan = default_plan(q, w, np.ones((4, 8)), 1, PlanOptions(neg_aggregate="all"))
    fp = build_fp8_plan(plan, q, w, MODELS["hopper"], "base")
    assert fp.aux_scale[0] == 1.0 and e4m3_values(fp.aux_payload[0])[0] == 448.0


def _exact_allowances(plan, q, w, gb):
    """Per group: the exact triangle Σ_h w_h‖d_h^(g)‖ and joint ½(‖Σu^(g)‖ +
    sqrt(Σ|u_h^(g)·u_l^(g)|)) allowances, d_h = q_h − β_h q_j* with the plan's β taken as
    exact numbers (mpmath, 120 digits: far below any float64 rounding)."""
    import mpmath

    mp = mpmath.mp.clone() if hasattr(mpmath.mp, "clone") else mpmath.mp
    mp.dps = 120
    D = q.shape[1]
    ds = []
    for i, h in enumerate(plan.P):
        a = int(plan.anchor[i])
        b = mp.mpf(float(plan.beta[i]))
        ds.append([mp.mpf(float(q[h, d])) - (b * mp.mpf(float(q[a, d])) if a >= 0 else 0)
                   for d in range(D)])  # fmt: skip
    wP = [mp.mpf(float(w[h])) for h in plan.P]
    tri, joint = [], []
    for g in range(gb.size - 1):
        sl = range(int(gb[g]), int(gb[g + 1]))
        tri.append(sum(wP[i] * mp.sqrt(sum(ds[i][d] ** 2 for d in sl)) for i in range(len(ds))))
        u = [[wP[i] * ds[i][d] for d in sl] for i in range(len(ds))]
        S = mp.sqrt(sum(sum(u[i][j] for i in range(len(u))) ** 2 for j in range(len(sl))))
        G = sum(abs(sum(u[i][j] * u[m][j] for j in range(len(sl))))
                for i in range(len(u)) for m in range(len(u)))  # fmt: skip
        joint.append((S + mp.sqrt(G)) / 2)
    return tri, joint


@pytest.mark.parametrize("e", [-1068, -1060, -1040, -1000, -600, 0, 400])
@pytest.mark.parametrize("allowance", ["triangle", "joint", "grouped"])
def test_positive_enclosure_dominates_exact_allowance(e, allowance):
    """E_g^+ (FP8ScreenPlan.E_plus) ≥ the exact allowance at every magnitude, including
    heads whose residuals and allowances are subnormal (where a rounding in the wrong
    direction loses a whole quantum) and nearly parallel heads (cancellation in d_h)."""
    import mpmath

    rs = np.random.default_rng(abs(e))
    H, D = 6, 8
    base = rs.standard_normal(D)
    q = rs.standard_normal((H, D)) * 0.3 + base
    q[2] = 0.75 * q[0] + 1e-9 * rs.standard_normal(D)  # nearly parallel: cancellation
    q = np.ldexp(q, e)
    w = np.abs(rs.standard_normal(H))
    w[5] *= -1
    for groups in (1, 3):
        opt = PlanOptions(allowance=allowance, groups=groups)
        plan = default_plan(q, w, np.ldexp(rs.standard_normal((5, D)), -e // 2), 2, opt)
        fp = build_fp8_plan(plan, q, w, MODELS["hopper"], "base")
        gb = plan.allowance_groups()
        tri, joint = _exact_allowances(plan, q, w, gb)
        for g in range(gb.size - 1):
            want = tri[g] if allowance == "triangle" else min(tri[g], joint[g])
            assert mpmath.mpf(float(fp.E_plus[g])) >= want, (e, allowance, groups, g)


@pytest.mark.parametrize("allowance", ["joint", "grouped"])
def test_joint_enclosure_at_subnormal_scale(allowance):
    """Two omitted positive heads with orthogonal residuals (joint = sqrt(Σ w_h²‖q_h‖²) <
    triangle) scaled into the subnormal range, where the final widening of E_g^+ is worth a
    whole quantum 2^-1074: E_g^+ ≥ the exact joint allowance for every scale and weight."""
    import mpmath

    mpmath.mp.dps = 60
    for e in range(-1074 + 8, -1030, 3):
        for w1, w2 in ((1.0, 1.0), (0.7, 1.3), (1.1, 0.35)):
            q = np.zeros((3, 4))
            q[0, 0] = 1.0
            q[1, 1], q[1, 2] = np.ldexp(3.0, e), np.ldexp(1.0, e)
            q[2, 3] = np.ldexp(5.0, e)
            w = np.array([1.0, w1, w2])
            plan = default_plan(
                q, w, np.ones((2, 4)), 1, PlanOptions(allowance=allowance, groups=1)
            )
            assert list(plan.P) == [1, 2]
            fp = build_fp8_plan(plan, q, w, MODELS["hopper"], "base")
            n1 = mpmath.sqrt(mpmath.mpf(float(q[1, 1])) ** 2 + mpmath.mpf(float(q[1, 2])) ** 2)
            n2 = mpmath.mpf(float(q[2, 3]))
            joint = mpmath.sqrt((w1 * n1) ** 2 + (w2 * n2) ** 2)
            assert mpmath.mpf(float(fp.E_plus[0])) >= joint, (e, w1, w2)


def test_residual_enclosure_under_cancellation():
    """An omitted head parallel to its anchor up to a few ulps: d_h = q_h − β q_j* is a
    difference of nearly equal numbers, and its enclosure must still contain it (E_g^+ ≥
    w_h‖d_h‖ exactly, with the plan's β as an exact number)."""
    import mpmath

    mpmath.mp.dps = 60
    rs = np.random.default_rng(11)
    for trial in range(40):
        D = 4
        q0 = rs.standard_normal(D)
        beta = [0.75, 0.3, 1.7, 0.1][trial % 4]
        noise = rs.integers(-6, 7, D) * 2.0**-52
        q = np.stack([q0, beta * q0 * (1.0 + noise)])
        w = np.array([1.0, 0.5 + trial / 40])
        for allowance in ("triangle", "joint"):
            plan = default_plan(q, w, np.ones((2, D)), 1, PlanOptions(allowance=allowance))
            if plan.P.size != 1 or plan.anchor[0] != 0:
                continue
            fp = build_fp8_plan(plan, q, w, MODELS["hopper"], "base")
            b = mpmath.mpf(float(plan.beta[0]))
            d = [mpmath.mpf(float(q[1, j])) - b * mpmath.mpf(float(q0[j])) for j in range(D)]
            ex = mpmath.mpf(float(w[1])) * mpmath.sqrt(sum(x * x for x in d))
            assert mpmath.mpf(float(fp.E_plus[0])) >= ex, (trial, allowance)


def test_matmul_bounds_accept_array_likes():
    """Nested lists are array-likes: converted, not assumed to be arrays."""
    a = [[1.0, 2.0, 3.0]]
    b = [[1.0], [0.5], [0.25]]
    assert matmul_abs_up(a, b)[0, 0] >= 2.75
    lo, hi = matmul_enclose(a, b)
    assert lo[0, 0] <= 2.75 <= hi[0, 0]


def test_fp8_topk_counts_exact_certificate_survivors():
    """guard_stats (default on): survivors of the exact-arithmetic certificate at the same
    plan and τ are counted, never more than the U^num survivors; off: nothing counted."""
    from dosa_ref.pipeline import fp8_topk, topk_check

    rs = np.random.default_rng(4)
    Qn, H, D, N, K = 2, 8, 32, 600, 8
    base = rs.standard_normal(D)
    q = 0.6 * base + rs.standard_normal((Qn, H, D))
    w = -np.abs(rs.standard_normal((Qn, H)))
    w[:, :2] *= -1
    qp, wf = quantize_queries(q, w)
    q, w = e4m3_values(qp), wf.astype(np.float64)
    payload, scale = quantize_keys(rs.standard_normal((N, D)) + base)
    res = fp8_topk(q, w, payload, scale, K, r=3, seeds="local", window=64)
    np.testing.assert_array_equal(res.ids, topk_check(q, w, payload, scale, K))
    st = res.stats
    assert np.all(st.survivors_exact > 0) and np.all(st.survivors_exact <= st.survivors)
    assert np.all(st.screened > st.survivors)
    off = fp8_topk(q, w, payload, scale, K, r=3, seeds="local", window=64, guard_stats=False)
    np.testing.assert_array_equal(off.ids, res.ids)
    assert np.all(off.stats.survivors_exact == 0)


def _random_plan_cases(n, seed=0):
    """Fixed pseudo-random plans (docs/records/mutation_contract_check.py draws the same):
    2–5 heads, D ≤ 6, heads at 2^-1070 … 2^300, nearly parallel and sparse heads."""
    rs = np.random.default_rng(seed)
    for _ in range(n):
        H, D = int(rs.integers(2, 6)), int(rs.integers(1, 7))
        q = rs.standard_normal((H, D))
        if rs.random() < 0.5:
            q[2 % H] = rs.uniform(0.1, 2) * q[0] * (1 + rs.integers(-4, 5, D) * 2.0**-52)
        if rs.random() < 0.3:
            q[:, 1:] *= rs.random(H)[:, None] < 0.5
        e = int(rs.choice([-1070, -1066, -1060, -1050, -1030, -900, -600, 0, 0, 0, 300]))
        q = np.ldexp(q, e)
        w = np.abs(rs.standard_normal(H)) * rs.choice([1.0, 0.5, 3.0])
        opt = PlanOptions(
            allowance=str(rs.choice(["triangle", "joint", "grouped"])),
            groups=int(rs.integers(1, 4)),
            pos_projection=bool(rs.random() < 0.8),
        )
        yield q, w, opt


def test_positive_enclosure_on_fixed_random_plans():
    """E_g^+ ≥ the exact allowance on 260 fixed plans, many of them with subnormal
    residuals: there one outward widening is worth a whole quantum and cannot be spared
    (the last widening of the joint form, the triangle products, the scaling exponent)."""
    import mpmath

    for i, (q, w, opt) in enumerate(_random_plan_cases(260)):
        plan = default_plan(q, w, np.ones((2, q.shape[1])), 1, opt)
        fp = build_fp8_plan(plan, q, w, MODELS["hopper"], "base")
        gb = plan.allowance_groups()
        tri, joint = _exact_allowances(plan, q, w, gb)
        for g in range(gb.size - 1):
            want = tri[g] if opt.allowance == "triangle" else min(tri[g], joint[g])
            assert mpmath.mpf(float(fp.E_plus[g])) >= want, (i, g)


def test_f32_up_is_the_smallest_float32_above():
    """f32_up(x) = x for fp32-representable x, else the next fp32 above (never two up)."""
    for v in (1.0, -1.0, 0.0, 3.0 * 2.0**-149, 2.0**-126, 448.0, 3.4e38, -2.5, 0.1):
        x = np.float64(np.float32(v))
        assert f32_up(x) == np.float32(v)
        y = np.float64(x) + abs(x) * 2.0**-40 + 2.0**-160  # just above, not representable
        got = f32_up(y)
        assert F(float(got)) >= F(float(y))
        assert F(float(np.nextafter(got, np.float32(-np.inf)))) < F(float(y))
    assert f32_up(np.array([np.nan]))[0] != f32_up(np.array([np.nan]))[0]


def test_norm_up_of_empty_rows():
    np.testing.assert_array_equal(norm_up(np.zeros((3, 0)), axis=1), np.zeros(3))
    assert norm_up(np.zeros((2, 0)), axis=1).shape == (2,)
    assert norm_up(np.zeros(0)) == 0.0


def test_aux_scales_stay_in_the_fp32_normal_range():
    """σ_m are stored as fp32 and read by a flush-to-zero kernel: they must be normal fp32
    powers of two (≥ 2^-126) even when the aggregate is far smaller (docs/numerics.md)."""
    for mag in (1e-30, 1e-38, 1e-42, 1e-60, 1e-200):
        q = np.array([[1.0, 0.5, 0.0, 0.0], [0.3, -1.0, 0.7, 0.1], [0.2, 0.1, -0.4, 1.0]])
        w = np.array([1.0, -mag, -mag * 0.3])
        plan = default_plan(q, w, np.ones((2, 4)), 1, PlanOptions(neg_aggregate="all"))
        for form in ("base", "abs"):
            fp = build_fp8_plan(plan, q, w, MODELS["hopper"], form)
            for s in fp.aux_scale:
                assert s >= np.float32(2.0**-126) and np.frexp(float(s))[0] == 0.5, (mag, form)


def _exact_envelopes(fp, plan, q, w, form):
    """Exact reconstruction errors the envelope must cover (Fractions): aux |t − v0 − v1|
    per coordinate with t = a_A (base) or V = a_A − ½Σ w̃_j q_j (abs), and the row term
    Σ_j | |c_j| q_jd − |ω_j| q̂_jd | (same signs) with c_j = w̃_j or ½w̃_j, w̃ exact."""
    D = q.shape[1]
    Fq = [[F(float(x)) for x in row] for row in q]
    wt = {int(j): F(float(w[j])) for j in plan.R}
    for i, h in enumerate(plan.P):
        if plan.anchor[i] >= 0 and plan.beta[i] != 0:
            wt[int(plan.anchor[i])] += F(float(w[h])) * F(float(plan.beta[i]))
    half = F(1, 2) if form == "abs" else F(1)
    t = [sum((abs(F(float(w[h]))) * Fq[h][d] for h in plan.A), F(0)) for d in range(D)]
    if form == "abs":
        t = [t[d] - sum(half * wt[int(j)] * Fq[j][d] for j in plan.R) for d in range(D)]
    pv = e4m3_values(fp.aux_payload)
    aux = [abs(t[d] - sum(F(float(fp.aux_scale[m])) * F(float(pv[m, d])) for m in range(2)))
           for d in range(D)]  # fmt: skip
    qv = e4m3_values(fp.q_payload)
    row = [F(0)] * D
    for jj, j in enumerate(plan.R):
        c, om = half * wt[int(j)], F(float(fp.omega[jj]))
        for d in range(D):
            if (c >= 0) == (om >= 0):
                row[d] += abs(abs(c) * Fq[j][d] - abs(om) * F(float(qv[jj, d])))
            else:
                row[d] += abs(c) * abs(Fq[j][d]) + abs(om) * abs(F(float(qv[jj, d])))
    return aux, row


@pytest.mark.parametrize("form", ["base", "abs"])
def test_envelope_parts_cover_the_exact_errors(form):
    """J_parts["aux"] ≥ the exact aux reconstruction error and J_parts["omega"] ≥ the exact
    row/weight rounding error, coordinate by coordinate (interval arithmetic checked in
    rationals, with projected heads so that w̃ ≠ w)."""
    for seed in range(4):
        rs = np.random.default_rng(seed)
        H, D = 6, 8
        base = rs.standard_normal(D)
        q = rs.standard_normal((H, D)) * 0.4 + base
        w = np.array([1.3, 0.7, 0.45, -0.8, -1.1, -0.25]) * (1 + rs.random(H))
        for opt in (PlanOptions(neg_aggregate="all"), PlanOptions(allowance="triangle")):
            plan = default_plan(q, w, rs.standard_normal((6, D)), 2, opt)
            assert np.any(plan.beta > 0)
            fp = build_fp8_plan(plan, q, w, MODELS["hopper"], form)
            aux, row = _exact_envelopes(fp, plan, q, w, form)
            for d in range(D):
                assert F(float(fp.J_parts["aux"][d])) >= aux[d], (seed, form, d)
                assert F(float(fp.J_parts["omega"][d])) >= row[d], (seed, form, d)


def test_envelope_parts_on_fixed_random_plans():
    """The same exact envelope check on 30 fixed random plans (2–6 heads, weights from
    2^-20 to 2^20, float32-exact rows half of the time, both forms): in the abs form the
    aux target V = a_A − ½Σ w̃_j q_j is a difference of enclosed terms, whose lower end
    must be rounded down."""
    rs = np.random.default_rng(7)
    for trial in range(30):
        H, D = int(rs.integers(2, 7)), int(rs.integers(1, 9))
        base = rs.standard_normal(D)
        q = rs.standard_normal((H, D)) * rs.uniform(0.05, 1) + base
        if rs.random() < 0.5:
            q = q.astype(np.float32).astype(np.float64)
        w = rs.standard_normal(H) * 2.0 ** float(rs.integers(-20, 20))
        opt = PlanOptions(neg_aggregate=str(rs.choice(["all", "majority"])))
        plan = default_plan(q, w, rs.standard_normal((6, D)), int(rs.integers(1, H)), opt)
        for form in ("base", "abs"):
            fp = build_fp8_plan(plan, q, w, MODELS["hopper"], form)
            aux, row = _exact_envelopes(fp, plan, q, w, form)
            for d in range(D):
                assert F(float(fp.J_parts["aux"][d])) >= aux[d], (trial, form, d)
                assert F(float(fp.J_parts["omega"][d])) >= row[d], (trial, form, d)
