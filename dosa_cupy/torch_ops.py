"""PyTorch custom operators (``torch.library``) for serving stacks: ``torch.ops.dosa.
prefill_topk``, ``torch.ops.dosa.ragged_topk`` and ``torch.ops.dosa.decode_topk``, each with
a fake implementation (shapes and dtypes only), so that ``torch.compile`` traces through
them and a graph-captured model can hold them as opaque nodes (docs/serving.md).

Importing this module registers the operators (it needs torch; CuPy is needed only when an
operator runs).  The tensors go to CuPy through DLPack without copies, and CuPy launches on
torch's current stream of the tensors' device, so the operators order with the surrounding
torch work and can be captured in a ``torch.cuda.CUDAGraph`` where the wrapped call can
(the decode step with a layout the caller built; not the prefill calls, which synchronize).
"""

import contextlib
import itertools

import torch

from ._build import cupy_or_raise

__all__ = ["decode_selector", "decode_topk", "prefill_topk", "ragged_topk", "release_selector"]

_SELECTORS: dict = {}  # handle → DecodeSelectorGPU
_HANDLES = itertools.count(1)


@contextlib.contextmanager
def _on_stream(t: torch.Tensor):
    """CuPy (yielded), on torch tensor ``t``'s device and current stream."""
    if t.device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor, got device {t.device}")
    cp = cupy_or_raise()
    stream = torch.cuda.current_stream(t.device).cuda_stream
    with cp.cuda.Device(t.device.index), cp.cuda.ExternalStream(stream):
        yield cp


@torch.library.custom_op("dosa::prefill_topk", mutates_args=())
def prefill_topk(
    q: torch.Tensor,
    w: torch.Tensor,
    k_payload: torch.Tensor,
    k_scale: torch.Tensor,
    K: int,
    ks: torch.Tensor | None = None,
    ke: torch.Tensor | None = None,
    route: str = "auto",
    check: bool = True,
) -> torch.Tensor:
    """``dosa_cupy.dosa_topk`` as an operator: q e4m3 [Qn, H, 128] (float8_e4m3fn or uint8
    bits), w fp32 [Qn, H], k_payload e4m3 [N, 128], k_scale fp32 [N], ks / ke int32 [Qn]
    → int64 [Qn, K] ids (score desc, id asc, −1 padding), equal to the dense route's."""
    from .pipeline import dosa_topk

    with _on_stream(q):
        ids = dosa_topk(q, w, k_payload, k_scale, K, ks, ke, route=route, check=check)
    return torch.from_dlpack(ids)


@prefill_topk.register_fake
def _prefill_topk_fake(q, w, k_payload, k_scale, K, ks=None, ke=None, route="auto", check=True):
    return q.new_empty((q.shape[0], K), dtype=torch.int64)


@torch.library.custom_op("dosa::ragged_topk", mutates_args=())
def ragged_topk(
    q: torch.Tensor,
    w: torch.Tensor,
    k_payload: torch.Tensor,
    k_scale: torch.Tensor,
    K: int,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = True,
    ids_dtype: str = "int64",
    page_table: torch.Tensor | None = None,
    route: str = "auto",
    check: bool = True,
) -> torch.Tensor:
    """``dosa_cupy.serving.ragged_topk`` as an operator: B requests' queries q e4m3
    [sum Qn_b, H, 128] / w fp32 [sum Qn_b, H] and keys k_payload e4m3 [sum N_b, 128] / k_scale
    fp32 [sum N_b] concatenated, offsets cu_seqlens_q / cu_seqlens_k int [B + 1] → ids
    [sum Qn_b, K] of ``ids_dtype`` relative to each request's first key (physical cache rows
    with ``page_table``), −1 padding; equal to the requests' own dense routes."""
    from .serving import ragged_topk as ragged

    with _on_stream(q):
        ids = ragged(q, w, k_payload, k_scale, K, cu_seqlens_q, cu_seqlens_k, causal=causal,
                     ids_dtype=ids_dtype, page_table=page_table, route=route,
                     check=check)  # fmt: skip
    return torch.from_dlpack(ids)


@ragged_topk.register_fake
def _ragged_topk_fake(q, w, k_payload, k_scale, K, cu_seqlens_q, cu_seqlens_k, causal=True,
                      ids_dtype="int64", page_table=None, route="auto", check=True):  # fmt: skip
    from .serving import ids_dtype_of

    dt = getattr(torch, ids_dtype_of(ids_dtype).name)  # the eager call's check and dtype
    return q.new_empty((q.shape[0], K), dtype=dt)


def decode_selector(K: int, history: int = 2, check_layout: bool = False,
                    scorer: str = "f16") -> int:  # fmt: skip
    """A ``decode.DecodeSelectorGPU`` for ``decode_topk`` on the canonical ``scorer`` ("f16"
    or "fp8", ``dosa_cupy.scorer``), returned as an integer handle (one per indexer layer).
    Its witness history is state kept between steps: it makes steps faster, never changes
    their ids (docs/method.md §10)."""
    from .decode import DecodeSelectorGPU

    sel = DecodeSelectorGPU(K=K, history=history, check_layout=check_layout, scorer=scorer)
    handle = next(_HANDLES)  # never reused: a graph holding a released handle fails loudly
    _SELECTORS[handle] = sel
    return handle


def release_selector(handle: int) -> None:
    """Free a selector's workspaces and forget its handle."""
    sel = _lookup(handle)
    sel.release()
    del _SELECTORS[handle]


def _lookup(handle: int):
    if handle not in _SELECTORS:
        raise ValueError(f"handle: no decode selector {handle!r} (decode_selector makes one)")
    return _SELECTORS[handle]


@torch.library.custom_op("dosa::decode_topk", mutates_args=())
def decode_topk(
    handle: int,
    K: int,
    q: torch.Tensor,
    w: torch.Tensor,
    kv_payload: torch.Tensor,
    kv_scale: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """One decode step of selector ``handle`` (``decode_selector``; K must be its K): q e4m3
    [B, next_n, H, 128], w fp32 [B, next_n, H], the paged cache kv_payload e4m3 [blocks, 64,
    128] with kv_scale fp32 [blocks, 64], block_table int32 [B, max_blocks], lengths int32
    [B] → int64 [B, next_n, K] ids, equal to ``decode.dense_decode_topk``'s."""
    sel = _lookup(handle)
    if K != sel.K:
        raise ValueError(f"K: selector {handle} selects {sel.K}, got {K}")
    with _on_stream(q) as cp:
        out = torch.empty((q.shape[0], q.shape[1], K), dtype=torch.int64, device=q.device)
        sel.step(q, w, kv_payload, kv_scale, block_table, lengths, return_stats=False,
                 out=cp.from_dlpack(out))  # fmt: skip
    return out


@decode_topk.register_fake
def _decode_topk_fake(handle, K, q, w, kv_payload, kv_scale, block_table, lengths):
    return q.new_empty((q.shape[0], q.shape[1], K), dtype=torch.int64)
