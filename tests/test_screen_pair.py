"""The paired screen (``screen="pair"``, screen.cu ``screen_pair``, screen.pair_plan).

Two queries share one 16-row MMA tile (r ≤ 6 retained rows + 2 aux rows each), so each
query costs half the MMAs and ReLU-weighted products of ``screen_mt1``.  Soundness rests on
(1) the gather ``pair_plan`` putting every nonzero row of a query's mts = 1 plan into the
tile, at the lane the kernel weighs it on, and (2) the evaluation depth staying within the
plan's screening allowance (screen.cu comment).  CPU tests: a lane-by-lane emulation of
the kernel's epilogue (exact float64 dots) equals the unpaired Û of docs/method.md §8 exactly,
and with plans from ``plan.build_plans`` (r ≤ 6) the paired U dominates every float64
score.  GPU tests (marked ``gpu``): ids == ``dense_topk``, 0 guard violations with
``debug_bounds`` (survivor counts of both screens printed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import params, read_source
from gpu_support import HAVE_GPU, cp, gpu, guard_violations
from hypothesis import given
from hypothesis import strategies as st

from dosa_cupy import plan as plan_mod
from dosa_cupy import screen, sm90a
from dosa_cupy.options import check_options
from dosa_ref.fp8 import e4m3_values, key_rms

KERNELS = Path(screen.__file__).parent / "csrc" / "kernels.cu"


def _unpaired_uhat(rows, omega, sigma, kv):
    """Û per (query, key) of an mts = 1 plan (docs/method.md §8), exact dots in float64:
    Σ_{rows j ∉ {7, 15}} ω_j [x_j]_+ − σ [x_7 + x_15]_+."""
    X = np.einsum("tjd,nd->tjn", e4m3_values(rows), kv)
    ret = [j for j in range(16) if j not in (7, 15)]
    om = np.asarray(omega, np.float64)[:, ret, None]
    aux = np.maximum(X[:, 7] + X[:, 15], 0)
    sig = np.asarray(sigma, np.float64)[:, None]
    return np.sum(om * np.maximum(X[:, ret], 0), axis=1) - sig * aux


def _kernel_uhat_f32(rows_p, omega_p, sigma, Qn, kv):
    """screen_pair's epilogue lane by lane (lane g: rows g and g + 8 of the tile), exact
    dots in float64 and the kernel's NaN semantics: s = fmaf(aux, y, x) (NaN if y is NaN,
    even times 0), fmaxf(s, 0) ignores NaN, then ω·[s]_+; → Û of queries 2p, 2p + 1 as
    [Qn, n], summed exactly for finite rows (the fp32 rounding is proofs/gpu_screen_epilogue's)."""
    X = np.einsum("pjd,nd->pjn", e4m3_values(rows_p), kv)
    sig = np.concatenate([np.asarray(sigma, np.float64), [0.0]])
    out = np.zeros((2 * rows_p.shape[0], kv.shape[0]))
    with np.errstate(invalid="ignore"):
        for p in range(rows_p.shape[0]):
            for g in range(8):
                lo, hi = X[p, g], X[p, g + 8]
                wa = omega_p[p, g] if g < 6 else (-sig[2 * p] if g == 7 else 0.0)
                wb = omega_p[p, g + 8] if g < 6 else (-sig[2 * p + 1] if g == 6 else 0.0)
                sa = lo + float(g == 7) * hi  # fmaf(aux, hi, lo): 0 · NaN = NaN
                sb = hi + float(g == 6) * lo
                out[2 * p] += wa * np.fmax(sa, 0)  # fmaxf(NaN, 0) = 0
                out[2 * p + 1] += wb * np.fmax(sb, 0)
    return out[:Qn]


def _random_plans(rng, Qn, r):
    """mts = 1 plans with r retained rows in slots 0..r−1 and aux rows 7, 15."""
    rows = np.zeros((Qn, 16, 128), np.uint8)
    omega = np.zeros((Qn, 16), np.float32)
    codes = rng.integers(0, 0x7E, (Qn, 16, 128), dtype=np.uint8)
    codes |= rng.integers(0, 2, codes.shape, dtype=np.uint8) << 7
    rows[:, :r] = codes[:, :r]
    rows[:, [7, 15]] = codes[:, [7, 15]]
    # 6-bit dyadic ω: products with the (≤ 42-bit) e4m3 dots and their sums are exact in
    # float64, so paired and unpaired Û compare with == whatever the summation order
    omega[:, :r] = (rng.integers(1, 65, (Qn, r)) / 64).astype(np.float32)
    sigma = (2.0 ** rng.integers(-3, 3, Qn)).astype(np.float32)
    return rows, omega, sigma


@pytest.mark.parametrize("Qn,r", [(1, 6), (2, 6), (7, 6), (10, 3), (9, 1)])
def test_pair_tile_equals_unpaired(Qn, r):
    rng = np.random.default_rng(Qn * 10 + r)
    rows, omega, sigma = _random_plans(rng, Qn, r)
    kv = e4m3_values(rng.integers(0, 0x7E, (300, 128), dtype=np.uint8))
    rows_p, omega_p = screen.pair_plan(rows, omega, np.ones(Qn, bool), np)
    P = (Qn + 1) // 2
    assert rows_p.shape == (P, 16, 128) and rows_p.dtype == np.uint8
    assert omega_p.shape == (P, 16) and omega_p.dtype == np.float32
    assert rows_p.flags.c_contiguous and omega_p.flags.c_contiguous
    assert np.all(omega_p[:, [6, 7, 14, 15]] == 0)
    want = _unpaired_uhat(rows, omega, sigma, kv)
    got = _kernel_uhat_f32(rows_p, omega_p, sigma, Qn, kv)
    assert np.array_equal(got, want)  # exact: the same terms, exact float64 sums


def test_invalid_partner_cannot_lower_a_bound():
    """A NaN code in one query's plan (such a plan is invalid and recovered) must not erase
    its partner's terms: pair_plan zeroes invalid plans, so the valid query's paired Û is
    its unpaired Û.  Without the zeroing the kernel's fmaf(0, NaN, x) drops them."""
    rng = np.random.default_rng(5)
    rows, omega, sigma = _random_plans(rng, 4, 6)
    rows[1, :6, 3] = 0x7F  # e4m3 NaN code in query 1's retained rows
    valid = np.array([True, False, True, True])
    kv = e4m3_values(rng.integers(0, 0x7E, (200, 128), dtype=np.uint8))
    want = _unpaired_uhat(rows[[0]], omega[[0]], sigma[[0]], kv)[0]
    raw_p, raw_o = screen.pair_plan(rows, omega, np.ones(4, bool), np)  # as if valid
    assert not np.array_equal(_kernel_uhat_f32(raw_p, raw_o, sigma, 4, kv)[0], want)
    rows_p, omega_p = screen.pair_plan(rows, omega, valid, np)
    got = _kernel_uhat_f32(rows_p, omega_p, sigma, 4, kv)
    assert np.array_equal(got[0], want) and np.all(np.isfinite(got))


def test_pair_plan_rejects_more_than_six_rows():
    rows, omega, _ = _random_plans(np.random.default_rng(1), 2, 6)
    rows[1, 9] = 0x38  # a retained row in slot 8 (row 9): r > 6
    with pytest.raises(ValueError, match="^rows:"):
        screen.pair_plan(rows, omega, np.ones(2, bool), np)
    rows, omega, _ = _random_plans(np.random.default_rng(1), 2, 6)
    for w in (0.5, np.nan):  # a weight alone in an empty slot (the checks read back together)
        om = omega.copy()
        om[0, 12] = w
        with pytest.raises(ValueError, match="^rows:"):
            screen.pair_plan(rows, om, np.ones(2, bool), np)


@given(
    Qn=st.integers(1, 9),
    r=st.integers(0, 6),
    seed=st.integers(0, 2**32 - 1),
    nan_query=st.integers(-1, 8),
)
def test_property_pair_tile_is_the_unpaired_bound(Qn, r, seed, nan_query):
    """Law: for any mts = 1 plans with r ≤ 6 (any Qn, odd or even), the kernel's paired
    evaluation (fp32 NaN semantics, exact dots) gives every valid query exactly its
    unpaired Û; a query whose plan holds a NaN code (invalid) does not disturb its partner."""
    rng = np.random.default_rng(seed)
    rows, omega, sigma = _random_plans(rng, Qn, r)
    valid = np.ones(Qn, bool)
    if 0 <= nan_query < Qn:
        rows[nan_query, rng.integers(0, 16), rng.integers(0, 128)] = 0x7F
        valid[nan_query] = False
    kv = e4m3_values(rng.integers(0, 0x7E, (40, 128), dtype=np.uint8))
    rows_p, omega_p = screen.pair_plan(rows, omega, valid, np)
    got = _kernel_uhat_f32(rows_p, omega_p, sigma, Qn, kv)
    with np.errstate(invalid="ignore"):
        want = _unpaired_uhat(rows, omega, sigma, kv)
    assert np.array_equal(got[valid], want[valid])
    assert np.all(got[~valid] == 0)  # zero plans: no term, no NaN


def test_pair_rows_table():
    """Every plan row that can be nonzero (slots 0..5, aux rows 7 and 15) of both queries
    appears exactly once; aux rows of one query share a lane (rows g and g + 8)."""
    got = sorted(screen.PAIR_ROWS)
    want = sorted([(w, j) for w in (0, 1) for j in (*range(6), 7, 15)])
    assert got == want and len(screen.PAIR_ROWS) == 16
    pr = screen.PAIR_ROWS
    assert (pr[7], pr[15]) == ((0, 7), (0, 15)) and (pr[6], pr[14]) == ((1, 7), (1, 15))
    assert all(pr[g][0] == 0 and pr[g + 8][0] == 1 for g in range(6))


def test_pair_plan_rejects_other_shapes():
    with pytest.raises(ValueError, match="rows"):
        screen.pair_plan(
            np.zeros((2, 32, 128), np.uint8), np.zeros((2, 32), np.float32), np.ones(2, bool), np
        )


@pytest.mark.parametrize("regime,H", [("calibrated", 32), ("h64", 64)])
@pytest.mark.parametrize("r", [6, 4])
def test_pair_plan_of_planner_dominates_scores(regime, H, r):
    """Plans of plan.build_plans (r ≤ 6, mts = 1): rows outside slots 0..5 ∪ {7, 15} are
    empty, and the paired certificate Û + ρC + ε_raw (exact dots) dominates every float64
    score Σ_h w_h[q_h·k]_+ (payload units, docs/method.md §8)."""
    workloads = pytest.importorskip("dosa_ref.workloads")
    from dosa_ref.fp8 import quantize_keys, quantize_queries

    wl = workloads.make_workload(regime, 9, 4096, H=H, seed=3)
    kp, _ = quantize_keys(wl.k)
    q, w = quantize_queries(wl.q, wl.w)
    pl = plan_mod.build_plans(q, w, kp, np.arange(0, 4096, 16), r, 1, xp=np)
    empty = [6, 8, 9, 10, 11, 12, 13, 14]
    assert np.all(pl.rows[:, empty] == 0) and np.all(pl.omega[:, empty] == 0)
    rows_p, omega_p = screen.pair_plan(pl.rows, pl.omega, pl.valid, np)
    kv = e4m3_values(kp)
    uh = _kernel_uhat_f32(rows_p, omega_p, pl.sigma, q.shape[0], kv)
    rho = key_rms(kp).astype(np.float64)
    U = uh + rho[None] * np.asarray(pl.C)[:, None] + np.asarray(pl.eps_raw)[:, None]
    s = np.einsum("th,thn->tn", w.astype(np.float64), np.maximum(e4m3_values(q) @ kv.T, 0))
    assert np.all(s <= U)


def test_screen_pair_signature_is_screen_mt1s():
    """The pipeline passes screen_pair (and screen_pair_tie) the argument tuple of
    screen_mt1 (and screen_mt1_tie), with the paired rows and ω in the places of rows, om."""
    src = read_source(KERNELS)
    assert params(src, r"\bscreen_pair") == params(src, r"\bscreen_mt##MTS")
    assert params(src, r"\bscreen_pair_tie") == params(src, r"\bscreen_mt##MTS##_tie")


def test_pair_option_validation():
    assert check_options({"screen": "pair", "r": 6})["screen"] == "pair"
    with pytest.raises(ValueError, match="^screen:"):
        check_options({"screen": "pair"})  # default r = 14
    with pytest.raises(ValueError, match="^screen:"):
        check_options({"screen": "pair", "r": 6, "cert_seeds": 64})


def test_auto_screen_rule():
    """screen="auto": the narrow screen (r ≤ 6; wgt on Hopper, pair elsewhere) iff ≥ 95 % of
    the queries have ≤ 6 positive weights and certificate seeds are off; r = 30 when the
    median query has > 20 positive weights; on the transposed Hopper screen (its FP8 build,
    screen.WGT_FP8) where it runs, fp64 otherwise; other screens pass through unchanged."""
    w = -np.ones((40, 32), np.float32)
    w[:, :6] = 1.0  # |H+| = 6 everywhere
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=False) == ("pair", 6)
    assert screen.auto_screen("auto", 4, 0, w, np, hopper=False) == ("pair", 4)
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=True) == ("wgt", 6)
    assert screen.auto_screen("auto", 4, 0, w, np, hopper=True) == ("wgt", 4)
    assert screen.auto_screen("auto", 14, 64, w, np, hopper=True) == ("fp64", 14)
    w[:2, 6] = 1.0  # 38 / 40 = 95 % still pair
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=False) == ("pair", 6)
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=True) == ("wgt", 6)
    w[2, 6] = 1.0  # 37 / 40 < 95 %
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=False) == ("fp64", 14)
    assert screen.auto_screen("auto", 14, 0, w, np, hopper=True) == ("wgt", 14)
    assert screen.auto_screen("auto", 16, 0, w, np, hopper=True) == ("wgt", 16)
    assert screen.auto_screen("auto", 16, 0, w, np, hopper=False) == ("fp64", 16)
    assert screen.auto_screen("auto", 14, 0, w[:0], np, hopper=True) == ("fp64", 14)
    wide = -np.ones((41, 32), np.float32)
    wide[:, :20] = 1.0  # median |H+| = 20: not above AUTO_WIDE_MEDIAN
    assert screen.auto_screen("auto", 14, 0, wide, np, hopper=False) == ("fp64", 14)
    wide[:21, 20] = 1.0  # 21 of 41 queries with 21: the median is 21
    assert screen.auto_screen("auto", 14, 0, wide, np, hopper=True) == ("wgt", 30)
    assert screen.auto_screen("auto", 14, 0, wide, np, hopper=False) == ("fp64", 30)
    assert screen.auto_screen("auto", 30, 0, wide, np, hopper=True) == ("wgt", 30)
    even = -np.ones((40, 32), np.float32)
    even[:, :20] = 1.0
    even[:20, 20] = 1.0  # 20 queries with 21, 20 with 20: the lower median is 20
    assert screen.auto_screen("auto", 14, 0, even, np, hopper=True) == ("wgt", 14)
    even[20, 20] = 1.0  # 21 of 40 with 21: the lower median is 21
    assert screen.auto_screen("auto", 14, 0, even, np, hopper=True) == ("wgt", 30)
    zeros = np.zeros((41, 48), np.float32)
    zeros[:, :6] = 1.0  # 6 positive, 42 zero weights: zeros are not positive heads
    zeros[:3, 6] = 1.0  # 38 of 41 ≤ 6 (92.7 %): not paired; median 6: not widened
    assert screen.auto_screen("auto", 14, 0, zeros, np, hopper=True) == ("wgt", 14)
    for scr in ("fp64", "pair", "wg"):
        assert screen.auto_screen(scr, 6, 0, w, np) == (scr, 6)
    assert check_options({"screen": "auto"})["screen"] == "auto"  # any r, any cert_seeds
    assert check_options({})["screen"] == "auto"  # the default


