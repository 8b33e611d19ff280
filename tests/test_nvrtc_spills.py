"""CI (no GPU): the runtime-compiled modules, built the way CuPy builds them (NVRTC to PTX,
then ptxas for sm_90), spill no registers in any kernel.

nvcc's build (tests/test_cuda_build.py) can allocate registers differently from NVRTC's:
in 13c8b57 ``select_kernel`` had no spills under nvcc and 16 bytes of spills under NVRTC,
and the prefill selection ran 40 % slower on the H200 (docs/records/benchmarks.md "The final
commit: 13c8b57").  Skipped, with the reason, where NVRTC or ptxas is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dosa_cupy._build import CSRC, OPTIONS
from dosa_cupy.sass import nvrtc_compile, nvrtc_include_dirs, nvrtc_library

PTXAS = shutil.which("ptxas")


LIB = nvrtc_library()


def _ptx(src: Path, defines: tuple[str, ...]) -> bytes:
    """``src`` as CuPy's NVRTC build makes it, to PTX (then ptxas reports each kernel)."""
    opts = OPTIONS + ("--gpu-architecture=compute_90", *(f"-D{d}" for d in defines))
    return nvrtc_compile(LIB, src, opts, get="PTX")[0].rstrip(b"\0")


_MAIN = ("DOSA_TILE_N=256", "DOSA_SCREEN_UNROLL=2")
_T128 = ("DOSA_TILE_N=128", "DOSA_SCREEN_UNROLL=2")

# Spills known when this check was written (2026-12-01), with their sizes (bytes stored,
# bytes loaded): the check fails if one grows or a new one appears.  All are in builds this
# session did not change: plan_mt2 (the fused planner for two-tile plans, capped at 48
# registers under NVRTC, none under nvcc) and the tie-aware certificate screen;
# docs/records/notes.md "Register spills under NVRTC".
KNOWN = {
    ("plan.cu", (), "plan_mt2"): (68, 108),
    ("kernels.cu", _MAIN, "screen_cert_mt1_tie"): (16, 16),
    ("kernels.cu", _T128, "screen_cert_mt1_tie"): (16, 16),
}

BUILDS = [
    ("kernels.cu", _MAIN),
    ("kernels.cu", _T128),
    ("decode.cu", ()),
    ("plan.cu", ()),
]


@pytest.mark.skipif(LIB is None, reason="libnvrtc not found on this machine")
@pytest.mark.skipif(PTXAS is None, reason="ptxas not found on this machine")
@pytest.mark.parametrize("name,defines", BUILDS, ids=[f"{n}:{','.join(d)}" for n, d in BUILDS])
def test_runtime_builds_do_not_spill(name, defines, tmp_path):
    if not nvrtc_include_dirs():
        pytest.skip("no CUDA headers (cuda_fp8.h) for NVRTC")
    (tmp_path / "k.ptx").write_bytes(_ptx(CSRC / name, defines))
    res = subprocess.run([PTXAS, "-arch=sm_90", "-v", str(tmp_path / "k.ptx"), "-o",
                          str(tmp_path / "k.cubin")], capture_output=True, text=True)  # fmt: skip
    if "Unsupported .version" in res.stderr:  # NVRTC newer than this machine's ptxas
        pytest.skip(f"ptxas cannot read this NVRTC's PTX: {res.stderr.splitlines()[0]}")
    assert res.returncode == 0, res.stderr
    kernels = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    assert kernels and len(spills) == len(kernels), res.stderr
    bad = []
    for k, (st, ld) in zip(kernels, spills, strict=True):
        allowed = KNOWN.get((name, tuple(defines), k), (0, 0))
        if int(st) > allowed[0] or int(ld) > allowed[1]:
            bad.append(f"{k} ({st} B stored, {ld} B loaded)")
    assert not bad, f"{name} {defines}: register spills in {bad}"


