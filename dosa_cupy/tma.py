"""Tensor maps of the bulk tensor copy engine (TMA, docs/design.md "Kernel sources"): the
driver's ``cuTensorMapEncodeTiled`` called through ctypes (CuPy exposes no binding), the
128-byte result handed to a kernel by value as a ``dosa::TensorMap`` (csrc/ptx_sm90a.cuh)
— a NumPy structured scalar of ``TMAP_DTYPE``, which CuPy passes as a struct.  A kernel
takes its maps as its first parameters, so each lies at a 64-byte-aligned offset of the
parameter buffer as the copy engine requires (128-byte maps from offset 0).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

__all__ = ["SWIZZLE", "TMAP_DTYPE", "tensor_map_2d"]

TMAP_DTYPE = np.dtype([("w", np.uint64, (16,))])  # csrc/ptx_sm90a.cuh dosa::TensorMap
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B}
_UINT8 = 0  # CU_TENSOR_MAP_DATA_TYPE_UINT8
_L2_256B = 3  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B


@functools.cache
def _encode():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuTensorMapEncodeTiled
    f.restype = ctypes.c_int
    u32, u64p, u32p = (
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
    )
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # fmt: skip
    return f


def tensor_map_2d(arr, box_rows: int, box_cols: int, swizzle: int = 128) -> np.void:
    """The tensor map of a C-contiguous 2-D uint8 CuPy array ``arr`` [rows, cols] for boxes of
    ``box_rows`` × ``box_cols`` bytes copied into shared memory with a ``swizzle``-byte swizzle
    (rows past the end read as zeros).  Returns a ``TMAP_DTYPE`` scalar (a kernel argument)."""
    if arr.dtype != np.uint8 or arr.ndim != 2 or not arr.flags.c_contiguous:
        raise ValueError("arr: expected a C-contiguous 2-D uint8 array")
    if swizzle not in SWIZZLE:
        raise ValueError(f"swizzle: expected one of {sorted(SWIZZLE)}, got {swizzle!r}")
    rows, cols = (int(x) for x in arr.shape)
    if cols % 16 or not (1 <= box_cols <= 256 and 1 <= box_rows <= 256):
        raise ValueError("box_rows, box_cols: 1..256 each, and cols a multiple of 16 bytes")
    if swizzle and box_cols > swizzle:
        raise ValueError(f"box_cols: at most the swizzle width {swizzle}, got {box_cols}")
    out = np.zeros(1, dtype=TMAP_DTYPE)
    dims = (ctypes.c_uint64 * 2)(cols, max(rows, 1))
    strides = (ctypes.c_uint64 * 1)(cols)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encode()(out.ctypes.data, _UINT8, 2, ctypes.c_void_p(int(arr.data.ptr)), dims, strides,
                   box, estr, 0, SWIZZLE[swizzle], _L2_256B, 0)  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc}")
    return out[0]
