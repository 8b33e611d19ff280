"""Hopper-only kernels (``csrc/screen_sm90a.cu``): warpgroup MMA needs the sm_90a target,
which CuPy's runtime compiler cannot ask for (docs/numerics.md "Warpgroup MMA"), so the file
is built once by ``nvcc`` into a cubin (cached by the hash of its sources and flags) and
loaded with ``cupy.RawModule(path=...)``.  The flags are CuPy's own (``-ftz=true``, C++17),
so the fp32 epilogue is compiled to the same arithmetic as the runtime-compiled kernels.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._build import CSRC, cupy_or_raise, raise_smem_limit, tile

SOURCE = CSRC / "screen_sm90a.cu"
DEPENDS = (SOURCE, CSRC / "common.cuh")
THREADS = 384  # three warpgroups per block (screen_sm90a.cu kThreads) in the mts = 1 build
QG = 96  # queries per block (a multiple of 4 per warpgroup): the tile is converted once for QG
# Builds per plan width (head tiles per query): their defines and threads per block; both
# fit three warpgroups in 168 registers without spills (tests/test_gpu_sm90a.py).  Each
# build holds the kernel and its tie-aware variant (name + "_tie", screen.tie_screen_wanted),
# which runs only on chunks with a query at τ = 0; the two-tile one spills (108 bytes at
# nvcc 13.0).
BUILDS = {1: ((), THREADS), 2: (("DOSA_WG_MTS=2",), THREADS)}


def threads(mts: int = 1) -> int:
    """Threads per block of the ``mts`` build."""
    return BUILDS[mts][1]


def smem_bytes(tile_n: int) -> int:
    """Dynamic shared memory of ``screen_wg_mt1`` / ``wg_probe_mma`` for ``tile_n`` keys:
    the f16 key tile (two 128-byte-swizzled panels), α and ρ as fp64 and fp32, the
    anchor-pool words and 1 KB to align the tile to the 1,024-byte swizzle atom."""
    return 2 * tile_n * 128 + tile_n * 24 + (tile_n // 32) * 4 + 1024


def nvcc() -> str | None:
    """The nvcc that builds the cubin: $DOSA_NVCC, then PATH, then $CUDA_HOME/bin."""
    for cand in (
        os.environ.get("DOSA_NVCC"),
        shutil.which("nvcc"),
        str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"),
    ):
        if cand and Path(cand).exists():
            return cand
    return None


def build_command(tile_n: int, out: Path, defines: tuple = ()) -> list[str]:
    """The nvcc command that builds the sm_90a cubin for ``tile_n`` keys per tile, with
    ``defines`` ("NAME=VALUE": the kernel's tuning knobs, screen_sm90a.cu)."""
    return [
        nvcc() or "nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17",
        "-ftz=true", f"-I{CSRC}", f"-DDOSA_TILE_N={int(tile_n)}",
        *(f"-D{d}" for d in defines), "-o", str(out), str(SOURCE),
    ]  # fmt: skip


def available() -> bool:
    """True on a compute-capability-9.0 GPU with an nvcc to build the cubin."""
    try:
        cp = cupy_or_raise()
        return cp.cuda.Device().compute_capability == "90" and nvcc() is not None
    except Exception:
        return False


@functools.cache
def module(tile_n: int, defines: tuple = ()):
    """The sm_90a cubin for ``tile_n`` keys per tile (and ``defines``), built on first use
    and cached under $DOSA_CACHE (default: the temp directory) by the hash of its sources
    and command."""
    cp = cupy_or_raise()
    h = hashlib.sha256()
    for p in DEPENDS:
        h.update(p.read_bytes())
    h.update(" ".join(build_command(tile_n, Path("x"), defines)[1:]).encode())
    cache = Path(os.environ.get("DOSA_CACHE", Path(tempfile.gettempdir()) / "dosa-cubin"))
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"screen_sm90a_{tile_n}_{h.hexdigest()[:16]}.cubin"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        res = subprocess.run(build_command(tile_n, tmp, defines), capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed to build {SOURCE.name} for sm_90a:\n{res.stderr}")
        tmp.replace(out)
    return cp.RawModule(path=str(out))


def kernel(name: str, mts: int = 1):
    """Kernel ``name`` (screen_wg_mt{mts}, its ``_tie`` variant, wg_probe_mma) of the sm_90a
    module of the ``mts`` build (BUILDS) for the current tile size, with its dynamic
    shared-memory limit raised to ``smem_bytes(tile())``."""
    defines = BUILDS[mts][0]
    f = module(tile(), defines).get_function(name)
    # keyed by the build too: each build's function object needs its own opt-in
    return raise_smem_limit(f, smem_bytes(tile()), "sm90a", name, tile(), defines)
