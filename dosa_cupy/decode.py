"""DoSA decode on the GPU (docs/method.md §10; issue 6) over a paged FP8 KV cache.

Layout (DeepGEMM ``fp8_paged_mqa_logits``): the KV cache is stored in blocks of 64 tokens,
``kv_payload`` e4m3 [num_blocks, 64, 128] (uint8 bits or an fp8 tensor) and ``kv_scale``
fp32 [num_blocks, 64]; ``block_table`` int32 [B, max_blocks] maps block ``i // 64`` of
request ``b`` to a cache block; ``lengths`` int32 [B] are context lengths.  Queries are
``q`` e4m3 [B, next_n, H, 128] with ``w`` fp32 [B, next_n, H] (query scales folded in).
Query j of request b sees logical keys ``[0, lengths[b] − next_n + j + 1)`` (clamped at 0:
``dosa_ref.decode``'s rule).  Ids are logical token positions of the request.

Routes (both use the call's canonical scorer, option ``scorer``: "f16", ``dosa::score_batch``
of ``csrc/scorer.cuh`` through ``csrc/decode.cu``, or "fp8" on sm_90a, the native FP8 scorer
through ``csrc/score_fp8.cu``'s decode kernels — so a key's score is the prefill dense route's
value on the same scorer, bit for bit):

    paged_logits(...)            fp32 [B, next_n, L] (L = max_blocks·64; −inf not visible)
    dense_decode_topk(..., K)    paged logits + the exact selection kernel (select.cu)
    DecodeSelectorGPU(K).step()  fused DoSA decode: witnesses → threshold record, one scan
                                 that scores every visible key and compacts the records
                                 at or above it, exact selection of the compact records;
                                 ids == dense bitwise

Exactness of the fused route is ``dosa_ref.decode``'s argument with the GPU scorer as the
original scorer, in record form (docs/method.md §10): the witnesses of a row are *distinct*
(deduplicated on the device) and *visible* (id < ke, checked in the witness kernel), and
each witness score is computed by the same device function on the same key fragments as in
the scan, so the K-th witness record is at or below the K-th record of Ω; every record of
Top-K(Ω) is at or above it and is compacted; a full record buffer is detected (the counter
counts every qualifying record) and the scan is re-run with the exact count as capacity
(never dropping).  The device part (launches, the step's workspace, the numpy emulation)
is ``dosa_cupy.decode_ops``.

Host logic (visible ranges, block-table → cache-row mapping, witness bookkeeping, τ,
overflow extension) is written once for numpy and CuPy (``xp``); ``backend="numpy"`` runs
the selector's step with float64 scores of the dequantized cache (``dosa_ref.scorer``) as
a CPU emulation (tests/test_gpu_decode.py compares it with ``dosa_ref.decode``).

Run records on the H200 (tests/test_gpu_decode.py, compute-sanitizer):
docs/records/gpu_tests.md.
"""

from __future__ import annotations

import numpy as np

from dosa_ref.decode import DecodeStats, DecodeStep
from dosa_ref.validate import as_array, check_int_dtype, check_K

from ._build import cupy_or_raise
from .decode_ops import (
    KMAX,
    PAGE,
    D,
    DeviceOps,
    NumpyOps,
    gather_request_keys,
    layout_device,
    page_rows,
    physical_rows,
    raise_layout,
    scan,
    witness_table,
)  # fmt: skip
from .prepare import MAX_KEYS
from .scorer import check_scorer, padded_heads

__all__ = [
    "PAGE",
    "DecodeSelectorGPU",
    "check_decode_inputs",
    "dense_decode_topk",
    "gather_request_keys",
    "page_rows",
    "paged_logits",
    "physical_rows",
    "visible_ends",
    "witness_table",
]


