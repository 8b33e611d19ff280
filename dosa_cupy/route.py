"""The route stage of ``dosa_topk`` on the GPU (docs/method.md §9 "Route choice"): per call
(chunk), the dense route or DoSA with one of its screens, from the cost model of the H200
(``cost.py``) and a measured sample of the chunk.

Every route returns the same ids (each is exact); the choice only decides the time.  Two
decisions, both before the expensive work:

1. **Early** (``early_choice``, no device work): when even the dense route's predicted time
   at every key visible is below the smallest DoSA call measured (``CostModel.dosa_floor_ms``:
   the fixed costs of prepare, seeds, plan and the launches), the chunk goes dense.
2. **Sampled** (``route_stage``, after seeds, before the plan of the whole chunk): the screen
   candidates (``cost.candidates``) each plan and screen one block row of evenly spaced
   queries (plans of those queries only: the chunk is planned after the decision, or with
   ``CHUNK_PLANS`` during it), timed with CUDA events; their survival and time, scaled to the chunk,
   plus the fitted refinement and finishing costs, predict DoSA's remaining time per
   candidate; the dense route's is predicted from the fitted logits and selection rates.
   The cheapest wins.

A ``cost.RouteMemo`` (``memo_recall`` / ``memo_store``) lets a chunk of a kind seen recently
skip both; with one, a chunk large enough to be sampled skips the early rule (its kind is
sampled once per ``refresh`` chunks instead).  The model is an argument of each decision, so a
caller (or a test) picks it.  The reference side's counterpart is ``dosa_ref.cost.choose_r``
(per query: an r, or dense scoring, in units of work rather than milliseconds).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from dosa_ref.cost import bound_fraction

from ._build import cupy_or_raise, device_const, kernel, read_back_async
from .cost import (
    CostModel,
    RouteChoice,
    RouteMemo,
    candidate_key,
    candidates_of,
    early_route,
    sample_scale,
    sample_size,
    samples,
    samples_any_screen,
)
from .dense import _NULL
from .plan import plan_stage
from .refine import popcount_rows
from .screen import (
    ScreenLaunch,
    auto_pick,
    auto_screen,
    auto_wanted,
    batch_plateau_rows,
    positive_heads_hist,
    screen_arith,
    screen_stage,
    tie_screen_flag,
)

__all__ = [
    "early_choice",
    "head_prefetch",
    "memo_recall",
    "memo_store",
    "pick_route",
    "route_stage",
    "sample_counts",
    "sample_rows",
]

# The counts of the two read-backs by one kernel each (csrc/route.cu route_head,
# route_sample) instead of ~25 array operations: the stage is host-bound (docs/records/
# benchmarks.md "the per-row constants' kernel, on an H100"); equal to the array path on the
# H200 and 0.0–0.6 ms faster per call (benchmarks.md "The scale-check and route-count kernels";
# bench builds=routearrays times the array path).
COUNT_KERNELS = True

# The first candidate's plan of the whole chunk queued behind the samples, read back by an
# event, so the GPU plans while the host decides; kept when that candidate wins (docs/method.md
# §9 "Route choice").  Under trial (bench builds=chunkplans; docs/records/benchmarks.md "The
# decision's plans"); off, the chunk is planned after the decision.
CHUNK_PLANS = False

# The positive-head histogram read back before the seeds (``head_prefetch``) and the chunk's
# counts with the samples: one read-back after the seeds instead of two (docs/method.md §9
# "Route choice").  −0.1 to −1.0 ms per sampled call on an H100
# (docs/records/benchmarks.md "The synchronization builds switched on"); bench
# builds=tworeadbacks reads the histogram after the seeds.
ONE_READBACK = True

# A gate in front of each timed sample (csrc/route.cu route_gate): the stream waits until the
# host has queued the launches it times, so an idle GPU does not time the host's launch
# overhead — which the decision scales 32-fold (docs/method.md §9 "Route choice").  Never an
# id; bench builds=nogate times the samples without it.
SAMPLE_GATE = True
GATE_MAX_NS = 2_000_000  # a gate the host does not open opens itself after 2 ms

_GATES: dict = {}  # device id → [page-locked uint32 word the gates read, the last ticket]


def early_choice(b, o: dict, model: CostModel) -> RouteChoice | None:
    """Decision 1 for batch ``b`` (``prepare.Batch``), before any device work: the dense
    route's ``RouteChoice`` when the options ask for it (reason "option") or when
    ``cost.early_route`` predicts it faster than any DoSA call ("early"), with its
    predicted time at every key visible; None when the chunk goes on to the seeds.  With a
    ``route_memo`` a chunk that every candidate would sample (``cost.samples_any_screen``)
    skips the early rule: the memo pays the sampled decision once per ``refresh`` chunks of
    its kind, so a measurement replaces the floor's guess (docs/method.md §9 "Route
    choice")."""
    early = o["route"] == "auto" and not (o["route_memo"] is not None and samples_any_screen(b.Qn))
    if o["route"] == "dense" or (early and early_route(model, b.Qn, b.N, b.heads)):
        reason = "option" if o["route"] == "dense" else "early"
        pred = {"dense": model.dense_ms(b.Qn, b.N, float(b.Qn) * b.N, b.heads)}  # all visible
        return RouteChoice("dense", reason, predicted_ms=pred)
    return None


