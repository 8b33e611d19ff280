"""Host-side mirrors of the device conventions (no GPU needed): e4m3 decoding, the monotone
score code and record order of the selection kernel (METHOD.md §9), used by tests and by
the planner.  Quantization itself is ``dosa_ref.fp8.quantize_keys`` (the GPU kernel is
tested bit-for-bit against it).
"""

from __future__ import annotations

import numpy as np

from dosa_ref.fp8 import E4M3, e4m3_bits, e4m3_values

__all__ = ["E4M3", "e4m3_bits", "e4m3_values", "record_order", "score_code"]


def score_code(s: np.ndarray) -> np.ndarray:
    """Monotone uint32 code of float32 scores (−0 → +0, NaN → 0): mirrors common.cuh."""
    f = np.asarray(s, dtype=np.float32).copy()
    f[f == 0] = 0.0
    b = f.view(np.uint32)
    code = np.where(b & np.uint32(0x80000000), ~b, b | np.uint32(0x80000000)).astype(np.uint32)
    code[np.isnan(f)] = 0
    return code


def record_order(scores: np.ndarray, ids: np.ndarray, K: int) -> np.ndarray:
    """The first K ids under (score desc, id asc) by the device's code order."""
    code = score_code(scores).astype(np.int64)
    order = np.lexsort((ids, -code))
    return ids[order[:K]]
