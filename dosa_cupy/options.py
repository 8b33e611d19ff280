"""Options, statistics and the common start of ``dosa_topk`` and ``fused_topk``.

The shared names mean what ``dosa_ref.options`` says (``OPTIONS``, ``STATS``): ``seeds``
names seed strategies ("local", "anchor", "certificate", "explicit"), ``seed_ids`` carries
explicit key ids, and ``DosaGpuStats`` is a ``dosa_ref.options.SelectStats`` with the GPU's
own fields added.  GPU defaults: seeds="local+anchor" (certificate seeds are slower at the
benched shapes); giving ``cert_seeds`` > 0 turns "certificate" on, as giving ``seed_ids``
turns "explicit" on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from dosa_ref.options import (
    STRATEGIES,
    SelectStats,
    check_count,
    check_flag,
    default_cert_seeds,
    default_window,
    parse_strategies,
)

from ._build import cupy_or_raise
from .cost import RouteMemo
from .emulate import record_score
from .prepare import pad_batch
from .scorer import check_scorer
from .screen import PAIR_MAX_R, SCREENS, WGT_MAX_R
from .seeds import device_seed_ids, device_tau_floor

__all__ = [
    "OPTIONS",
    "DosaGpuStats",
    "StageTimer",
    "check_options",
    "resolve_options",
    "resolved",
    "start",
    "strategies",
]

OPTIONS = {
    "seeds": "local+anchor",
    "seed_ids": None,
    "window": None,
    "sinks": 16,
    "n_anchors": 4,
    "anchor_segments": 1,
    "r": 14,
    "buffer": 65536,
    "p_sample": 256,
    "cert_seeds": None,
    "cert_cap": 16384,
    "return_stats": False,
    "debug_bounds": False,
    "timing": False,
    "screen": "auto",
    "tie_reject": True,
    "route": "auto",
    "route_memo": None,
    "graph": None,
    "check": True,
    "scorer": "f16",
    "tau_floor": None,
}
ROUTES = ("auto", "dosa", "dense")  # route.py: the route choice (docs/method.md §9)
CERT_MAX = 4096  # certificate seeds per query (one selection of at most 4096 records)


@dataclass
class DosaGpuStats(SelectStats):
    """``dosa_ref.options.SelectStats`` (per-query numpy arrays; ``dosa_ref.options.STATS``
    gives each shared field's meaning) with the GPU's own fields.

    On the GPU: explicit seeds are screened and refined like any other key (they only
    raise τ), so ``screened`` = visible − default seeds; ``scored`` counts every scoring
    with all heads, re-scorings included (explicit seeds again in the certificate pass,
    survivors again in an overflow extension, every visible key again in a recovery);
    ``bound_work`` is visible·(r + 2)/H (two aux rows) plus, for the sampled queries, the
    route choice's sample screens; ``tau_final`` is NaN for recovered queries and for every
    query of a chunk that took the dense route (that route keeps no K-th record);
    ``est_survival`` / ``est_work``: the route choice's sampled survival of the screen that
    ran (or a ``RouteMemo``'s, from an earlier chunk) and f + (1 − f)((r + 2)/H + m) with
    it, NaN where nothing was sampled (``route.py``). ``dense`` marks recovered queries and
    every query of a chunk that took the dense route (dosa_topk), or every query
    (fused_topk: no screen); ``refined`` is then every visible key not a default seed.
    ``tie_rejected``: keys that the plain rule U^num < τ keeps and the tie-aware screen
    rejects (docs/method.md §7 "Tie-aware rejection and zero plateaus"), counted by the
    screen where it ran (chunks with a query at τ = 0, ``screen.tie_screen_wanted``); 0
    elsewhere.
    """

    screen: str = None  # the screen kernel that ran ("fp64", "pair", "wg"; auto's pick)
    route: object = None  # cost.RouteChoice: the route taken, why, and the predicted times
    stage_ms: dict = None  # CUDA-event time per stage (timing=True)
    bounds: object = None  # fp64 [Qn, N] U^num (debug_bounds=True), NaN where not visible

    @property
    def overflowed(self) -> np.ndarray:
        """bool [Qn]: overflows > 0 (the name dosa_cupy.bench reads; prefer ``overflows``)."""
        return self.overflows > 0

    def fill_common(self, b, seeds, recs, kth, bad) -> None:
        """The fields both routes fill alike, from the ``Batch`` b, the ``seeds.Seeds``,
        the compact ``select.Records``, the K-th selected records kth uint64 [Qn] and the
        recovered queries bad bool [Qn] (device arrays; one host copy each)."""
        cp = cupy_or_raise()
        self.fill_seeds(b, seeds)
        self.kept = cp.asnumpy(recs.cnt).astype(np.int64)
        self.overflows = cp.asnumpy(recs.over).astype(np.int64)
        self.recovered = cp.asnumpy(bad).astype(bool)
        self.dense = self.recovered.copy()
        self.tau_final = np.where(self.recovered, np.nan, record_score(cp.asnumpy(kth)))

    def fill_seeds(self, b, seeds) -> None:
        """``visible`` from the ``Batch`` b and, with the ``seeds.Seeds`` (None: no seed
        stage ran), ``explicit_seeds``, ``seeds`` and ``anchor_scored``."""
        cp = cupy_or_raise()
        self.visible = cp.asnumpy(b.visible)
        if seeds is None:
            return
        self.explicit_seeds = cp.asnumpy(seeds.xcnt).astype(np.int64)
        self.seeds = cp.asnumpy(seeds.default.cnt).astype(np.int64) + self.explicit_seeds
        if seeds.anchors is not None:
            self.anchor_scored = int(self.visible[cp.asnumpy(seeds.anchors)].sum())


def strategies(seeds, seed_ids) -> tuple[str, ...]:
    """Seed strategy names of the ``seeds`` option (``dosa_ref.options.parse_strategies``);
    ``seed_ids`` turns "explicit" on.  ValueError naming ``seeds`` for key ids given as
    ``seeds`` (they go to ``seed_ids``) and naming ``seed_ids`` for "explicit" without ids."""
    names_only = isinstance(seeds, str) or (
        isinstance(seeds, (list, tuple)) and all(isinstance(x, str) for x in seeds)
    )
    if not names_only:
        raise ValueError(
            f"seeds: expected seed strategy names from {STRATEGIES} (e.g. 'local+anchor'), "
            f"got {type(seeds).__name__}; explicit key ids go to seed_ids="
        )
    names = parse_strategies(seeds)
    if seed_ids is not None and "explicit" not in names:
        names = ("explicit", *names)
    if "explicit" in names and seed_ids is None:
        raise ValueError("seed_ids: the 'explicit' seed strategy needs seed_ids")
    return names


def _certificate_on(o: dict, names: tuple) -> bool:
    cs = o["cert_seeds"]
    return cs > 0 if cs is not None else "certificate" in names


def check_options(kw: dict) -> dict:
    """The options of ``dosa_topk`` / ``fused_topk`` over the defaults ``OPTIONS``;
    ValueError naming the option for an unknown name or a bad value.  Defaults that
    depend on K (window, cert_seeds) stay None until ``resolve_options``."""
    for k in kw:
        if k not in OPTIONS:
            raise ValueError(f"{k}: unknown option; expected one of {sorted(OPTIONS)}")
    o = dict(OPTIONS)
    o.update(kw)
    names = strategies(o["seeds"], o["seed_ids"])
    for k in ("sinks", "n_anchors", "p_sample"):
        check_count(k, o[k])
    for k in ("buffer", "cert_cap", "anchor_segments"):
        check_count(k, o[k], 1)
    if o["window"] is not None:
        check_count("window", o["window"])
    if o["cert_seeds"] is not None:
        check_count("cert_seeds", o["cert_seeds"], 0, CERT_MAX)
    rr = check_count("r", o["r"], 1, 30)
    if o["screen"] not in SCREENS:
        raise ValueError(f"screen: expected one of {tuple(SCREENS)}, got {o['screen']!r}")
    check_scorer(o["scorer"], device=False)  # the device's part in pad_batch
    if not isinstance(o["route"], str) or o["route"] not in ROUTES:
        raise ValueError(f"route: expected one of {ROUTES}, got {o['route']!r}")
    memo = o["route_memo"]
    if memo is not None and not isinstance(memo, RouteMemo):
        raise ValueError(f"route_memo: expected None or a cost.RouteMemo, got {memo!r}")
    if memo is not None and o["route"] != "auto":
        raise ValueError(f"route_memo: needs route='auto', got route={o['route']!r}")
    if o["graph"] is not None and not callable(getattr(o["graph"], "topk", None)):
        raise ValueError(f"graph: expected None or a capture.StepGraphs, got {o['graph']!r}")
    if o["route"] == "dense" and o["debug_bounds"]:
        raise ValueError("debug_bounds: the dense route computes no bounds (route='dense')")
    for k in ("tie_reject", "check"):
        check_flag(k, o[k])
    if o["screen"] == "wg" and _certificate_on(o, names):
        raise ValueError(
            f"screen: 'wg' needs no certificate seeds, got r={rr}, "
            f"cert_seeds={o['cert_seeds']}, seeds={o['seeds']!r}"
        )
    if o["screen"] == "pair" and (rr > PAIR_MAX_R or _certificate_on(o, names)):
        raise ValueError(
            f"screen: 'pair' needs r <= {PAIR_MAX_R} and no certificate seeds, got r={rr}, "
            f"cert_seeds={o['cert_seeds']}, seeds={o['seeds']!r}"
        )
    if o["screen"] == "wgt" and (rr > WGT_MAX_R or _certificate_on(o, names)):
        raise ValueError(
            f"screen: 'wgt' needs r <= {WGT_MAX_R} and no certificate seeds, "
            f"got r={rr}, cert_seeds={o['cert_seeds']}, seeds={o['seeds']!r}"
        )
    return o


def resolve_options(o: Mapping, K: int) -> Mapping:
    """Checked options → the counts the stages read, as a read-only mapping (``resolved``):
    the strategies off give no seeds of their kind (no "local": window = sinks = 0; no
    "anchor": n_anchors = 0); window None → ``default_window(K, strategies)``; cert_seeds
    (0 = off) None → ``default_cert_seeds(K)`` with "certificate", else 0; route "auto" →
    "dosa" with debug_bounds (bounds exist only where a chunk is screened);
    ``o["strategies"]``."""
    o = dict(o)
    names = strategies(o["seeds"], o["seed_ids"])
    o["strategies"] = names
    if o["window"] is None:
        o["window"] = default_window(K, names)
    if "local" not in names:
        o["window"] = o["sinks"] = 0
    if "anchor" not in names:
        o["n_anchors"] = 0
    if o["debug_bounds"] and o["route"] == "auto":
        o["route"] = "dosa"  # the bounds asked for exist only where the chunk is screened
    cert = _certificate_on(o, names)
    cs = o["cert_seeds"]
    o["cert_seeds"] = (default_cert_seeds(K) if cs is None else cs) if cert else 0
    return resolved(o)


def resolved(o: Mapping, **changes) -> Mapping:
    """Resolved options ``o`` with ``changes`` as a new read-only mapping: the one way a
    decision of a call (the route's screen, the device copy of the seed ids) reaches the
    stages after it; no stage changes the options it was given."""
    return MappingProxyType({**o, **changes})


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
    """The common start of ``dosa_topk`` and ``fused_topk``: (resolved options with the
    explicit seed ids validated on the device, stage timer, stats (None unless
    return_stats or debug_bounds), ``Batch`` (its value checks deferred: the caller calls
    ``b.raise_if_bad()`` before its result leaves) with heads
    padded to 16·MT, empty); ``empty`` is the finished result (−1 ids) when there is no
    query or no key, else None."""
    cp = cupy_or_raise()
    o = check_options(options)
    tm = StageTimer(o["timing"])
    # the value checks are read back by the caller (Batch.raise_if_bad): a chunk that goes
    # to the dense route at once reads them after its launches, not before
    b = pad_batch(q, w, k_payload, k_scale, K, ks, ke, bool(o["check"]), defer=True,
                  scorer=o["scorer"])  # fmt: skip
    o = resolve_options(o, b.K)
    o = resolved(o, seed_ids=device_seed_ids(o["seed_ids"], b.Qn, b.N),
                 tau_floor=device_tau_floor(o["tau_floor"], b.Qn))  # fmt: skip
    # the statistics only when asked for: a small chunk's call is mostly host time
    want = o["return_stats"] or o["debug_bounds"]
    st = DosaGpuStats(b.Qn, stage_ms={}) if want else None
    empty = None
    if b.Qn == 0 or b.N == 0:
        b.raise_if_bad()
        ids = cp.full((b.Qn, b.K), -1, dtype=cp.int64)
        empty = (ids, st) if o["return_stats"] else ids
    return o, tm, st, b, empty
