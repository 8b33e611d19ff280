"""Inputs and the prepare stage (docs/method.md §8): device arrays from CuPy or any DLPack
tensor, validation (ValueError naming the argument), GPU key quantization bit-identical
to ``dosa_ref.fp8.quantize_keys``, and the conservative RMS summary ρ per key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dosa_ref.validate import as_array, check_int_dtype, check_K

from ._build import cupy_or_raise, kernel, num_sms, read_back_async
from .scorer import check_scorer, overflowing_scores, padded_heads, valid_scales

__all__ = [
    "D",
    "Batch",
    "as_device",
    "check_inputs",
    "check_selection_K",
    "check_values",
    "envelope_queries",
    "SCORE_OVERFLOW",
    "ValueCheck",
    "key_rho",
    "pad_batch",
    "pad_heads",
    "quantize_keys",
]

D = 128  # head dimension of the kernels (DSA indexers: D = 128)
MAX_KEYS = 2**31 - 64  # key ids are int32 in the kernels (ids + a tile's slack stay < 2^31)


def as_device(x, name: str, dtype=None):
    """CuPy view of ``x`` (CuPy array, DLPack tensor such as torch, or host array).

    torch fp8 tensors are viewed as uint8 bit patterns first (no copy); numpy ml_dtypes
    fp8 arrays likewise.  ``dtype``: the required dtype (ValueError otherwise).
    """
    cp = cupy_or_raise()
    if x is None:
        raise ValueError(f"{name}: missing")
    mod = type(x).__module__
    if mod.startswith("torch"):
        if "float8" in str(x.dtype):
            x = x.view(__import__("torch").uint8)
        x = cp.from_dlpack(x)
    elif isinstance(x, cp.ndarray):
        pass
    elif (
        hasattr(x, "__cuda_array_interface__")
        or hasattr(x, "__dlpack__")
        and not isinstance(x, np.ndarray)
    ):
        x = cp.from_dlpack(x) if hasattr(x, "__dlpack__") else cp.asarray(x)
    else:
        a = as_array(x, name)  # None, a ragged list: named here, not by numpy
        if a.dtype.kind == "V" or "float8" in str(a.dtype):
            a = a.view(np.uint8)
        elif a.dtype.kind in "OSU":  # CuPy holds no objects or strings: name it first
            raise ValueError(f"{name}: expected a numeric array, got dtype {a.dtype}")
        x = cp.asarray(a)
    if dtype is not None and x.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    return x


# check_inputs' value checks, in the order they are reported
_VALUE_ERRORS = (
    "q: contains e4m3 NaN codes",
    "k_payload: contains e4m3 NaN codes",
    "w: contains non-finite values (nan or inf)",
    "ks: entries must lie in [0, N={N}]",
    "ke: entries must lie in [0, N={N}]",
)
CHECK_ORDER = 1 << len(_VALUE_ERRORS)  # check_values' bit for "some ks > ke"
CHECK_ENVELOPE = CHECK_ORDER << 1  # some query's scores may overflow fp32 (envelope_queries)
# some key scale is invalid (negative, NaN, inf): not an error — the queries that see one are
# recovered by the dense route (docs/method.md §7 C.3); with CHECK_ENVELOPE clear as well, the
# host knows that no query needs recovery (Batch.recovery_known_empty)
SCALES_INVALID = CHECK_ENVELOPE << 1

# The scale and envelope checks by one kernel (csrc/prepare.cu check_scales) instead of ~15
# array operations, the prepare stage's largest line (docs/records/benchmarks.md "the
# per-row constants' kernel, on an H100"): the array path's flag word on the H200, 0.8–1.2 ms
# faster per call (benchmarks.md "The scale-check and route-count kernels"; bench
# builds=scalearrays times the array path).
SCALE_CHECK_KERNEL = True

# A DoSA call's value checks read back by an event once its seed stage is queued, instead of
# by a synchronization before it, so that the host queues the seeds while the GPU checks
# (the launches queued before the read-back run on the ranges clamped into [0, N] with
# ks ≤ ke: ``ValueCheck``; bad input still raises before anything is screened or returned).
# The seed stage is host-bound at 128K keys (docs/records/benchmarks.md "The finish's counts
# in one read-back; the sample behind a gate"); on an H100 the deferred read-back was
# 1.01–1.12× faster per call with equal ids (benchmarks.md "The decode step's bookkeeping
# folded; the value checks deferred"). Bench build syncchecks reads them back before the
# seeds.
DEFER_CHECKS = True

# The GPU scorer's domain (docs/method.md §1 "The scorer's domain"): every visible key with a
# valid scale (α ≥ 0, finite) has a finite fp32 score, or every route raises this.
SCORE_OVERFLOW = (
    "w, k_scale: a visible key's score overflows fp32 (|w|·|q|·|k| too large; docs/method.md §1)"
)
# |q̄_h·k̄_i| ≤ D·448² = 25,690,112 < 2^25 for e4m3 payloads; a query whose
# Σ_h |w'_h| · 2^25 · max(1, max α) is at most 2^125 keeps every fp32 intermediate of
# score_batch (the MMA dot, the head sum, the product by α) below 2^126 < FLT_MAX, as the
# accumulations' rounding grows a sum by far less than a factor 2 (docs/method.md §1).
_DOT_BOUND = 2.0**25
ENVELOPE_MAX = 2.0**125


def envelope_queries(w, ksc):
    """Queries whose fp32 scores the envelope cannot prove finite: bool [Qn] on the device.

    w fp32 [Qn, H] (padded heads have weight 0), ksc fp32 [N]; the largest *valid* scale
    bounds α (invalid scales are recovered by the dense route, docs/method.md §7 C.3).  No
    synchronization (capturable).  A flagged query is recovered by the dense route on every
    route, and with the value checks on, its scores are checked exactly
    (``ValueCheck.raise_if_bad``)."""
    cp = cupy_or_raise()
    wsum = cp.abs(w).astype(cp.float64).sum(axis=1)
    if ksc.size == 0:  # no key: no score
        return cp.zeros(wsum.shape, dtype=cp.bool_)
    amax = cp.where(valid_scales(ksc), ksc, cp.float32(0)).max().astype(cp.float64)
    return wsum * (_DOT_BOUND * cp.maximum(amax, 1.0)) > ENVELOPE_MAX


def check_selection_K(K) -> int:
    """K as the reference takes it (an int, a numpy integer or a 0-d integer array; a 0-d
    device array is read back first; a float or a bool raises, dosa_ref.validate.check_K),
    at most 4096 (the selection kernel's limit, which takes the place of the reference's
    K_MAX, so a huge K is told the limit that applies here): int."""
    K = K.get() if getattr(K, "ndim", None) == 0 and hasattr(K, "get") else K
    return check_K(K, max_K=4096, why="the selection kernel's limit")


def check_inputs(q, w, k_payload, k_scale, K, ks, ke, check: bool = True, defer: bool = False):
    """Validate and convert the DeepGEMM/SGLang layout; returns contiguous CuPy arrays.

    q: e4m3 payload [Qn, H, D] (uint8 bits or an fp8 tensor); w: fp32 [Qn, H] (query scale
    folded in); k_payload: e4m3 [N, D]; k_scale: fp32 [N]; ks/ke: int32 [Qn] (default: all
    keys visible).  Invalid key *scales* are not rejected here: they trigger query-level
    recovery (docs/method.md §7 C.3).  NaN payload codes and non-finite weights are rejected.
    Shapes and dtypes are always checked on the host; ``check=False`` skips the value checks
    (NaN codes, finite weights, ranges in [0, N], ks ≤ ke) for a caller that validated its
    inputs — then the call neither synchronizes nor checks them, and invalid values are
    undefined behaviour (a range outside [0, N] reads out of bounds).  With ``defer`` the
    value checks are launched but not read back: the result has an eighth element, the
    ``ValueCheck`` (None without ``check``), whose ``raise_if_bad`` the caller must call
    before it returns; the ranges returned are then clamped into [0, N] (ks ≤ ke), so work
    launched before that stays in bounds.
    """
    cp = cupy_or_raise()
    K = check_selection_K(K)
    q = cp.ascontiguousarray(as_device(q, "q", np.uint8))
    w = as_device(w, "w")
    if w.dtype != np.float32:
        raise ValueError(f"w: expected dtype float32, got {w.dtype}")
    w = cp.ascontiguousarray(w)
    kp = cp.ascontiguousarray(as_device(k_payload, "k_payload", np.uint8))
    ksc = as_device(k_scale, "k_scale")
    if ksc.dtype != np.float32:
        raise ValueError(f"k_scale: expected dtype float32, got {ksc.dtype}")
    ksc = cp.ascontiguousarray(ksc)
    if q.ndim != 3 or q.shape[2] != D:
        raise ValueError(f"q: expected shape [Qn, H, {D}], got {tuple(q.shape)}")
    Qn, H, _ = q.shape
    if H < 1 or H > 64:
        raise ValueError(f"q: need 1 <= H <= 64 heads, got {H}")
    if w.shape != (Qn, H):
        raise ValueError(f"w: expected shape {(Qn, H)} to match q, got {tuple(w.shape)}")
    if kp.ndim != 2 or kp.shape[1] != D:
        raise ValueError(f"k_payload: expected shape [N, {D}], got {tuple(kp.shape)}")
    N = kp.shape[0]
    if N >= MAX_KEYS:
        raise ValueError(f"k_payload: N={N} too large for int32 key ids")
    if ksc.shape != (N,):
        raise ValueError(f"k_scale: expected shape ({N},), got {tuple(ksc.shape)}")
    out = []
    for name, v, default in (("ks", ks, 0), ("ke", ke, N)):
        if v is None:
            out.append(cp.full(Qn, default, dtype=cp.int32))
            continue
        a = as_device(v, name)
        check_int_dtype(a, name)  # integer dtypes only, as dosa_ref.validate.int_array
        if a.shape != (Qn,):
            raise ValueError(f"{name}: expected shape ({Qn},), got {tuple(a.shape)}")
        out.append(a)
    vc = None
    if check:
        vc = ValueCheck(q, w, kp, out[0], out[1], N, ksc)
        ks_, ke_ = vc.ks, vc.ke
        if not defer:
            vc.raise_if_bad()
    else:
        ks_, ke_ = (cp.ascontiguousarray(a.astype(cp.int32, copy=False)) for a in out)
    res = (q, w, kp, ksc, int(K), ks_, ke_)
    return (*res, vc) if defer else res


class ValueCheck:
    """The value checks of one call (``check_inputs``), launched in one kernel
    (``check_values_i32`` / ``_i64``, csrc/prepare.cu; reference
    ``dosa_ref.stages.check_values``) and read back once, by ``flags`` or
    ``raise_if_bad``.

    q uint8 [Qn, H, 128], w fp32 [Qn, H], kp uint8 [N, 128] (C-contiguous CuPy arrays);
    ks, ke integer [Qn] in any integer dtype (other than int32 compared as int64: a uint64
    entry ≥ 2^63 becomes negative and fails the range check, as it lies above N anyway).
    ``self.ks``, ``self.ke``: int32 [Qn], the ranges clamped into [0, N] with ks ≤ ke.
    """

    scorer = "f16"  # the call's scorer, whose scores the overflow check computes (pad_batch)
    _copy = None  # (host flag word, event) of ``prefetch`` until ``flags`` reads it

    def __init__(self, q, w, kp, ks, ke, N: int, ksc=None):
        cp = cupy_or_raise()
        self._given, self._N, self._bad = (ks, ke), int(N), None
        self._inputs = (q, w, kp, ksc)
        if not (ks.dtype == ke.dtype == np.int32):
            ks, ke = ks.astype(cp.int64), ke.astype(cp.int64)
        name = "check_values_i32" if ks.dtype == np.int32 else "check_values_i64"
        ks, ke = cp.ascontiguousarray(ks), cp.ascontiguousarray(ke)
        self._flags = cp.zeros(1, dtype=cp.uint32)
        self.ks, self.ke = cp.empty(ks.shape, cp.int32), cp.empty(ke.shape, cp.int32)
        # the kernel reads q and kp as 16-byte vectors: a view at an odd offset is copied
        q, kp = (a if a.data.ptr % 16 == 0 else a.copy() for a in (q, kp))
        n = max(q.size // 16, kp.size // 16, w.size, ks.size, 1)
        kernel(name)(
            (min(-(-n // 256), 8 * num_sms()),), (256,),
            (q, np.int64(q.size // 16), w, np.int64(w.size), kp, np.int64(kp.size // 16), ks,
             ke, np.int64(ks.size), np.int64(N), self._flags, self.ks, self.ke),
        )  # fmt: skip
        self._flag_envelope(w, ksc)

    def _flag_envelope(self, w, ksc) -> None:
        """The score envelope and the presence of an invalid key scale join the same flag
        word (one read-back; no synchronization): with ``SCALE_CHECK_KERNEL`` by csrc/prepare.cu
        check_scales (one launch), else by array operations (~15)."""
        if ksc is not None and SCALE_CHECK_KERNEL:
            cp = cupy_or_raise()
            acc = cp.zeros(3, dtype=cp.uint64)  # the kernel's two maxima and its block count
            n = max(int(ksc.size), int(w.shape[0]), 1)
            kernel("check_scales")(
                (min(-(-n // 256), 4 * num_sms()),), (256,),
                (ksc, np.int64(ksc.size), w, np.int64(w.shape[0]), np.int32(w.shape[1]),
                 np.float64(_DOT_BOUND), np.float64(ENVELOPE_MAX), acc, self._flags,
                 np.uint32(CHECK_ENVELOPE), np.uint32(SCALES_INVALID)),
            )  # fmt: skip
        elif ksc is not None:
            env = envelope_queries(w, ksc).any()
            self._flags |= env.astype(np.uint32) * np.uint32(CHECK_ENVELOPE)
            some = (~valid_scales(ksc)).any()
            self._flags |= some.astype(np.uint32) * np.uint32(SCALES_INVALID)

    def flag_word(self):
        """The flag word on the device (uint32 0-d; ``flags`` without the read-back)."""
        return self._flags[0]

    @property
    def read(self) -> bool:
        """Whether the flags of this call's inputs have been read back (``flags``)."""
        return self._bad is not None

    def forget(self) -> None:
        """Read the flags again on the next ``flags`` (a captured step's replay wrote them
        anew, capture.py)."""
        self._bad = self._copy = None

    def prefetch(self) -> None:
        """Copy the flag word to the host by an event (``_build.read_back_async``: it waits
        for the checks, not for what is queued after them); ``flags`` then waits for that
        event instead of synchronizing the stream (``DEFER_CHECKS``)."""
        if self._bad is None and self._copy is None:
            self._copy = read_back_async(self._flags)

    @property
    def flags(self) -> int:
        """Bit i set when check i of ``_VALUE_ERRORS`` fails, ``CHECK_ORDER`` when some
        ks > ke (read the first time: one synchronization, or after ``prefetch`` the wait
        for its copy's event)."""
        if self._bad is None and self._copy is not None:  # prefetched: wait for its event
            self._copy[1].synchronize()
            self._bad, self._copy = int(self._copy[0][0]), None
        elif self._bad is None:
            self._bad = int(cupy_or_raise().asnumpy(self._flags)[0])
        return self._bad

    def raise_if_bad(self) -> None:
        """ValueError naming the argument of the first failing check, in the order of
        ``_VALUE_ERRORS``, then ks > ke with its first row, then ``SCORE_OVERFLOW`` where a
        query flagged by the envelope has a visible non-finite score (checked exactly)."""
        bad = self.flags
        for bit, msg in enumerate(_VALUE_ERRORS):
            if bad >> bit & 1:
                raise ValueError(msg.format(N=self._N))
        if bad & CHECK_ORDER:
            cp = cupy_or_raise()
            ks, ke = (a.astype(cp.int64) for a in self._given)
            t = int(cp.argmax(ks > ke))
            raise ValueError(f"ks: ks[{t}] > ke[{t}]")
        if bad & CHECK_ENVELOPE:  # the flagged queries scored exactly
            q, w, kp, ksc = self._inputs
            rows = cupy_or_raise().flatnonzero(envelope_queries(w, ksc))
            qp, wp = pad_heads(q[rows], w[rows], self.scorer)
            if overflowing_scores(qp, wp, kp, ksc, self.ks[rows], self.ke[rows], self.scorer):
                raise ValueError(SCORE_OVERFLOW)


