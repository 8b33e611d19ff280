"""Serving entry points over whole batches of requests (docs/serving.md "Ragged batches",
"Paged prefill", "Page-table transform").

    ragged_topk(q, w, k_payload, k_scale, K, cu_seqlens_q, cu_seqlens_k)
        B requests in one ``dosa_topk`` call (DeepGEMM ``fp8_mqa_logits`` / SGLang prefill
        layout: queries and keys of all requests concatenated, prefix offsets per request);
        ids relative to each request's first key, int64 or int32, optionally translated to
        physical cache rows through a page table (SGLang's ``fast_topk_transform_fused``).
    paged_prefill_topk(q, w, kv_payload, kv_scale, block_table, lengths, cu_seqlens_q, K)
        the same over DeepGEMM's paged FP8 cache (64-token blocks): the visible keys are
        gathered into one contiguous array first (an extra copy, not fused).

Exactness (docs/serving.md "What holds"): a query's visible range lies inside its own
request's keys, and the canonical score of a key (``dense.dense_logits``) depends only on
the query and that key, so the Top-K of a query in the batch is the Top-K of the same query
in its request's own call with every id shifted by the request's first key — a constant
shift, which keeps the tie order (id ascending).  ``dosa_topk`` returns the dense route's
ids whatever route it takes, so the batch's ids equal B separate calls' bit for bit.
"""

from __future__ import annotations

import numpy as np

from dosa_ref.options import check_flag
from dosa_ref.validate import as_array

from ._build import cupy_or_raise
from .decode import PAGE, _int_arr, page_rows, used_blocks
from .pipeline import dosa_topk
from .prepare import MAX_KEYS, D, as_device

__all__ = ["paged_prefill_topk", "page_rows", "ragged_topk"]


# ---------------------------------------------------------------------------------------
# Host-side validation (ValueError naming the argument; no CuPy needed)
# ---------------------------------------------------------------------------------------


def _shape(x, name: str) -> tuple[int, ...]:
    if x is None:
        raise ValueError(f"{name}: missing")
    s = getattr(x, "shape", None)
    if s is None:
        raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
    return tuple(int(v) for v in s)


def _host_ints(x, name: str) -> np.ndarray:
    """A small 1-d integer array (offsets, lengths) on the host as int64: one device → host
    copy of B + 1 entries (the prefill call synchronizes anyway, docs/serving.md)."""
    if x is None:
        raise ValueError(f"{name}: missing")
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()  # a CuPy array
    a = _int_arr(as_array(x, name), name)  # a ragged list: named here, not by numpy
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-d array, got shape {a.shape}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: entries too large for int64")
    return a.astype(np.int64)


def _offsets(x, name: str, total: int, what: str, B: int | None = None) -> np.ndarray:
    """Prefix offsets int64 [B + 1]: start at 0, non-decreasing, last entry ``total``."""
    cu = _host_ints(x, name)
    if cu.size < 1 or (B is not None and cu.size != B + 1):
        want = "(B + 1,)" if B is None else f"({B + 1},)"
        raise ValueError(f"{name}: expected shape {want}, got {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {name}[0]={cu[0]}")
    d = np.diff(cu)
    if (d < 0).any():
        b = int(np.argmax(d < 0))
        raise ValueError(f"{name}: decreases at {b}: {name}[{b + 1}]={cu[b + 1]} < {cu[b]}")
    if cu[-1] != total:
        raise ValueError(f"{name}: last entry {cu[-1]} must equal {what} ({total})")
    return cu