def memo_recall(b, o: dict) -> tuple:
    """(key, choice) of batch ``b`` in the options' ``route_memo``: key None without a memo
    (or without route="auto"); choice None when the memo holds none for the key or it is
    due to be sampled again (``RouteMemo.recall``)."""
    memo = o["route_memo"]
    if memo is None or o["route"] != "auto":
        return None, None
    cp = cupy_or_raise()
    key = (cp.cuda.Device().id, *RouteMemo.kind(b, o))  # per GPU: kernels differ
    return key, memo.recall(key)


def memo_store(o: dict, key, choice: RouteChoice) -> None:
    """Remember a sampled ``choice`` under ``key`` (from ``memo_recall``; None: no memo)."""
    if key is not None:
        o["route_memo"].store(key, choice)


def head_prefetch(b, o: dict):
    """With ``ONE_READBACK``, for a chunk about to be seeded (route "auto", no memo choice):
    ``screen.positive_heads_hist`` of ``b.w`` queued now — with ``COUNT_KERNELS`` by
    route_head alone (one launch in front of the seeds instead of six array operations, while
    the GPU waits for the call's first work) — and read back by an event (``read_back_async``:
    it waits for the work queued before it, not for the seeds queued after), which
    ``route_stage`` takes as ``hist``; None otherwise."""
    screen, cert = o["screen"], int(o["cert_seeds"])
    if not ONE_READBACK or o["route"] != "auto" or not auto_wanted(screen, cert, b.Qn):
        return None
    cp = cupy_or_raise()
    if not COUNT_KERNELS:
        return read_back_async(positive_heads_hist(b.w, cp).astype(cp.int64))
    out = cp.zeros(3 + b.w.shape[1] + 1, dtype=cp.int64)
    _route_head(b, None, False, True, out)  # the histogram alone: no seeds yet
    return read_back_async(out[3:])