def check_values(q, w, kp, ks, ke, N: int) -> int:
    """``ValueCheck(...).flags``: the value checks' flag word (see ``ValueCheck``)."""
    return ValueCheck(q, w, kp, ks, ke, N).flags


def pad_heads(q, w, scorer: str = "f16"):
    """Pad heads to the ``scorer``'s count (``scorer.padded_heads``: a multiple of 16, or 32 /
    64 for "fp8") with zero payload and zero weight (adds exact +0 terms to the head sum, so
    scores are those of the padded problem on every route)."""
    cp = cupy_or_raise()
    Qn, H, _ = q.shape
    Hp = padded_heads(H, scorer)
    if Hp == H:
        return q, w
    qp = cp.zeros((Qn, Hp, D), dtype=cp.uint8)
    qp[:, :H] = q
    wp = cp.zeros((Qn, Hp), dtype=cp.float32)
    wp[:, :H] = w
    return qp, wp


@dataclass(frozen=True)
class Batch:
    """The checked, head-padded inputs of one call (``pad_batch``), passed to every stage.

    q uint8 [Qn, Hp, 128] with Hp = 16·mth (``scorer.padded_heads`` of the call's scorer),
    w fp32 [Qn, Hp], kp uint8 [N, 128], ksc fp32 [N], ks / ke int32 [Qn] (visible ranges
    [ks, ke)), K the selection size, H the heads before padding (None: Hp), ``scorer`` the
    call's canonical scorer.  Device arrays (numpy in the CPU tests).
    """

    q: object
    w: object
    kp: object
    ksc: object
    K: int
    ks: object
    ke: object
    H: int | None = None
    pending: ValueCheck | None = None  # value checks not yet read back (pad_batch's defer)
    scorer: str = "f16"  # the canonical scorer every stage of the call scores with (scorer.py)

    def raise_if_bad(self) -> None:
        """Read back the deferred value checks (one synchronization, or the wait for a
        ``prefetch_checks`` copy) and raise on bad input; nothing when the checks were off
        or already read."""
        if self.pending is not None:
            self.pending.raise_if_bad()

    def prefetch_checks(self) -> None:
        """Start the value checks' read-back by an event (``ValueCheck.prefetch``;
        ``DEFER_CHECKS``): ``raise_if_bad`` later waits for the checks only."""
        if self.pending is not None:
            self.pending.prefetch()

    def recovery_known_empty(self) -> bool:
        """True when this call's value checks ran, were read back (``raise_if_bad``) and
        saw no invalid key scale and no query the envelope flags — then no query needs
        query-level recovery (``select.recovery_queries``), which the host knows without
        device work; False otherwise (checks off, not read yet — a captured step's are read
        only after its replay —, or something flagged)."""
        vc = self.pending
        return vc is not None and vc.read and not vc.flags & (SCALES_INVALID | CHECK_ENVELOPE)

    @property
    def heads(self) -> int:
        """Heads of the problem before padding (the statistics' unit of work)."""
        return self.q.shape[1] if self.H is None else self.H

    @property
    def Qn(self) -> int:
        return self.q.shape[0]

    @property
    def mth(self) -> int:
        """Head tiles of 16 (the ``_mt{mth}`` instance of the full-head kernels)."""
        return self.q.shape[1] // 16

    @property
    def N(self) -> int:
        return self.kp.shape[0]

    @property
    def visible(self):
        """Visible keys of each query, int64 [Qn] (a device array): ke − ks."""
        return self.ke.astype("int64") - self.ks.astype("int64")

    @property
    def NW(self) -> int:
        """uint32 words of a key bitmask row."""
        return (self.N + 31) // 32

    def rows(self, idx) -> Batch:
        """The sub-problem of queries ``idx`` (an integer array of rows; same keys; the
        overflow extension, recovery, anchors, the sampled decision).  By ``take``, not
        ``a[idx]``: CuPy's advanced indexing first prepares a general index on the host, and
        a sampled call makes two sub-batches while its GPU waits for the host
        (docs/records/benchmarks.md "The sampled decision's host work")."""

        def take(a):
            return a.take(idx, axis=0)

        return Batch(take(self.q), take(self.w), self.kp, self.ksc, self.K, take(self.ks),
                     take(self.ke), self.H, scorer=self.scorer)  # fmt: skip


