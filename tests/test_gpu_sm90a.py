"""The Hopper (sm_90a, wgmma) screen: its MMA chain equals the canonical mma.sync chain bit
for bit (docs/numerics.md "Warpgroup MMA"), so ``screen="wg"`` computes exactly the bounds
of ``screen_mt1`` and DoSA's ids equal the dense route's.  GPU tests need an H200-class GPU
(compute capability 9.0); the CPU part builds the module (nvcc; NVRTC where libnvrtc is
installed) and checks the options."""

import numpy as np
import pytest
from gpu_support import HAVE_GPU, cp, gpu, needs_sm90a, ptxas_report

from dosa_cupy import _build, sm90a
from dosa_cupy.options import check_options


def test_build_targets_sm90a_with_cupys_flags(tmp_path):
    """NVRTC and the nvcc fallback build screen_sm90a.cu for sm_90a with -ftz=true (CuPy's
    flag for every other module), the include directory and the spec's defines."""
    spec = sm90a.spec(256)
    assert spec.sm90a and spec.source == sm90a.SOURCE and "DOSA_TILE_N=256" in spec.defines
    assert set(_build.SM90A_NVRTC) == {"--gpu-architecture=sm_90a", "-ftz=true"}
    cmd = _build.nvcc_command(spec, tmp_path / "s.cubin")
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "-ftz=true" in cmd
    assert "-DDOSA_TILE_N=256" in cmd and str(_build.CSRC / sm90a.SOURCE) in cmd
    assert set(spec.options()) <= set(cmd)


def test_sm90a_cubin_needs_no_cuda_toolkit(tmp_path, monkeypatch):
    """The sm_90a module is built by NVRTC (the library CuPy loads) into the cache: no nvcc
    on the machine is needed; only where NVRTC fails is nvcc tried, and without it the error
    names the source."""
    monkeypatch.setenv("DOSA_CACHE", str(tmp_path))
    monkeypatch.setattr(_build, "nvcc", lambda: None)
    monkeypatch.setattr(_build, "_nvrtc_cubin", lambda spec: b"cubin:" + spec.source.encode())
    out = _build.sm90a_cubin(sm90a.spec(256))
    assert out.parent == tmp_path and out.read_bytes() == b"cubin:screen_sm90a.cu"
    assert _build.sm90a_cubin(sm90a.spec(256)) == out  # cached by sources and flags
    assert _build.sm90a_cubin(sm90a.spec(128)) != out

    def fail(spec):
        raise RuntimeError("NVRTC: no sm_90a")

    monkeypatch.setattr(_build, "_nvrtc_cubin", fail)
    with pytest.raises(RuntimeError, match="screen_sm90a.cu: NVRTC failed and no nvcc"):
        _build.sm90a_cubin(sm90a.spec(64))


# the library's builds (sm90a.BUILDS) and the mt1 variants `dosa bench --screen-variants` times
BUILD_CASES = [(), ("DOSA_WG_GROUPS=2",), sm90a.BUILDS[2][0]]


@pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize("defines", BUILD_CASES)
def test_sm90a_cubin_builds_without_spills_in_the_screen(defines, tmp_path):
    """CI (no GPU) builds the wgmma code itself: for sm_90 the file compiles to an empty
    module (tests/test_cuda_build.py), so only this build sees a wgmma error."""
    report = ptxas_report(sm90a.spec(256, defines), tmp_path)
    mts = 2 if "DOSA_WG_MTS=2" in defines else 1
    screen = report.split(f"entry function 'screen_wg_mt{mts}'")[1].split("Compiling")[0]
    assert "0 bytes spill stores" in screen, screen
    assert "C7518" not in report, report  # no wgmma serialized by ptxas


@pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize("mts", [1, 2])
def test_sm90a_tie_variants_compile(mts, tmp_path):
    """The tie-aware variants (screen_wg_mt*_tie, in every build) compile for sm_90a without
    a serialized wgmma; the one-tile one also without spills (the two-tile one spills:
    sm90a.BUILDS)."""
    report = ptxas_report(sm90a.spec(256, sm90a.BUILDS[mts][0]), tmp_path)
    assert "C7518" not in report, report
    screen = report.split(f"entry function 'screen_wg_mt{mts}_tie'")[1].split("Compiling")[0]
    if mts == 1:
        assert "0 bytes spill stores" in screen, screen


def test_smem_holds_two_panels_and_the_alignment_slack():
    assert sm90a.smem_bytes(256) == 2 * 256 * 128 + 256 * (8 + 8 + 4 + 4) + 8 * 4 + 1024


