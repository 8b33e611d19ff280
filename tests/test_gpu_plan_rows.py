"""The FP8 screen's per-row constants by one kernel (``plan.ROW_CONSTANTS_KERNEL``, csrc/plan.cu
screen_row_constants_fresh) on the GPU: equal bit for bit to its numpy emulation
(tests/test_plan_fused.py ``emulate_row_constants``, which the CPU test ties to the
specification ``plan.screen_row_constants``), and the pipeline's ids with it on equal to the
dense route's.  GPU tests (marked ``gpu``, skipped without CuPy / a GPU; the pipeline test
needs sm_90a, the FP8 screen's)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import HAVE_GPU, cp, gpu, needs_sm90a
from test_plan_fused import emulate_row_constants

from dosa_cupy import plan as pf
from dosa_ref.rounding import gamma_up

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


def _rows(rs, Qn, mts):
    """Plan-like operands: e4m3 rows with zero steps, subnormal-only steps and NaN codes
    among ordinary ones, weights of both signs and zeros, σ powers of two."""
    nrow = 16 * mts
    rows = rs.randint(0, 256, size=(Qn, nrow, 128)).astype(np.uint8)
    rows[:, 3, :32] = 0x80  # a step of −0 only: no term
    rows[:, 5, 32:64] = rs.randint(0, 8, size=(Qn, 32)).astype(np.uint8)  # subnormals: 2^−6
    rows[::7, 9] = 0  # a whole row of zeros
    omega = (rs.standard_normal((Qn, nrow)) * (rs.rand(Qn, nrow) < 0.8)).astype(np.float32)
    sigma = np.ldexp(1.0, rs.randint(-20, 4, size=Qn)).astype(np.float32)
    return rows, omega, sigma


@pytest.mark.parametrize("mts", [1, 2])
@gpu
def test_row_constants_kernel_equals_its_emulation(mts):
    rs = np.random.RandomState(3 + mts)
    Qn = 203
    rows, omega, sigma = _rows(rs, Qn, mts)
    got = cp.asnumpy(pf._row_constants_kernel(cp.asarray(rows), cp.asarray(omega),
                                              cp.asarray(sigma), mts, cp))  # fmt: skip
    want = np.empty(Qn)
    emulate_row_constants(rows, omega, sigma.astype(np.float64), Qn, 16 * mts,
                          pf.A_STEP, pf.row_lift(mts), want)  # fmt: skip
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    spec = pf.screen_row_constants(rows, omega, sigma, mts, "fp8_fresh", 17, np)
    # the same products, the row sum in another order, then the same three roundings (σ term,
    # lift, 1 + MU) on both: within 2·γ_{n+2} of fp64 (test_row_constants_kernel_host_code)
    assert np.all(np.abs(got - spec) <= 2 * gamma_up(16 * mts + 2, 2.0**-53) * spec)


@pytest.mark.parametrize("regime", ["calibrated", "many_positive", "ties"])
@needs_sm90a
@gpu
def test_row_constants_kernel_in_the_pipeline(monkeypatch, regime):
    """With the kernel on, DoSA on the FP8 screen (r 6, 14, 30) returns the dense route's ids."""
    monkeypatch.setattr(pf, "ROW_CONSTANTS_KERNEL", True)
    wl = make_gpu_workload(regime, 300, 12000, 64, seed=19)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
    for scorer in ("fp8", "f16"):
        dense = dosa_cupy.dense_topk(*a, scorer=scorer)
        for r in (6, 14, 30):
            ids = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, scorer=scorer,
                                      tie_reject=False)  # fmt: skip
            assert cp.array_equal(ids, dense), (regime, scorer, r)


@pytest.mark.parametrize("P,cap,ns", [(0, 8, 5), (1, 8, 8), (5, 64, 7), (40, 64, 64),
                                      (3000, 4096, 2048), (4096, 4096, 1)])  # fmt: skip
@gpu
def test_pool_sample_kernel_is_the_array_path(monkeypatch, P, cap, ns):
    """``plan.POOL_SAMPLE_KERNEL`` (csrc/seeds.cu pool_sample): the plan's activation sample
    ids of a pool at its capacity (P ids, zeros after) equal the array path's
    pool[arange(ns) · max(P − 1, 0) // max(ns − 1, 1)] — repeats where P < ns, key 0 where
    P = 0; and plan_stage's plans with it equal those with the array path bit for bit."""
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import pad_batch

    rs = np.random.RandomState(P + ns)
    pool = np.zeros(cap, dtype=np.int32)
    pool[:P] = np.sort(rs.choice(50_000, size=P, replace=False))
    pool_d, pcount = cp.asarray(pool), cp.asarray(np.int64(P))
    got = cp.empty(ns, dtype=cp.int32)
    dosa_cupy._build.kernel("pool_sample")((-(-ns // 256),), (256,),
                                           (pool_d, pcount, np.int64(ns), got))  # fmt: skip
    want = pool[np.arange(ns, dtype=np.int64) * max(P - 1, 0) // max(ns - 1, 1)]
    assert np.array_equal(cp.asnumpy(got), want)
    wl = make_gpu_workload("calibrated", 37, 50_000, 32, seed=P)
    b = pad_batch(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64, wl["ks"], wl["ke"],
                  scorer="fp8")  # fmt: skip
    o = dict(resolve_options(check_options({}), b.K), p_sample=ns)
    plans = []
    for on in (True, False):
        monkeypatch.setattr(pf, "POOL_SAMPLE_KERNEL", on)
        plans.append(pf.plan_stage(b, pool_d, 14, o, pcount, "fp8_fresh"))
    for name in ("rows", "omega", "sigma", "C", "eps_raw", "valid", "inR", "inA"):
        x, y = (cp.ascontiguousarray(getattr(p, name)).view(cp.uint8) for p in plans)
        assert bool((x == y).all()), name
