"""The canonical GPU scorer's launch (docs/method.md §1): the dense logits kernel
(``dense_logits_mt*``, csrc/dense.cu over ``dosa::Scorer::score``) on head-padded inputs, and
the exact overflow check of the scorer's domain built on it.  The lowest layer of the
routes: ``prepare`` (the value checks), ``dense`` and every stage that scores keys import it,
and it imports only the build.
"""

from __future__ import annotations

import numpy as np

from ._build import cupy_or_raise, kernel, tile

__all__ = ["MMA_BITS", "QG", "ROWB", "overflowing_scores", "valid_scales"]

_F32_MAX = np.float32(np.finfo(np.float32).max)


def valid_scales(ksc):
    """bool [N]: key scales the canonical score is defined on (0 ≤ α ≤ FLT_MAX: not
    negative, NaN or inf; the others are recovered by the dense route, docs/method.md §7
    C.3).  Comparisons only, so numpy and CuPy arrays alike."""
    return (ksc >= 0) & (ksc <= _F32_MAX)


ROWB = 320  # bytes per f16 shared-memory key row (csrc/common.cuh ROWH)
# The canonical scorer's error model (docs/error_model.md, docs/numerics.md "The mma.sync
# accumulator"): the f16 m16n8k16 chain keeps W = 17 bits of each step's aligned sum, the
# largest window consistent with every crafted probe on the H200.  A property of the scorer
# that every plan allowance is derived from, not an option: a larger W would make the bound
# unsound.
MMA_BITS = 17
QG = 64  # queries per dense block (keys of a tile are reused by QG queries)


def _dense_logits_raw(q, w, kp, ksc, ks, ke):
    """The canonical logits of every key for queries already padded to a multiple of 16
    heads (``prepare.pad_heads``): fp32 [Qn, N], −inf where a key is not visible."""
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    N = kp.shape[0]
    out = cp.empty((Qn, N), dtype=cp.float32)
    if Qn == 0 or N == 0:
        return out
    T = tile()
    grid = ((N + T - 1) // T, (Qn + QG - 1) // QG)
    smem = T * ROWB + T * 4
    kernel(f"dense_logits_mt{Hp // 16}", smem)(
        grid,
        (256,),
        (q, w, kp, ksc, ks, ke, np.int32(Qn), np.int64(N), np.int32(QG), out),
        shared_mem=smem,
    )
    return out


def overflowing_scores(q, w, kp, ksc, ks, ke) -> bool:
    """True when one of the queries has a visible key with a valid scale (α ≥ 0, finite)
    whose canonical fp32 score is not finite (docs/method.md §1 "The scorer's domain").
    q uint8 [n, Hp, 128], w fp32 [n, Hp] padded (``prepare.pad_heads``), kp, ksc, ks / ke
    int32 [n]: the queries the envelope flagged (``prepare.ValueCheck``), scored in full in
    blocks of at most 1 GiB of logits."""
    cp = cupy_or_raise()
    n, N = int(q.shape[0]), int(kp.shape[0])
    if n == 0:
        return False
    cols = cp.arange(N, dtype=cp.int32)[None, :]
    valid = valid_scales(ksc)[None, :]
    step = max(1, (1 << 30) // max(1, 4 * N))
    for a in range(0, n, step):
        b = min(n, a + step)
        lg = _dense_logits_raw(q[a:b], w[a:b], kp, ksc, ks[a:b], ke[a:b])
        vis = (cols >= ks[a:b, None]) & (cols < ke[a:b, None]) & valid
        if bool((vis & ~cp.isfinite(lg)).any()):
            return True
    return False