def ids_dtype_of(ids_dtype) -> np.dtype:
    """The ``ids_dtype`` argument as np.int64 or np.int32 (ValueError naming it otherwise)."""
    try:
        dt = np.dtype(ids_dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise ValueError(f"ids_dtype: expected 'int64' or 'int32', got {ids_dtype!r}")
    return dt


def _query_rows(q, w) -> int:
    """sum Qn_b after the shape checks of q [sum Qn_b, H, 128] and w [sum Qn_b, H]; dtypes
    and values are checked by ``dosa_topk`` (``prepare.check_inputs``, the same names)."""
    qs, ws = _shape(q, "q"), _shape(w, "w")
    if len(qs) != 3 or qs[2] != D:
        raise ValueError(f"q: expected shape [sum Qn_b, H, {D}], got {qs}")
    if ws != qs[:2]:
        raise ValueError(f"w: expected shape {qs[:2]} to match q, got {ws}")
    return qs[0]


def _key_rows(k_payload, k_scale) -> int:
    """sum N_b after the shape checks of k_payload [sum N_b, 128] and k_scale [sum N_b]."""
    kps, kss = _shape(k_payload, "k_payload"), _shape(k_scale, "k_scale")
    if len(kps) != 2 or kps[1] != D:
        raise ValueError(f"k_payload: expected shape [sum N_b, {D}], got {kps}")
    if kps[0] >= MAX_KEYS:
        raise ValueError(f"k_payload: {kps[0]} keys in all, too many for int32 key ids")
    if kss != kps[:1]:
        raise ValueError(f"k_scale: expected shape {kps[:1]}, got {kss}")
    return kps[0]


def _causal_fits(cu_q: np.ndarray, cu_k: np.ndarray) -> None:
    """Causal chunks are their request's last Qn_b tokens (docs/serving.md "Ragged
    batches"): Qn_b ≤ N_b for every request."""
    over = np.diff(cu_q) > np.diff(cu_k)
    if over.any():
        b = int(np.argmax(over))
        raise ValueError(
            f"cu_seqlens_q: request {b} has {cu_q[b + 1] - cu_q[b]} queries but "
            f"{cu_k[b + 1] - cu_k[b]} keys (causal: its queries are its last tokens)"
        )


def _kind(x) -> str:
    try:
        return np.dtype(str(x.dtype).replace("torch.", "")).kind
    except TypeError:
        return "?"


def _page_table_shape(page_table, name: str, B: int, lengths: np.ndarray) -> int:
    """max_blocks of ``page_table`` [B, max_blocks] (integer entries) after checking that it
    covers every request's ``lengths`` tokens."""
    s = _shape(page_table, name)
    if len(s) != 2 or s[0] != B:
        raise ValueError(f"{name}: expected shape [B={B}, max_blocks], got {s}")
    if _kind(page_table) not in "iu":
        raise ValueError(f"{name}: expected integer entries, got dtype {page_table.dtype}")
    over = lengths > s[1] * PAGE
    if over.any():
        b = int(np.argmax(over))
        raise ValueError(
            f"{name}: request {b} has {lengths[b]} tokens, more than its {s[1]} blocks of {PAGE}"
        )
    return s[1]


# ---------------------------------------------------------------------------------------
# Device helpers (written for numpy and CuPy: ``xp``)
# ---------------------------------------------------------------------------------------


def _request_of(cu, n: int, xp):
    """Request index int64 [n] of each of n concatenated items under offsets ``cu`` (empty
    requests repeat an offset: side="right" picks the last request starting there)."""
    return xp.searchsorted(xp.asarray(cu), xp.arange(n, dtype=xp.int64), side="right") - 1


def _check_pages(bt, lengths: np.ndarray, name: str, xp, num_blocks: int | None) -> None:
    """Every block-table entry of a used block in [0, num_blocks) (num_blocks None: ≥ 0):
    computed on the device, read back once (the decode layout check, decode.py)."""
    mb = int(bt.shape[1])
    used = used_blocks(lengths, mb, xp)
    b64 = bt.astype(xp.int64)
    bad = used & ((b64 < 0) | (b64 >= (num_blocks if num_blocks is not None else 2**62)))
    flat = bad.ravel()
    if not bool(flat.any()):
        return
    b, i = divmod(int(xp.argmax(flat)), mb)
    where = "negative" if num_blocks is None else f"outside [0, {num_blocks})"
    raise ValueError(f"{name}: {name}[{b}, {i}]={int(b64[b, i])} {where}")


def _shift_seed_ids(seed_ids, start, n_b, xp):
    """Request-relative explicit seeds (docs/method.md §2) → global key ids: −1 stays −1;
    an id outside [−1, N_b) of its request raises (it would name another request's key)."""
    s = as_device(seed_ids, "seed_ids")
    if s.dtype.kind not in "iu" or s.ndim != 2 or s.shape[0] != start.shape[0]:
        raise ValueError(
            f"seed_ids: expected integer ids [{start.shape[0]}, S], got {s.dtype} {tuple(s.shape)}"
        )
    if s.dtype.kind == "u" and bool((s > MAX_KEYS).any()):  # would wrap to −1 in int64
        raise ValueError("seed_ids: entries must be -1 or a key position of their request")
    s = s.astype(xp.int64)
    if bool(((s < -1) | (s >= n_b[:, None])).any()):
        raise ValueError("seed_ids: entries must be -1 or a key position of their request")
    return xp.where(s >= 0, s + start[:, None], -1)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def ragged_topk(q, w, k_payload, k_scale, K, cu_seqlens_q, cu_seqlens_k, *, causal=True,
                ids_dtype="int64", page_table=None, **options):  # fmt: skip
    """Exact Top-K of a ragged batch of B requests in one ``dosa_topk`` call.

    Args (DeepGEMM ``fp8_mqa_logits`` / SGLang prefill layout; CuPy arrays or DLPack tensors):
        q: e4m3 [sum Qn_b, H, 128] (uint8 bits or fp8); w: fp32 [sum Qn_b, H] (query scales
        folded in); k_payload: e4m3 [sum N_b, 128]; k_scale: fp32 [sum N_b]; K ≤ 4096;
        cu_seqlens_q, cu_seqlens_k: integer [B + 1] prefix offsets of each request's queries
        and keys (start at 0, non-decreasing, last = the totals; read to the host once).
        causal: True — query i (0-based in its request) sees the request's first
        N_b − Qn_b + i + 1 keys (its queries are its last Qn_b tokens; Qn_b > N_b raises);
        False — every key of its request.
        ids_dtype: "int64" (default) or "int32".
        page_table: optional integer [B, max_blocks] block table of 64-token pages
        (DeepGEMM's): the ids become physical cache rows block·64 + offset (SGLang's
        ``fast_topk_transform_fused``; the entries of used blocks must be ≥ 0, checked
        unless check=False).
        options: ``dosa_topk``'s (route, route_memo, check, return_stats, ...);
        ``seed_ids`` are request-relative positions [sum Qn_b, S] (−1 padding).
    Returns ids [sum Qn_b, K] of ``ids_dtype`` (score desc, id asc, −1 padding): positions
    relative to each request's first key (physical rows with ``page_table``); with
    return_stats=True, (ids, stats) as ``dosa_topk`` returns them.

    Exact (module docstring): each query's range lies in its request, a key's score does
    not depend on other keys, so the ids are the request's own call's, shifted by the
    request's first key — a constant shift, which keeps the id-ascending tie order.
    """
    causal = check_flag("causal", causal)
    dt = ids_dtype_of(ids_dtype)
    Qt, Nt = _query_rows(q, w), _key_rows(k_payload, k_scale)
    cu_q = _offsets(cu_seqlens_q, "cu_seqlens_q", Qt, "q.shape[0]")
    cu_k = _offsets(cu_seqlens_k, "cu_seqlens_k", Nt, "k_payload.shape[0]", cu_q.size - 1)
    if causal:
        _causal_fits(cu_q, cu_k)
    if page_table is not None:
        _page_table_shape(page_table, "page_table", cu_q.size - 1, np.diff(cu_k))
    check = check_flag("check", options.get("check", True))
    bt = None
    if page_table is not None:
        bt = as_device(page_table, "page_table")
        if check:
            _check_pages(bt, np.diff(cu_k), "page_table", cupy_or_raise(), None)
    return _run(q, w, k_payload, k_scale, K, cu_q, cu_k, causal=causal, dt=dt, pages=bt,
                options=options)  # fmt: skip


def _run(q, w, k_payload, k_scale, K, cu_q, cu_k, *, causal, dt, pages, options):
    """``ragged_topk`` after its checks: global ranges on the device, one ``dosa_topk`` call,
    ids back to request positions (and through the checked device block table ``pages``)."""
    cp = cupy_or_raise()
    bt = pages
    Qt = int(cu_q[-1])
    req = _request_of(cu_q, Qt, cp)
    ck = cp.asarray(cu_k)
    start, end = ck[req], ck[req + 1]
    n_b = end - start  # the keys of each query's request
    if causal:  # docs/serving.md "Ragged batches": the chunk is the request's last tokens
        i = cp.arange(Qt, dtype=cp.int64) - cp.asarray(cu_q)[req]
        qn = cp.asarray(np.diff(cu_q))[req]
        end = start + cp.maximum(0, end - start - qn + i + 1)
    if options.get("seed_ids") is not None:
        options = dict(options, seed_ids=_shift_seed_ids(options["seed_ids"], start, n_b, cp))
    out = dosa_topk(q, w, k_payload, k_scale, K, start.astype(cp.int32), end.astype(cp.int32),
                    **options)  # fmt: skip
    ids, stats = out if isinstance(out, tuple) else (out, None)
    ids = cp.where(ids >= 0, ids - start[:, None], -1)
    if bt is not None:
        ids = page_rows(bt, req, ids, cp)
        if dt == np.int32 and ids.size and int(ids.max()) > np.iinfo(np.int32).max:
            raise ValueError("ids_dtype: physical rows exceed int32; use 'int64'")
    ids = ids.astype(dt)
    return ids if stats is None else (ids, stats)


def paged_prefill_topk(q, w, kv_payload, kv_scale, block_table, lengths, cu_seqlens_q, K, *,
                       ids_dtype="int64", physical=False, **options):  # fmt: skip
    """Exact Top-K of a prefill chunk per request over DeepGEMM's paged FP8 cache.

    Args:
        q: e4m3 [sum Qn_b, H, 128]; w: fp32 [sum Qn_b, H] (query scales folded in);
        kv_payload: e4m3 [num_blocks, 64, 128]; kv_scale: fp32 [num_blocks, 64];
        block_table: integer [B, max_blocks] (block i // 64 of request b → cache block);
        lengths: integer [B] tokens of each request in the cache, the chunk's queries
        included (they are its last Qn_b tokens: query i sees the first
        lengths[b] − Qn_b + i + 1 tokens); cu_seqlens_q: integer [B + 1] query offsets;
        K ≤ 4096; ids_dtype: "int64" or "int32"; physical: False — logical token positions
        of each request, True — physical cache rows block·64 + offset (into
        kv_payload.reshape(-1, 128)); options: ``dosa_topk``'s (``ragged_topk``).
    Returns ids [sum Qn_b, K] of ``ids_dtype`` (−1 padding), equal to ``ragged_topk`` on
    the requests' keys in logical order.

    The visible keys of every request are gathered into one contiguous array first
    (``page_rows``, then fancy indexing): an extra copy of sum lengths[b] · 132 bytes, not
    fused into the scoring kernels (docs/serving.md "Paged prefill").  The block-table
    entries of used blocks are checked against num_blocks unless check=False.
    """
    dt = ids_dtype_of(ids_dtype)
    physical = check_flag("physical", physical)
    kvs, scs = _shape(kv_payload, "kv_payload"), _shape(kv_scale, "kv_scale")
    if len(kvs) != 3 or kvs[1:] != (PAGE, D):
        raise ValueError(f"kv_payload: expected shape [num_blocks, {PAGE}, {D}], got {kvs}")
    if scs != kvs[:2]:
        raise ValueError(f"kv_scale: expected shape {kvs[:2]}, got {scs}")
    L = _host_ints(lengths, "lengths")
    if (L < 0).any():
        b = int(np.argmax(L < 0))
        raise ValueError(f"lengths: lengths[{b}]={L[b]} is negative")
    _page_table_shape(block_table, "block_table", L.size, L)
    cu_k = np.concatenate([[0], np.cumsum(L)]).astype(np.int64)
    if cu_k[-1] >= MAX_KEYS:
        raise ValueError(f"lengths: {cu_k[-1]} tokens in all, too many for int32 key ids")
    cu_q = _offsets(cu_seqlens_q, "cu_seqlens_q", _query_rows(q, w), "q.shape[0]", L.size)
    _causal_fits(cu_q, cu_k)
    kp, ksc, bt = _gather(kv_payload, kv_scale, block_table, cu_k,
                          check_flag("check", options.get("check", True)))  # fmt: skip
    return _run(q, w, kp, ksc, K, cu_q, cu_k, causal=True, dt=dt,
                pages=bt if physical else None, options=options)  # fmt: skip


def _gather(kv_payload, kv_scale, block_table, cu_k: np.ndarray, check: bool):
    """Each request's tokens in logical order, concatenated: (payload uint8 [sum L, 128],
    scale fp32 [sum L], block table on the device)."""
    cp = cupy_or_raise()
    kv = as_device(kv_payload, "kv_payload", np.uint8)
    sc = as_device(kv_scale, "kv_scale")
    if sc.dtype != np.float32:
        raise ValueError(f"kv_scale: expected dtype float32, got {sc.dtype}")
    bt = as_device(block_table, "block_table")
    if check:  # a bad entry would gather another request's keys (docs/serving.md)
        _check_pages(bt, np.diff(cu_k), "block_table", cp, int(kv.shape[0]))
    n = int(cu_k[-1])
    req = _request_of(cu_k, n, cp)
    pos = cp.arange(n, dtype=cp.int64) - cp.asarray(cu_k)[req]
    rows = page_rows(bt, req, pos[:, None], cp)[:, 0]
    return kv.reshape(-1, D)[rows], sc.reshape(-1)[rows], bt
