"""The canonical GPU scorer (docs/method.md §1) behind one seam: its name, the head padding
its kernels take, the error model every plan allowance derives from, and its dense logits —
with the exact overflow check of the scorer's domain built on them.  The lowest layer of the
routes: ``prepare`` (the value checks), ``dense`` and every stage that scores keys import it,
and it imports only the build.

Two scorers (``SCORERS``, the ``scorer`` option of every route; one per call, every stage of
the call scores with it, so a key's score has the same bits in the dense route, the seeds
and refinement):

* "f16": the f16 m16n8k16 ``mma.sync`` chain of csrc/scorer.cuh (``dense_logits_mt*``,
  csrc/dense.cu), on every GPU; heads padded to a multiple of 16.
* "fp8": the native FP8 scorer of csrc/scorer_fp8.cuh — e4m3 ``wgmma`` k32 steps from fresh
  accumulators, added in k order, then the fixed head-sum tree (docs/error_model.md "A
  native FP8 scorer"; host model ``dosa_ref.mma_model.fp8_fresh_scores``) — sm_90a only
  (csrc/dense_fp8.cu for the dense logits, csrc/score_fp8.cu for gathered keys); heads
  padded to 32 or 64 (zero rows and weights add exact +0 terms: the padded problem's bits).
"""

from __future__ import annotations

import functools

import numpy as np

from ._build import KernelSpec, cupy_or_raise, kernel, tile
from .tma import tensor_map_2d

__all__ = [
    "FP8_DENSE",
    "MMA_BITS",
    "QG",
    "ROWB",
    "SCORERS",
    "check_scorer",
    "dense_logits_raw",
    "fp8_available",
    "fp8_dense_logits",
    "padded_heads",
    "overflowing_scores",
    "plan_scorer",
    "valid_scales",
]

SCORERS = ("f16", "fp8")

_F32_INF_BITS = np.uint32(0x7F800000)  # +inf; every smaller pattern is +0 … FLT_MAX
_F32_NEG_ZERO_BITS = np.uint32(0x80000000)


def valid_scales(ksc):
    """bool [N]: key scales the canonical score is defined on (0 ≤ α ≤ FLT_MAX: not
    negative, NaN or inf; the others are recovered by the dense route, docs/method.md §7
    C.3).  ksc fp32 [N], numpy or CuPy.  Decided on the bits — +0 up to FLT_MAX, or −0 —
    because CuPy's kernels flush subnormal operands (docs/numerics.md "CuPy and CUDA
    compilation"): a float compare on the device would take a negative subnormal for −0 and
    call it valid where numpy and csrc/prepare.cu check_scales call it negative."""
    b = ksc.view(np.uint32)
    return (b < _F32_INF_BITS) | (b == _F32_NEG_ZERO_BITS)


ROWB = 320  # bytes per f16 shared-memory key row (csrc/common.cuh ROWH)
# The canonical scorer's error model (docs/error_model.md, docs/numerics.md "The mma.sync
# accumulator"): the f16 m16n8k16 chain keeps W = 17 bits of each step's aligned sum, the
# largest window consistent with every crafted probe on the H200.  A property of the scorer
# that every plan allowance is derived from, not an option: a larger W would make the bound
# unsound.
MMA_BITS = 17
QG = 64  # queries per dense block (keys of a tile are reused by QG queries)


# The FP8 scorer's specs (csrc/score_fp8.cu, csrc/dense_fp8.cu: sm_90a cubins) and the dense
# logits build each padded head count runs: (build, columns per MMA, query tiles per stage,
# consumer warpgroups) — the fastest fresh build of each H in one run (docs/records/
# benchmarks.md "FP8 dense logits: lean builds"; bench/fp8_dense.py times every build).
# Every build computes the same bits (tests/test_gpu_fp8_probe.py).
FP8_DENSE = {64: ("lean_n128q4_w3_seq", 128, 4, 3), 32: ("lean_n128q4_w3_seq", 128, 4, 3)}
FP8_SPEC = KernelSpec("score_fp8.cu", (), sm90a=True)
FP8_TILE = 64  # keys (or ids) per tile of score_fp8.cu's key rings (kTileBytes / 128)
FP8_DENSE_SPEC = KernelSpec("dense_fp8.cu", (), sm90a=True)


def check_scorer(scorer, device: bool = True) -> str:
    """The ``scorer`` option checked: one of ``SCORERS``; with ``device``, "fp8" only where
    it runs (``fp8_available``; ``device=False``: the name alone, before any device work).
    ValueError naming the option otherwise."""
    if not isinstance(scorer, str) or scorer not in SCORERS:
        raise ValueError(f"scorer: expected one of {SCORERS}, got {scorer!r}")
    if device and scorer == "fp8" and not fp8_available():
        raise ValueError("scorer: 'fp8' needs a compute-capability-9.0 GPU (sm_90a wgmma)")
    return scorer


