"""A prefill step that can be captured in a CUDA graph (docs/serving.md "Prefill capture").

``dosa_topk`` reads device values back to size buffers and to choose branches; a graph
cannot hold such reads, and memory that CuPy's pool hands to a captured kernel is handed
to other work afterwards.  ``PrefillSelectorGPU`` runs the same stages with every size
fixed by the chunk's shape and every branch fixed when a shape is first seen:

* the screen kernel and r: chosen on the shape's first step (``route="auto"``: the cost
  model's choice for that chunk, ``dosa_topk``'s ``stats.route``), then kept;
* the route: with ``route="auto"``, where the first step's choice was sampled, chosen per
  step inside the step (``route_per_step=True``; off by default until its GPU tests
  pass, docs/records/gpu_tests.md): the prefix builds the anchor pool,
  seeds the sampled rows alone and screens them, csrc/route.cu route_pick applies the cost
  model's ``LinearRule`` to the counts on the device, and an if/else graph node runs DoSA's
  stages (the chunk's seeds on) or the dense route's (_graph.py; docs/method.md §9 "A route
  chosen inside a graph"); otherwise fixed on the first step;
* the anchor pool at its capacity min(anchors · anchor_segments · K, N), its size P on the device
  (``seeds.seed_stage`` with given anchors, ``plan.plan_stage``'s device sample);
* the screen build (tie-aware or plain) from the first step's τ; both are exact;
* no overflow extension and no recovery inside the step: a query whose compact records
  overflowed, whose plan is invalid or that sees an invalid key scale is *flagged* on the
  device, its ids row is written as ``FLAGGED`` (−2, never a key id), and ``finish``
  re-runs exactly those queries on the dense route outside the graph (docs/method.md §7
  C.3) — a candidate is never dropped; with ``RECOVER_ROWS`` > 0 (off by default) the
  first of them are re-run inside the graph instead, behind an if node;
* temporaries from arenas per shape (``Arena``; one for the prefix, one per route's body):
  the shape's first step measures the bytes its allocations take (running both bodies
  where the route is chosen per step), later steps take the same sequence of blocks from
  each allocation, so a captured graph keeps its addresses for the selector's life.

The value checks (``check=True``) run inside the step and are read by ``finish``, which
raises the same ``ValueError`` as ``dosa_topk``; the ranges are clamped on the device
first, so a bad range never reads out of bounds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from dosa_ref.options import check_flag

from . import _graph
from ._build import cupy_or_raise, device_name
from .cost import LinearRule, model_for, sample_scale
from .dense import _dense_topk_raw, dense_ids
from .options import OPTIONS, check_options, resolve_options, resolved, strategies
from .pipeline import dosa_topk
from .plan import plan_stage, row_tiles
from .prepare import Batch, as_device, check_selection_K, key_rho, pad_batch
from .refine import refine_stage
from .route import pick_route, sample_counts, sample_rows
from .screen import plateau_constants, screen_arith, screen_stage, tie_screen_wanted
from .seeds import anchor_queries, anchor_stage, pool_capacity, seed_stage
from .select import recover_condition, recover_first, recovery_queries, select_ids

__all__ = ["FLAGGED", "Arena", "PrefillSelectorGPU", "PrefillStep", "StepGraphs"]

FLAGGED = -2  # the ids row of a query ``finish`` must still complete (not a key id, not −1)
# Flagged rows a captured step completes inside its graph (docs/serving.md "Prefill
# capture"; docs/method.md §7 C.3): the first RECOVER_ROWS of them by the dense route, behind
# an if node that runs only where the step flagged a row, so that finish has only its status
# to read where few rows were flagged; 0: every flagged row is left to finish — the default
# until its GPU tests have run (docs/records/gpu_tests.md).  Fixed on a shape's first step.
RECOVER_ROWS = 0
ALIGN = 256  # bytes: every arena block starts on this boundary (CuPy's pool uses 512)


def _aligned(size: int) -> int:
    """``size`` bytes rounded up to a whole number of ALIGN blocks."""
    return -(-int(size) // ALIGN) * ALIGN


# options a captured step cannot honour (each needs a host read or a host copy per call),
# with the values that mean "off" and are accepted
_NOT_CAPTURABLE = {
    "seed_ids": (None,),  # the explicit-seed table's width is read back
    "cert_seeds": (None, 0),  # certificate seeds size their table from the survivors
    "return_stats": (False,),
    "debug_bounds": (False,),
    "timing": (False,),
    "route_memo": (None,),
    "tau_floor": (None,),  # a sharded context's floor: the eager call's (dosa_cupy.shards)
}


def _is_off(v, off: tuple) -> bool:
    """``v`` is one of ``off`` (None and False by identity, integers by value; an array
    never is)."""
    return any(
        v is x
        if x is None or isinstance(x, bool)
        else (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v == x)
        for x in off
    )


def _refusal(options: dict) -> str | None:
    """Why a captured step cannot take ``options`` (an option that needs a host read or copy
    per call; ``PrefillSelectorGPU`` raises it as ValueError), or None."""
    for name, off in _NOT_CAPTURABLE.items():
        if name in options and not _is_off(options[name], off):
            return f"{name}: not available in a captured step, got {options[name]!r}"
    if options.get("screen") == "pair":
        return "screen: 'pair' is not available in a captured step (host copies)"
    return None


class Arena:
    """A bump allocator over one device allocation, for CuPy's ``using_allocator``: block
    i of a step starts where block i − 1 ended (rounded up to ``ALIGN``), and ``reset``
    starts the next step at offset 0.  Blocks are never reused within a step, so kernels
    of one step never share memory, and every step of the same allocation sequence gets
    the same addresses — the property a replayed graph needs."""

    def __init__(self, nbytes: int):
        cp = cupy_or_raise()
        self.nbytes = int(nbytes)
        self._mem = cp.cuda.Memory(max(self.nbytes, ALIGN))  # owned; freed with the arena
        self.used = 0

    def reset(self) -> None:
        self.used = 0

    def malloc(self, size: int):
        cp = cupy_or_raise()
        off = self.used
        end = off + _aligned(size)
        if end > self.nbytes:
            raise RuntimeError(
                f"arena: a step asked for more than the {self.nbytes} bytes its shape's first "
                "step took (the allocation sequence changed; a bug, please report)"
            )
        self.used = end
        return cp.cuda.MemoryPointer(self._mem, off)


class _Counter:
    """``using_allocator`` hook of a shape's first step: passes each request to the
    allocator in place and adds its aligned size."""

    def __init__(self, inner):
        self.inner, self.nbytes = inner, 0

    def malloc(self, size: int):
        self.nbytes += _aligned(size)
        return self.inner(size)


@dataclass
class PrefillStep:
    """One step's result: ``ids`` (the ``out`` given, int64 or int32 [Qn, K]; rows
    ``FLAGGED`` until ``finish``) and what ``finish`` reads: status int64 [3] (the value
    checks' flag word, the number of flagged rows, 1 where the route chosen in the step was
    DoSA's), redo bool [Qn] or None, the step's ``Batch`` (its inputs, for the re-run) and
    its ``ValueCheck`` or None — device arrays at fixed addresses, rewritten by every replay
    of a graph that captured this step.  ``route``: "dosa" or "dense", the route the step
    took — where the step chooses it (``PrefillSelectorGPU``'s ``route_per_step``), that of
    the run ``finish`` read last ("per_step" before)."""

    ids: object
    status: object
    redo: object
    batch: Batch
    check: object = None
    keep: object = None  # the shape's arenas and anchors: alive as long as this step is
    route: str = "dense"

    def finish(self) -> int:
        """Complete this step or the last replay of the graph that captured it: read the
        status (one synchronization of the current stream: call it with the replay's
        stream current, or after synchronizing), raise ``ValueError`` on bad input (the
        value checks ran), replace each flagged row of ``ids`` by the dense route's ids
        (docs/method.md §7 C.3).  Returns the number of rows re-run."""
        cp = cupy_or_raise()
        status = cp.asnumpy(self.status)
        if status[0] and self.check is not None:
            self.check.forget()
            self.check.raise_if_bad()
        if self.keep is not None and self.keep.route == "per_step":
            self.route = "dosa" if status[2] else "dense"
        n = int(status[1])
        if n:
            rows = cp.flatnonzero(self.redo)
            self.ids[rows] = dense_ids(self.batch.rows(rows)).astype(self.ids.dtype)
        return n


@dataclass
class _Shape:
    """What a shape's first step fixed."""

    route: str  # "dosa", "dense" or "per_step" (DoSA's body or the dense route's, per step)
    screen: str | None
    r: int | None
    tie: bool
    anchors: object  # int64 [na] device rows or None
    rule: object = None  # per_step: float64 [7] device, cost.LinearRule.coefficients
    side: object = None  # per_step: the stream the if/else node's bodies are captured from
    choice: object = None  # the first step's ``cost.RouteChoice`` (None: it took none)
    recover: int = 0  # flagged rows completed inside a captured step (RECOVER_ROWS), or 0
    arenas: dict | None = None  # part → Arena, from the first step's sizes
    sizes: dict = field(default_factory=dict)  # part → bytes, measured by the first step


class PrefillSelectorGPU:
    """Exact prefill Top-K as a graph-capturable step (module doc; docs/serving.md).

    Args:
        K: selection size (1 ≤ K ≤ 4096).
        check: run the value checks inside the step (``PrefillStep.finish`` raises on bad
            input);
            False: shapes and dtypes only (a caller that validated its inputs).
        options: ``dosa_topk``'s options that fix the method: route ("auto", default: the
            cost model's choice on a shape's first step; "dosa"; "dense"), screen ("auto":
            decided on the first step; "fp64", "wg", "wgt"; "pair" is not capturable —
            "auto" picks it only where the Hopper screens do not run, and its chunks then
            take "fp64" with the same r),
            r, seeds ("local+anchor", "local", "anchor"), window, sinks, n_anchors, buffer
            (compact records per query: a query with more is flagged and re-run), p_sample,
            tie_reject (the tie-aware kernels when the first step has a query at τ = 0).
            Options that need host reads per call (seed_ids, cert_seeds, statistics,
            route_memo) raise ValueError.
        route_per_step: True — with route "auto", where the shape's first step took the
            sampled decision, every later step (eager or replayed) chooses between DoSA and
            the dense route itself, from its own sample (module doc); False (default, until
            its GPU tests pass: docs/records/gpu_tests.md), or where conditional graph
            nodes are not available (``_graph.available``): the first step's route is kept.
            Ids never depend on it.

    Use: ``h = step(..., out=)`` issues kernels only once a shape has been seen (its first
    step is eager: it decides and measures); capture a later step in a graph, replay it on
    new inputs in the same arrays, then call ``h.finish()`` (``h``: the captured step's
    ``PrefillStep``) with the replay's stream current: one 24-byte read; the flagged rows
    of ``out`` are completed exactly.  Ids equal ``dense_topk``'s after ``finish``; it
    reads the inputs as they are when it runs (call it before writing the next chunk).
    Graphs of one shape share its arenas: replay them in stream order, each followed by its
    own step's ``finish``.  The arenas hold all of a step's temporaries (no reuse; an estimated
    2.5–3 GB for DoSA's stages at Qn = 4096, 128K keys, default buffer, and the dense route's
    logits beside them where the route is chosen per step); ``release`` frees them.
    """

    def __init__(self, K: int, *, check: bool = True, route_per_step: bool = False, **options):
        refusal = _refusal(options)
        if refusal is not None:
            raise ValueError(refusal)
        self.check = check_flag("check", check)
        self.route_per_step = check_flag("route_per_step", route_per_step)
        o = check_options(dict(options, check=self.check))
        if not set(strategies(o["seeds"], None)) <= {"local", "anchor"}:
            raise ValueError(f"seeds: a captured step takes local and anchor, got {o['seeds']!r}")
        self.K = check_selection_K(K)
        self._o = o
        self._shapes: dict = {}

    # -- the step ---------------------------------------------------------------------------

    def step(self, q, w, k_payload, k_scale, ks=None, ke=None, *, out) -> PrefillStep:
        """Top-K ids of one chunk into ``out`` (int64 or int32 [Qn, K], a CuPy array or a
        DLPack tensor; flagged rows ``FLAGGED`` until ``PrefillStep.finish``).  Layout and
        meaning as ``dosa_topk``.  Issues kernels only once the shape has been seen."""
        cp = cupy_or_raise()
        # CuPy views first (no copies of device arrays or DLPack tensors): the key reads
        # their layouts
        q, w = as_device(q, "q", np.uint8), as_device(w, "w")
        k_payload = as_device(k_payload, "k_payload", np.uint8)
        k_scale = as_device(k_scale, "k_scale")
        ks, ke = (None if a is None else as_device(a, n) for a, n in ((ks, "ks"), (ke, "ke")))
        out = _device_out(out, q.shape[0] if q.ndim else 0, self.K)  # before any work
        key = (cp.cuda.Device().id, *_shape_key(q, w, k_payload, k_scale, ks, ke, out))
        sh = self._shapes.get(key)
        if sh is None:  # eager: decide, measure the allocations, size the arenas
            sh = self._first(q, w, k_payload, k_scale, ks, ke)
            res = self._run(sh, q, w, k_payload, k_scale, ks, ke, out)
            sh.arenas = {part: Arena(n) for part, n in sh.sizes.items()}
            self._shapes[key] = sh
            return res
        return self._run(sh, q, w, k_payload, k_scale, ks, ke, out)

    def release(self) -> None:
        """Free every shape's arena and decisions.  Graphs that captured a step of this
        selector must not be replayed afterwards."""
        self._shapes.clear()

    # -- internals --------------------------------------------------------------------------

    def _first(self, q, w, k_payload, k_scale, ks, ke) -> _Shape:
        """A shape's decisions (route, screen, r, tie-aware kernels, anchors), from its first
        step."""
        o = self._o
        b = pad_batch(q, w, k_payload, k_scale, self.K, ks, ke, self.check, scorer=o["scorer"])
        if b.Qn == 0 or b.N == 0:  # nothing to select: −1 rows, no route to choose
            return _Shape("dense", None, None, False, None)
        ro = resolve_options(o, b.K)
        route, screen, r = o["route"], o["screen"], int(o["r"])
        rule = choice = None
        if route == "auto" or screen == "auto":
            opts = {k: v for k, v in o.items() if k not in ("check", "return_stats")}
            _, st = dosa_topk(q, w, k_payload, k_scale, self.K, ks, ke, check=False,
                              return_stats=True, **opts)  # fmt: skip
            choice = st.route
            route = choice.route
            if route == "dosa":
                screen, r = choice.screen, int(choice.r)
            if o["route"] == "auto" and self._per_step(choice):
                screen, r, rule = self._rule(b, choice)
                route = "per_step"
        if route != "dense" and screen == "pair":  # auto's narrow pick off Hopper (host copies)
            screen = "fp64"
        cp = cupy_or_raise()
        tie = False
        anchors = anchor_queries(b.Qn, ro["n_anchors"])
        if route != "dense" and ro["tie_reject"]:
            tie = tie_screen_wanted(seed_stage(b, ro, anchors), ro)
        # device constants copied once, before the allocations are measured
        if tie:
            plateau_constants(cp, row_tiles(r))
        sh = _Shape(route, screen, r, bool(tie), anchors, choice=choice)
        if route == "per_step":
            sample_rows(b.Qn, screen)
            sh.rule = cp.asarray(rule.coefficients(), dtype=cp.float64)
        if route != "dense" and RECOVER_ROWS > 0 and _graph.available():
            sh.recover = int(RECOVER_ROWS)
        if route == "per_step" or sh.recover:
            sh.side = cp.cuda.Stream(non_blocking=True)
        return sh

    def _per_step(self, choice) -> bool:
        """Whether a shape whose first step chose ``choice`` (a ``RouteChoice``) chooses its
        route per step: the sampled decision, ``route_per_step``, conditional nodes here."""
        return self.route_per_step and choice.reason == "sampled" and _graph.available()

    def _rule(self, b: Batch, choice) -> tuple:
        """(screen, r, ``cost.LinearRule``) of a shape whose route is chosen per step: DoSA's
        body takes the sampled candidate predicted fastest, whose sample's measured time, per
        visible pair of the first step, is the screen's share of the rule."""
        cands = {k: v for k, v in choice.predicted_ms.items() if k != "dense"}
        key = min(cands, key=lambda k: (cands[k], k))
        screen, r = key.split("/")  # cost.candidate_key's "screen/r"
        pairs = float(b.visible.sum())
        screen_ms = choice.sample_ms[key] * sample_scale(screen, b.Qn, choice.sample[key])
        model = model_for(b.scorer, device_name())
        rule = LinearRule.of(model, b.Qn, b.N, b.K, b.heads, screen_ms / pairs if pairs else 0.0)
        return screen, int(r), rule

    def _run(self, sh: _Shape, q, w, k_payload, k_scale, ks, ke, out) -> PrefillStep:
        """The stages with fixed sizes and branches; kernels only (module doc), but for the
        route's read-back of an eager step whose route is chosen per step."""
        cp = cupy_or_raise()
        rho = pooled = o = None
        with self._part(sh, "prefix"):
            b = pad_batch(q, w, k_payload, k_scale, self.K, ks, ke, self.check, defer=True,
                          scorer=self._o["scorer"])  # fmt: skip
            status = cp.zeros(3, dtype=cp.int64)
            if b.pending is not None:
                status[0] = b.pending.flag_word()
            if b.Qn == 0 or b.N == 0:
                out[...] = -1
                return PrefillStep(out, status, None, b, b.pending, sh)
            if sh.route != "dense":
                o = resolved(resolve_options(self._o, b.K), screen=sh.screen)
            if sh.route == "per_step":  # the sampled rows seeded alone; the chunk's seeds
                rho = key_rho(b.kp)  # are DoSA's body's (docs/method.md §9, as above)
                pooled = anchor_stage(b, o, sh.anchors, pool_capacity(b, o, sh.anchors))
                bs = b.rows(sample_rows(b.Qn, sh.screen)[0])
                ss = seed_stage(bs, o, sh.anchors, pooled)
                stream = cp.cuda.get_current_stream()
                cond = _graph.condition(stream) if _graph.capturing(stream) else None
                sample = sample_counts(bs, ss, rho, o, sh.screen, sh.r, sh.tie)
                pick_route(b, sample, sh.rule, cond, status[2:])
                # every row flagged until a body writes it: a step in which no body ran is
                # completed whole by finish, never returned stale (docs/method.md §9 "A route
                # chosen inside a graph")
                redo = cp.ones(b.Qn, dtype=cp.bool_)
                status[1:2].fill(b.Qn)
        step = PrefillStep(out, status, None, b, b.pending, sh, route=sh.route)
        if sh.route == "per_step":
            step.redo = redo

        def dosa() -> None:
            with self._part(sh, "dosa"):
                self._dosa(sh, step, o, rho, pooled)

        def dense() -> None:
            with self._part(sh, "dense"):
                out[...] = _dense_topk_raw(b.q, b.w, b.kp, b.ksc, b.K, b.ks, b.ke,
                                           scorer=b.scorer)  # fmt: skip
                if sh.route == "per_step":  # a step whose DoSA body ran first (below)
                    status[1] = 0

        if sh.route != "per_step":
            (dosa if sh.route == "dosa" else dense)()
        elif cond is not None:
            _graph.if_else(stream, sh.side, cond, dosa, dense)
        else:  # eager: the one read-back; the first step runs both (their arenas' sizes)
            step.route = "dosa" if int(status[2]) else "dense"
            bodies = (dense, dosa) if step.route == "dosa" else (dosa, dense)
            for body in bodies if sh.arenas is None else bodies[1:]:
                body()
        if sh.recover:
            self._recover(sh, step)
        return step

    def _recover(self, sh: _Shape, step: PrefillStep) -> None:
        """Where the shape recovers inside the step (``RECOVER_ROWS``): captured, an if node
        that runs ``select.recover_first`` on the step's first ``sh.recover`` flagged rows
        where the step flagged any (csrc/route.cu recover_pick); finish completes the rest.
        An eager step leaves its flagged rows to finish; the shape's first step runs the
        recovery once on copies of the flags and the status (its ids rows come out exact,
        its flags stay for finish) to size the part's arena."""
        cp = cupy_or_raise()
        stream = cp.cuda.get_current_stream()
        redo, status = step.redo, step.status

        def recover() -> None:
            with self._part(sh, "recover"):
                recover_first(step.batch, step.ids, redo, status, sh.recover)

        if _graph.capturing(stream):
            cond = _graph.condition(stream)
            recover_condition(status, cond)
            _graph.if_else(stream, sh.side, cond, recover)
        elif sh.arenas is None:
            redo, status = redo.copy(), status.copy()
            recover()

    def _dosa(self, sh: _Shape, step: PrefillStep, o: dict, rho, pooled) -> None:
        """DoSA's stages from the seeds on into ``step``'s ids, status[1] and redo (ρ and the
        anchor pool ``pooled`` where the prefix made them)."""
        cp = cupy_or_raise()
        b = step.batch
        if rho is None:
            rho = key_rho(b.kp)
        seeds = seed_stage(b, o, sh.anchors, pooled)
        plan = plan_stage(b, seeds.pool, sh.r, o, seeds.pcount, screen_arith(sh.screen, sh.tie))
        screened = screen_stage(b, plan, seeds, rho, o, sh.tie)
        recs = refine_stage(b, seeds.tau, screened.surv, int(o["buffer"]), extend=False)
        ids, _ = select_ids(b.K, seeds.default, recs)
        redo = recovery_queries(b) | ~plan.valid | recs.over
        if step.redo is None:
            step.redo = redo
        else:  # the prefix's (route chosen per step)
            step.redo[...] = redo
        step.ids[...] = cp.where(step.redo[:, None], FLAGGED, ids)
        step.status[1] = cp.count_nonzero(step.redo)

    @contextlib.contextmanager
    def _part(self, sh: _Shape, part: str):
        """Allocations of one part of a step ("prefix", "dosa", "dense"): on the shape's
        first step counted into ``sh.sizes``, later from the part's arena, whose blocks must
        come out as the first step's did."""
        cp = cupy_or_raise()
        if sh.arenas is None:
            counter = _Counter(cp.cuda.get_allocator())
            with cp.cuda.using_allocator(counter.malloc):
                yield
            sh.sizes[part] = sh.sizes.get(part, 0) + counter.nbytes
            return
        arena = sh.arenas[part]
        arena.reset()
        with cp.cuda.using_allocator(arena.malloc):
            yield
        if arena.used != arena.nbytes:
            raise RuntimeError(
                f"arena: this step's {part} took {arena.used} bytes, its shape's first step "
                f"{arena.nbytes} (the allocation sequence changed; a bug, please report)"
            )


class StepGraphs:
    """``dosa_topk(..., graph=StepGraphs())``: each call through a captured step of its chunk
    shape (docs/serving.md "Prefill capture"), for a caller that selects over many chunks of
    a few shapes.  Per shape and options, the first call runs the step eagerly (the shape's
    first step: decides, sizes the arenas), the second captures it, every later one copies
    its inputs into the graph's arrays and replays it — no host work between the kernels, and
    with route "auto" the route chosen in the graph from the call's own sample
    (``PrefillSelectorGPU``'s ``route_per_step``).  Each call synchronizes once (``finish``:
    flagged rows completed, bad input raised) and returns a new int64 [Qn, K] array, equal to
    ``dense_topk``'s.  Calls whose options a graph cannot hold (statistics, timing, debug
    bounds, explicit or certificate seeds, a route memo, a τ floor) run eagerly.

    Memory: per shape, a copy of the inputs and the step's arenas (docs/serving.md); ``release``
    frees them.  Not thread-safe; one per indexer layer or per stream of calls.  Its GPU test
    has not yet run with the route chosen per step (docs/records/gpu_tests.md)."""

    def __init__(self):
        self._entries: dict = {}  # shape and options → _Graphed
        self._stream = None

    def release(self) -> None:
        """Free every shape's graphs, input copies and arenas."""
        self._entries.clear()

    def topk(self, q, w, k_payload, k_scale, K, ks, ke, options: dict):
        """``dosa_topk``'s ids through the captured step, or None where ``options`` are not
        capturable (the caller then runs eagerly)."""
        o = {k: v for k, v in options.items() if k != "graph"}
        if _refusal(o) is not None:
            return None
        seeds = strategies(o.get("seeds", OPTIONS["seeds"]), None)
        if not set(seeds) <= {"local", "anchor"}:  # certificate or explicit seeds
            return None
        cp = cupy_or_raise()
        ranges = (None if a is None else as_device(a, n) for a, n in ((ks, "ks"), (ke, "ke")))
        x = (as_device(q, "q", np.uint8), as_device(w, "w"),
             as_device(k_payload, "k_payload", np.uint8), as_device(k_scale, "k_scale"),
             *ranges)  # fmt: skip
        Kn = check_selection_K(K)
        sig = tuple(None if a is None else (tuple(a.shape), str(a.dtype)) for a in x)
        key = (cp.cuda.Device().id, Kn, sig, tuple(sorted((k, repr(v)) for k, v in o.items())))
        e = self._entries.get(key)
        if e is None:
            sel = PrefillSelectorGPU(Kn, route_per_step=True, **o)
            e = self._entries[key] = _Graphed(sel, x, Kn)
        if self._stream is None:
            self._stream = cp.cuda.Stream(non_blocking=True)
        return e.run(x, self._stream)


class _Graphed:
    """One shape's input copies, ids array, selector and (from its second call) graph."""

    def __init__(self, sel: PrefillSelectorGPU, x: tuple, K: int):
        cp = cupy_or_raise()
        self.sel = sel
        self.x = tuple(None if a is None else cp.empty(a.shape, dtype=a.dtype) for a in x)
        Qn = x[0].shape[0] if x[0].ndim else 0
        self.out = cp.empty((Qn, K), dtype=cp.int64)
        self.calls, self.graph, self.step = 0, None, None

    def run(self, x: tuple, stream):
        """Copy ``x`` in on ``stream`` (after the caller's work), run the step (eager, capture
        or replay), ``finish``; the ids copied out, the caller's stream after ``stream``."""
        cp = cupy_or_raise()
        caller = cp.cuda.get_current_stream()
        stream.wait_event(caller.record())
        with stream:
            for dst, src in zip(self.x, x, strict=True):
                if dst is not None:
                    dst[...] = src
            if self.graph is None and self.calls == 0:
                self.step = self.sel.step(*self.x, out=self.out)
            elif self.graph is None:
                stream.begin_capture()
                try:
                    self.step = self.sel.step(*self.x, out=self.out)
                except BaseException:
                    stream.end_capture()  # the partial graph is dropped; the shape stays eager
                    raise
                self.graph = stream.end_capture()
            if self.graph is not None:
                self.graph.launch(stream)
            self.calls += 1
            self.step.finish()
            ids = self.out.copy()
        caller.wait_event(stream.record())
        return ids


def _shape_key(q, w, kp, ksc, ks, ke, out) -> tuple:
    """What fixes a step's allocation sequence: shapes, dtypes, layouts, which ranges are
    given (the step's CuPy views of its arguments)."""

    def sig(a):
        if a is None:
            return None
        # strides and 16-byte alignment decide whether the checks copy an input
        return (tuple(a.shape), str(a.dtype), tuple(a.strides), _address(a) % 16)

    return (sig(q), sig(w), sig(kp), sig(ksc), sig(ks), sig(ke), sig(out))


def _address(a) -> int:
    """The first element's address of a CuPy array (the CUDA array interface) or a host
    array (numpy)."""
    if hasattr(a, "__cuda_array_interface__"):
        return int(a.__cuda_array_interface__["data"][0])
    return int(a.ctypes.data) if hasattr(a, "ctypes") else 0


def _as_out(out):
    """``out`` as a CuPy array when it is a DLPack tensor (a view, not a copy); anything
    else as given (``_device_out`` checks it)."""
    cp = cupy_or_raise()
    if out is not None and not isinstance(out, cp.ndarray) and hasattr(out, "__dlpack__"):
        return cp.from_dlpack(out)
    return out


def _device_out(out, Qn: int, K: int):
    """``out`` as a CuPy array (a DLPack tensor such as torch's is viewed, not copied):
    int64 or int32 [Qn, K], C-contiguous."""
    out = _as_out(out)
    if not isinstance(out, cupy_or_raise().ndarray):
        raise ValueError(f"out: expected a device array int64 or int32 [Qn, K], got {out!r}")
    if tuple(out.shape) != (Qn, K) or out.dtype not in (np.int64, np.int32):
        raise ValueError(
            f"out: expected int64 or int32 {(Qn, K)}, got {out.dtype} {tuple(out.shape)}"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out: expected a C-contiguous array")
    return out