def route_stage(b, seeds, rho, o: dict, model: CostModel, hist=None, prefix=None) -> RouteChoice:
    """The route stage for batch ``b`` (``prepare.Batch``) after the seed stage (``seeds``,
    ρ per key ``rho``; ``o`` the resolved options, route "auto" or "dosa": "dense" was
    decided by ``early_choice``).  route="dosa": DoSA with ``screen.auto_screen``'s pick
    (reason "option").  route="auto": decision 2 — screen a sample of evenly spaced queries
    with each candidate (``cost.candidates_of``), timed; predict each candidate's remaining
    time and the dense route's with ``model``; the cheapest wins.  Each candidate plans its
    sampled queries only (a query's plan does not depend on the other queries), so the
    whole chunk is planned once, after the decision, and never when the dense route wins;
    with ``CHUNK_PLANS`` the first candidate's plan of the chunk is queued behind the
    samples and read-back 2 waits by an event for the samples only, so the GPU plans while
    the host decides; the plan is the chunk's when that candidate wins
    (``RouteChoice.plan``), and thrown away otherwise.  Two read-backs: the chunk's counts
    with auto's histogram, then every candidate's sample (their launches queued back to
    back).  ``hist`` (``head_prefetch``'s, with ``ONE_READBACK``): the histogram read back
    before the seeds, so the samples go out on the plain rule's build without read-back 1
    and the chunk's counts and tie flag come with read-back 2 — the samples are taken again
    on the tie-aware build in the rare chunk whose flag says so (the same decision as with
    two read-backs).  Each candidate's prediction is its time from the decision on — the
    chunk's plan and the rest (``CostModel.dosa_ms``); with a ``route_memo``, which applies
    the choice to later chunks that have spent nothing yet, the candidates are also charged
    this call's prepare and seeds (``prefix``: CUDA events around them, completed by
    read-back 2; ``RouteChoice.spent_ms``), which a remembered dense route skips — None
    where those stages used a kernel for the first time in the process (their span then
    holds its build: pipeline.py), and nothing is charged.
    Returns the ``RouteChoice``."""
    cp = cupy_or_raise()
    screen, r, cert = o["screen"], int(o["r"]), int(o["cert_seeds"])
    if o["route"] != "auto":
        return RouteChoice("dosa", "option", *auto_screen(screen, r, cert, b.w, cp))
    auto = auto_wanted(screen, cert, b.Qn)
    if hist is not None:  # read-back 1 before the seeds; the counts come with read-back 2
        hist[1].synchronize()
        head, pick = None, auto_pick(r, hist[0])
    else:
        head = cp.asnumpy(_head_counts(b, seeds, o, auto))  # read-back 1
        pick = auto_pick(r, head[3:]) if auto else auto_screen(screen, r, cert, b.w, cp)
    tie = head is not None and bool(head[2])  # without read-back 1: the plain build first
    cands = candidates_of(screen, r, cert, pick)
    if not samples(b.Qn, [s for s, _ in cands]):
        return RouteChoice("dosa", "small", *cands[0], tie=None if head is None else tie)
    head_dev = _head_counts(b, seeds, o, False) if head is None else None
    runs, got, plans = _samples(b, seeds, rho, o, cands, tie, head_dev)
    if head_dev is not None:
        head, got = got[:3], got[3:]
        if head[2] and not tie:  # a chunk for the tie-aware build: its samples taken again
            tie = True
            runs, got, plans = _samples(b, seeds, rho, o, cands, tie, None)
    pairs, screened = head[:2]
    choice = RouteChoice("dense", "sampled", bound_work=np.zeros(b.Qn), tie=tie)
    choice.predicted_ms["dense"] = model.dense_ms(b.Qn, b.N, float(pairs), b.heads)
    best = choice.predicted_ms["dense"]
    if prefix is not None:  # given with a route memo only (pipeline.py)
        choice.spent_ms = cp.cuda.get_elapsed_time(*prefix)  # completed before read-back 2
    at = 0
    for scr, rr, n, rows, (start, end, _) in runs:
        out, at = got[at : at + 2 + 2 * n], at + 2 + 2 * n
        ms = cp.cuda.get_elapsed_time(start, end)  # its end event completed with the read-back
        m = float(out[0]) / float(out[1]) if out[1] > 0 else 0.0
        vis_s, r_s = out[2 : 2 + n], out[2 + n :]
        np.add.at(choice.bound_work, rows, vis_s * bound_fraction(r_s, b.heads))
        key = candidate_key(scr, rr)
        choice.predicted_ms[key] = model.dosa_ms(
            b.Qn, b.N, b.K, m * float(screened), b.heads, ms * sample_scale(scr, b.Qn, n)
        )
        choice.survival[key], choice.sample[key], choice.sample_ms[key] = m, n, ms
        if choice.predicted_ms[key] + choice.spent_ms < best:
            best = choice.predicted_ms[key] + choice.spent_ms
            choice.route, choice.screen, choice.r = "dosa", scr, rr
            choice.plan = plans.get(key)
    return choice


def _samples(b, seeds, rho, o: dict, cands, tie: bool, head_dev):
    """(runs, got, plans) of the sampled decision: per candidate (screen, r) its sample —
    ``sample_size`` evenly spaced queries planned alone and screened on ``tie``'s build
    (``_sample``) — queued back to back, then read-back 2: ``got`` numpy int64, the chunk's
    counts ``head_dev`` first where given, then every sample's vector; ``runs`` (screen, r,
    n, the sampled rows numpy int64 [n], ``_sample``'s result) per candidate; ``plans``
    {candidate key: plan of the whole chunk} (``CHUNK_PLANS``: the first candidate's, queued
    behind the samples)."""
    cp = cupy_or_raise()
    runs, plans = [], {}
    for scr, rr in cands:
        idx, n = sample_rows(b.Qn, scr)
        bs = b.rows(idx)
        plan = plan_stage(bs, seeds.pool, rr, o, seeds.pcount, screen_arith(scr, tie))
        # the rows' host copy for the bound work: no read-back between read-back 2 and the plan
        runs.append((scr, rr, n, _sample_rows(b.Qn, n),
                     _sample(bs, plan, seeds, idx, rho, dict(o, screen=scr), tie)))  # fmt: skip
    parts = ([] if head_dev is None else [head_dev]) + [run[-1][2] for run in runs]
    counts = cp.concatenate(parts)
    if not CHUNK_PLANS:
        return runs, cp.asnumpy(counts), plans  # read-back 2
    got, ready = read_back_async(counts)  # read-back 2 by an event, the chunk plan behind it
    scr, rr = cands[0]
    plans[candidate_key(scr, rr)] = plan_stage(
        b, seeds.pool, rr, o, seeds.pcount, screen_arith(scr, tie)
    )
    ready.synchronize()
    return runs, got, plans


