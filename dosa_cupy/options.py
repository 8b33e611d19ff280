"""Options, statistics and the common start of ``dosa_topk`` and ``fused_topk``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._build import cupy_or_raise
from .prepare import pad_batch
from .refine import STREAMS
from .screen import PAIR_MAX_R, SCREENS
from .seeds import device_seeds

__all__ = ["OPTIONS", "PLANNERS", "DosaGpuStats", "StageTimer", "check_options", "start"]

OPTIONS = {
    "window": 2048,
    "sinks": 16,
    "n_anchors": 4,
    "r": 14,
    "buffer": 65536,
    "mma_bits": 17,
    "p_sample": 256,
    "seeds": None,
    "cert_seeds": 0,
    "cert_cap": 16384,
    "return_stats": False,
    "debug_bounds": False,
    "timing": False,
    "stream": "per_query",
    "screen": "fp64",
    "planner": "fused",
}
PLANNERS = ("cupy", "fused")  # plan.build_plans / plan_fused.build_plans_fused


@dataclass
class DosaGpuStats:
    """Per-query counts (numpy) and stage times (ms, when ``timing=True``).

    ``seeds``: default seed records (sinks, local window, anchor pool; excluded from
    screening); ``explicit_seeds``: explicit seeds scored beyond them (distinct, visible,
    not default seeds) — they raise τ but are screened like any other key;
    ``cert_seeds``: certificate-guided seed candidates per query (the survivors of largest
    U, before deduplication against explicit seeds; ``cert_seeds`` > 0).
    """

    seeds: np.ndarray = None
    explicit_seeds: np.ndarray = None
    cert_seeds: np.ndarray = None
    screen: str = None  # the screen kernel that ran ("fp64", "fast32", "pair"; auto's pick)
    tau: np.ndarray = None
    screened: np.ndarray = None
    survivors: np.ndarray = None
    kept: np.ndarray = None
    overflowed: np.ndarray = None
    recovered: np.ndarray = None
    r: np.ndarray = None
    omitted_positive: np.ndarray = None
    aggregated: np.ndarray = None
    stage_ms: dict = field(default_factory=dict)
    bounds: object = None  # fp64 [Qn, N] U^num (debug_bounds=True), NaN where not visible
    # stream="shared" (docs/method.md §9): keys of the query's group shared set (the shared
    # stream scores each for every query of the group whose bit is set) and the query's
    # survivors refined there (the rest, survivors − shared_survivors, per query).
    shared_keys: np.ndarray = None
    shared_survivors: np.ndarray = None


def check_options(kw: dict) -> dict:
    """The options of ``dosa_topk`` / ``fused_topk`` over the defaults ``OPTIONS``;
    ValueError naming the option for an unknown name or a bad value."""
    for k in kw:
        if k not in OPTIONS:
            raise ValueError(f"{k}: unknown option; expected one of {sorted(OPTIONS)}")
    o = dict(OPTIONS)
    o.update(kw)
    for k in ("window", "sinks", "n_anchors", "p_sample", "cert_seeds"):
        v = o[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{k}: expected a nonnegative integer, got {v!r}")
    for k in ("buffer", "cert_cap"):
        v = o[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{k}: expected a positive integer, got {v!r}")
    rr = o["r"]
    if isinstance(rr, bool) or not isinstance(rr, (int, np.integer)) or not 1 <= rr <= 30:
        raise ValueError(f"r: expected an integer in [1, 30], got {rr!r}")
    cs = o["cert_seeds"]
    if cs > 4096:
        raise ValueError(f"cert_seeds: expected an integer in [0, 4096], got {cs!r}")
    mb = o["mma_bits"]
    if isinstance(mb, bool) or not isinstance(mb, (int, np.integer)) or not 8 <= mb <= 24:
        raise ValueError(f"mma_bits: expected an integer in [8, 24], got {mb!r}")
    if o["stream"] not in STREAMS:
        raise ValueError(f"stream: expected one of {STREAMS}, got {o['stream']!r}")
    if o["screen"] not in SCREENS:
        raise ValueError(f"screen: expected one of {tuple(SCREENS)}, got {o['screen']!r}")
    if o["planner"] not in PLANNERS:
        raise ValueError(f"planner: expected one of {PLANNERS}, got {o['planner']!r}")
    if o["screen"] == "pair" and (rr > PAIR_MAX_R or cs):
        raise ValueError(
            f"screen: 'pair' needs r <= {PAIR_MAX_R} and cert_seeds = 0, got r={rr}, "
            f"cert_seeds={cs}"
        )
    return o


class StageTimer:
    """CUDA-event time of each stage (``timing=True``; one synchronization per mark)."""

    def __init__(self, on: bool):
        self.on = on
        self.ms = {}
        self.cp = cupy_or_raise()
        self.last = None
        if on:
            self.last = self.cp.cuda.Event()
            self.last.record()

    def mark(self, name: str) -> None:
        if not self.on:
            return
        e = self.cp.cuda.Event()
        e.record()
        e.synchronize()
        self.ms[name] = self.ms.get(name, 0.0) + self.cp.cuda.get_elapsed_time(self.last, e)
        self.last = e


def start(q, w, k_payload, k_scale, K, ks, ke, options: dict):
    """The common start of ``dosa_topk`` and ``fused_topk``: (options with explicit seeds
    validated on the device, stage timer, stats, ``Batch`` with heads padded to 16·MT,
    empty); ``empty`` is the finished result (−1 ids) when there is no query or no key,
    else None."""
    cp = cupy_or_raise()
    o = check_options(options)
    tm = StageTimer(o["timing"])
    b = pad_batch(q, w, k_payload, k_scale, K, ks, ke)
    o["seeds"] = device_seeds(o["seeds"], b.Qn, b.N)
    st = DosaGpuStats()
    empty = None
    if b.Qn == 0 or b.N == 0:
        ids = cp.full((b.Qn, b.K), -1, dtype=cp.int64)
        empty = (ids, st) if o["return_stats"] else ids
    return o, tm, st, b, empty