def pad_batch(q, w, k_payload, k_scale, K, ks=None, ke=None, check: bool = True,
              defer: bool = False, scorer: str = "f16") -> Batch:  # fmt: skip
    """``check_inputs`` (``check``: with the value checks; ``defer``: not yet read back —
    the caller calls ``Batch.raise_if_bad`` before it returns) then ``pad_heads`` for the
    ``scorer`` (checked: ``scorer.check_scorer``): the ``Batch`` of one call."""
    scorer = check_scorer(scorer)
    *inputs, vc = check_inputs(q, w, k_payload, k_scale, K, ks, ke, check, defer=True)
    if vc is not None:
        vc.scorer = scorer
        if not defer:
            vc.raise_if_bad()
    q, w, kp, ksc, K, ks, ke = inputs
    H = q.shape[1]
    q, w = pad_heads(q, w, scorer)
    return Batch(q, w, kp, ksc, K, ks, ke, H, vc if defer else None, scorer)


def _launch_tokens(name, N, *args):
    if N == 0:
        return
    warps = 8
    kernel(name)(((N + warps - 1) // warps,), (32 * warps,), args)


def quantize_keys(k, scale_fmt: str = "amax"):
    """GPU quantization of keys [N, 128] → (payload uint8 [N, 128], scale fp32 [N], ρ fp32 [N]).

    Bit-identical to ``dosa_ref.fp8.quantize_keys`` (tests/test_gpu.py), ρ ≥ ‖k̄‖/√D.
    """
    cp = cupy_or_raise()
    fmts = {"amax": 0, "ue8m0": 1}
    if scale_fmt not in fmts:
        raise ValueError(f"scale_fmt: expected one of {tuple(fmts)}, got {scale_fmt!r}")
    k = as_device(k, "k")
    if k.ndim != 2 or k.shape[1] != D:
        raise ValueError(f"k: expected shape [N, {D}], got {tuple(k.shape)}")
    if k.dtype.kind != "f":
        raise ValueError(f"k: expected a float array, got dtype {k.dtype}")
    k = cp.ascontiguousarray(k.astype(cp.float32))
    if not bool(cp.all(cp.isfinite(k))):
        raise ValueError("k: contains non-finite values (nan or inf)")
    N = k.shape[0]
    payload = cp.empty((N, D), dtype=cp.uint8)
    scale = cp.empty(N, dtype=cp.float32)
    rho = cp.empty(N, dtype=cp.float32)
    _launch_tokens(
        "quantize_keys_kernel", N, k, np.int64(N), np.int32(fmts[scale_fmt]), payload, scale, rho
    )
    return payload, scale, rho


# key_rho by key_rho_int_kernel (csrc/prepare.cu: eight lanes per key, the squares summed as
# integers; the same ρ bit for bit, docs/method.md §8 "ρ from integer squares"): 2.6× faster
# than key_rho_kernel at 1M keys on an H100 (docs/records/benchmarks.md "The selection's
# loads and ρ from integer squares"); bench build rhofloat keeps key_rho_kernel.
RHO_INT = True


def key_rho(k_payload):
    """ρ_i (fp32, rounded up) with ρ_i·√D ≥ ‖k̄_i‖ for e4m3 payloads [N, 128]."""
    cp = cupy_or_raise()
    kp = cp.ascontiguousarray(as_device(k_payload, "k_payload", np.uint8))
    N = kp.shape[0]
    rho = cp.empty(N, dtype=cp.float32)
    if RHO_INT and N and kp.data.ptr % 16 == 0:  # its 16-byte loads
        kernel("key_rho_int_kernel")((-(-8 * N // 256),), (256,), (kp, np.int64(N), rho))
    else:
        _launch_tokens("key_rho_kernel", N, kp, np.int64(N), rho)
    return rho