def sample_rows(Qn: int, screen: str) -> tuple:
    """(int64 device [n], n): the n = ``cost.sample_size(screen)`` evenly spaced sampled rows
    of a chunk of Qn queries, copied to the device once per shape and kept (a repeated shape
    copies nothing; a captured step may not copy from the host)."""
    cp = cupy_or_raise()
    n = sample_size(screen)
    idx = device_const(cp, f"sample_rows_{Qn}_{n}", lambda: _sample_rows(Qn, n))
    _iota(cp, n)  # the sampled rows' own indices (``sample_counts``), kept likewise
    return idx, n


def _iota(cp, n: int):
    """int64 device [n]: 0, 1, …, n − 1, kept per device."""
    return device_const(cp, f"iota_{n}", lambda: np.arange(n, dtype=np.int64))


def sample_counts(bs, seeds, rho, o: dict, screen: str, r: int, tie: bool):
    """int64 device [2 + 2n]: ``_sample``'s counts of candidate (``screen``, r) for the n
    sampled rows ``bs`` (``Batch.rows`` of ``sample_rows``) seeded on their own (``seeds``:
    ``seeds.seed_stage`` of ``bs`` on the chunk's anchor pool — their τ is the chunk's), ρ
    per key ``rho``, resolved options ``o``, ``tie``: the build — untimed and without a
    read-back: the captured step's sample (capture.py), which ``pick_route`` reads on the
    device.  Kernels only."""
    n = bs.Qn
    plan = plan_stage(bs, seeds.pool, r, o, seeds.pcount, screen_arith(screen, tie))
    surv = screen_stage(bs, plan, seeds, rho, dict(o, screen=screen), tie).surv
    return _sample_counts(surv, bs, seeds, _iota(cupy_or_raise(), n), plan)


def pick_route(b, sample, rule, cond, pick) -> None:
    """Queue csrc/route.cu route_pick: ``pick`` (int64 device [1]) = 1 where the cost model's
    ``rule`` (float64 device [7], ``cost.LinearRule.coefficients``) predicts DoSA faster for
    batch ``b``'s visible pairs and the sample's counts ``sample`` (``sample_counts``), else
    0; ``cond`` (None: none): the conditional graph node's handle that takes the same value
    (``_graph.condition``)."""
    n = (int(sample.shape[0]) - 2) // 2
    handle = np.uint64(0 if cond is None else int(cond))
    args = (b.ks, b.ke, np.int32(b.Qn), sample, np.int64(n), rule, handle, pick)
    kernel("route_pick")((1,), (256,), args)


def _sample_seeds(seeds, idx):
    """``seeds`` with the sampled rows' τ and K-th ids (what a sample's screen reads)."""
    kth = seeds.kth_id.take(idx) if seeds.kth_id is not None else None
    return replace(seeds, tau=seeds.tau.take(idx), kth_id=kth)


@functools.cache
def _sample_rows(Qn: int, n: int):
    """int64 numpy [n]: the n evenly spaced sampled rows of a chunk of Qn queries (read-only:
    one array per shape)."""
    rows = np.linspace(0, Qn - 1, n).astype(np.int64)
    rows.flags.writeable = False
    return rows


def _sample(bs, plan, seeds, idx, rho, o: dict, tie: bool):
    """(start event, end event, int64 device [2 + 2n]: the sample's survivors, its screened
    keys, then visible keys [n] and plan r [n]) of the sampled queries ``idx`` (sub-batch
    ``bs``, their ``plan``) screened with ``o["screen"]``; ``tie``: the whole chunk's build
    choice (``screen.tie_screen_wanted``).  No synchronization: the caller reads the vector
    back, after which the end event has completed."""
    cp = cupy_or_raise()
    ss = _sample_seeds(seeds, idx)
    zrow = batch_plateau_rows(bs, plan, cp) if tie else None
    launch = ScreenLaunch.of(bs, plan, ss, rho, o["screen"], False, zrow)
    surv = cp.empty((bs.Qn, bs.NW), dtype=cp.uint32)
    tcnt = cp.zeros(bs.Qn, dtype=cp.uint32) if tie else None
    launch.prime(surv, tcnt)  # built, loaded and launched once in the process before it is timed
    opened = _gate() if SAMPLE_GATE else None
    start, end = cp.cuda.Event(), cp.cuda.Event()
    try:
        start.record()
        launch(surv, None, None, tcnt)
        end.record()
    finally:
        if opened is not None:
            opened()
    return start, end, _sample_counts(surv, bs, seeds, idx, plan)