def test_auto_screen_on_the_reference_regimes():
    """The rule on dosa_ref.workloads: calibrated (≤ 4 positive heads) pairs, h64 (up to
    8 positive heads in a third of its queries) does not."""
    workloads = pytest.importorskip("dosa_ref.workloads")
    from dosa_ref.fp8 import quantize_queries

    for regime, H, want in (("calibrated", 32, "pair"), ("h64", 64, "fp64")):
        wl = workloads.make_workload(regime, 64, 4096, H=H, seed=7)
        _, w = quantize_queries(wl.q, wl.w)
        assert screen.auto_screen("auto", 14, 0, w, np, hopper=False)[0] == want, regime


# ---------------------------------------------------------------------------------------
# GPU (H200)
# ---------------------------------------------------------------------------------------

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

PAIR_CASES = [("calibrated", 32, 257, 32768, 6), ("h64", 64, 128, 32768, 6),
              ("structured", 32, 64, 16384, 4), ("ties", 32, 33, 8192, 6),
              ("adversarial", 64, 64, 8192, 6)]  # fmt: skip


@pytest.mark.parametrize("case", PAIR_CASES, ids=[f"{c[0]}-H{c[1]}-Q{c[2]}" for c in PAIR_CASES])
@gpu
def test_gpu_pair_equals_dense_and_unpaired(case):
    regime, H, Qn, N, r = case
    if regime in ("calibrated", "h64"):
        pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")
    wl = make_gpu_workload(regime, Qn, N, H, seed=17)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    ids, st = dosa_cupy.dosa_topk(*args, r=r, screen="pair", return_stats=True, debug_bounds=True)
    ids1, st1 = dosa_cupy.dosa_topk(*args, r=r, screen="fp64", return_stats=True)
    assert cp.array_equal(ids, dense) and cp.array_equal(ids1, dense)
    lg = dosa_cupy.dense_logits(*args[:4], wl["ks"], wl["ke"])
    viol, slack = guard_violations(lg, st.bounds)
    a, b = int(st.survivors.sum()), int(st1.survivors.sum())
    print(f"\n[pair] {regime} H={H} Qn={Qn} r={r}: violations={viol} min(U-s)={slack:.3e} "
          f"survivors pair={a} unpaired={b}")  # fmt: skip
    assert viol == 0
    # survivors differ from the unpaired screen's only through fp32 summation order near τ
    # (no bound on how many keys lie that close, so printed, not asserted)


