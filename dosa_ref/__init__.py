"""DoSA reference (CPU, float64): exact certificate-pruned Top-K for the DSA indexer.

Public contract (docs/design.md): ``index_scores``, ``topk_ids``, ``dosa_topk``; FP8 in
``dosa_ref.fp8``; workloads in ``dosa_ref.workloads``.
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