def test_wg_option_validation():
    assert check_options({"screen": "wg", "r": 30})["r"] == 30  # two tiles: screen_wg_mt2
    assert sm90a.threads(1) == sm90a.THREADS and sm90a.threads(2) == sm90a.THREADS
    with pytest.raises(ValueError, match="screen"):
        check_options({"screen": "wg", "cert_seeds": 64})
    assert check_options({"screen": "wg"})["screen"] == "wg"


def _e4m3_codes(rs, shape):
    """Uniform e4m3 bit patterns without the NaN codes: every exponent from 2^-9 to 448, so
    products span 2^-18 .. 2^17.6 and partial sums often exceed the accumulator window."""
    b = rs.randint(0, 256, size=shape).astype(np.uint8)
    return np.where((b & 0x7F) == 0x7F, b ^ 0x01, b).astype(np.uint8)


def _crafted(rs, shape):
    """One large product beside many tiny ones per row (the pattern that showed the
    mma.sync truncation, docs/numerics.md): dim 0 ±448, the rest ±2^-9 .. 2^-6."""
    tiny = np.array([0x01, 0x02, 0x04, 0x08, 0x81, 0x82, 0x84, 0x88], dtype=np.uint8)
    b = tiny[rs.randint(0, tiny.size, size=shape)]
    col = rs.randint(0, shape[1], size=shape[0])
    b[np.arange(shape[0]), col] = np.where(rs.rand(shape[0]) < 0.5, 0x7E, 0xFE)
    return b


@pytest.mark.parametrize("kind", ["uniform_codes", "crafted", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@needs_sm90a
@gpu
def test_wgmma_chain_equals_mma_sync_bitwise(kind, seed):
    T = 256
    f = sm90a.kernel("wg_probe_mma", 1)
    rs = np.random.RandomState(seed)
    R = sm90a.THREADS // 2  # 16 rows per warp
    if kind == "uniform_codes":
        rows, keys = _e4m3_codes(rs, (R, 128)), _e4m3_codes(rs, (T, 128))
    elif kind == "crafted":
        rows, keys = _crafted(rs, (R, 128)), _crafted(rs, (T, 128))
    else:
        rows, keys = _crafted(rs, (R, 128)), _e4m3_codes(rs, (T, 128))
    out_wg = cp.full((R, T), np.nan, dtype=cp.float32)
    out_mma = cp.full((R, T), np.nan, dtype=cp.float32)
    f((1,), (sm90a.THREADS,), (cp.asarray(rows), cp.asarray(keys), out_wg, out_mma),
      shared_mem=sm90a.smem_bytes(T))  # fmt: skip
    a, b = cp.asnumpy(out_wg), cp.asnumpy(out_mma)
    assert not np.isnan(a).any() and not np.isnan(b).any(), "unwritten accumulator"
    diff = int((a.view(np.uint32) != b.view(np.uint32)).sum())
    print(f"\n[wg probe] {kind} seed={seed}: {diff} of {a.size} accumulators differ")
    assert diff == 0


if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

CASES = [("calibrated", 32, 256, 65536), ("h64", 64, 131, 32768), ("structured", 32, 64, 16384),
         ("ties", 32, 33, 8192), ("adversarial", 64, 64, 8192), ("gaussian", 32, 5, 3000),
         ("equal", 32, 9, 4100)]  # fmt: skip


@pytest.mark.parametrize("r", [14, 30])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-H{c[1]}-Q{c[2]}-N{c[3]}" for c in CASES])
@needs_sm90a
@gpu
def test_gpu_wg_screen_equals_screen_mt1_and_dense(case, r):
    """r = 14: screen_wg_mt1 against screen_mt1; r = 30: screen_wg_mt2 against screen_mt2."""
    regime, H, Qn, N = case
    wl = make_gpu_workload(regime, Qn, N, H, seed=29)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    kw = dict(r=r, return_stats=True, debug_bounds=True)
    ids, st = dosa_cupy.dosa_topk(*args, screen="wg", **kw)
    ids1, st1 = dosa_cupy.dosa_topk(*args, screen="fp64", **kw)
    assert cp.array_equal(ids, dense) and cp.array_equal(ids1, dense)
    u, u1 = cp.asnumpy(st.bounds), cp.asnumpy(st1.bounds)
    same = (u.view(np.uint64) == u1.view(np.uint64)) | (np.isnan(u) & np.isnan(u1))
    print(f"\n[wg screen] {regime} H={H} r={r} Qn={Qn} N={N}: {int((~same).sum())} bounds differ, "
          f"survivors wg={int(st.survivors.sum())} mt1={int(st1.survivors.sum())}")  # fmt: skip
    assert same.all()
    assert np.array_equal(np.asarray(st.survivors), np.asarray(st1.survivors))