def _nvrtc_sm90a_log(spec) -> str:
    """ptxas's report of ``spec`` built by NVRTC for sm_90a with the library's flags
    (``_build.SM90A_NVRTC``: the build that runs on the H200)."""
    from dosa_cupy import _build

    opts = spec.options() + _build.SM90A_NVRTC + ("--ptxas-options=-v",)
    return nvrtc_compile(LIB, _build.CSRC / spec.source, opts)[1]


@pytest.mark.skipif(LIB is None, reason="libnvrtc not found on this machine")
@pytest.mark.parametrize("mts", [1, 2])
def test_sm90a_nvrtc_builds_without_spills_or_serialized_wgmma(mts):
    """The Hopper screen as the library builds it (NVRTC, sm_90a): no wgmma serialized in a
    screen kernel (ptxas's C7512 / C7518 name only the accumulator probe), and no spills in
    the one-tile kernels (the two-tile tie-aware one spills: sm90a.BUILDS)."""
    from dosa_cupy import sm90a

    log = _nvrtc_sm90a_log(sm90a.spec(256, sm90a.BUILDS[mts][0]))
    serialized = re.findall(r"\(C75(?:12|18)\)[^\n]*function '(\w+)'", log)
    assert set(serialized) <= {"wg_probe_mma"}, log
    for k in (f"screen_wg_mt{mts}", f"screen_wg_mt{mts}_tie"):
        props = log.split(f"Function properties for {k}\n")[1].split("\n")[0]
        if mts == 1 or not k.endswith("_tie"):
            assert "0 bytes spill stores" in props, (k, props)


@pytest.mark.skipif(LIB is None, reason="libnvrtc not found on this machine")
def test_dense_fp8_consumers_ask_no_more_registers_than_the_block_holds():
    """Every dense_fp8 build as the library builds it: the consumers' ``setmaxnreg.inc``
    draws only on the block's launch allocation plus what the producer's ``setmaxnreg.dec``
    gives back (docs/design.md "The FP8 dense kernel"; a build asking for more hung on the
    H200, records/gpu_tests.md 2026-12-02 11:25) — read from ptxas's register count and the
    PTX's immediates, so a change of either is caught without a GPU; and no spills."""
    from dosa_cupy import _build
    from dosa_cupy.bench.fp8_dense import VARIANTS

    src = _build.CSRC / "dense_fp8.cu"
    opts = _build.KernelSpec("dense_fp8.cu", (), sm90a=True).options() + _build.SM90A_NVRTC
    log = nvrtc_compile(LIB, src, opts + ("--ptxas-options=-v",))[1]
    ptx = nvrtc_compile(LIB, src, opts, get="PTX")[0].decode(errors="replace")
    entries = dict(re.findall(r"\.entry (\w+)\((.*?)(?=\.entry |\Z)", ptx, re.S))
    for H in (32, 64):
        for v, (_, _, cwg, fresh) in VARIANTS.items():
            k = f"dense_fp8_h{H}_{v}"
            props = log.split(f"Function properties for {k}\n")[1].split("\n")[0]
            assert "0 bytes spill stores" in props, (k, props)
            used = int(re.search(rf"Compiling entry function '{k}'.*?Used (\d+) registers",
                                 log, re.S).group(1))  # fmt: skip
            assert used * 128 * (1 + cwg) <= 65536, (k, used)
            dec = [
                int(n)
                for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", entries[k])
            ]
            inc = [
                int(n)
                for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", entries[k])
            ]
            if not fresh:
                assert not dec and not inc, k
                continue
            assert len(set(dec)) == 1 and len(set(inc)) == 1, (k, dec, inc)
            assert cwg * (inc[0] - used) <= used - dec[0], (k, used, dec, inc)


def _setmaxnreg(ptx_entry: str, op: str) -> list[int]:
    return [int(n) for n in re.findall(rf"setmaxnreg\.{op}\.sync\.aligned\.u32\s+(\d+)", ptx_entry)]


