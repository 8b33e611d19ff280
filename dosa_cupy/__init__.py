"""DoSA on the GPU with CuPy (docs/method.md §8–§9): the canonical FP8 dense route and the
exact certificate-pruned pipeline.  CUDA sources live in ``csrc/``.

    dense_logits(q, w, k_payload, k_scale, ks, ke)      canonical FP8 logits [Qn, N]
    dense_topk(q, w, k_payload, k_scale, K, ks, ke)     dense logits + exact selection
    dosa_topk(q, w, k_payload, k_scale, K, ks, ke, **o) DoSA; ids == dense_topk bitwise
                                                        (int64 ids, −1 padding, as dosa_ref)
    fused_topk(...)                                     fused scoring + online τ filter
    RouteMemo(refresh)                                  route choices kept across chunks
                                                        (dosa_topk(..., route_memo=memo))
    ragged_topk(q, w, k_payload, k_scale, K, cu_q, cu_k) B requests in one call (serving.py)
    paged_prefill_topk(q, w, kv, kv_scale, block_table, lengths, cu_q, K)
                                                        prefill over the paged FP8 cache
    capture.PrefillSelectorGPU(K, **o)                  a prefill step for CUDA graphs
                                                        (step(..., out=) → finish())
    quantize_keys(k, scale_fmt)                         GPU e4m3 keys (= dosa_ref.fp8)
    key_rho(k_payload)                                  conservative RMS summaries ρ
    bench.main(argv)                                    `dosa bench` (routes in one run)

Where each stage runs: everything on the GPU — the plan too (batched CuPy float64 array
ops + one e4m3 rounding kernel, ``plan.build_plans``).  Kernels: mma.sync m16n8k16 on
e4m3 values converted exactly to f16 (sm_90 lowers mma e4m3 to the same HMMA path).
Records of runs and figures: docs/records/gpu_tests.md, docs/records/benchmarks.md,
docs/records/notes.md.
"""

from .cost import RouteMemo
from .dense import dense_logits, dense_topk, select_records, select_rows
from .fused import fused_topk
from .options import DosaGpuStats
from .pipeline import dosa_topk
from .prepare import key_rho, quantize_keys
from .serving import paged_prefill_topk, ragged_topk

__all__ = [
    "DosaGpuStats",
    "RouteMemo",
    "dense_logits",
    "dense_topk",
    "dosa_topk",
    "fused_topk",
    "key_rho",
    "paged_prefill_topk",
    "quantize_keys",
    "ragged_topk",
    "select_records",
    "select_rows",
]