@pytest.mark.parametrize("regime,H,want", [("calibrated", 32, "pair"), ("h64", 64, "fp64")])
@gpu
def test_gpu_auto_screen(regime, H, want):
    pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")
    wl = make_gpu_workload(regime, 96, 16384, H, seed=23)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
    ids, st = dosa_cupy.dosa_topk(*args, screen="auto", return_stats=True)
    if sm90a.available():  # on an sm_90a GPU the Hopper screens: wgt for r ≤ 6; for r = 14
        # wgt where its FP8 build runs (screen.WGT_FP8), else wg (screen.auto_pick)
        want = {"pair": "wgt", "fp64": "wgt" if screen.WGT_FP8 else "wg"}[want]
    assert st.screen == want
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*args))


@pytest.mark.parametrize("screen,mts", [("wg", 1), ("wg", 2), ("wgt", 1), ("wgt", 2), ("fp64", 2)])
@pytest.mark.parametrize("tie", [False, True])
def test_screen_launch_names_its_build(screen, mts, tie):
    """``ScreenLaunch.of`` on host stand-ins: the Hopper screen's launch is the Hopper build
    of the plan's width (hopper, mts, tie by name — a positional list once put mts in the
    wgt flag), the transposed screen's is a wgt build, the mma.sync screen neither; the
    flags cannot be given by position."""
    import types

    from dosa_cupy import screen as S

    Qn, N = 5, 300
    z = np.zeros
    b = types.SimpleNamespace(Qn=Qn, N=N, kp=z((N, 128), np.uint8), ksc=z(N, np.float32),
                              ks=z(Qn, np.int32), ke=z(Qn, np.int32))  # fmt: skip
    plan = types.SimpleNamespace(rows=z((Qn, 16 * mts, 128), np.uint8),
                                 omega=z((Qn, 16 * mts)), sigma=z(Qn), C=z(Qn), eps_raw=z(Qn),
                                 eps_out=0.0, mts=mts, r_max=None, screen="f16")  # fmt: skip
    seeds = types.SimpleNamespace(tau=z(Qn, np.float32), kth_id=z(Qn, np.int32),
                                  default_args=lambda: ())  # fmt: skip
    zrow = z((Qn, 16 * mts), np.float32) if tie else None
    launch = S.ScreenLaunch.of(b, plan, seeds, z(N, np.float32), screen, False, zrow)
    assert launch.hopper == (screen == "wg") and launch.wgt == (screen == "wgt")
    assert launch.tie == tie and launch.name.endswith("_tie") == tie
    if screen == "wg":
        assert launch.mts == mts and launch.name == f"screen_wg_mt{mts}" + ("_tie" if tie else "")
    with pytest.raises(TypeError):
        S.ScreenLaunch("x", (1, 1), 0, (), True)  # noqa: FBT003
