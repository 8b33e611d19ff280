"""Hopper-only kernels (``csrc/screen_sm90a.cu``): the screen with its MMA as warpgroup MMA,
which needs the sm_90a target; built through ``_build`` (NVRTC for sm_90a, else nvcc;
docs/numerics.md "Warpgroup MMA") with the flags of the other modules, so the fp32 epilogue
is compiled to the same arithmetic as the runtime-compiled kernels.
"""

from __future__ import annotations

import functools

from ._build import KernelSpec, cupy_or_raise, tile
from ._build import kernel as _kernel

SOURCE = "screen_sm90a.cu"
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


def spec(tile_n: int, defines: tuple = ()) -> KernelSpec:
    """The build of screen_sm90a.cu for ``tile_n`` keys per tile with ``defines`` ("NAME=
    VALUE": the plan width of BUILDS, the tuning knobs of screen_sm90a.cu)."""
    return KernelSpec(SOURCE, (f"DOSA_TILE_N={int(tile_n)}", *defines), sm90a=True)


@functools.cache
def _builds_on(dev: int) -> bool:
    try:
        _kernel("screen_wg_mt1", smem_bytes(tile()), spec(tile(), BUILDS[1][0]))
        return True
    except Exception:
        return False


def available() -> bool:
    """True on a compute-capability-9.0 GPU where the sm_90a module builds and loads (the
    first call builds it)."""
    try:
        cp = cupy_or_raise()
        dev = cp.cuda.Device()
        return dev.compute_capability == "90" and _builds_on(dev.id)
    except Exception:
        return False


def kernel(name: str, mts: int = 1):
    """Kernel ``name`` (screen_wg_mt{mts}, its ``_tie`` variant, wg_probe_mma) of the ``mts``
    build (BUILDS) for the current tile size, with its dynamic shared-memory limit raised to
    ``smem_bytes(tile())``."""
    return _kernel(name, smem_bytes(tile()), spec(tile(), BUILDS[mts][0]))