def visible_ends(lengths, next_n: int, xp=np):
    """ke int32 [B, next_n]: query j of request b sees ``[0, ke[b, j])`` with
    ``ke = max(0, lengths[b] − next_n + j + 1)`` (DeepGEMM's mask k ≤ q_offset)."""
    L = xp.asarray(lengths).astype(xp.int64)
    j = xp.arange(next_n, dtype=xp.int64)
    return xp.maximum(0, L[:, None] - next_n + 1 + j[None, :]).astype(xp.int32)


# ---------------------------------------------------------------------------------------
# Validation (ValueError naming the argument)
# ---------------------------------------------------------------------------------------


def _as(x, name: str, xp):
    if x is None:
        raise ValueError(f"{name}: missing")
    if xp is np:
        mod = type(x).__module__
        if mod.startswith("torch") or mod.startswith("cupy"):
            raise ValueError(f"{name}: the numpy backend takes host arrays, got {mod}")
        a = as_array(x, name)  # a ragged list: named here, not by numpy
        if a.dtype.kind == "V" or "float8" in str(a.dtype):
            a = a.view(np.uint8)
        return a
    from .prepare import as_device

    return as_device(x, name)


def _int_arr(a, name: str):
    """``a`` (numpy or CuPy) when its dtype is an integer dtype: floats are refused even
    when whole, with the reference's words (dosa_ref.validate.check_int_dtype)."""
    check_int_dtype(a, name)
    return a


def used_blocks(lengths, mb: int, xp=np):
    """bool [B, mb]: block j of request b holds some of its lengths[b] tokens (j < ⌈L/64⌉)."""
    nblk = (xp.asarray(lengths).astype(xp.int64) + PAGE - 1) // PAGE
    return xp.arange(mb, dtype=xp.int64)[None, :] < nblk[:, None]


def _check_layout(xp, L, bt, mb: int, nb: int) -> None:
    """lengths within [0, max_blocks·64] and the block-table entries of every used block
    within [0, num_blocks): computed on the device, read back with one transfer."""
    Lh = L.astype(xp.int64)
    bad = (Lh < 0) | (Lh > mb * PAGE)
    used = used_blocks(xp.clip(Lh, 0, mb * PAGE), mb, xp)
    btl = bt.astype(xp.int64)
    badb = used & ((btl < 0) | (btl >= nb))
    flags = xp.stack([bad.any(), badb.any()])
    flags = flags.get() if hasattr(flags, "get") else flags  # the one host sync of the check
    b_len = int(xp.argmax(bad)) if flags[0] else None
    flat = int(xp.argmax(badb.ravel())) if flags[1] else None
    raise_layout(b_len, flat, Lh, btl, mb, nb)


def check_decode_inputs(q, w, kv_payload, kv_scale, block_table, lengths, K, *, xp=np,
                        check_values: bool = False, check_layout: bool = True,
                        bufs=None, scorer: str = "f16") -> dict:  # fmt: skip
    """Validate the paged decode layout (see the module docstring); returns a dict of
    contiguous arrays: q [R, Hp, 128] and w [R, Hp] with heads padded to the ``scorer``'s
    count (``scorer.padded_heads``: 16·MT for "f16", 32 or 64 for "fp8"; R = B·next_n),
    kv [rows, 128], scale [rows], block_table int32 [B, max_blocks], lengths int32 [B],
    ke int32 [R], and B, n, H, Hp, K, L (= max_blocks·64), num_blocks.

    ``check_layout`` (default) checks lengths and the block-table entries of the used blocks
    on the device, with one host synchronization; a caller that built them itself may pass
    False (an out-of-range entry would then read outside the cache).  ``check_values``
    (opt-in) also scans values: e4m3 NaN codes in q and in the used cache blocks, non-finite
    w — one pass over the cache per call.  Unscanned values cannot make the result differ
    from the dense route's: both score with the same function, and a NaN score has the
    lowest record code on both (docs/method.md §10).

    ``bufs`` (device): an object whose ``ke``, ``bad`` (int32 [R], [2]) and, when heads are
    padded, ``q``, ``w`` buffers are used instead of new arrays (the selector's workspace:
    a call with it allocates nothing unless ``check_values``).
    """
    part = validate_shapes(q, w, kv_payload, kv_scale, block_table, lengths, K, xp=xp,
                           scorer=scorer)  # fmt: skip
    return complete_inputs(part, check_values=check_values, check_layout=check_layout, bufs=bufs)