# Spills of the sm_90a builds under NVRTC when this check was written (2026-12-05, NVRTC of
# the cu13 wheel): the 32-row transposed screen, 4 bytes (none under nvcc 13.0, which built
# every measured run of it until screen_wgt.cu compiled under NVRTC: docs/records/notes.md,
# session 20).  The check fails if one grows or a new one appears.
KNOWN_SM90A = {("screen_wgt.cu", "screen_wgt_rows32"): (4, 8)}
SM90A_SOURCES = ["screen_wgt.cu", "score_fp8.cu", "dense_fp8.cu", "fp8_probe.cu"]


@pytest.mark.skipif(LIB is None, reason="libnvrtc not found on this machine")
@pytest.mark.parametrize("source", SM90A_SOURCES)
def test_every_sm90a_source_builds_under_nvrtc(source):
    """The sm_90a sources build with NVRTC as the library builds them (no nvcc needed on a
    machine with CuPy's NVRTC alone: _build.sm90a_cubin falls back to nvcc only where NVRTC
    fails) — no serialised wgmma and no spills beyond KNOWN_SM90A in the transposed screen
    (its ring and FP8 builds and the FP8 fp32-guard kernels, the pipelined halves' too,
    included), the decode scan by TMA, the decode witnesses that select their K-th and those of
    a request's two rows."""
    from dosa_cupy import _build

    log = _nvrtc_sm90a_log(_build.KernelSpec(source, (), sm90a=True))
    ours = (
        "screen_wgt",
        "decode_logits_tma",
        "decode_fused_tma",
        "decode_witness_kth",
        "decode_witness_fp8_h64_n2",
        "decode_witness_fp8_h32_n2",
    )
    serialized = re.findall(r"\(C75(?:12|14|15|17|18)\)[^\n]*function '(\w+)'", log)
    assert not [k for k in serialized if k.startswith(ours)], log
    checked = 0
    for k in re.findall(r"Compiling entry function '(\w+)'", log):
        if not k.startswith(ours):
            continue
        props = log.split(f"Function properties for {k}\n")[1].split("\n")[0]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", props)
        allowed = KNOWN_SM90A.get((source, k), (0, 0))
        assert int(spill[1]) <= allowed[0] and int(spill[2]) <= allowed[1], (k, props)
        checked += 1
    assert checked == {"screen_wgt.cu": 32, "score_fp8.cu": 20}.get(source, 0), checked


@pytest.mark.skipif(LIB is None, reason="libnvrtc not found on this machine")
def test_decode_tma_consumers_ask_no_more_registers_than_the_block_holds():
    """decode_scan_tma's setmaxnreg (score_fp8.cu): the consumers' ``inc`` draws only on the
    block's launch allocation plus what the producer's ``dec`` gives back (the rule of
    test_dense_fp8_consumers_ask_no_more_registers_than_the_block_holds: a build asking for
    more hung on the H200)."""
    from dosa_cupy import _build
    from dosa_cupy.decode_ops import FP8_TMA_CWG

    src = _build.CSRC / "score_fp8.cu"
    opts = _build.KernelSpec("score_fp8.cu", (), sm90a=True).options() + _build.SM90A_NVRTC
    log = nvrtc_compile(LIB, src, opts + ("--ptxas-options=-v",))[1]
    ptx = nvrtc_compile(LIB, src, opts, get="PTX")[0].decode(errors="replace")
    entries = dict(re.findall(r"\.entry (\w+)\((.*?)(?=\.entry |\Z)", ptx, re.S))
    names = [k for k in entries if "_tma_fp8_" in k]
    assert len(names) == 16, names
    for k in names:
        used = int(re.search(rf"Compiling entry function '{k}'.*?Used (\d+) registers",
                             log, re.S).group(1))  # fmt: skip
        assert used * 128 * (1 + FP8_TMA_CWG) <= 65536, (k, used)
        dec, inc = _setmaxnreg(entries[k], "dec"), _setmaxnreg(entries[k], "inc")
        assert len(set(dec)) == 1 and len(set(inc)) == 1, (k, dec, inc)
        assert FP8_TMA_CWG * (inc[0] - used) <= used - dec[0], (k, used, dec, inc)
