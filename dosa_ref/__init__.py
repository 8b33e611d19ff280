"""DoSA reference (CPU, float64): exact certificate-pruned Top-K for the DSA indexer.

Public contract (docs/design.md): ``index_scores``, ``topk_ids``, ``dosa_topk``; FP8 keys in
``dosa_ref.fp8`` and ``fp8_topk``; workloads in ``dosa_ref.workloads``.  The option and
statistics vocabulary shared with ``dosa_cupy`` is ``dosa_ref.options``.

Modules by stage of Algorithm 1 (docs/method.md §7, §9): ``prepare`` → ``seeds`` → ``cost``
and ``plan`` → ``screen`` (``certificate``; FP8: ``numeric``, ``error_model``, ``rounding``)
→ ``refine`` → ``select``, run per query by ``pipeline``; ``decode`` for decode steps.
"""

from .certificate import slack, upper_bound
from .decode import DecodeSelector
from .numeric import fp8_bounds
from .options import SelectOptions
from .pipeline import DosaResult, DosaStats, dosa_topk, fp8_topk
from .plan import Plan, PlanOptions, build_plan
from .scorer import index_scores, score_keys, topk_ids, topk_of

__all__ = [
    "DecodeSelector",
    "DosaResult",
    "DosaStats",
    "Plan",
    "PlanOptions",
    "SelectOptions",
    "build_plan",
    "dosa_topk",
    "fp8_bounds",
    "fp8_topk",
    "index_scores",
    "score_keys",
    "slack",
    "topk_ids",
    "topk_of",
    "upper_bound",
]