def _check_K(K) -> None:
    """A decode step's K: what the reference takes (dosa_ref.validate.check_K: a Python or
    numpy integer or a 0-d host integer array, not a float or a bool), 1 <= K <= KMAX."""
    check_K(K, max_K=KMAX, why="the selection kernel's limit")


def validate_shapes(q, w, kv_payload, kv_scale, block_table, lengths, K, *, xp=np,
                    scorer: str = "f16") -> dict:  # fmt: skip
    """The host half of ``check_decode_inputs``: dtypes, shapes and limits (no device work
    beyond views); returns the arrays and sizes that ``complete_inputs`` finishes, with the
    canonical ``scorer`` (``dosa_cupy.scorer``; "fp8" needs sm_90a on the device backend,
    the numpy one emulates it bit for bit) and its head padding Hp."""
    scorer = check_scorer(scorer, device=xp is not np)
    _check_K(K)
    q = _as(q, "q", xp)
    if q.dtype != np.uint8:
        raise ValueError(f"q: expected e4m3 bits (uint8 or fp8), got dtype {q.dtype}")
    if q.ndim != 4 or q.shape[3] != D:
        raise ValueError(f"q: expected shape [B, next_n, H, {D}], got {tuple(q.shape)}")
    B, n, H, _ = (int(x) for x in q.shape)
    if B < 1:
        raise ValueError(f"q: need at least one request, got shape {tuple(q.shape)}")
    if n not in (1, 2):
        raise ValueError(f"q: next_n must be 1 or 2, got {n}")
    if not 1 <= H <= 64:
        raise ValueError(f"q: need 1 <= H <= 64 heads, got {H}")
    w = _as(w, "w", xp)
    if w.dtype != np.float32:
        raise ValueError(f"w: expected dtype float32, got {w.dtype}")
    if tuple(w.shape) != (B, n, H):
        raise ValueError(f"w: expected shape {(B, n, H)} to match q, got {tuple(w.shape)}")
    kv = _as(kv_payload, "kv_payload", xp)
    if kv.dtype != np.uint8:
        raise ValueError(f"kv_payload: expected e4m3 bits (uint8 or fp8), got dtype {kv.dtype}")
    if kv.ndim == 4 and kv.shape[2] == 1:
        kv = kv.reshape(kv.shape[0], kv.shape[1], kv.shape[3])
    if kv.ndim != 3 or kv.shape[1] != PAGE or kv.shape[2] != D:
        raise ValueError(
            f"kv_payload: expected shape [num_blocks, {PAGE}, {D}], got {tuple(kv.shape)}"
        )
    nb = int(kv.shape[0])
    sc = _as(kv_scale, "kv_scale", xp)
    if sc.dtype != np.float32:
        raise ValueError(f"kv_scale: expected dtype float32, got {sc.dtype}")
    if sc.ndim == 3 and sc.shape[2] == 1:
        sc = sc.reshape(sc.shape[0], sc.shape[1])
    if tuple(sc.shape) != (nb, PAGE):
        raise ValueError(f"kv_scale: expected shape ({nb}, {PAGE}), got {tuple(sc.shape)}")
    bt = _int_arr(_as(block_table, "block_table", xp), "block_table")
    if bt.ndim != 2 or bt.shape[0] != B or bt.shape[1] < 1:
        raise ValueError(
            f"block_table: expected shape ({B}, max_blocks >= 1), got {tuple(bt.shape)}"
        )
    mb = int(bt.shape[1])
    L = _int_arr(_as(lengths, "lengths", xp), "lengths")
    if tuple(L.shape) != (B,):
        raise ValueError(f"lengths: expected shape ({B},), got {tuple(L.shape)}")
    if mb * PAGE >= MAX_KEYS:
        raise ValueError(f"block_table: max_blocks={mb} too large for int32 token ids")
    if nb * PAGE >= 2**31:
        raise ValueError(f"kv_payload: num_blocks={nb} too large for int32 cache rows")
    return dict(
        q=q, w=w, kv=kv, scale=sc, block_table=bt, lengths=L, B=B, n=n, H=H,
        Hp=padded_heads(H, scorer), K=int(K), L=mb * PAGE, max_blocks=mb, num_blocks=nb, xp=xp,
        scorer=scorer,
    )  # fmt: skip


