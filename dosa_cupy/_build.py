"""Build and cache the CUDA module (``csrc/kernels.cu``) through ``cupy.RawModule``.

CuPy compiles for the device's own architecture (sm_90 on the H200) and appends
``-ftz=true`` (docs/numerics.md): every guard computation in the kernels that must round
upward is therefore done in fp64 with ``__d*_ru`` intrinsics (docs/method.md §8).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_FILE = CSRC / "kernels.cu"
OPTIONS = ("-std=c++17", f"-I{CSRC}")


def kernel_sources() -> list[Path]:
    """Every CUDA source (.cu, .cuh) under ``CSRC``, sorted: what the builds below read.

    ``CSRC`` is found next to this file, so an installed package reads its own copy; the
    wheel must therefore carry all of them (pyproject package-data; tests/test_wheel.py).
    """
    return sorted(p for p in CSRC.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh"))


def cupy_or_raise():
    try:
        import cupy
    except Exception as e:  # pragma: no cover - exercised only without CuPy
        raise RuntimeError(f"dosa_cupy needs CuPy and an NVIDIA GPU: {e}") from e
    return cupy


_CONSTS: dict = {}


def device_const(xp, name: str, make):
    """``xp.asarray(make())`` copied to the current device once and kept (per device and
    ``name``): an index or lookup table used by host code on every call.  A copy from
    pageable host memory waits for the stream's queued work, so a table copied per call costs
    a synchronization; a captured step (capture.py) may not copy from the host at all.  With
    numpy (the CPU tests) it is ``make()`` as an array."""
    if not hasattr(xp, "cuda"):
        return xp.asarray(make())
    key = (xp.cuda.Device().id, name)
    if key not in _CONSTS:
        _CONSTS[key] = xp.asarray(make())
    return _CONSTS[key]


def num_sms() -> int:
    """Streaming multiprocessors of the current device (cached per device): the grid of the
    persistent kernels."""
    cp = cupy_or_raise()
    dev = cp.cuda.Device()
    if dev.id not in _SMS:
        _SMS[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _SMS[dev.id]


_SMS: dict = {}

TILES = (128, 256)
_state = {"tile": int(os.environ.get("DOSA_TILE_N", "256"))}  # 256: +8–12% (BENCHMARKS v6)


def tile() -> int:
    """Keys per block tile of the tiled kernels (dense logits, fused, screen)."""
    return _state["tile"]


def set_tile(n: int) -> None:
    """Choose the key-tile size (128: 41 KB shared memory per block; 256 (default): 82 KB,
    with the dynamic shared-memory opt-in).  Scores do not depend on it (a key's score is a
    function of that key alone)."""
    if n not in TILES:
        raise ValueError(f"tile: expected one of {TILES}, got {n!r}")
    _state["tile"] = int(n)


@functools.cache
def module(tile_n: int = 128, defines: tuple = ()):
    """kernels.cu built for ``tile_n`` keys per tile, plus ``defines`` ("NAME=VALUE"): one
    cached module per combination."""
    cp = cupy_or_raise()
    # DOSA_SCREEN_UNROLL: batches per trip of the screening loop (a tuning experiment,
    # docs/records/notes.md v8); it changes scheduling only, never a value.
    unroll = int(os.environ.get("DOSA_SCREEN_UNROLL", "2"))
    if unroll not in (1, 2, 4):
        raise ValueError(f"DOSA_SCREEN_UNROLL: expected 1, 2 or 4, got {unroll!r}")
    opts = OPTIONS + (f"-DDOSA_TILE_N={int(tile_n)}", f"-DDOSA_SCREEN_UNROLL={unroll}")
    opts += tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=source_text(KERNEL_FILE), options=opts, backend="nvrtc")


def source_text(path: Path) -> str:
    """The text of a .cu file plus a comment holding the hash of every file in csrc/: CuPy's
    kernel cache is keyed by the code string and the options only, so without it an edited
    included stage file (screen.cu, common.cuh, ...) would reuse a stale cached build."""
    h = hashlib.sha256()
    for f in sorted(CSRC.glob("*.cu*")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return Path(path).read_text() + f"\n// csrc sha256 {h.hexdigest()}\n"


def kernel(name: str, smem: int = 0, defines: tuple = ()):
    """Kernel ``name`` of the module built for the current tile size (and ``defines``);
    raises the dynamic shared-memory limit when a launch needs more than 48 KB."""
    f = module(tile(), tuple(defines)).get_function(name)
    if smem > 48 * 1024:
        raise_smem_limit(f, smem, name, tile(), tuple(defines))
    return f


@functools.cache
def source_module(path: Path, defines: tuple = ()):
    """``cupy.RawModule`` of one .cu file of csrc/ (decode.cu, plan.cu)
    with the package's NVRTC options plus ``defines`` ("NAME=VALUE")."""
    cp = cupy_or_raise()
    opts = OPTIONS + tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=source_text(path), options=opts, backend="nvrtc")


def raise_smem_limit(f, smem: int, *key):
    """Raise kernel ``f``'s dynamic shared-memory limit to at least ``smem`` bytes (the
    attribute belongs to the loaded function, i.e. to each device's copy, named by the
    device and ``key``; the default limit of 48 KB counts static and dynamic shared memory
    together).  The limit only ever grows: one value per function serves every launch of
    it, so a smaller request never lowers what a larger launch of the same function needs."""
    k = (cupy_or_raise().cuda.Device().id, *key)
    if _opted.get(k, 0) < smem:
        f.max_dynamic_shared_size_bytes = int(smem)  # RawKernel → cuFuncSetAttribute
        _opted[k] = int(smem)
    return f


_opted: dict = {}