def _gate():
    """Queue csrc/route.cu route_gate on the current stream with the next ticket of the
    device's gate word (page-locked; the tickets count up and the word only ever moves to a
    later one, so opening a gate opens every earlier one too); returns the function that
    opens it (writes its ticket) — the caller calls it once the timed launches are queued."""
    cp = cupy_or_raise()
    dev = cp.cuda.Device().id
    if dev not in _GATES:
        import cupyx  # with CuPy

        _GATES[dev] = [cupyx.zeros_pinned(1, dtype=np.uint32), 0]
    g = _GATES[dev]
    g[1] = (g[1] + 1) & 0xFFFFFFFF
    word, ticket = g[0], g[1]
    kernel("route_gate")((1,), (1,), (np.uint64(word.ctypes.data), np.uint32(ticket),
                                      np.int64(GATE_MAX_NS)))  # fmt: skip

    def opened() -> None:
        word[0] = ticket

    return opened


def _head_counts(b, seeds, o: dict, auto: bool):
    """int64 device [3 (+ Hp + 1 with ``auto``)]: the chunk's visible keys, those past the
    default seeds, the tie-aware build's flag (``screen.tie_screen_flag``), then with ``auto``
    ``screen.positive_heads_hist`` — by csrc/route.cu route_head with ``COUNT_KERNELS``."""
    cp = cupy_or_raise()
    if COUNT_KERNELS:
        out = cp.zeros(3 + (b.w.shape[1] + 1 if auto else 0), dtype=cp.int64)
        _route_head(b, seeds, bool(o["tie_reject"]), auto, out)
        return out
    vis = b.visible.sum()
    screened = vis - seeds.default.cnt.astype(cp.int64).sum()
    tie = tie_screen_flag(seeds, o, cp)  # the build the whole chunk's screen will take
    parts = [cp.stack([vis, screened, tie.astype(cp.int64)])]
    if auto:
        parts.append(positive_heads_hist(b.w, cp).astype(cp.int64))
    return cp.concatenate(parts)


def _route_head(b, seeds, tie_reject: bool, hist: bool, out) -> None:
    """csrc/route.cu route_head over batch ``b`` into ``out`` (int64 device, zeroed, [3 (+ Hp
    + 1 with ``hist``)]); ``seeds`` None: the histogram alone (its ranges and τ not read)."""
    cp = cupy_or_raise()
    Qn, Hp = b.w.shape
    ranges = (_NULL,) * 4 if seeds is None else (
        b.ks, b.ke, seeds.default.cnt, cp.ascontiguousarray(seeds.tau))  # fmt: skip
    kernel("route_head")(
        (max(1, min(-(-Qn // 256), 64)),), (256,),
        (*ranges, b.w, np.int32(Qn), np.int32(Hp), np.int32(tie_reject), np.int32(hist), out),
    )  # fmt: skip


def _sample_counts(surv, bs, seeds, idx, plan):
    """int64 device [2 + 2n] of ``_sample`` for the n sampled queries ``idx`` (sub-batch
    ``bs``, survivor bitmask ``surv`` uint32 [n, NW], their ``plan``) — by csrc/route.cu
    route_sample with ``COUNT_KERNELS``."""
    cp = cupy_or_raise()
    if COUNT_KERNELS:
        n, NW = surv.shape
        out = cp.zeros(2 + 2 * n, dtype=cp.int64)
        r = cp.ascontiguousarray(plan.r.astype(cp.int32, copy=False))
        kernel("route_sample")(
            (max(1, min(-(-n * NW // 256), 1024)),), (256,),
            (surv, np.int64(n), np.int64(NW), bs.ks, bs.ke, seeds.default.cnt, idx, r, out),
        )  # fmt: skip
        return out
    vis = bs.visible
    scr = vis - seeds.default.cnt[idx].astype(cp.int64)
    head = cp.stack([popcount_rows(surv, cp).sum(), scr.sum()])
    return cp.concatenate([head, vis, plan.r.astype(cp.int64)])
