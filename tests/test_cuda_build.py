"""CI (no GPU): every .cu under dosa_cupy compiles with the machine's nvcc for sm_90 (with
-ftz=true, as CuPy compiles it), so a build error fails CI.  Skipped only without nvcc."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "dosa_cupy"
SOURCES = sorted(ROOT.rglob("*.cu"))
NVCC = shutil.which("nvcc") or (
    "/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None
)


def test_sources_exist():
    assert SOURCES, "no .cu sources under dosa_cupy"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize("tile", [128, 256])
@pytest.mark.parametrize("src", SOURCES, ids=[s.name for s in SOURCES])
def test_compiles_sm90(src, tile, tmp_path):
    cmd = [
        NVCC, "-arch=sm_90", "-std=c++17", "-ftz=true", f"-I{src.parent}", f"-DDOSA_TILE_N={tile}",
        "-Xptxas", "-warn-spills", "-c", str(src), "-o", str(tmp_path / "k.o"),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower(), res.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize("define", ["DOSA_SCREEN_UNROLL=1"])
def test_kernel_variants_compile_sm90(define, tmp_path):
    """The tuning builds of kernels.cu (_build's DOSA_SCREEN_UNROLL)."""
    src = ROOT / "csrc" / "kernels.cu"
    cmd = [
        NVCC, "-arch=sm_90", "-std=c++17", "-ftz=true", f"-I{src.parent}", "-DDOSA_TILE_N=256",
        f"-D{define}", "-Xptxas", "-warn-spills", "-c", str(src), "-o", str(tmp_path / "k.o"),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower(), res.stderr


def test_device_const_copies_a_table_once_per_device_and_name(monkeypatch):
    """Host tables reach a device once (a copy from pageable memory per call would wait for
    the stream); numpy stands for itself."""
    import types

    import numpy as np

    from dosa_cupy import _build

    monkeypatch.setattr(_build, "_CONSTS", {})
    dev, copies = [0], []

    def asarray(a):
        copies.append(np.asarray(a).copy())
        return copies[-1]

    xp = types.SimpleNamespace(
        asarray=asarray, cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=dev[0]))
    )
    a = _build.device_const(xp, "t", lambda: np.arange(3))
    assert _build.device_const(xp, "t", lambda: np.arange(5)) is a and len(copies) == 1
    assert len(_build.device_const(xp, "u", lambda: np.arange(5))) == 5  # another name
    dev[0] = 1
    assert _build.device_const(xp, "t", lambda: np.arange(3)) is not a  # another device
    assert len(copies) == 3
    assert (_build.device_const(np, "t", lambda: [1, 2]) == [1, 2]).all()


def test_scorer_error_model_is_one_number():
    """The canonical scorer's accumulator bits are one property (csrc/scorer.cuh
    ScorerF16::kMmaBits) that the host's plan allowances read (dosa_cupy.scorer.MMA_BITS)."""
    import re

    from dosa_cupy import scorer

    src = (ROOT / "csrc" / "scorer.cuh").read_text()
    (bits,) = re.findall(r"static constexpr int kMmaBits = (\d+);", src)
    assert int(bits) == scorer.MMA_BITS == 17
    assert "using Scorer = ScorerF16;" in src


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
def test_wgt_ring_sizes_are_the_kernels(tmp_path):
    """screen.wgt_image_bytes / wgt_ring_smem_bytes equal screen_wgt.cu's Ring<RQ, FP8>
    kImageBytes / kSmemBytes for every build (a host program prints the constants): the
    ring kernels trap on less shared memory, and the image buffer is sized from these."""
    from dosa_cupy import screen

    prog = tmp_path / "sizes.cu"
    cases = [(rq, fp8) for rq in (8, 16, 32) for fp8 in (False, True)]
    lines = "".join(
        f'  printf("%d %d\\n", dosa::wgt::Ring<{rq}, {str(fp8).lower()}>::kImageBytes, '
        f"dosa::wgt::Ring<{rq}, {str(fp8).lower()}>::kSmemBytes);\n"
        for rq, fp8 in cases
    )
    prog.write_text(f'#include "screen_wgt.cu"\n#include <cstdio>\nint main() {{\n{lines}}}\n')
    exe = tmp_path / "sizes"
    src = ROOT / "csrc"
    res = subprocess.run([NVCC, "-std=c++17", f"-I{src}", str(prog), "-o", str(exe)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = [tuple(map(int, ln.split())) for ln in subprocess.run(
        [str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()]  # fmt: skip
    want = [(screen.wgt_image_bytes(rq, fp8), screen.wgt_ring_smem_bytes(rq, fp8))
            for rq, fp8 in cases]  # fmt: skip
    assert got == want


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
def test_warp_specialised_smem_sizes_are_the_kernels(tmp_path):
    """decode_ops.fp8_tma_smem equals score_fp8.cu's decode_tma_smem (the kernel traps on
    less), and the launch constants the host mirrors (the consumer warpgroups, the slots, the
    threads) equal the source's — read from a host program."""
    from dosa_cupy import decode_ops

    prog = tmp_path / "sizes.cu"
    prog.write_text(
        '#include "score_fp8.cu"\n#include <cstdio>\nint main() {\n'
        "  using namespace dosa::fp8;\n"
        '  printf("%d %d %d\\n", kCwg, kTmaSlots, kTmaThreads);\n'
        '  for (int nc : {32, 64, 128}) printf("%d ", decode_tma_smem(nc));\n}\n'
    )
    exe = tmp_path / "sizes"
    src = ROOT / "csrc"
    res = subprocess.run([NVCC, "-std=c++17", f"-I{src}", str(prog), "-o", str(exe)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = [int(x) for x in out]
    cwg = decode_ops.FP8_TMA_CWG
    want = [cwg, decode_ops.FP8_TMA_SLOTS, 128 * (1 + cwg)]
    want += [decode_ops.fp8_tma_smem(nc) for nc in (32, 64, 128)]
    assert got == want