@functools.cache
def _fp8_device(dev: int) -> bool:
    cp = cupy_or_raise()
    return cp.cuda.Device(dev).compute_capability == "90"


def fp8_available() -> bool:
    """True on a GPU that runs the FP8 scorer's sm_90a kernels (compute capability 9.0)."""
    try:
        cp = cupy_or_raise()
        return _fp8_device(cp.cuda.Device().id)
    except Exception:
        return False


def padded_heads(H: int, scorer: str) -> int:
    """Heads the ``scorer``'s kernels take for H ≤ 64 real heads: a multiple of 16 (f16),
    32 or 64 (fp8)."""
    if scorer == "fp8":
        return 32 if H <= 32 else 64
    return -(-H // 16) * 16


def plan_scorer(scorer: str) -> str:
    """The name of the scorer's arithmetic in ``plan.scorer_allowance`` (the canonical
    error the screen's bound covers): "f16" → "f16", "fp8" → "fp8_fresh"."""
    return "fp8_fresh" if scorer == "fp8" else "f16"


def fp8_dense_smem(nc: int, qt: int, cwg: int) -> int:
    """Dynamic shared memory of a dense_fp8 build: 4 key slots of 64·cwg keys, qt query tiles
    of nc rows of 128 bytes, 8 mbarriers and 1 KB to align to the swizzle atom."""
    return 4 * 8192 * cwg + qt * nc * 128 + 64 + 1024


def fp8_dense_logits(q, w, kp, ksc, ks, ke, build: tuple | None = None, out=None):
    """The FP8 scorer's logits of every key (csrc/dense_fp8.cu): q uint8 [Qn, Hp, 128] with
    Hp = 32 or 64, w fp32 [Qn, Hp], kp uint8 [N, 128] (C-contiguous), ksc fp32 [N], ks / ke
    int32 [Qn] → fp32 [Qn, N], −inf where a key is not visible.  ``build``: (name, columns,
    query tiles, consumer warpgroups), default ``FP8_DENSE[Hp]``."""
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    N = kp.shape[0]
    if out is None:
        out = cp.empty((Qn, N), dtype=cp.float32)
    if Qn == 0 or N == 0:
        return out
    name, nc, qt, cwg = FP8_DENSE[Hp] if build is None else build
    smem = fp8_dense_smem(nc, qt, cwg)
    kp = cp.ascontiguousarray(kp)
    qb = qt * nc // Hp
    # the key stages' tensor map (a driver call, microseconds: encoded per launch rather than
    # cached, since a cache would keep the key array alive)
    kmap = tensor_map_2d(kp, 64 * cwg, 128)
    kernel(f"dense_fp8_h{Hp}_{name}", smem, FP8_DENSE_SPEC)(
        (-(-Qn // qb),), (128 * (1 + cwg),),
        (kmap, cp.ascontiguousarray(q), cp.ascontiguousarray(w), ksc, ks, ke,
         np.int32(Qn), np.int64(N), out),
        shared_mem=smem,
    )  # fmt: skip
    return out


def dense_logits_raw(q, w, kp, ksc, ks, ke, scorer: str = "f16"):
    """The ``scorer``'s logits of every key for queries padded to ``padded_heads``: fp32
    [Qn, N], −inf where a key is not visible."""
    if scorer == "fp8":
        return fp8_dense_logits(q, w, kp, ksc, ks, ke)
    return _dense_logits_raw(q, w, kp, ksc, ks, ke)


def _dense_logits_raw(q, w, kp, ksc, ks, ke):
    """The f16 scorer's logits of every key for queries already padded to a multiple of 16
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


def overflowing_scores(q, w, kp, ksc, ks, ke, scorer: str = "f16") -> bool:
    """True when one of the queries has a visible key with a valid scale (α ≥ 0, finite)
    whose canonical fp32 score is not finite (docs/method.md §1 "The scorer's domain").
    q uint8 [n, Hp, 128], w fp32 [n, Hp] padded (``prepare.pad_heads``), kp, ksc, ks / ke
    int32 [n]: the queries the envelope flagged (``prepare.ValueCheck``), scored in full by
    the ``scorer`` in blocks of at most 1 GiB of logits."""
    cp = cupy_or_raise()
    n, N = int(q.shape[0]), int(kp.shape[0])
    if n == 0:
        return False
    cols = cp.arange(N, dtype=cp.int32)[None, :]
    valid = valid_scales(ksc)[None, :]
    step = max(1, (1 << 30) // max(1, 4 * N))
    for a in range(0, n, step):
        b = min(n, a + step)
        lg = dense_logits_raw(q[a:b], w[a:b], kp, ksc, ks[a:b], ke[a:b], scorer)
        vis = (cols >= ks[a:b, None]) & (cols < ke[a:b, None]) & valid
        if bool((vis & ~cp.isfinite(lg)).any()):
            return True
    return False
