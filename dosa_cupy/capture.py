"""A prefill step that can be captured in a CUDA graph (docs/serving.md "Prefill capture").

``dosa_topk`` reads device values back to size buffers and to choose branches; a graph
cannot hold such reads, and memory that CuPy's pool hands to a captured kernel is handed
to other work afterwards.  ``PrefillSelectorGPU`` runs the same stages with every size
fixed by the chunk's shape and every branch fixed when a shape is first seen:

* the route, the screen kernel and r: chosen on the shape's first step (``route="auto"``:
  the cost model's choice for that chunk, ``dosa_topk``'s ``stats.route``), then kept;
* the anchor pool at its capacity min(anchors · anchor_segments · K, N), its size P on the device
  (``seeds.seed_stage`` with given anchors, ``plan.plan_stage``'s device sample);
* the screen build (tie-aware or plain) from the first step's τ; both are exact;
* no overflow extension and no recovery inside the step: a query whose compact records
  overflowed, whose plan is invalid or that sees an invalid key scale is *flagged* on the
  device, its ids row is written as ``FLAGGED`` (−2, never a key id), and ``finish``
  re-runs exactly those queries on the dense route outside the graph (docs/method.md §7
  C.3) — a candidate is never dropped;
* temporaries from an arena per shape (``Arena``): the shape's first step measures the
  bytes its allocations take, later steps take the same sequence of blocks from one
  allocation, so a captured graph keeps its addresses for the selector's life.

The value checks (``check=True``) run inside the step and are read by ``finish``, which
raises the same ``ValueError`` as ``dosa_topk``; the ranges are clamped on the device
first, so a bad range never reads out of bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dosa_ref.options import check_flag

from ._build import cupy_or_raise
from .dense import _dense_topk_raw, dense_ids
from .options import check_options, resolve_options, resolved, strategies
from .pipeline import dosa_topk
from .plan import plan_stage, row_tiles
from .prepare import Batch, as_device, check_selection_K, key_rho, pad_batch
from .refine import refine_stage
from .screen import plateau_constants, screen_arith, screen_stage, tie_screen_wanted
from .seeds import anchor_queries, seed_stage
from .select import recovery_queries, select_ids

__all__ = ["FLAGGED", "Arena", "PrefillSelectorGPU", "PrefillStep"]

FLAGGED = -2  # the ids row of a query ``finish`` must still complete (not a key id, not −1)
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
    ``FLAGGED`` until ``finish``) and what ``finish`` reads: status int64 [2] (the value
    checks' flag word, the number of flagged rows), redo bool [Qn] or None, the step's
    ``Batch`` (its inputs, for the re-run) and its ``ValueCheck`` or None — device arrays
    at fixed addresses, rewritten by every replay of a graph that captured this step."""

    ids: object
    status: object
    redo: object
    batch: Batch
    check: object = None
    keep: object = None  # the shape's arena and anchors: alive as long as this step is

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
        n = int(status[1])
        if n:
            rows = cp.flatnonzero(self.redo)
            self.ids[rows] = dense_ids(self.batch.rows(rows)).astype(self.ids.dtype)
        return n


