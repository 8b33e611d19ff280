"""Build and cache the CUDA module (``csrc/kernels.cu``) through ``cupy.RawModule``.

CuPy compiles for the device's own architecture (sm_90 on the H200) and appends
``-ftz=true`` (NUMERICS.md): every guard computation in the kernels that must round
upward is therefore done in fp64 with ``__d*_ru`` intrinsics (METHOD.md §8).
"""

from __future__ import annotations

import functools
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_FILE = CSRC / "kernels.cu"
OPTIONS = ("-std=c++17", f"-I{CSRC}")


def cupy_or_raise():
    try:
        import cupy
    except Exception as e:  # pragma: no cover - exercised only without CuPy
        raise RuntimeError(f"dosa_cupy needs CuPy and an NVIDIA GPU: {e}") from e
    return cupy


@functools.cache
def module():
    cp = cupy_or_raise()
    return cp.RawModule(code=KERNEL_FILE.read_text(), options=OPTIONS, backend="nvrtc")


def kernel(name: str):
    return module().get_function(name)
