"""GPU tests of dosa_cupy (docs/method.md §7–§9).  Marked ``gpu``; skipped with a reason when
CuPy or a GPU is absent.  Exactness: ``dosa_topk`` (and ``fused_topk``) ids ==
``dense_topk`` ids bitwise on every regime; the dense scores stay within the error model's
bound of the float64 value; the guard s^ref ≤ U^num holds for every visible (query, key)
(0 violations).  Figures (max error / bound, survival) are printed; run with ``-s``.
The last tests run on the CPU (host code of dosa_cupy with numpy: the batched planner and
the screen emulation).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gpu_support import HAVE_GPU, cp, gpu, guard_violations, numpy_as_cupy

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.emulate import record_order
    from dosa_cupy.plan import gamma, gamma_mma
    from dosa_cupy.workload import make_gpu_workload
    from dosa_ref.fp8 import e4m3_values, key_rms
    from dosa_ref.fp8 import quantize_keys as ref_quantize_keys


def _run_both(wl, K, **opt):
    """dense ids, DoSA ids, DoSA stats; also asserts fused == dense (same options)."""
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    ids, st = dosa_cupy.dosa_topk(*args, return_stats=True, **opt)
    fused = dosa_cupy.fused_topk(*args, **opt)
    assert cp.array_equal(fused, dense), "fused route differs from the dense route"
    return cp.asnumpy(dense), cp.asnumpy(ids), st


def _survival(st):
    scr = np.maximum(st.screened, 1)
    return float(np.mean(st.survivors / scr))


@pytest.mark.parametrize("fmt", ["amax", "ue8m0"])
@gpu
def test_quantize_keys_bitmatch(fmt):
    rs = np.random.default_rng(1)
    k = rs.standard_normal((4096, 128)).astype(np.float32)
    k[0] = 0.0
    k[1] *= 1e-30
    k[2] *= 1e6
    k[3, :] = np.linspace(-465, 465, 128, dtype=np.float32)
    k[4:100] *= rs.exponential(10.0, (96, 1)).astype(np.float32)
    p, s, rho = dosa_cupy.quantize_keys(cp.asarray(k), fmt)
    pr, sr = ref_quantize_keys(k, fmt)
    assert np.array_equal(cp.asnumpy(p), pr)
    assert np.array_equal(cp.asnumpy(s).view(np.uint32), sr.view(np.uint32))
    v = e4m3_values(pr)
    rho = cp.asnumpy(rho).astype(np.float64)
    assert np.all(rho * rho * 128 >= np.sum(v * v, axis=1))
    assert np.all(rho <= key_rms(pr))
    # key_rho of the payload: the quantizer's ρ bit for bit (the same exact ‖k̄‖²)
    assert np.array_equal(
        cp.asnumpy(dosa_cupy.key_rho(p)).view(np.uint32), rho.astype(np.float32).view(np.uint32)
    )


@pytest.mark.parametrize("N", [1, 3, 4, 5, 4099])
@gpu
def test_key_rho_int_kernel_equals_key_rho_kernel(monkeypatch, N):
    """prepare.RHO_INT (key_rho_int_kernel: eight lanes per key, integer squares) gives
    key_rho_kernel's ρ bit for bit — every e4m3 code, NaN codes included, subnormals, the
    largest values, a last warp with fewer than four keys — and a payload that is 4-byte
    but not 16-byte aligned (key_rho_kernel's loads are 4 bytes wide) falls back to
    key_rho_kernel."""
    from dosa_cupy import prepare

    rs = np.random.default_rng(N)
    p = rs.integers(0, 256, (N, 128), dtype=np.uint8)
    p[0] = np.arange(128, dtype=np.uint8) + (128 if N % 2 else 0)  # half the codes each
    if N > 4:
        p[1] = 0x7E  # the largest finite code in every slot
        p[2] = rs.integers(0, 8, 128, dtype=np.uint8)  # subnormals and zeros
    dp = cp.asarray(p)
    monkeypatch.setattr(prepare, "RHO_INT", False)
    want = cp.asnumpy(dosa_cupy.key_rho(dp)).view(np.uint32)
    monkeypatch.setattr(prepare, "RHO_INT", True)
    assert np.array_equal(cp.asnumpy(dosa_cupy.key_rho(dp)).view(np.uint32), want)
    raw = cp.zeros(N * 128 + 4, dtype=cp.uint8)
    raw[4:] = dp.ravel()
    off = raw[4:].reshape(N, 128)  # four bytes past an aligned allocation
    assert off.data.ptr % 16 == 4
    assert np.array_equal(cp.asnumpy(dosa_cupy.key_rho(off)).view(np.uint32), want)


def _ref_scores(wl, qs):
    """float64 exact-ish reference (products exact, float64 sums) and the |·| mass."""
    q = e4m3_values(cp.asnumpy(wl["q"][qs]))
    w = cp.asnumpy(wl["w"][qs]).astype(np.float64)
    k = e4m3_values(cp.asnumpy(wl["k_payload"]))
    a = cp.asnumpy(wl["k_scale"]).astype(np.float64)
    x = np.einsum("thd,nd->thn", q, k)
    s = np.einsum("th,thn->tn", w, np.maximum(x, 0)) * a
    mass = np.einsum("th,thn->tn", np.abs(w), np.einsum("thd,nd->thn", np.abs(q), np.abs(k))) * a
    return s, mass


@pytest.mark.parametrize("regime", ["gaussian", "structured", "adversarial"])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_dense_scores_within_error_model(regime, H):
    wl = make_gpu_workload(regime, 64, 4096, H, seed=3, causal=False)
    lg = cp.asnumpy(dosa_cupy.dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"]))
    qs = np.arange(64)
    s, mass = _ref_scores(wl, qs)
    bits = dosa_cupy.scorer.MMA_BITS
    g_ref = gamma_mma(bits) + gamma(2 * (H // 16) + 5) * (1 + gamma_mma(bits))
    bound = g_ref * mass + 2.0**-120
    err = np.abs(lg.astype(np.float64) - s)
    ratio = float(np.max(err / bound))
    rel = float(np.max(err / np.maximum(mass, 1e-300)))
    print(f"\n[dense-error] {regime} H={H}: max err/bound = {ratio:.3e}, max err/mass = {rel:.3e}")
    assert np.all(err <= bound)


@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_gpu_plan_matches_reference(H):
    """The batched GPU plan equals dosa_ref.plan.build_plan (same R and A) within float64
    rounding: folded weights, negative aggregate, positive allowance min(E_P, E_P^joint)
    (the GPU value is rounded outward by 2^-30 of its magnitude sum); ω = fp32(w̃)."""
    from dosa_cupy.plan import build_plans, row_slots
    from dosa_ref.plan import PlanOptions, build_plan

    wl = make_gpu_workload("structured", 16, 4096, H, seed=8)
    sample = cp.arange(0, 4096, 16)
    for r, mts in ((14, 1), (30, 2)):
        pl = build_plans(wl["q"], wl["w"], wl["k_payload"], sample, r, mts)
        qv = e4m3_values(cp.asnumpy(wl["q"]))
        w = cp.asnumpy(wl["w"]).astype(np.float64)
        inR, inA = cp.asnumpy(pl.inR), cp.asnumpy(pl.inA)
        wt, aA, E = cp.asnumpy(pl.w_fold), cp.asnumpy(pl.a_A), cp.asnumpy(pl.E)
        om = cp.asnumpy(pl.omega)
        for t in range(16):
            R, A = np.flatnonzero(inR[t]), np.flatnonzero(inA[t])
            ref = build_plan(
                qv[t], w[t], np.full(H, 0.5), r, PlanOptions(allowance="joint"), R=R, A=A
            )
            assert np.array_equal(ref.R, R)
            mag = np.abs(w[t]).sum() * np.abs(qv[t]).max() + 1e-300
            assert np.allclose(ref.w_fold, wt[t, R], rtol=1e-12, atol=1e-12 * mag)
            assert np.allclose(ref.a_A, aA[t], rtol=1e-12, atol=1e-12 * mag)
            e_ref = min(ref.E_P, ref.E_P_joint)
            assert E[t] >= e_ref * (1 - 1e-12)
            assert E[t] <= e_ref * (1 + 1e-8) + 1e-8 * mag
            got = np.sort(om[t, row_slots(mts)][om[t, row_slots(mts)] != 0])
            want = np.sort(ref.w_fold.astype(np.float32)[ref.w_fold.astype(np.float32) != 0])
            assert np.array_equal(got, want)


@pytest.fixture(params=["select_kernel", "select_kernel_ilp", "select_kernel_buf"])
def either_select(request, monkeypatch):
    """Each selection kernel in turn (dense.SELECT_ILP: four loads of each thread in
    flight; dense.SELECT_BUF: the last pass over the scratch)."""
    from dosa_cupy import dense as dense_mod

    monkeypatch.setattr(dense_mod, "SELECT_ILP", request.param != "select_kernel")
    monkeypatch.setattr(dense_mod, "SELECT_BUF", request.param == "select_kernel_buf")


@gpu
def test_select_matches_host_order(either_select):
    """dense_topk's ids == the host's (score desc, id asc) order of the dense logits, with
    either selection kernel."""
    wl = make_gpu_workload("ties", 32, 20000, 32, seed=5)
    lg = cp.asnumpy(dosa_cupy.dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"]))
    ids = cp.asnumpy(
        dosa_cupy.dense_topk(
            wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 300, wl["ks"], wl["ke"]
        )
    )
    ks, ke = cp.asnumpy(wl["ks"]), cp.asnumpy(wl["ke"])
    lgc = cp.asnumpy(
        dosa_cupy.dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], wl["ks"], wl["ke"])
    )
    for t in range(32):
        a, b = ks[t], ke[t]
        exp = record_order(lg[t, a:b], np.arange(a, b), 300)
        assert np.array_equal(ids[t, : exp.size], exp)
        assert np.all(ids[t, exp.size :] == -1)
        assert np.all(np.isneginf(lgc[t, :a])) and np.all(np.isneginf(lgc[t, b:]))
        assert np.array_equal(lgc[t, a:b].view(np.uint32), lg[t, a:b].view(np.uint32))


@pytest.mark.parametrize("regime,N", [("equal", 150000), ("ties", 150000), ("structured", 70000)])
@gpu
def test_select_large_rows(either_select, regime, N):
    """Rows longer than the selection scratch (65,536): all-equal scores (the K-th record is
    found only in the id digits), few distinct values, and a plain row; either selection
    kernel."""
    wl = make_gpu_workload(regime, 4, N, 16, seed=6, causal=False)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"])
    lg = cp.asnumpy(dosa_cupy.dense_logits(*a))
    ids = cp.asnumpy(dosa_cupy.dense_topk(*a, 2048))
    for t in range(4):
        assert np.array_equal(ids[t], record_order(lg[t], np.arange(N), 2048))


CASES = [
    # regime, Qn, N, H, K, options
    ("gaussian", 64, 16384, 32, 512, {}),
    ("structured", 128, 32768, 32, 1024, {}),
    ("structured", 128, 32768, 64, 1024, {"r": 30}),
    ("structured", 96, 40000, 48, 2048, {"window": 512}),
    ("ties", 64, 16384, 32, 512, {}),
    ("equal", 32, 8192, 32, 512, {}),
    ("adversarial", 64, 16384, 64, 512, {}),
    ("structured", 64, 16384, 32, 512, {"buffer": 16}),
    ("structured", 64, 16384, 32, 64, {"buffer": 64}),  # buffer ≥ K: the raised extension
    ("structured", 64, 16384, 32, 512, {"n_anchors": 0, "window": 64}),
    # dosa_ref.workloads regimes (skipped when that module is absent)
    ("calibrated", 128, 32768, 32, 2048, {}),
    ("many_positive", 128, 32768, 32, 2048, {"r": 30}),
    ("h64", 128, 32768, 64, 2048, {"r": 30}),
]


def _need_regime(regime):
    if regime in ("calibrated", "many_positive", "h64", "isotropic"):
        pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-H{c[3]}-{c[5]}" for c in CASES])
@gpu
def test_dosa_equals_dense(case):
    regime, Qn, N, H, K, opt = case
    _need_regime(regime)
    wl = make_gpu_workload(regime, Qn, N, H, seed=11)
    dense, ids, st = _run_both(wl, K, **opt)
    print(
        f"\n[dosa] {regime} Qn={Qn} N={N} H={H} K={K} {opt}: survival={_survival(st):.4f} "
        f"overflows={int(st.overflows.sum())} recovered={int(st.recovered.sum())}"
    )
    assert np.array_equal(dense, ids)
    if "buffer" in opt:
        assert st.overflows.any()


@pytest.mark.parametrize("route", ["dosa", "fused"])
@gpu
def test_raised_extension_selects_from_fewer_records(monkeypatch, route):
    """The overflowed rows refined again against max(τ, the K-th record their first pass
    kept) (``select.captured_floor``, docs/method.md §7 C.3): ids == the dense route's with
    the floor and without it (bench build plainext), and the second pass keeps fewer
    records with it; the floor is the host's K-th of the kept records, bit for bit — or with
    ``FLOOR_WIDE`` the lower edge of that record's 22-bit code bucket (the buffer holds more
    than K records: the wide floor is −inf where a row kept at most K)."""
    from dosa_cupy import refine as refine_mod
    from dosa_cupy import select as select_mod
    from dosa_cupy.emulate import record_score, wide_floor

    wl = make_gpu_workload("structured", 64, 16384, 32, seed=11)
    K, buffer = 64, 80
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    seen, floors = {}, []
    real_floor, real_extend = select_mod.captured_floor, select_mod.extend_flagged

    def floor_spy(k, recs, oq):
        f = real_floor(k, recs, oq)
        floors.append((cp.asnumpy(recs.rec[oq]), cp.asnumpy(recs.cnt[oq]), cp.asnumpy(f)))
        return f

    def extend_spy(recs, rescore, k, counted=None):
        out = real_extend(recs, rescore, k, counted)
        seen[select_mod.RAISED_EXTENSION] = int(out.ext[2].sum()) if out.ext else 0
        return out

    monkeypatch.setattr(select_mod, "captured_floor", floor_spy)
    monkeypatch.setattr(select_mod, "extend_flagged", extend_spy)  # extend_overflow's
    monkeypatch.setattr(refine_mod, "extend_flagged", extend_spy)  # the deferred extension's
    run = dosa_cupy.fused_topk if route == "fused" else dosa_cupy.dosa_topk
    for raised in (True, False):
        monkeypatch.setattr(select_mod, "RAISED_EXTENSION", raised)
        assert cp.array_equal(run(*args, buffer=buffer), dense), raised
    assert 0 < seen[True] < seen[False], seen
    rec, cnt, f = floors[0]
    for j in range(rec.shape[0]):
        kept = np.sort(rec[j, : min(int(cnt[j]), buffer)])[::-1]
        if select_mod.FLOOR_WIDE:  # the lower edge of the K-th kept record's code bucket
            want = np.float32(wide_floor(kept, K)).reshape(1)
        else:
            want = record_score(kept[K - 1 : K])
        assert want.view(np.uint32)[0] == f[j : j + 1].view(np.uint32)[0]


@gpu
def test_tile_sizes_agree():
    """Key tiles of 128 and 256 keys give bit-identical logits and identical ids (a key's
    score depends on that key alone); the 256 tile also exercises the shared-memory opt-in."""
    from dosa_cupy._build import set_tile, tile

    before = tile()
    wl = make_gpu_workload("structured", 96, 20000, 64, seed=12)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"])
    rng = (wl["ks"], wl["ke"])
    try:
        set_tile(128)
        lg1 = dosa_cupy.dense_logits(*args, *rng)
        d1 = dosa_cupy.dosa_topk(*args, 512, *rng, r=30)
        set_tile(256)
        lg2 = dosa_cupy.dense_logits(*args, *rng)
        d2 = dosa_cupy.dosa_topk(*args, 512, *rng, r=30)
        f2 = dosa_cupy.fused_topk(*args, 512, *rng)
    finally:
        set_tile(before)
    assert cp.array_equal(lg1.view(cp.uint32), lg2.view(cp.uint32))
    assert cp.array_equal(d1, d2) and cp.array_equal(f2, d1)


@gpu
def test_rows_shorter_than_K():
    wl = make_gpu_workload("structured", 64, 3000, 32, seed=2)
    wl["ks"] = cp.asarray(np.random.default_rng(0).integers(0, 2900, 64), dtype=cp.int32)
    wl["ke"] = cp.minimum(wl["ks"] + cp.arange(64, dtype=cp.int32) * 40, 3000).astype(cp.int32)
    dense, ids, _ = _run_both(wl, 1024)
    assert np.array_equal(dense, ids)
    n = cp.asnumpy(wl["ke"] - wl["ks"])
    for t in range(64):
        assert np.all(ids[t, min(n[t], 1024) :] == -1)
        assert np.all(ids[t, : min(n[t], 1024)] >= 0)


@gpu
def test_invalid_scales_recover():
    wl = make_gpu_workload("structured", 64, 16384, 32, seed=4)
    ksc = wl["k_scale"].copy()
    ksc[100] = -1.0
    ksc[5000] = np.nan
    ksc[16000] = np.inf
    wl["k_scale"] = ksc
    dense, ids, st = _run_both(wl, 512)
    assert np.array_equal(dense, ids)
    assert st.recovered.all()  # every query sees key 100 (causal prefix)


@pytest.mark.parametrize("r", [14, 30])
@pytest.mark.parametrize("regime", ["gaussian", "structured", "ties", "adversarial"])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_guard_no_violation(regime, H, r):
    """s^ref ≤ U^num for every visible (query, key), with the pipeline's plans
    (plan.build_plans_fused, csrc/plan.cu)."""
    wl = make_gpu_workload(regime, 32, 8192, H, seed=7)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"])
    lg = dosa_cupy.dense_logits(*args, wl["ks"], wl["ke"])
    _, st = dosa_cupy.dosa_topk(*args, 512, wl["ks"], wl["ke"], debug_bounds=True, r=r)
    viol, slack = guard_violations(lg, st.bounds)
    print(f"\n[guard] {regime} H={H} r={r}: violations={viol} min(U-s)={slack:.3e}")
    assert viol == 0


@pytest.mark.parametrize("regime", ["structured", "calibrated"])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_realistic_size(H, regime):
    """At least 4K queries × 128K keys (issue 4's "done when" size), causal chunk."""
    _need_regime(regime)
    wl = make_gpu_workload(regime, 4096, 131072, H, seed=21)
    dense, ids, st = _run_both(wl, 2048, r=14 if H == 32 else 30)
    print(
        f"\n[realistic] {regime} H={H}: survival={_survival(st):.4f} "
        f"kept/query={st.kept.mean():.0f} overflows={int(st.overflows.sum())} "
        f"recovered={int(st.recovered.sum())}"
    )
    assert np.array_equal(dense, ids)


@gpu
def test_torch_dlpack_inputs():
    torch = pytest.importorskip("torch")
    wl = make_gpu_workload("structured", 32, 8192, 32, seed=9)
    tq = torch.from_dlpack(wl["q"]).view(torch.float8_e4m3fn)
    tk = torch.from_dlpack(wl["k_payload"]).view(torch.float8_e4m3fn)
    ids = dosa_cupy.dosa_topk(
        tq, torch.from_dlpack(wl["w"]), tk, torch.from_dlpack(wl["k_scale"]), 256,
        torch.from_dlpack(wl["ks"]), torch.from_dlpack(wl["ke"]),
    )  # fmt: skip
    dense = dosa_cupy.dense_topk(
        wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"]
    )
    assert cp.array_equal(ids, dense)


@gpu
def test_bad_input_raises():
    wl = make_gpu_workload("structured", 8, 1024, 32, seed=1)
    args = [wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64, wl["ks"], wl["ke"]]
    with pytest.raises(ValueError, match="K"):
        dosa_cupy.dosa_topk(*args[:4], 0)
    bad = list(args)
    bad[1] = wl["w"][:, :16]
    with pytest.raises(ValueError, match="w"):
        dosa_cupy.dosa_topk(*bad)
    bad = list(args)
    bad[5] = wl["ke"] + 1
    with pytest.raises(ValueError, match="ks"):
        dosa_cupy.dosa_topk(*bad)
    with pytest.raises(ValueError, match="window"):
        dosa_cupy.dosa_topk(*args, window=-1)
    # K as a 0-d integer array (host or device) is K; a float or a bool K is refused
    ref = dosa_cupy.dosa_topk(*args)
    for k0 in (np.asarray(64), cp.asarray(64, dtype=cp.int32)):
        assert cp.array_equal(dosa_cupy.dosa_topk(*args[:4], k0, *args[5:]), ref)
    for bad_k in (64.0, True, np.asarray([64])):
        with pytest.raises(ValueError, match="K"):
            dosa_cupy.dosa_topk(*args[:4], bad_k, *args[5:])


@pytest.mark.parametrize("defer", [False, True])
@gpu
def test_value_checks_name_the_argument_and_can_be_skipped(defer, monkeypatch):
    """prepare.check_inputs reads every value check back in one synchronization and still
    names the argument of the first failing one; ``check=False`` skips them and returns
    the same ids on valid inputs — also with ``prepare.DEFER_CHECKS`` (a DoSA call reads
    them back after its seeds are queued on the clamped ranges)."""
    from dosa_cupy import prepare

    monkeypatch.setattr(prepare, "DEFER_CHECKS", defer)
    wl = make_gpu_workload("structured", 8, 1024, 32, seed=2)
    args = [wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64, wl["ks"], wl["ke"]]
    q_nan, kp_nan, w_inf = wl["q"].copy(), wl["k_payload"].copy(), wl["w"].copy()
    q_nan[3, 5, 7], kp_nan[1000, 0], w_inf[7, 31] = 0xFF, 0x7F, np.inf
    ks_lo, ke_hi, ks_hi, ke_lo = (wl[k].copy() for k in ("ks", "ke", "ks", "ke"))
    ks_lo[2], ke_hi[6], ks_hi[4], ke_lo[4] = -1, 1025, 10, 5  # the last: in range, ks > ke
    cases = [
        ({0: q_nan}, "q: contains"), ({2: kp_nan}, "k_payload: contains"),
        ({1: w_inf}, "w: contains"), ({5: ks_lo}, "ks: entries"), ({6: ke_hi}, "ke: entries"),
        ({5: ks_hi, 6: ke_lo}, r"ks: ks\[4\] > ke\[4\]"),
    ]  # fmt: skip
    # route="auto": this small chunk goes to the dense route at once, which reads the checks
    # after its launches (the GPU tests' default route is "dosa", tests/conftest.py)
    early = functools.partial(dosa_cupy.dosa_topk, route="auto")
    for f in (dosa_cupy.dosa_topk, early, dosa_cupy.dense_topk, dosa_cupy.fused_topk):
        for repl, msg in cases:
            bad = list(args)
            for i, v in repl.items():
                bad[i] = v
            with pytest.raises(ValueError, match=msg):
                f(*bad)
        assert cp.array_equal(f(*args, check=False), f(*args))
    for f in (dosa_cupy.dosa_topk, dosa_cupy.dense_topk, dosa_cupy.fused_topk):
        with pytest.raises(ValueError, match="check"):
            f(*args, check=1)


@gpu
def test_check_values_kernel_equals_reference():
    """The one-pass check kernel (csrc/prepare.cu check_values) sets exactly the flag word
    of ``dosa_ref.stages.check_values``: each failure alone, all together, none, a NaN code
    in the last byte of the arrays (the vector tail), ranges in int32, int64 and unsigned
    dtypes, the ranges clamped into [0, N] with ks ≤ ke (work launched before the flags are
    read stays in bounds), and a key array at an odd address (copied before the 16-byte
    reads)."""
    from dosa_cupy.prepare import ValueCheck, check_values
    from dosa_ref import stages

    rng = np.random.default_rng(5)
    Qn, H, N = 37, 32, 3001
    q = rng.integers(0, 0x7F, (Qn, H, 128), dtype=np.uint8)  # no NaN code: < 0x7F
    kp = rng.integers(0, 0x7F, (N, 128), dtype=np.uint8) | 0x80 * (rng.random((N, 128)) < 0.5)
    kp = kp.astype(np.uint8) & ~np.uint8(0x01)  # clear bit 0: no 0x7F / 0xFF code
    w = rng.standard_normal((Qn, H)).astype(np.float32)
    ks = rng.integers(0, N // 2, Qn)
    ke = ks + rng.integers(0, N // 2, Qn)
    edits = [
        lambda a: a["q"].__setitem__((Qn - 1, H - 1, 127), 0xFF),
        lambda a: a["kp"].__setitem__((N - 1, 127), 0x7F),
        lambda a: a["kp"].__setitem__((5, 3), 0xFF),
        lambda a: a["w"].__setitem__((0, 0), np.nan),
        lambda a: a["w"].__setitem__((Qn - 1, H - 1), -np.inf),
        lambda a: a["ks"].__setitem__(3, -1),
        lambda a: a["ke"].__setitem__(Qn - 1, N + 1),
        lambda a: (a["ks"].__setitem__(4, 10), a["ke"].__setitem__(4, 9)),
    ]
    for chosen in [[], *([e] for e in edits), edits]:
        a = {"q": q.copy(), "kp": kp.copy(), "w": w.copy(), "ks": ks.copy(), "ke": ke.copy()}
        for e in chosen:
            e(a)
        want = stages.check_values(a["q"], a["w"], a["kp"], a["ks"], a["ke"], N)
        assert want == 0 or chosen
        dev = {k: cp.asarray(v) for k, v in a.items()}
        lo, hi = stages.clamp_ranges(a["ks"], a["ke"], N)
        for dt in (cp.int32, cp.int64, cp.uint32):
            vc = ValueCheck(dev["q"], dev["w"], dev["kp"], dev["ks"].astype(dt),
                            dev["ke"].astype(dt), N)  # fmt: skip
            if dt != cp.uint32:  # (a −1 entry wraps to 2^32 − 1 as uint32: still flagged)
                assert vc.flags == want, (chosen, vc.flags, want)
                assert np.array_equal(cp.asnumpy(vc.ks), lo)
                assert np.array_equal(cp.asnumpy(vc.ke), hi)
            else:
                assert (vc.flags != 0) == (want != 0)
        odd = cp.empty(N * 128 + 1, dtype=cp.uint8)[1:].reshape(N, 128)
        odd[...] = dev["kp"]
        assert odd.data.ptr % 16 == 1
        assert check_values(dev["q"], dev["w"], odd, dev["ks"], dev["ke"], N) == want
    big = cp.full(Qn, 2**63 + 5, dtype=cp.uint64)  # above N; wraps negative as int64
    assert check_values(cp.asarray(q), cp.asarray(w), cp.asarray(kp), big, big, N) & 0b11000


@pytest.mark.parametrize("N", [1, 31, 32, 4096, 5000])
@gpu
def test_anchor_pool_kernels_equal_reference(N):
    """seeds.anchor_pool and seed_ranges (bitmask + prefix counts, csrc/seeds.cu) equal the
    sort-based references: the sorted distinct ids, the bitmask, and the seed ranges — with
    repeats, −1 padding, ids 0 and N − 1, ranges ending at N, and no anchor id at all;
    local_ranges writes seed_ranges' first four rows."""
    from dosa_cupy._build import kernel
    from dosa_cupy.seeds import anchor_pool, seed_ranges
    from dosa_ref import stages

    rng = np.random.default_rng(N)
    NW = -(-N // 32)
    for aid in (
        rng.integers(-1, N, (4, 64)),
        np.array([[0, N - 1, N - 1, -1, 0]]),
        np.full((2, 3), -1),
        np.zeros((0,), dtype=np.int64),
    ):
        ks = rng.integers(0, N + 1, 50)
        ke = np.maximum(ks, rng.integers(0, N + 1, 50))
        ks[:2], ke[:2] = (0, N), (N, N)
        pool, mask, offs = anchor_pool(cp.asarray(aid, dtype=cp.int32), NW)
        want = stages.pool_ids(aid)
        assert pool.dtype == cp.int32 and np.array_equal(cp.asnumpy(pool), want)
        assert np.array_equal(cp.asnumpy(mask), stages.pool_mask(want, NW))
        for sinks, window in ((0, 0), (3, 7), (16, 2048)):
            ks_d, ke_d = cp.asarray(ks, dtype=cp.int32), cp.asarray(ke, dtype=cp.int32)
            rg = seed_ranges(mask, offs, ks_d, ke_d, sinks, window)
            assert np.array_equal(cp.asnumpy(rg), stages.seed_ranges(want, ks, ke, sinks, window))
            # local_ranges (seeds.SIDE_STREAM): seed_ranges' sinks and window rows
            loc = cp.full((4, ks.size), -7, dtype=cp.int32)
            args = (ks_d, ke_d, np.int32(sinks), np.int32(window), np.int32(ks.size), loc)
            kernel("local_ranges")((1,), (256,), args)
            assert cp.array_equal(loc, rg[:4])


@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("layout", ["causal", "random", "ragged"])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_seed_records_are_the_default_seeds_with_dense_scores(layout, H, tile_n, monkeypatch):
    """The tiled seed kernel (seeds.cu seed_score) writes, for every query, exactly one record
    per default seed — the sinks, the local window and the visible anchor-pool ids that are
    neither (the reference sets of dosa_ref.stages.seed_ranges) — each with the dense
    route's logit bit for bit; with causal ranges, random ones (wide block spans) and the
    ranges of a ragged batch whose queries alternate between far-apart requests (tiles no
    query of a block needs are skipped), at both key-tile sizes."""
    from dosa_cupy import _build
    from dosa_cupy.emulate import score_code
    from dosa_cupy.options import start
    from dosa_cupy.seeds import seed_stage
    from dosa_ref import stages

    monkeypatch.setitem(_build._state, "tile", tile_n)  # _build.set_tile, undone afterwards
    Qn, N, K = 150, 9000, 256
    wl = make_gpu_workload("calibrated", Qn, N, H, seed=23)
    rs = np.random.default_rng(3)
    if layout == "random":
        ks = rs.integers(0, N // 2, Qn)
        ke = ks + rs.integers(0, N // 2, Qn)
        ks[:3], ke[:3] = (0, 5, 9), (N, 5, 30)
    if layout == "ragged":  # 5 requests of 1800 keys; query t belongs to request t % 5
        req = np.arange(Qn) % 5
        ks = 1800 * req
        ke = ks + rs.integers(1, 1801, Qn)
    if layout != "causal":
        wl["ks"], wl["ke"] = cp.asarray(ks, dtype=cp.int32), cp.asarray(ke, dtype=cp.int32)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])
    o, _, _, b, _ = start(*args, {"window": 700})
    seeds = seed_stage(b, o)
    lg = cp.asnumpy(dosa_cupy.dense_logits(*args[:4], wl["ks"], wl["ke"]))
    # the pool's P ids (at its capacity, seeds.POOL_CAPACITY, the rest is padding)
    pool = cp.asnumpy(seeds.pool if seeds.pcount is None else seeds.pool[: int(seeds.pcount)])
    ks, ke = cp.asnumpy(wl["ks"]), cp.asnumpy(wl["ke"])
    rg = stages.seed_ranges(pool, ks, ke, o["sinks"], o["window"])
    cnt = cp.asnumpy(seeds.default.cnt)
    rec = cp.asnumpy(seeds.default.rec)
    for t in range(Qn):
        want = np.concatenate([np.arange(rg[0, t], rg[1, t]), np.arange(rg[2, t], rg[3, t]),
                               pool[rg[4, t] : rg[5, t]]])  # fmt: skip
        r = rec[t, : cnt[t]]
        ids = (~(r & np.uint64(0xFFFFFFFF))).astype(np.uint32).astype(np.int64)
        order = np.argsort(ids)
        assert np.array_equal(ids[order], np.sort(want)), t
        codes = (r >> np.uint64(32)).astype(np.uint32)[order]
        assert np.array_equal(codes, score_code(lg[t, ids[order]])), t


@gpu
def test_select_kth_only_equals_sorted_selection(either_select):
    """select_kernel without ids (the seeds' τ, the decode threshold) returns the least
    record at or above the radix threshold instead of sorting: the same K-th record as the
    sorted path, for rows with fewer than, exactly and more than K records, tied score codes,
    a second record list, and K from 1 to 4096; either selection kernel."""
    from dosa_cupy.dense import select_records

    rng = np.random.default_rng(11)
    for K in (1, 7, 2048, 4096):
        rows, cap = 40, 9000
        cnt = rng.integers(0, cap + 1, rows)
        cnt[:3] = (K - 1, K, K + 1)
        cnt = np.minimum(cnt, cap)
        code = rng.integers(0, 50, (rows, cap)).astype(np.uint64) + np.uint64(0x80000000)
        ids = np.stack([rng.permutation(1 << 20)[:cap] for _ in range(rows)]).astype(np.uint64)
        rec = (code << np.uint64(32)) | (~ids & np.uint64(0xFFFFFFFF))
        cntB = rng.integers(0, 300, rows).astype(np.uint32)
        recB = (np.uint64(0x80000010) << np.uint64(32)) | (
            ~np.arange(1 << 21, (1 << 21) + rows * 300, dtype=np.uint64).reshape(rows, 300)
            & np.uint64(0xFFFFFFFF)
        )
        for extra in (False, True):
            args = (K, cp.asarray(rec), cp.asarray(cnt.astype(np.uint32)))
            more = (cp.asarray(recB), cp.asarray(cntB)) if extra else ()
            got, k_sorted = select_records(*args, *more, want_kth=True)
            none, k_only = select_records(*args, *more, want_ids=False, want_kth=True)
            assert none is None and cp.array_equal(k_only, k_sorted), (K, extra)
            got = cp.asnumpy(got)
            for r in range(rows):  # numpy: the K-th largest record, 0 below K records
                rr = rec[r, : cnt[r]]
                if extra:
                    rr = np.concatenate([rr, recB[r, : cntB[r]]])
                want = np.sort(rr)[-K] if rr.size >= K else 0
                assert int(k_only[r]) == int(want), (K, extra, r)
                top = np.sort(rr)[::-1][:K]  # the ids in record order, −1 padded
                top_ids = (~(top & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
                assert np.array_equal(got[r, : top.size], top_ids), (K, extra, r)
                assert (got[r, top.size :] == -1).all(), (K, extra, r)


@gpu
def test_select_rank_equals_select_kernel():
    """select_rank (dense.select_records_rank_into: the decode step's selection of at most
    RANK_ROWS rows by rank) == select_kernel_buf and the host's record order, ids and K-th
    record bitwise: rows of 0, K − 1, K, K + 1 records, at and past rank_max (the one-block
    path), tied score codes (the id decides), K from 1 to 4096, 1 to RANK_ROWS rows."""
    from dosa_cupy import dense as dense_mod

    rng = np.random.default_rng(29)
    for rows in (1, 2, 3, 4):
        rm = dense_mod.rank_max(rows)
        for K in (1, 7, 300, 2048, 4096):
            cap = rm + 700
            cnt = rng.integers(0, rm + 1, rows)
            pick = [0, K - 1, K, K + 1, rm, rm + 1, cap, rng.integers(K, rm + 1)]
            cnt[: min(rows, 2)] = rng.choice(pick, min(rows, 2), replace=False)
            cnt = np.minimum(cnt, cap).astype(np.uint32)
            code = rng.integers(0, 40, (rows, cap)).astype(np.uint64) + np.uint64(0x80000000)
            ids = np.stack([rng.permutation(1 << 20)[:cap] for _ in range(rows)])
            rec = (code << np.uint64(32)) | (~ids.astype(np.uint64) & np.uint64(0xFFFFFFFF))
            rec_d, cnt_d = cp.asarray(rec), cp.asarray(cnt)
            got_ids = cp.full((rows, K), -7, dtype=cp.int32)
            got_kth = cp.full(rows, 7, dtype=cp.uint64)
            dense_mod.select_records_rank_into(K, rec_d, cnt_d, got_ids, got_kth,
                                               dense_mod.scratch(rows))  # fmt: skip
            only_kth = cp.full(rows, 7, dtype=cp.uint64)
            dense_mod.select_records_rank_into(K, rec_d, cnt_d, None, only_kth,
                                               dense_mod.scratch(rows))  # fmt: skip
            want_ids, want_kth = dense_mod.select_records(K, rec_d, cnt_d, want_kth=True)
            assert cp.array_equal(got_ids, want_ids), (rows, K, cnt)
            assert cp.array_equal(got_kth, want_kth) and cp.array_equal(only_kth, want_kth)
            got = cp.asnumpy(got_ids)
            for r in range(rows):  # the host's order: records descending, −1 padded
                top = np.sort(rec[r, : cnt[r]])[::-1][:K]
                top_ids = (~(top & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
                assert np.array_equal(got[r, : top.size], top_ids), (rows, K, r)
                assert (got[r, top.size :] == -1).all(), (rows, K, r)
    with pytest.raises(ValueError, match="rec"):
        big = cp.zeros((dense_mod.RANK_ROWS + 1, 8), dtype=cp.uint64)
        dense_mod.select_records_rank_into(1, big, cp.zeros(big.shape[0], cp.uint32), None,
                                           None, dense_mod.scratch(big.shape[0]))  # fmt: skip


@gpu
def test_public_ids_int64():
    """docs/design.md: dense_topk, dosa_topk and fused_topk return the dosa_ref.topk_ids
    contract — int64 [Qn, K], −1 padding — also on the empty early-return path."""
    wl = make_gpu_workload("structured", 16, 2048, 32, seed=13)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
    outs = [f(*args) for f in (dosa_cupy.dense_topk, dosa_cupy.dosa_topk, dosa_cupy.fused_topk)]
    for ids in outs:
        assert ids.dtype == cp.int64 and ids.shape == (16, 512)
        assert cp.array_equal(ids, outs[0])
    ids, _ = dosa_cupy.dosa_topk(*args, return_stats=True)
    assert ids.dtype == cp.int64
    ids, _ = dosa_cupy.fused_topk(*args, return_stats=True)
    assert ids.dtype == cp.int64
    empty = (wl["q"][:0], wl["w"][:0], wl["k_payload"], wl["k_scale"], 8)
    for f in (dosa_cupy.dense_topk, dosa_cupy.dosa_topk, dosa_cupy.fused_topk):
        assert f(*empty).dtype == cp.int64 and f(*empty).shape == (0, 8)


# ------------------------------------------------------------------------------------
# Explicit seeds (docs/method.md §2): they only raise τ; ids stay those of the dense route
# ------------------------------------------------------------------------------------


def _explicit_seed_cases(case, dense, ks, ke, N, K, rs):
    """Seeds [Qn, S] and options for each case (numpy, host side)."""
    Qn = dense.shape[0]
    if case == "true_topk":  # (a) τ = τ* exactly
        return dense, {"window": 256}
    if case == "messy":  # (b) repeats, −1, invisible ids, sinks / local-window ids
        rnd = rs.integers(0, N, (Qn, 300))
        sinks = ks[:, None] + np.arange(8)[None, :]
        local = np.maximum(ke[:, None] - 1 - np.arange(8)[None, :], 0)
        invisible = np.stack([np.maximum(ks - 1, 0), np.minimum(ke, N - 1)], axis=1)
        top = np.tile(dense[:, : K // 4], 4)  # repeated high scorers: τ must not exceed τ*
        pad = np.full((Qn, 5), -1)
        a = np.concatenate([top, rnd, sinks, local, invisible, pad, dense[:, K // 2 :]], axis=1)
        return rs.permuted(a, axis=1), {}
    if case == "only_explicit":  # (c) no default seeds at all
        a = np.concatenate([dense[:, ::2], rs.integers(0, N, (Qn, K))], axis=1)
        return a.astype(np.int32), {"window": 0, "sinks": 0, "n_anchors": 0}
    if case == "fewer_than_K":  # (d) |default ∪ explicit| < K: τ = −inf
        a = np.concatenate([dense[:, : K // 4], dense[:, : K // 4]], axis=1)
        return a.astype(np.int16), {"window": 16, "sinks": 4, "n_anchors": 0}
    if case == "overflow":  # (e) a tiny buffer: exact extension with explicit seeds
        return rs.integers(-1, N, (Qn, 2 * K)).astype(np.int64), {"buffer": 16}
    raise AssertionError(case)


EXPLICIT = ["true_topk", "messy", "only_explicit", "fewer_than_K", "overflow"]


@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("case", EXPLICIT)
@gpu
def test_explicit_seeds_equal_dense(case, H):
    """dosa_topk / fused_topk with explicit seeds: ids == dense_topk bitwise; τ never
    exceeds the true K-th score (no key counted twice) and never falls below the default
    seeds' τ; with seeds = the true Top-K, τ = τ* and survival drops."""
    Qn, N, K = 64, 16384, 512
    rs = np.random.default_rng(17)
    wl = make_gpu_workload("structured", Qn, N, H, seed=19)
    ks = rs.integers(0, N // 2, Qn).astype(np.int32)
    ks[:4] = 0
    wl["ks"] = cp.asarray(ks)
    ke = cp.asnumpy(wl["ke"])
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    seeds, opt = _explicit_seed_cases(case, cp.asnumpy(dense), ks, ke, N, K, rs)
    seeds_dev = cp.asarray(seeds) if case in ("true_topk", "messy") else seeds  # numpy too
    ids, st = dosa_cupy.dosa_topk(*args, seed_ids=seeds_dev, return_stats=True, **opt)
    fused, fst = dosa_cupy.fused_topk(*args, seed_ids=seeds_dev, return_stats=True, **opt)
    _, st0 = dosa_cupy.dosa_topk(*args, return_stats=True, **opt)
    assert ids.dtype == cp.int64 and fused.dtype == cp.int64
    assert cp.array_equal(ids, dense) and cp.array_equal(fused, dense)
    lg = dosa_cupy.dense_logits(*args[:4], wl["ks"], wl["ke"])
    full = ke - ks >= K
    kth = cp.asnumpy(cp.take_along_axis(lg, cp.maximum(dense[:, K - 1 : K], 0), axis=1))[:, 0]
    assert np.all(st.tau[full] <= kth[full]), "τ above the true K-th score"
    assert np.array_equal(st.tau.view(np.uint32), fst.tau.view(np.uint32))
    assert np.all(st.tau >= st0.tau)
    assert np.all(st.survivors <= st0.survivors)  # U does not depend on τ
    print(
        f"\n[explicit] {case} H={H}: explicit/query={st.explicit_seeds.mean():.0f} "
        f"survival {_survival(st0):.4f} -> {_survival(st):.4f} "
        f"overflows={int(st.overflows.sum())}"
    )
    distinct = [
        np.unique(r[(r >= a) & (r < b)]).size for r, a, b in zip(seeds, ks, ke, strict=True)
    ]
    assert np.all(st.explicit_seeds <= np.asarray(distinct))
    if case == "true_topk":
        assert np.array_equal(st.tau[full], kth[full])  # == : the score code folds −0 to +0
        assert st.survivors.sum() < st0.survivors.sum()
    if case == "only_explicit":
        assert np.all(st.seeds == st.explicit_seeds) and np.all(st.explicit_seeds > 0)
    if case == "fewer_than_K":
        assert np.all(np.isneginf(st.tau))
    if case == "overflow":  # both routes took the exact extension of the overflowed rows
        assert st.overflows.any() and fst.overflows.any()


@gpu
def test_explicit_seeds_bad_input_raises():
    wl = make_gpu_workload("structured", 8, 1024, 32, seed=1)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64, wl["ks"], wl["ke"])
    good = cp.zeros((8, 4), dtype=cp.int32)
    bad = {
        "rows": cp.zeros((7, 4), dtype=cp.int32),
        "id>=N": good + 1024,
        "id<-1": good - 2,
        "float": good.astype(cp.float32),
        "uint64 huge": cp.full((8, 4), 2**64 - 1, dtype=cp.uint64),
    }
    for f in (dosa_cupy.dosa_topk, dosa_cupy.fused_topk):
        for name, s in bad.items():
            with pytest.raises(ValueError, match="seed_ids"):
                f(*args, seed_ids=s)
                pytest.fail(f"{f.__name__}: no ValueError for seeds case {name!r}")
        assert f(*args, seed_ids=good).dtype == cp.int64
        assert cp.array_equal(f(*args, seed_ids=cp.zeros((8, 0), cp.int32)), f(*args))


@gpu
def test_mma_crafted_worst_case():
    """Crafted wide-dynamic-range dots (docs/numerics.md): a large product in some tensor-core
    steps (or a large accumulator) beside many tiny same-sign products.  The observed error
    must stay within the error model the guard uses (plan.gamma_mma at the pipeline's
    default kept bits); the ratios to W = 13 and W = 17 models are printed."""
    rs = np.random.default_rng(0)
    N, D = 8192, 128
    k = rs.integers(1, 8, (N, D)).astype(np.uint8)  # 2^-9 .. 7·2^-9 (e4m3 subnormals)
    big = rs.integers(0x70, 0x7F, (N, 8)).astype(np.uint8)  # 128 .. 448
    pattern = rs.integers(0, 4, N)
    rnd = rs.integers(0, D, N)
    for s in range(8):  # step s covers dims 32c + 4s + {0..3}; put the big term at c = 0
        on = (pattern == 0) | ((pattern == 1) & (s == 0)) | ((pattern == 2) & (s == 7))
        k[on, 4 * s] = big[on, s]
    k[pattern == 3, rnd[pattern == 3]] = 0x7E
    q = np.zeros((1, 16, D), dtype=np.uint8)
    q[0, :] = rs.integers(0x30, 0x48, (16, D)).astype(np.uint8)  # 0.5 .. 4
    w = np.zeros((1, 16), dtype=np.float32)
    w[0, 0] = 1.0
    lg = cp.asnumpy(
        dosa_cupy.dense_logits(
            cp.asarray(q), cp.asarray(w), cp.asarray(k), cp.ones(N, dtype=cp.float32)
        )
    )[0]
    qv, kv = e4m3_values(q[0, 0]), e4m3_values(k)
    exact = kv @ qv  # products exact, float64 sum exact at these magnitudes
    mass = np.abs(kv) @ np.abs(qv)
    err = np.abs(lg.astype(np.float64) - exact)
    bits = dosa_cupy.scorer.MMA_BITS
    r13 = float(np.max(err / (gamma_mma(13) * mass)))
    r17 = float(np.max(err / (gamma_mma(17) * mass)))
    rel = max(float(np.max(err / mass)), 1e-300)
    print(
        f"\n[mma-crafted] max err/mass = {rel:.3e} (2^{np.log2(rel):.1f}); err/bound W=13: "
        f"{r13:.3e}, W=17: {r17:.3e}; nonzero errors: {int(np.sum(err > 0))}/{N}"
    )
    assert np.all(err <= gamma_mma(bits) * mass)


# ------------------------------------------------------------------------------------
# CPU tests of dosa_cupy's host code (no GPU needed)
# ------------------------------------------------------------------------------------


def _cpu_workload(H, Qn=16, N=4096, seed=0):
    from dosa_ref.fp8 import quantize_keys as qk
    from dosa_ref.fp8 import quantize_queries as qq

    rs = np.random.default_rng(seed)
    topic = rs.standard_normal(128)
    qf = rs.standard_normal((Qn, H, 128)) + 2 * topic
    w = np.where(rs.random((Qn, H)) < 0.75, 1.0, -1.0) * (0.2 + rs.random((Qn, H)))
    k = rs.standard_normal((N, 128)) + 0.5 * topic
    kp, ksc = qk(k)
    q, wq = qq(qf, w)
    return q, wq, kp, ksc


@pytest.mark.parametrize("H", [32, 64])
def test_plan_numpy_matches_reference(H):
    """The batched planner (run with numpy) equals dosa_ref.plan.build_plan for the same R
    and A (folded weights, a_A, min(E_P, E_P^joint) within its outward 2^-30 rounding)."""
    from dosa_cupy.plan import build_plans, row_slots
    from dosa_ref.fp8 import e4m3_values as ev
    from dosa_ref.plan import PlanOptions, build_plan

    q, w, kp, _ = _cpu_workload(H)
    qv, w64 = ev(q), w.astype(np.float64)
    for r, mts in ((14, 1), (30, 2)):
        pl = build_plans(q, w, kp, np.arange(0, 4096, 16), r, mts, xp=np)
        for t in range(q.shape[0]):
            R, A = np.flatnonzero(pl.inR[t]), np.flatnonzero(pl.inA[t])
            ref = build_plan(
                qv[t], w64[t], np.full(H, 0.5), r, PlanOptions(allowance="joint"), R=R, A=A
            )
            assert np.array_equal(ref.R, R)
            mag = np.abs(w64[t]).sum() * np.abs(qv[t]).max()
            assert np.allclose(ref.w_fold, pl.w_fold[t, R], rtol=1e-12, atol=1e-12 * mag)
            assert np.allclose(ref.a_A, pl.a_A[t], rtol=1e-12, atol=1e-12 * mag)
            e_ref = min(ref.E_P, ref.E_P_joint)
            assert e_ref * (1 - 1e-12) <= pl.E[t] <= e_ref * (1 + 1e-8) + 1e-8 * mag
            om = pl.omega[t, row_slots(mts)]
            wf = ref.w_fold.astype(np.float32)
            assert np.array_equal(np.sort(om[om != 0]), np.sort(wf[wf != 0]))


@pytest.mark.parametrize("name,H", [("calibrated", 32), ("h64", 64)])
def test_emulated_screen_calibrated(name, H):
    """CPU emulation of the GPU screen on dosa_ref.workloads regimes: the bound dominates
    the float64 scores everywhere (0 violations); survival is printed (docs/records/notes.md)."""
    wlm = pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")
    from dosa_cupy.emulate import screen_survival
    from dosa_ref.fp8 import quantize_keys as qk
    from dosa_ref.fp8 import quantize_queries as qq

    wl = wlm.make_workload(name, 8, 8192, H=H, seed=2)
    kp, ksc = qk(wl.k)
    q, w = qq(wl.q, wl.w)
    res = screen_survival(q, w, kp, ksc, 1024, wl.ks, wl.ke)
    print(f"\n[emulated screen] {name} H={H}: survival={res['survival']:.4f}")
    assert res["violations"] == 0


def test_emulated_fp8_screen_allowance():
    """An FP8 screen's allowance (``plan.build_plans(screen="fp8_fresh")``: fresh e4m3 k32
    steps on the plan rows, docs/error_model.md "An FP8 screen") keeps the bound above every
    float64 score and survival at or below the f16 screen's; chaining the steps does not."""
    wlm = pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")
    from dosa_cupy.emulate import screen_survival
    from dosa_ref.fp8 import quantize_keys as qk
    from dosa_ref.fp8 import quantize_queries as qq

    wl = wlm.make_workload("calibrated", 8, 8192, H=32, seed=2)
    kp, ksc = qk(wl.k)
    q, w = qq(wl.q, wl.w)
    got = {
        screen: screen_survival(
            q, w, kp, ksc, 1024, wl.ks, wl.ke, scorer="fp8_fresh", screen=screen
        )  # fmt: skip
        for screen in ("f16", "fp8_fresh", "fp8_chained")
    }
    assert all(r["violations"] == 0 for r in got.values())
    assert got["fp8_fresh"]["survival"] <= got["f16"]["survival"] < got["fp8_chained"]["survival"]


def test_bench_report_from_recorded_run(tmp_path):
    """The bench's markdown and plots render from a recorded H200 run (no GPU needed)."""
    import json
    from pathlib import Path

    from dosa_cupy.bench import markdown, plots

    rec = Path(__file__).resolve().parents[1] / "docs" / "records" / "results" / "bench_run12.json"
    rows = json.loads(rec.read_text())
    md = markdown(rows)
    assert md.count("\n| ") >= len(rows)
    assert all(r["dosa_ids_equal_dense"] and r["fused_ids_equal_dense"] for r in rows)
    pytest.importorskip("matplotlib")
    files = plots(rows, tmp_path)
    assert files and all(f.stat().st_size > 0 for f in files)


def test_check_seed_ids_cpu():
    """Validation of ``seed_ids`` (numpy stands in for CuPy): ValueError naming ``seed_ids``."""
    from dosa_cupy.seeds import check_seed_ids as check_seeds

    good = np.array([[0, -1, 99], [5, 5, -1]], dtype=np.int64)
    out = check_seeds(good, 2, 100)
    assert out.dtype == np.int32 and np.array_equal(out, good)
    assert check_seeds(np.array([[0], [99]], np.uint8), 2, 100).dtype == np.int32
    assert check_seeds(np.zeros((2, 0), np.int16), 2, 100).shape == (2, 0)
    bad = [
        np.zeros((3, 2), np.int32),  # rows != Qn
        np.zeros(2, np.int32),  # not 2-D
        good + 1,  # 100 >= N
        good - 1,  # -2 < -1
        good.astype(np.float32),
        good >= 0,  # bool
        np.full((2, 1), 2**64 - 1, np.uint64),  # would wrap to -1 as int64
        np.full((2, 1), 2**32 + 3, np.int64),  # would wrap into range as int32
    ]
    for a in bad:
        with pytest.raises(ValueError, match="seed_ids"):
            check_seeds(a, 2, 100)
    with pytest.raises(ValueError, match="seed_ids"):
        check_seeds(np.zeros((2, 1), np.int32), 2, 0)


def test_seed_options_cpu():
    """The shared vocabulary (dosa_ref.options): ``seeds`` names strategies, key ids given
    as ``seeds`` raise a ValueError that points to ``seed_ids``; the GPU defaults resolve to
    the counts the stages always used (window 2048, sinks 16, 4 anchors, no certificate)."""
    from dosa_cupy.options import check_options, resolve_options
    from dosa_ref.options import default_cert_seeds

    for bad in (np.zeros((2, 3), np.int32), [[1, 2]], [1, 2]):
        with pytest.raises(ValueError, match="^seeds:.*seed_ids"):
            check_options({"seeds": bad})
    with pytest.raises(ValueError, match="^seeds:"):
        check_options({"seeds": "local+bogus"})
    with pytest.raises(ValueError, match="^seed_ids:"):
        check_options({"seeds": "explicit"})
    with pytest.raises(ValueError, match="^screen:"):
        check_options({"screen": "pair", "r": 6, "seeds": "local+certificate"})
    o = resolve_options(check_options({}), 512)
    assert (o["window"], o["sinks"], o["n_anchors"], o["cert_seeds"]) == (2048, 16, 4, 0)
    assert o["strategies"] == ("local", "anchor")
    o = resolve_options(check_options({"seeds": "anchor", "window": 99}), 512)
    assert (o["window"], o["sinks"], o["n_anchors"]) == (0, 0, 4)
    o = resolve_options(check_options({"seeds": ["local"]}), 4096)
    assert (o["window"], o["n_anchors"]) == (8192, 0)
    assert resolve_options(check_options({"cert_seeds": 64}), 512)["cert_seeds"] == 64
    o = resolve_options(check_options({"seeds": "local+anchor+certificate"}), 512)
    assert o["cert_seeds"] == default_cert_seeds(512)
    o = resolve_options(check_options({"seeds": "local+certificate", "cert_seeds": 0}), 512)
    assert o["cert_seeds"] == 0
    o = resolve_options(check_options({"seed_ids": np.zeros((2, 1), np.int32)}), 512)
    assert o["strategies"] == ("explicit", "local", "anchor")


def test_explicit_seed_table_cpu():
    """The dedup/filter of explicit seeds (numpy stands in for CuPy) against a per-query
    set computation: visible, not a sink / local-window / anchor-pool seed, distinct."""
    from dosa_cupy.seeds import explicit_seed_table
    from dosa_ref.stages import pool_mask

    rs = np.random.default_rng(3)
    Qn, N = 40, 700
    ks = rs.integers(0, N, Qn)
    ke = np.minimum(ks + rs.integers(0, 300, Qn), N)
    ks[0], ke[0] = 0, N
    ks[1], ke[1] = 10, 10  # empty range
    pool = np.unique(rs.integers(0, N, 60))
    poolmask = pool_mask(pool, (N + 31) // 32)
    for sinks, window in ((4, 16), (0, 0), (1000, 5), (3, 10**6)):
        seeds = rs.integers(-1, N, (Qn, 90))
        seeds[:, 10:20] = seeds[:, :10]  # repeats
        seeds[:, 20:30] = (ke - 1)[:, None]  # local window / last visible key
        seeds[:, 30:35] = ks[:, None]  # sinks / first visible key
        seeds[:, 35:40] = pool[rs.integers(0, pool.size, (Qn, 5))]
        tab = explicit_seed_table(seeds, ks.astype(np.int32), ke.astype(np.int32), sinks,
                                  window, poolmask, np)  # fmt: skip
        assert tab.dtype == np.int32 and tab.ndim == 2 and tab.shape[0] == Qn
        widths = []
        for t in range(Qn):
            a, b = int(ks[t]), int(ke[t])
            ns = min(sinks, b - a)
            default = set(range(a, a + ns)) | set(range(max(a + ns, b - window), b))
            default |= {int(i) for i in pool if a <= i < b}
            want = sorted({int(i) for i in seeds[t] if a <= i < b} - default)
            row = tab[t]
            got = row[row >= 0]
            assert got.tolist() == want
            assert np.all(row[got.size :] == -1)
            widths.append(len(want))
        assert tab.shape[1] == max(widths)


def test_public_ids_int64_cpu(monkeypatch):
    """dense_topk's host code returns int64 ids (numpy stands in for CuPy; the logits
    kernel and the selection kernel are emulated); the pipelines' empty early returns
    (no kernel launch) are int64 too."""

    import dosa_cupy.dense as dense_mod
    import dosa_cupy.fused as fused_mod
    import dosa_cupy.options as options_mod
    import dosa_cupy.pipeline as pipe_mod
    import dosa_cupy.prepare as prep_mod
    import dosa_cupy.scorer as scorer_mod
    import dosa_cupy.seeds as seeds_mod
    from dosa_ref import stages
    from dosa_ref.fp8 import e4m3_values as ev

    shim = numpy_as_cupy()
    for mod in (dense_mod, fused_mod, options_mod, pipe_mod, prep_mod, seeds_mod, scorer_mod):
        monkeypatch.setattr(mod, "cupy_or_raise", lambda: shim)

    def logits(q, w, kp, ksc, ks, ke):
        s = np.einsum("th,thn->tn", w, np.maximum(np.einsum("thd,nd->thn", ev(q), ev(kp)), 0))
        s = (s.astype(np.float32) * ksc).astype(np.float32)
        cols = np.arange(kp.shape[0])[None, :]
        return np.where((cols >= ks[:, None]) & (cols < ke[:, None]), s, -np.inf)

    def select(lg, K, ks, ke):
        out = np.full((lg.shape[0], K), -1, np.int32)
        for t in range(lg.shape[0]):
            a, b = int(ks[t]), int(ke[t])
            top = (a + np.lexsort((np.arange(b - a), -lg[t, a:b].astype(np.float64))))[:K]
            out[t, : top.size] = top
        return out

    class EmulatedCheck(prep_mod.ValueCheck):  # the check kernel: its reference + clamps
        def __init__(self, q, w, kp, ks, ke, N, ksc=None):
            self._given, self._N, self._bad = (ks, ke), int(N), None
            self._inputs = (q, w, kp, ksc)
            self._flags = np.array([stages.check_values(q, w, kp, ks, ke, N)], np.uint32)
            self.ks, self.ke = stages.clamp_ranges(ks, ke, N)
            self._flag_envelope(w, ksc)

    monkeypatch.setattr(prep_mod, "ValueCheck", EmulatedCheck)
    # the flags by the array path (tests/test_check_scales.py: the kernel sets the same word)
    monkeypatch.setattr(prep_mod, "SCALE_CHECK_KERNEL", False)
    monkeypatch.setattr(scorer_mod, "_dense_logits_raw", logits)  # the f16 route's and the check's
    monkeypatch.setattr(dense_mod, "_select_rows", select)
    q, w, kp, ksc = _cpu_workload(16, Qn=4, N=300)
    ke = np.array([300, 100, 5, 0], np.int32)
    ids = dense_mod.dense_topk(q, w, kp, ksc, 8, None, ke)
    assert ids.dtype == np.int64 and ids.shape == (4, 8)
    assert np.all(ids[2, 5:] == -1) and np.all(ids[3] == -1) and np.all(ids[2, :5] >= 0)
    # the deferred checks still raise: after the launches, on the clamped ranges
    with pytest.raises(ValueError, match="ke: entries"):
        dense_mod.dense_topk(q, w, kp, ksc, 8, None, np.array([301, 100, 5, 0], np.int32))
    # the scorer's domain (docs/method.md §1): past fp32 the checks raise; a query the
    # envelope flags whose scores stay finite gets its ids
    w_big = w.copy()
    w_big[1] = 3e38
    with pytest.raises(ValueError, match="overflows fp32"):
        dense_mod.dense_topk(q, w_big, kp, ksc, 8, None, ke)
    w_big[1] = 1e29
    assert prep_mod.envelope_queries(w_big, ksc).tolist() == [False, True, False, False]
    checked = dense_mod.dense_topk(q, w_big, kp, ksc, 8, None, ke)
    unchecked = dense_mod.dense_topk(q, w_big, kp, ksc, 8, None, ke, check=False)
    assert np.array_equal(checked, unchecked)
    for f in (pipe_mod.dosa_topk, fused_mod.fused_topk):  # and so does the empty return
        with pytest.raises(ValueError, match="ke: entries"):
            f(q[:2], w[:2], kp[:0], ksc[:0], 8, np.array([0, 0]), np.array([0, 1]))
    for f in (pipe_mod.dosa_topk, fused_mod.fused_topk):
        out = f(q[:0], w[:0], kp, ksc, 8)
        assert out.dtype == np.int64 and out.shape == (0, 8)
        out, _ = f(q, w, kp[:0], ksc[:0], 8, return_stats=True, seed_ids=np.full((4, 2), -1))
        assert out.dtype == np.int64 and np.all(out == -1)


def test_plan_invalid_when_sigma_overflows_fp32():
    """Huge negative weights: σ (a power of two ≥ max|a_A|/448) is finite in float64 but
    not in fp32, where the screen reads it — the plan must be invalid (query-level
    recovery), not weigh the aux rows by −inf."""
    from dosa_cupy.plan import build_plans

    q, w, kp, _ = _cpu_workload(32)
    w = w.astype(np.float32).copy()
    w[0] = np.float32(-3e38)  # every head negative and near FLT_MAX: |a_A|/448 > FLT_MAX
    with np.errstate(over="ignore"):
        pl = build_plans(q, w, kp, np.arange(0, 4096, 16), 14, 1, xp=np)
    assert pl.aggregated[0] > 0 and np.isinf(pl.sigma[0])  # fp32 σ overflowed
    assert not pl.valid[0]
    assert pl.valid[1:].all()


def test_recovery_known_empty_only_from_clean_checks_read_back(monkeypatch):
    """CPU: ``select.recovery_queries`` skips its device work only where the call's value
    checks were read back and flagged neither an invalid key scale nor an envelope query
    (``Batch.recovery_known_empty``); otherwise it computes the queries that see an
    invalid scale — checks off, not yet read (a captured step), or either bit set."""
    import types

    from gpu_support import numpy_as_cupy

    from dosa_cupy import prepare, select
    from dosa_cupy.prepare import CHECK_ENVELOPE, SCALES_INVALID, Batch

    monkeypatch.setattr(select, "cupy_or_raise", numpy_as_cupy)
    monkeypatch.setattr(prepare, "cupy_or_raise", numpy_as_cupy)
    Qn, N, H = 4, 64, 16
    ksc = np.ones(N, np.float32)
    ksc[40] = np.nan  # seen by queries 2 and 3 only
    ks, ke = np.zeros(Qn, np.int32), np.array([10, 40, 41, 64], np.int32)
    w = np.ones((Qn, H), np.float32)

    def batch(pending):
        return Batch(np.zeros((Qn, H, 128), np.uint8), w, np.zeros((N, 128), np.uint8), ksc, 4,
                     ks, ke, H, pending)  # fmt: skip

    sees = np.array([False, False, True, True])
    for pending, known in (
        (None, False),
        (types.SimpleNamespace(read=False, flags=0), False),
        (types.SimpleNamespace(read=True, flags=SCALES_INVALID), False),
        (types.SimpleNamespace(read=True, flags=CHECK_ENVELOPE), False),
    ):
        b = batch(pending)
        assert b.recovery_known_empty() is known
        assert np.array_equal(select.recovery_queries(b), sees)
    clean = batch(types.SimpleNamespace(read=True, flags=0))  # the flags' word, trusted
    assert clean.recovery_known_empty()
    assert not select.recovery_queries(clean).any()


@gpu
def test_value_checks_flag_invalid_scales():
    """The value checks' word has SCALES_INVALID exactly when some key scale is negative,
    NaN or inf (the bit that lets a clean call skip the recovery's device work)."""
    from dosa_cupy.prepare import SCALES_INVALID, ValueCheck

    wl = make_gpu_workload("structured", 16, 4096, 32, seed=2)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["ks"], wl["ke"], 4096)
    assert not ValueCheck(*args, wl["k_scale"]).flags & SCALES_INVALID
    for bad in (-1.0, np.nan, np.inf):
        ksc = wl["k_scale"].copy()
        ksc[4095] = bad
        assert ValueCheck(*args, ksc).flags & SCALES_INVALID, bad


@pytest.mark.parametrize("N", [0, 1, 4096, 300_000])
@gpu
def test_check_scales_kernel_equals_the_array_path(monkeypatch, N):
    """``prepare.SCALE_CHECK_KERNEL`` (csrc/prepare.cu check_scales) leaves the flag word of
    the array path: special scales (−0, subnormals of both signs, FLT_MAX, ±inf, NaN, a
    negative) one at a time, and the envelope's boundary ± one ulp for several α_max, over
    one block and many (tests/test_check_scales.py emulates it on the CPU)."""
    from dosa_cupy import prepare as prep
    from dosa_cupy.scorer import valid_scales

    rs = np.random.RandomState(5)
    base = (rs.rand(N) * 0.5 + 0.25).astype(np.float32)
    args = (cp.zeros((64, 32, 128), cp.uint8), None, cp.zeros((max(N, 1), 128), cp.uint8),
            cp.zeros(64, cp.int32), cp.full(64, N, cp.int32), N)  # fmt: skip

    def word(w, ksc, on):
        monkeypatch.setattr(prep, "SCALE_CHECK_KERNEL", on)
        a = (args[0], cp.asarray(w), args[2][:N] if N else args[2][:0], *args[3:])
        return prep.ValueCheck(*a, cp.asarray(ksc)).flags

    neg_sub = np.array([0x80000001], np.uint32).view(np.float32)[0]
    specials = [None, -0.0, np.float32(1e-45), neg_sub, np.finfo(np.float32).max, np.inf,
                -np.inf, np.nan, -1.0]  # fmt: skip
    for sp in specials if N else [None]:
        ksc = base.copy()
        if sp is not None:
            ksc[rs.randint(N)] = sp
        ok = ksc[valid_scales(ksc)]  # the bits' definition, as the kernel and numpy take it
        amax = float(ok.max()) if ok.size else 0.0  # no valid scale: the kernel's 0
        edge = 2.0**125 / (2.0**25 * max(amax, 1.0)) if N else 1e30
        for target in (np.nextafter(np.float32(edge), np.float32(0)), np.float32(edge),
                       np.nextafter(np.float32(edge), np.float32(np.inf)), 1.0):  # fmt: skip
            w = np.zeros((64, 32), np.float32)
            w[37, 3] = target
            assert word(w, ksc, True) == word(w, ksc, False), (N, sp, target)
