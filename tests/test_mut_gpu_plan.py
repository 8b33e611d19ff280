"""The GPU planner's certificate constants, derived independently of dosa_cupy/plan.py
(docs/mutation.md, cluster 5).  The other CPU checks of the planner (test_plan_fused's
emulation, test_gpu) call ``plan.gamma`` / ``plan.gamma_mma`` themselves, so an error in
those helpers would be copied into the check; here every constant is recomputed from its
definition in exact rationals:

* fp32 epilogue chains of n round-to-nearest operations: γ_n = n·u/(1 − n·u), u = 2^-24;
* MMA dots (m16n8k16, S = ⌈D/16⌉ steps of 16 exact products + the accumulator, W kept
  bits): γ_mma = S·(17·2^-W + u)·(1 + 2^-4) — which must dominate the numeric reference's
  truncating-accumulator model Sθ/(1 − Sθ), θ = (k+1)·2^-W·(1 + 2^-23) + 2^-23 with k = 16
  (dosa_ref.numeric.ErrorModel docstring);
* the plan's J, C, E, ε_raw, ε_out (module docstring of dosa_cupy/plan.py), from the plan's
  exposed fields and the inputs.
All CPU, numpy standing in for CuPy (``xp=np``).
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

from dosa_cupy import plan as plan_mod
from dosa_ref.fp8 import e4m3_bits, e4m3_values, quantize_keys, quantize_queries
from dosa_ref.plan import PlanOptions, build_plan

U = F(1, 2**24)
MU = F(1, 2**30)
TINY = F(1, 2**126)


def gamma_exact(n: int) -> F:
    return n * U / (1 - n * U)


def gamma_mma_exact(W: int, D: int = 128) -> F:
    S = -(-D // 16)
    return S * (17 * F(1, 2**W) + U) * (1 + F(1, 16))


def truncating_model(W: int, D: int = 128) -> F:
    """numeric.ErrorModel's truncating accumulator with k = 16 products per step."""
    S = -(-D // 16)
    theta = 17 * F(1, 2**W) * (1 + F(1, 2**23)) + F(1, 2**23)
    return S * theta / (1 - S * theta)


def test_gamma_equals_its_definition():
    for n in (1, 2, 3, 7, 8, 9, 16, 40, 133):
        assert F(plan_mod.gamma(n)) == pytest.approx(gamma_exact(n), rel=1e-15)
    assert plan_mod.U32 == 2.0**-24 and plan_mod.MU == 2.0**-30 and plan_mod.TINY == 2.0**-126
    assert plan_mod.K_STEP == 16


@pytest.mark.parametrize("W", [13, 15, 17, 20])
@pytest.mark.parametrize("D", [16, 100, 128, 256])
def test_gamma_mma_from_the_error_model(W, D):
    got = F(plan_mod.gamma_mma(W, D))
    assert got == pytest.approx(gamma_mma_exact(W, D), rel=1e-15)
    assert got >= truncating_model(W, D)  # covers the numeric reference's model
    assert F(plan_mod.gamma_mma(W)) == F(plan_mod.gamma_mma(W, 128))


def test_row_slots_leave_the_aux_rows_free():
    for mts in (1, 2, 3):
        s = plan_mod.row_slots(mts)
        last = 16 * (mts - 1)
        assert s.size == 16 * mts - 2
        assert set(range(16 * mts)) - set(s.tolist()) == {last + 7, last + 15}


def _workload(Qn=3, H=32, N=512, seed=7):
    rs = np.random.default_rng(seed)
    topic = rs.standard_normal(128)
    qf = rs.standard_normal((Qn, H, 128)) + rs.random((Qn, H, 1)) * topic
    w = np.where(rs.random((Qn, H)) < 0.4, 1.0, -1.0) * (0.2 + rs.random((Qn, H)))
    k = rs.standard_normal((N, 128)) + 0.5 * topic
    kp, _ = quantize_keys(k)
    q, wq = quantize_queries(qf, w)
    return q, wq, kp


def _expected_J(pl, q, w, t, mts, W):
    """The coordinate envelope J of query t recomputed from its definition (module
    docstring of dosa_cupy/plan.py): aux reconstruction, folded-weight rounding, screen
    and scorer arithmetic, each with its 2^-30 plan-arithmetic allowance."""
    qv = e4m3_values(q[t])
    wf = w[t].astype(np.float64)
    inR, inA = pl.inR[t], pl.inA[t]
    wt = pl.w_fold[t]
    last = 16 * (mts - 1)
    v0 = e4m3_values(pl.rows[t, last + 7])
    v1 = e4m3_values(pl.rows[t, last + 15])
    sig = float(pl.sigma[t])
    eA = pl.a_A[t] - sig * v0 - sig * v1  # exact: σ is a power of two
    om = wt.astype(np.float32).astype(np.float64)
    fold = wt - wf
    J = np.abs(eA) + float(MU) * (np.abs(wf[inA]) @ np.abs(qv[inA]))
    J += (np.abs(wt[inR] - om[inR]) + float(MU) * (np.abs(wf[inR]) + fold[inR])) @ np.abs(qv[inR])
    gm = gamma_mma_exact(W)
    g_scr = float(gm + gamma_exact(2 * mts + 6) * (1 + gm))
    g_ref = float(gm + gamma_exact(2 * (q.shape[1] // 16) + 5) * (1 + gm))
    J += g_scr * (np.abs(om[inR]) @ np.abs(qv[inR]) + sig * (np.abs(v0) + np.abs(v1)))
    J += g_ref * (np.abs(wf) @ np.abs(qv))
    return J


@pytest.mark.parametrize("r,mts,W", [(14, 1, 17), (30, 2, 17), (14, 1, 13)])
def test_plan_constants_from_their_definitions(r, mts, W):
    q, w, kp = _workload()
    sample = np.arange(0, kp.shape[0], 4)
    pl = plan_mod.build_plans(q, w, kp, sample, r, mts, W, xp=np)
    Qn, Hp, D = q.shape
    mth = Hp // 16
    # every fp32 result of Û (2 per plan row, 8 more) and of the head sum (2 per head, 16
    # more) may be flushed, 8 to spare: 32·(mts + mth + 1) results of < 2^-126 each
    assert np.all(pl.eps_raw == float(((32 * mts + 8) + (32 * mth + 16) + 8) * TINY))
    assert pl.eps_out == float(TINY)
    assert pl.valid.all()
    for t in range(Qn):
        qv = e4m3_values(q[t])
        wf = w[t].astype(np.float64)
        R, A = np.flatnonzero(pl.inR[t]), np.flatnonzero(pl.inA[t])
        # E: min(E_P, E_P^joint) of the reference planner, widened by 2^-30 of itself and
        # of the plan magnitude Σ_P w_h(‖q_h‖ + β_h‖q_j*‖).
        ref = build_plan(qv, wf, np.full(Hp, 0.5), r, PlanOptions(allowance="joint"), R=R, A=A)
        qn = np.linalg.norm(qv, axis=1)
        mplan = sum(
            wf[h] * (qn[h] + (ref.beta[i] * qn[ref.anchor[i]] if ref.anchor[i] >= 0 else 0.0))
            for i, h in enumerate(ref.P)
        )
        E_want = min(ref.E_P, ref.E_P_joint) * (1 + float(MU)) + float(MU) * mplan
        assert pl.E[t] == pytest.approx(E_want, rel=1e-12, abs=1e-300)
        # σ: the smallest power of two ≥ max|a_A|/448 (1 when a_A = 0).
        amax = float(np.max(np.abs(pl.a_A[t])))
        want_sig = 1.0
        if amax > 0:
            e = math.frexp(amax / 448.0)[1]
            want_sig = 2.0 ** (e - 1) if 2.0 ** (e - 1) >= amax / 448.0 else 2.0**e
        assert pl.sigma[t] == want_sig
        last = 16 * (mts - 1)
        z = pl.a_A[t] / want_sig
        v0 = e4m3_bits(z.astype(np.float32))
        assert np.array_equal(pl.rows[t, last + 7], v0)
        v1 = e4m3_bits((z - e4m3_values(v0)).astype(np.float32))
        assert np.array_equal(pl.rows[t, last + 15], v1)
        # C = √D (E + ‖J‖(1 + μ))(1 + μ).
        J = _expected_J(pl, q, w, t, mts, W)
        C_want = math.sqrt(D) * (pl.E[t] + np.linalg.norm(J) * (1 + float(MU))) * (1 + float(MU))
        assert pl.C[t] == pytest.approx(C_want, rel=1e-12)
        assert pl.r[t] == R.size and pl.aggregated[t] == A.size


def test_plan_constants_retained_only_query():
    """All nonzero heads retained (no P, no A): E = 0, σ = 1, empty aux rows, and
    J = (μ + g_scr + g_ref)·Σ_h|w_h||q_h| exactly as defined."""
    rs = np.random.default_rng(3)
    q, w = quantize_queries(rs.standard_normal((1, 16, 128)), rs.standard_normal((1, 16)))
    w[0, 4:] = 0.0
    kp, _ = quantize_keys(rs.standard_normal((64, 128)))
    pl = plan_mod.build_plans(q, w, kp, None, 14, 1, 17, xp=np)
    assert pl.r[0] == 4 and pl.omitted_positive[0] == 0 and pl.aggregated[0] == 0
    assert pl.E[0] == 0.0 and pl.sigma[0] == 1.0
    assert not pl.rows[0, 7].any() and not pl.rows[0, 15].any()
    qv = e4m3_values(q[0])
    mass = np.abs(w[0].astype(np.float64)) @ np.abs(qv)
    gm = gamma_mma_exact(17)
    g = MU + gm + gamma_exact(8) * (1 + gm) + gm + gamma_exact(7) * (1 + gm)
    C_want = math.sqrt(128) * np.linalg.norm(float(g) * mass) * (1 + float(MU)) ** 2
    assert pl.C[0] == pytest.approx(C_want, rel=1e-12)
    om = pl.omega[0, plan_mod.row_slots(1)]
    assert np.array_equal(np.sort(om[om != 0]), np.sort(w[0, :4]))


def test_empty_sample_means_no_sample():
    """An empty key sample gives p_h = 1/2 like no sample (no mean over zero keys)."""
    q, w, kp = _workload(Qn=2)
    a = plan_mod.build_plans(q, w, kp, np.arange(0), 14, 1, xp=np)
    b = plan_mod.build_plans(q, w, kp, None, 14, 1, xp=np)
    for name in ("rows", "omega", "sigma", "C", "inR", "inA", "E"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


class _NotNumpy:
    """numpy under another name: build_plans then takes its device branch (the e4m3
    rounding kernel), which the fake ``kernel`` below runs thread by thread."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=None):
        return np.full(shape, 0x7F, dtype=dtype)  # NaN code: unwritten outputs show


def test_e4m3_kernel_launch_covers_every_element(monkeypatch):
    """The aux rows' rounding kernel (kernels.cu e4m3_round_f64: thread i rounds x[i] if
    i < n) is launched on enough threads, with n = x.size, and equals the host rounding."""
    import dosa_cupy._build as build

    launches = []

    def fake_kernel(name, *a, **kw):
        assert name == "e4m3_round_f64"

        def launch(grid, block, args):
            x, n, out = args
            assert x.dtype == np.float64 and x.flags.c_contiguous and out.dtype == np.uint8
            assert int(n) == x.size == out.size
            threads = grid[0] * block[0]
            launches.append((threads, int(n)))
            i = np.arange(min(threads, int(n)))
            out.reshape(-1)[i] = e4m3_bits(x.reshape(-1)[i].astype(np.float32))

        return launch

    monkeypatch.setattr(build, "kernel", fake_kernel)
    # 520 queries: n = 520·128 = 66,560 aux values, more than 256 blocks of 256 threads
    q, w, kp = _workload(Qn=520, H=16, N=64)
    dev = plan_mod.build_plans(q, w, kp, np.arange(0, 64, 2), 14, 1, xp=_NotNumpy())
    host = plan_mod.build_plans(q, w, kp, np.arange(0, 64, 2), 14, 1, xp=np)
    assert len(launches) == 2 and all(t >= n for t, n in launches)
    assert all(t == -(-n // 256) * 256 for t, n in launches)  # ⌈n/256⌉ blocks of 256
    assert np.array_equal(dev.rows, host.rows)
    assert np.array_equal(dev.C, host.C) and np.array_equal(dev.sigma, host.sigma)


def test_anchor_is_always_a_retained_head():
    """Omitted positive heads nearly orthogonal to every retained head (ratios
    [q_h·q_j]_+/‖q_j‖ < 1): the anchor j* is still chosen among R only (Prop. 1), so E
    equals the reference planner's for the same R and A."""
    Hp, D = 16, 128
    x = np.full((1, Hp, D), 0.125)
    for h in range(Hp):
        x[0, h, h] = 8.0
    q = e4m3_bits(x.astype(np.float32))
    w = np.linspace(1.0, 2.0, Hp).astype(np.float32)[None, :]
    kp, _ = quantize_keys(np.random.default_rng(0).standard_normal((32, D)))
    pl = plan_mod.build_plans(q, w, kp, None, 4, 1, 17, xp=np)
    qv, wf = e4m3_values(q[0]), w[0].astype(np.float64)
    R, A = np.flatnonzero(pl.inR[0]), np.flatnonzero(pl.inA[0])
    assert R.size == 4 and pl.omitted_positive[0] == Hp - 4
    ref = build_plan(qv, wf, np.full(Hp, 0.5), 4, PlanOptions(allowance="joint"), R=R, A=A)
    assert np.all(np.isin(ref.anchor[ref.anchor >= 0], R))
    qn = np.linalg.norm(qv, axis=1)
    mplan = sum(
        wf[h] * (qn[h] + (ref.beta[i] * qn[ref.anchor[i]] if ref.anchor[i] >= 0 else 0.0))
        for i, h in enumerate(ref.P)
    )
    E_want = min(ref.E_P, ref.E_P_joint) * (1 + float(MU)) + float(MU) * mplan
    assert E_want > 0 and pl.E[0] == pytest.approx(E_want, rel=1e-12, abs=1e-300)


def test_one_key_sample_is_a_sample():
    """A sample of one key gives p ∈ {0, 1}: the negative heads aggregated into A are then
    exactly the omitted negative heads active on that key (p ≥ 1/2), not all of them."""
    q, w, kp = _workload(Qn=2, H=32, N=64)
    pl = plan_mod.build_plans(q, w, kp, np.array([5]), 6, 1, 17, xp=np)
    kv = e4m3_values(kp[5]).astype(np.float32)
    for t in range(q.shape[0]):
        x = e4m3_values(q[t]).astype(np.float32) @ kv
        want = (w[t] < 0) & ~pl.inR[t] & (x > 0)
        np.testing.assert_array_equal(pl.inA[t], want)
        assert 0 < want.sum() < ((w[t] < 0) & ~pl.inR[t]).sum()