@dataclass
class _Shape:
    """What a shape's first step fixed."""

    route: str  # "dosa" or "dense"
    screen: str | None
    r: int | None
    tie: bool
    anchors: object  # int64 [na] device rows or None
    arena: Arena | None = None


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

    Use: ``h = step(..., out=)`` issues kernels only once a shape has been seen (its first
    step is eager: it decides and measures); capture a later step in a graph, replay it on
    new inputs in the same arrays, then call ``h.finish()`` (``h``: the captured step's
    ``PrefillStep``) with the replay's stream current: one 16-byte read; the flagged rows
    of ``out`` are completed exactly.  Ids equal ``dense_topk``'s after ``finish``; it
    reads the inputs as they are when it runs (call it before writing the next chunk).
    Graphs of one shape share its arena: replay them in stream order, each followed by its
    own step's ``finish``.  An arena holds all of a step's temporaries (no reuse; an estimated
    2.5–3 GB at Qn = 4096, 128K keys, default buffer); ``release`` frees them.
    """

    def __init__(self, K: int, *, check: bool = True, **options):
        for name, off in _NOT_CAPTURABLE.items():
            if name in options and not _is_off(options[name], off):
                raise ValueError(f"{name}: not available in a captured step, got {options[name]!r}")
        if options.get("screen") == "pair":
            raise ValueError("screen: 'pair' is not available in a captured step (host copies)")
        self.check = check_flag("check", check)
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
        if sh is None:  # eager: decide, measure the allocations, size the arena
            sh = self._first(q, w, k_payload, k_scale, ks, ke)
            counter = _Counter(cp.cuda.get_allocator())
            with cp.cuda.using_allocator(counter.malloc):
                res = self._run(sh, q, w, k_payload, k_scale, ks, ke, out)
            sh.arena = Arena(counter.nbytes)
            self._shapes[key] = sh
            return res
        sh.arena.reset()
        with cp.cuda.using_allocator(sh.arena.malloc):
            res = self._run(sh, q, w, k_payload, k_scale, ks, ke, out)
        if sh.arena.used != sh.arena.nbytes:
            raise RuntimeError(
                f"arena: this step took {sh.arena.used} bytes, its shape's first step "
                f"{sh.arena.nbytes} (the allocation sequence changed; a bug, please report)"
            )
        return res

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
        if route == "auto" or screen == "auto":
            opts = {k: v for k, v in o.items() if k not in ("check", "return_stats")}
            _, st = dosa_topk(q, w, k_payload, k_scale, self.K, ks, ke, check=False,
                              return_stats=True, **opts)  # fmt: skip
            choice = st.route
            route = choice.route
            if route == "dosa":
                screen, r = choice.screen, int(choice.r)
        if route == "dosa" and screen == "pair":  # auto's narrow pick off Hopper (host copies)
            screen = "fp64"
        tie = False
        anchors = anchor_queries(b.Qn, ro["n_anchors"])
        if route == "dosa" and ro["tie_reject"]:
            tie = tie_screen_wanted(seed_stage(b, ro, anchors), ro)
        if tie:  # device constants copied once, before the allocations are measured
            plateau_constants(cupy_or_raise(), row_tiles(r))
        return _Shape(route, screen, r, bool(tie), anchors)

    def _run(self, sh: _Shape, q, w, k_payload, k_scale, ks, ke, out) -> PrefillStep:
        """The stages with fixed sizes and branches; kernels only (module doc)."""
        cp = cupy_or_raise()
        b = pad_batch(q, w, k_payload, k_scale, self.K, ks, ke, self.check, defer=True,
                      scorer=self._o["scorer"])  # fmt: skip
        status = cp.zeros(2, dtype=cp.int64)
        if b.pending is not None:
            status[0] = b.pending.flag_word()
        if b.Qn == 0 or b.N == 0:
            out[...] = -1
            return PrefillStep(out, status, None, b, b.pending, sh)
        if sh.route == "dense":
            ids = _dense_topk_raw(b.q, b.w, b.kp, b.ksc, b.K, b.ks, b.ke, scorer=b.scorer)
            out[...] = ids
            return PrefillStep(out, status, None, b, b.pending, sh)
        o = resolved(resolve_options(self._o, b.K), screen=sh.screen)
        rho = key_rho(b.kp)
        seeds = seed_stage(b, o, sh.anchors)
        plan = plan_stage(b, seeds.pool, sh.r, o, seeds.pcount, screen_arith(sh.screen, sh.tie))
        screened = screen_stage(b, plan, seeds, rho, o, sh.tie)
        recs = refine_stage(b, seeds.tau, screened.surv, int(o["buffer"]), extend=False)
        ids, _ = select_ids(b.K, seeds.default, recs)
        redo = recovery_queries(b) | ~plan.valid | recs.over
        out[...] = cp.where(redo[:, None], FLAGGED, ids)
        status[1] = cp.count_nonzero(redo)
        return PrefillStep(out, status, redo, b, b.pending, sh)


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