def complete_inputs(part: dict, *, check_values: bool = False, check_layout: bool = True,
                    bufs=None, ke_later: bool = False) -> dict:  # fmt: skip
    """The device half of ``check_decode_inputs``: visible ends, the layout check, the
    opt-in value scan and the head padding, in the buffers of ``bufs`` when given.
    ``ke_later``: where the visible ends would take a launch of their own without a check
    (device arrays, int32 lengths and block table, ``check_layout`` False), leave
    ``bufs.ke`` to the step's dedup (``decode_ops.DeviceOps.tau``) and mark the result's
    ``ke_later``."""
    xp, q, w, kv, sc = part["xp"], part["q"], part["w"], part["kv"], part["scale"]
    bt, L, B, n, H, Hp = (part[k] for k in ("block_table", "lengths", "B", "n", "H", "Hp"))
    mb, nb = part["max_blocks"], part["num_blocks"]
    R = B * n
    device_ends = xp is not np and L.dtype == np.int32 and bt.dtype == np.int32
    ke_later = bool(ke_later and device_ends and not check_layout and bufs is not None)
    if ke_later:
        ke = bufs.ke  # written by the step's dedup, before its first reader
    elif device_ends:
        ke = layout_device(L, bt, mb, nb, n, check_layout, bufs)  # one launch (+ one sync)
    else:
        if check_layout:
            _check_layout(xp, L, bt, mb, nb)
        ke = visible_ends(L, n, xp).reshape(R)
    if check_values:
        used = used_blocks(L, mb, xp)
        btl = bt.astype(xp.int64)
        if bool(((q & 0x7F) == 0x7F).any()):
            raise ValueError("q: contains e4m3 NaN codes")
        if not bool(xp.isfinite(w).all()):
            raise ValueError("w: contains non-finite values (nan or inf)")
        # per cache block: any NaN code (no gather copy of the cache); then the used ones
        blk_bad = ((kv & 0x7F) == 0x7F).reshape(nb, -1).any(axis=1)
        if bool((used & blk_bad[xp.clip(btl, 0, nb - 1)]).any()):
            raise ValueError("kv_payload: contains e4m3 NaN codes in a used block")
    qf = q.reshape(R, H, D)
    wf = w.reshape(R, H)
    if Hp != H:
        qp = bufs.q if bufs is not None else xp.zeros((R, Hp, D), dtype=xp.uint8)
        qp[:, :H] = qf
        wp = bufs.w if bufs is not None else xp.zeros((R, Hp), dtype=xp.float32)
        wp[:, :H] = wf
        qf, wf = qp, wp
    return dict(
        part, q=xp.ascontiguousarray(qf), w=xp.ascontiguousarray(wf),
        kv=xp.ascontiguousarray(kv.reshape(nb * PAGE, D)),
        scale=xp.ascontiguousarray(sc.reshape(nb * PAGE)),
        block_table=xp.ascontiguousarray(bt.astype(xp.int32, copy=False)),
        lengths=xp.ascontiguousarray(L.astype(xp.int32, copy=False)),
        ke=xp.ascontiguousarray(ke), ke_later=ke_later,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Dense decode route (GPU)
# ---------------------------------------------------------------------------------------


def _logits_raw(d):
    cp = cupy_or_raise()
    R, L = d["B"] * d["n"], d["L"]
    out = cp.empty((R, L), dtype=cp.float32)
    scan(d, False, (out,))
    return out


def paged_logits(q, w, kv_payload, kv_scale, block_table, lengths, *, check_values=False,
                 check_layout=True, scorer: str = "f16"):  # fmt: skip
    """Canonical logits of every key of each request on the ``scorer`` ("f16" or "fp8",
    ``dosa_cupy.scorer``): fp32 [B, next_n, max_blocks·64], −inf where the key is not
    visible to the query."""
    cp = cupy_or_raise()
    d = check_decode_inputs(q, w, kv_payload, kv_scale, block_table, lengths, 1, xp=cp,
                            check_values=check_values, check_layout=check_layout,
                            scorer=scorer)  # fmt: skip
    return _logits_raw(d).reshape(d["B"], d["n"], d["L"])


def _dense_ids_raw(d):
    cp = cupy_or_raise()
    from .dense import _select_rows

    lg = _logits_raw(d)
    R = lg.shape[0]
    ids = _select_rows(lg, d["K"], cp.zeros(R, dtype=cp.int32), d["ke"])
    return ids.astype(cp.int64).reshape(d["B"], d["n"], d["K"])


def dense_decode_topk(q, w, kv_payload, kv_scale, block_table, lengths, K, *,
                      check_values=False, check_layout=True, scorer: str = "f16"):  # fmt: skip
    """The dense decode route: paged logits on the ``scorer`` + exact selection → int64
    [B, next_n, K] (score desc, id asc, −1 padding; ids are logical token positions)."""
    cp = cupy_or_raise()
    d = check_decode_inputs(q, w, kv_payload, kv_scale, block_table, lengths, K, xp=cp,
                            check_values=check_values, check_layout=check_layout,
                            scorer=scorer)  # fmt: skip
    return _dense_ids_raw(d)


# ---------------------------------------------------------------------------------------
# Backends of the fused step: the three device operations and their numpy emulation
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# The selector
# ---------------------------------------------------------------------------------------


class DecodeSelectorGPU:
    """Exact decode-time Top-K with witnesses on the paged cache (``dosa_ref.decode.
    DecodeSelector``'s API and rule, docs/method.md §10).

    Args:
        K: selection size (1 ≤ K ≤ 4096).
        history: recent steps whose selections are witnesses (≥ 0; 0: τ = −inf always).
        within_step: must be False (the next_n queries of a step are scanned together).
        buffer: compact records per query row.  None (default): room for every visible key
            (8 bytes per key and row, like a logits buffer of twice the size), so a step
            never overflows and needs no host synchronization.  An integer bounds it; a row
            with more qualifying keys is then scanned again with the exact count (one host
            synchronization per step to learn it).
        check_layout: check lengths and the used block-table entries every step (one host
            synchronization); False for a caller that built them.
        check_values: also scan q, w and the used cache for NaN codes / non-finite weights
            (one pass over the cache per step; opt-in: the result equals the dense route's
            without it, see ``check_decode_inputs``).
        backend: "cupy" (the kernels) or "numpy" (CPU emulation: float64 scores for "f16",
            the FP8 scorer's bits for "fp8", ``dosa_ref.mma_model.fp8_fresh_scores``).
        scorer: the canonical scorer ("f16", default, or "fp8" on sm_90a,
            ``dosa_cupy.scorer``): the witnesses, the scan and the dense decode route it
            equals all score with it.

    Witness state lives on the device: a ring of the last ``history`` steps' selections
    per request, deduplicated at each step (``decode_ops.Workspace``); a new step shape
    starts an empty history (efficiency only).  The numpy backend keeps the selections of
    any B (rows beyond a step's B are empty for that step), as ``dosa_ref.decode``.
    Above DEDUP_MAX (16,384) witnesses per request (history·next_n·K) the device table is
    built by sorting instead (allocates: such a step cannot be captured in a graph).
    """

    def __init__(self, K: int, history: int = 2, within_step: bool = False, buffer=None,
                 check_values: bool = False, backend: str = "cupy",
                 check_layout: bool = True, scorer: str = "f16"):  # fmt: skip
        _check_K(K)
        if isinstance(history, bool) or not isinstance(history, (int, np.integer)):
            raise ValueError(f"history: expected a nonnegative integer, got {history!r}")
        if history < 0:
            raise ValueError(f"history: must be >= 0, got {history}")
        if within_step is not False:
            raise ValueError(f"within_step: not supported on the GPU, got {within_step!r}")
        if buffer is not None and (
            isinstance(buffer, bool) or not isinstance(buffer, (int, np.integer)) or buffer < 1
        ):
            raise ValueError(f"buffer: expected None or a positive integer, got {buffer!r}")
        if backend not in ("cupy", "numpy"):
            raise ValueError(f"backend: expected 'cupy' or 'numpy', got {backend!r}")
        self.scorer = check_scorer(scorer, device=backend == "cupy")
        self.K, self.history, self.within_step = int(K), int(history), False
        self.buffer = None if buffer is None else int(buffer)
        self.check_values, self.check_layout = bool(check_values), bool(check_layout)
        self.backend = backend
        self.xp = np if backend == "numpy" else cupy_or_raise()
        self._ops = NumpyOps(self.scorer) if backend == "numpy" else DeviceOps(self.scorer)
        self._wss: dict = {}  # one workspace per step shape (decode_ops.Workspace)
        self._ws = None  # the last step's
        self.last_overflow = False  # whether the last step needed the exact extension

    # -- witness state -------------------------------------------------------------------

    def witnesses(self, b: int) -> np.ndarray:
        """Witness ids of request slot ``b`` (host): sorted, distinct int64."""
        return self._ws.witnesses(b) if self._ws is not None else np.zeros(0, dtype=np.int64)

    def reset(self, b: int | None = None) -> None:
        """Forget the witnesses of slot ``b`` (all slots when ``b`` is None), in the
        workspace of every step shape."""
        for ws in {id(w): w for w in self._wss.values()}.values():  # numpy: one, shared
            ws.reset(b)

    def release(self) -> None:
        """Free every workspace (and with them the witness histories).  CUDA graphs that
        captured a step of this selector must not be replayed afterwards."""
        self.reset()  # the numpy backend keeps its one workspace past the dict below
        self._wss.clear()
        self._ws = None

    def _workspace(self, part: dict):
        """The workspace of this step's shape (B, next_n, H, context blocks).  Each shape
        keeps its own, for the selector's life (or until ``release``): a CUDA graph captured
        at one shape holds that workspace's addresses, and a serving stack captures one graph
        per batch size.  A shape seen for the first time starts with an empty history."""
        cap = part["L"] if self.buffer is None else self.buffer
        key = (part["B"], part["n"], part["H"], self.K, part["L"], self.history, cap)
        if key not in self._wss:
            self._wss[key] = self._ops.workspace(*key)
        self._ws = self._wss[key]
        return self._ws

    # -- one step ------------------------------------------------------------------------

    @property
    def ops(self):
        """The backend's operations (``decode_ops.DeviceOps`` or ``NumpyOps``): a sharded
        step (``dosa_cupy.shards``) runs them in its own order."""
        return self._ops

    def begin(self, q, w, kv_payload, kv_scale, block_table, lengths, ends=None):
        """A step's checked inputs and its shape's workspace: (d, ws), ``d`` as
        ``check_decode_inputs`` returns it.  ``ends`` (int [B, next_n]) replaces the visible
        ends that ``lengths`` imply — a shard's, in its local ids (``dosa_cupy.shards``);
        each must lie in [0, lengths[b]], nondecreasing in j."""
        part = validate_shapes(q, w, kv_payload, kv_scale, block_table, lengths, self.K,
                               xp=self.xp, scorer=self.scorer)  # fmt: skip
        ws = self._workspace(part)
        # the visible ends by the step's dedup where it runs one (no launch of their own;
        # not for a shard, whose ends replace them below)
        later = ends is None and self._ops.dedup_folds(ws)
        d = complete_inputs(part, check_values=self.check_values, check_layout=self.check_layout,
                            bufs=ws if self.backend == "cupy" else None,
                            ke_later=later)  # fmt: skip
        if ends is not None:
            xp = self.xp
            e = xp.asarray(ends).astype(xp.int64)
            L = d["lengths"].astype(xp.int64)[:, None]
            # nondecreasing along a request's rows: the scan reads a request's keys up to
            # its last row's end
            if (tuple(e.shape) != (d["B"], d["n"]) or bool(((e < 0) | (e > L)).any())
                    or bool((e[:, :-1] > e[:, 1:]).any())):  # fmt: skip
                raise ValueError(f"ends: expected int [{d['B']}, {d['n']}] in [0, lengths[b]], "
                                 "nondecreasing along each row")  # fmt: skip
            d["ke"][...] = e.reshape(-1).astype(xp.int32)
        return d, ws

    def step(self, q, w, kv_payload, kv_scale, block_table, lengths, *,
             return_stats: bool = True, out=None) -> DecodeStep:  # fmt: skip
        """Exact Top-K of every query row of one decode step (paged layout, module doc).

        Returns ``DecodeStep``: ``ids`` int64 [B, next_n, K] (device array for the cupy
        backend; score desc, id asc, −1 padding), equal to ``dense_decode_topk``; ``stats``
        (``dosa_ref.decode.DecodeStats``, numpy) when ``return_stats``, else None.
        ``out``: an int64 [B, next_n, K] array to write the ids into (returned as ``ids``).

        On the device backend a step with ``return_stats=False``, ``check_layout=False``,
        the default buffer and ``out`` issues kernels only — no allocation, no host
        synchronization — so it can be captured in a CUDA graph and replayed on new inputs
        in the same buffers (docs/method.md §10).
        """
        xp, ops, K = self.xp, self._ops, self.K
        d, ws = self.begin(q, w, kv_payload, kv_scale, block_table, lengths)
        B, n = d["B"], d["n"]
        if out is None:
            out = xp.empty((B, n, K), dtype=xp.int64)
        elif tuple(out.shape) != (B, n, K) or out.dtype != np.int64:
            raise ValueError(f"out: expected int64 {(B, n, K)}, got {out.dtype} {out.shape}")
        thr, wcnt = ops.tau(d, ws)
        # buffer None: room for every visible key of a row, so nothing can overflow and the
        # step needs no host synchronization; a bounded buffer costs one (docs/method.md §10)
        cap = d["L"] if self.buffer is None else self.buffer
        rec, cnt = ops.scan(d, thr, cap, ws)
        self.last_overflow = False
        if self.buffer is not None:
            need = ops.max_count(cnt)  # the one host sync of a bounded buffer
            self.last_overflow = need > cap
            if self.last_overflow:  # exact extension: re-scan with the exact count
                rec, cnt = ops.scan(d, thr, need, ws, again=True)
        ids, kth = ops.select(d, rec, cnt, return_stats, ws)
        # the witnesses of the next steps, and the ids into out (one launch with STEP_FOLD)
        dense_out = out.flags.c_contiguous
        ops.push(d, ws, ids, out if dense_out else None)
        if not dense_out:
            out[...] = ids.reshape(B, n, K)
        st = None
        if return_stats:

            def host(a):
                return np.asarray(a.get() if hasattr(a, "get") else a)

            st = DecodeStats(
                witnesses=host(wcnt).astype(np.int64).reshape(B, n),
                tau=ops.thr_score(thr).reshape(B, n),
                compacted=host(cnt).astype(np.int64).reshape(B, n),
                visible=host(d["ke"]).astype(np.int64).reshape(B, n),
                tau_final=np.asarray(kth, dtype=np.float64).reshape(B, n),
                scored=None if (sc := ops.scored(d, ws)) is None else sc.reshape(B, n),
            )
        return DecodeStep(ids=out, stats=st)
