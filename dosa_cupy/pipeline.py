"""The DoSA pipeline on the GPU (docs/method.md §7 Algorithm 1, §9 execution), one module per
stage:

    prepare  ρ per key                                    (prepare.key_rho)
    seeds    default + explicit seeds scored, τ           (seeds.seed_stage)
    route    dense or DoSA, the screen and r              (route.route_stage; decision 1,
             from the shapes alone, before prepare: route.early_choice)
    plan     per-query screening plans                    (plan.plan_stage)
    screen   U^num vs τ → survivor bitmask                (screen.screen_stage)
             [certificate seeds raise τ, drop survivors]  (seeds.certificate_seeds)
    refine   survivors scored, compact records s ≥ τ      (refine.refine_stage)
    select   exact Top-K of seed ∪ compact records        (select.select_ids)
             + query-level recovery (dense route) of invalid scales / plans

ids equal ``dense_topk`` bitwise; the public functions return int64 ids (the
``dosa_ref.topk_ids`` contract, docs/design.md).  The fused route (no screen) is
``fused.fused_topk``.  Not implemented: grouping queries by retained-head budget (one r per
call).
"""

from __future__ import annotations

import numpy as np

from dosa_ref.cost import bound_fraction, work_estimate

from . import prepare as prepare_mod
from . import refine as refine_mod
from ._build import cupy_or_raise, device_name, first_uses, read_back_async
from .cost import RouteChoice, candidate_key, model_for
from .dense import dense_ids
from .options import resolved, start
from .plan import plan_stage
from .prepare import key_rho
from .refine import extend_records, popcount_rows, refine_stage
from .route import early_choice, head_prefetch, memo_recall, memo_store, route_stage
from .screen import prefetched_tie, rule_and_arith, screen_stage, tie_prefetch
from .seeds import apply_tau_floor, certificate_seeds, seed_stage
from .select import overflow_counts, recover, recovery_queries, select_extended, select_ids

__all__ = ["dosa_topk"]


def dosa_topk(q, w, k_payload, k_scale, K, ks=None, ke=None, **options):
    """Exact Top-K of the canonical FP8 indexer with certificate screening.

    Args (DeepGEMM / SGLang layout; CuPy arrays or DLPack tensors, e.g. torch, no copies):
        q: e4m3 [Qn, H, 128] (uint8 bits or fp8 dtype); w: fp32 [Qn, H] with the query
        scales folded in; k_payload: e4m3 [N, 128]; k_scale: fp32 [N]; K ≤ 4096;
        ks, ke: int32 [Qn] visible ranges [ks, ke) (default: every key).
    Options (the shared ones mean what dosa_ref.options.OPTIONS says; defaults
        options.OPTIONS): seeds (strategies, "local+anchor" by default: the local window
        and sinks, the anchor pool; docs/method.md §2), window (None: dosa_ref's
        default_window(K, seeds)), sinks, n_anchors, anchor_segments (1: each anchor's Top-K;
        S: its Top-K within each of S segments of the keys, a pool up to S times larger —
        τ higher, the pool's scoring S times the work); seed_ids (explicit seed ids, any integer
        dtype [Qn, S], −1 padding, each id −1 or in [0, N); ids outside the query's visible
        range are ignored, repeats count once; they only raise τ); cert_seeds (0 = off;
        m ≤ 4096 turns the "certificate" strategy on: after screening, score the m survivors
        of largest U, raise τ and drop survivors with U below it; None with "certificate"
        in seeds: default_cert_seeds(K); slower than without at the benched shapes) with
        cert_cap (recorded survivors per query); r (retained heads, ≤ 30); buffer (compact
        records per query before an exact extension); screen ("auto", default: per chunk,
        from the positive heads per query, r ≤ 6 on "wgt" where it runs, else "pair"; wider
        plans r or 30 on "wg" where it runs, on "fp64" elsewhere — ``screen.auto_screen``;
        "fp64": the mma.sync screen; "pair": two queries per 16-row MMA tile, needs r ≤ 6,
        screen.cu screen_pair; "wg": the Hopper warpgroup-MMA screen, sm_90a,
        screen_sm90a.cu, bounds bitwise equal to "fp64"'s; "wgt": the transposed Hopper
        screen, screen_wgt.cu, r ≤ 30, the same error model);
        tie_reject (True, default: chunks with a query at τ = 0 are screened by the
        tie-aware kernels — the rule against the K-th seed record (τ, j) and the
        zero-plateau bound, docs/method.md §7 "Tie-aware rejection and zero plateaus";
        False: the plain rule U < τ everywhere); route
        ("auto", default: the dense route when the cost model predicts it faster — before
        any work for small chunks, else after the seeds from a timed sample screen of each
        screen candidate, which also picks r: 14 or 30, 6 for the paired screen; the route
        stage, route.py, with the cost model of cost.py; docs/method.md §9 "Route choice");
        "dosa": always screen, with ``screen``'s pick; "dense": the dense route); route_memo
        (None, default; a ``cost.RouteMemo``, with route="auto" only: chunks of a kind seen
        recently take its remembered route without seeding or sampling, every refresh-th
        call samples again, and a chunk of ≥ 512 queries is sampled rather than sent dense
        by the early rule — for a caller running one layer over many chunks); graph (None,
        default; a ``capture.StepGraphs``: the call runs as a replay of a captured step of
        its shape — copies of the inputs, no host work between kernels, the route chosen in
        the graph from this call's own sample; the first two calls of a shape run eagerly
        and capture; calls with statistics, timing, debug bounds, explicit or certificate
        seeds, a memo or a τ floor run eagerly; docs/serving.md "Prefill capture");
        check (True, default: the inputs' values are checked on the device with one
        synchronization; False: only shapes and dtypes — for callers that validated them,
        ``prepare.check_inputs``); return_stats, timing, debug_bounds (the chunk is
        screened: the route choice is off); tau_floor (None, default; float [Qn]: a lower
        bound per query on the K-th score of a context that holds these keys — another
        shard's τ, docs/method.md §12 "Sharded contexts" — screened against where it is above
        the seeds' τ; the ids are then exact where their score is at least the floor, which
        is all the merge of the shards reads: ``dosa_cupy.shards``).
    Returns int64 [Qn, K] ids (score desc, id asc, −1 padding; the ``dosa_ref.topk_ids``
    contract), equal to ``dense_topk`` whichever route ran; with return_stats=True, (ids,
    DosaGpuStats; ``stats.route`` is the ``cost.RouteChoice``).
    """
    cp = cupy_or_raise()
    graph = options.get("graph")
    if graph is not None and callable(getattr(graph, "topk", None)):
        ids = graph.topk(q, w, k_payload, k_scale, K, ks, ke, options)  # capture.StepGraphs
        if ids is not None:  # None: options a graph cannot hold; the call runs eagerly
            return ids
    o, tm, st, b, empty = start(q, w, k_payload, k_scale, K, ks, ke, options)
    if empty is not None:
        return empty
    stats = st is not None  # start() makes statistics only when they are asked for

    # the route choice (docs/method.md §9 "Route choice"; route.py with the cost model of the
    # call's scorer, cost.py): decision 1 from the shapes alone, then a memo's choice, before
    # any device work
    model = model_for(b.scorer, device_name())
    route = early_choice(b, o, model)
    if route is not None:
        return _dense_route(b, st, tm, route, None, stats)
    key, route = memo_recall(b, o)  # an earlier chunk of this kind decided
    if route is not None and route.route == "dense":
        return _dense_route(b, st, tm, route, None, stats)
    if prepare_mod.DEFER_CHECKS:  # read back once the seeds are queued (prepare.py)
        b.prefetch_checks()
    else:
        b.raise_if_bad()  # bad input raises before the screening stages
    hist = head_prefetch(b, o) if route is None else None  # read back before the seeds
    # the span of DoSA's own prepare and seeds, which a memo's DoSA choice pays on every call
    # it is recalled for and its dense choice does not (route.route_stage); not taken where a
    # kernel is used for the first time in it (a build or a load, not the stages' time)
    memo_decides = route is None and o["route"] == "auto" and o["route_memo"] is not None
    prefix = (cp.cuda.Event(), cp.cuda.Event(), first_uses()) if memo_decides else None
    if prefix is not None:
        prefix[0].record()
    rho = key_rho(b.kp)  # prepare (docs/method.md §8)
    tm.mark("prepare")
    seeds = apply_tau_floor(seed_stage(b, o), o["tau_floor"])  # default + explicit seeds, τ (§2)
    if prefix is not None:
        prefix[1].record()
        prefix = prefix[:2] if first_uses() == prefix[2] else None
    b.raise_if_bad()  # bad input raises before the screening stages (read already, or now)
    tm.mark("seeds")
    if route is None:  # the route stage: decision 2 (sampled screens) or the options' screen
        route = route_stage(b, seeds, rho, o, model, hist, prefix)
        if o["route"] == "auto":  # the samples are timed as a stage; the option's pick is not
            tm.mark("route")
            memo_store(o, key, route)
        if route.route == "dense":
            return _dense_route(b, st, tm, route, seeds, stats)
    o = resolved(o, screen=route.screen)  # the decision's screen for the stages after it
    flag = tie_prefetch(seeds, o, route.tie)  # the rule read back while the chunk screens
    tie, arith = rule_and_arith(seeds, o, False if flag is not None else route.tie)
    plan, route.plan = route.plan, None  # the sampled winner's plan of the chunk, if any
    if plan is None or (plan.r_max, plan.screen) != (route.r, arith):
        plan = plan_stage(b, seeds.pool, route.r, o, seeds.pcount, arith)  # §3–§5, §8
    tm.mark("plan")
    screened = screen_stage(b, plan, seeds, rho, o, tie)  # §8–§9
    if flag is not None and prefetched_tie(flag):  # the tie-aware build after all (§7)
        plain = arith
        tie, arith = rule_and_arith(seeds, o, True)
        if arith != plain:  # the plans of the FP8 build cover its own dots only
            plan = plan_stage(b, seeds.pool, route.r, o, seeds.pcount, arith)
        screened = screen_stage(b, plan, seeds, rho, o, tie)
    tm.mark("screen")
    tau, cert_scored = seeds.tau, None
    if screened.cert is not None:  # certificate-guided seeds (§2): raise τ, drop survivors
        tau, cert_scored = certificate_seeds(b, seeds, screened.cert, int(o["cert_seeds"]),
                                             screened.surv)  # fmt: skip
        tau = cp.maximum(tau, seeds.tau)  # the certificate's τ, or a higher tau_floor
        tm.mark("cert")
    # refine with compact writeback, exact extension on overflow (§7 C.3, §9)
    deferred = refine_mod.DEFERRED_EXTENSION  # the overflow flags read with the recovery's
    recs = refine_stage(b, tau, screened.surv, int(o["buffer"]), extend=not deferred,
                        spill=refine_mod.SPILL)  # fmt: skip
    bad = recovery_queries(b) | ~plan.valid  # query-level recovery (§7 C.3)
    counts = None
    if deferred and refine_mod.PREFETCH_COUNTS:  # read back while the selection runs
        counts = read_back_async(overflow_counts(recs, bad))
    tm.mark("refine")
    ids, kth = select_ids(b.K, seeds.default, recs, want_kth=stats)  # exact selection (§7, §9)
    tm.mark("select")
    if deferred:  # one read-back: the overflowed rows extended, then the recovered ones
        if counts is None:
            counts = read_back_async(overflow_counts(recs, bad))
        counts[1].synchronize()
        n_over, top, n_bad, spilled = (int(x) for x in counts[0])
        if n_over:
            recs = extend_records(b, tau, screened.surv, recs, (n_over, top), spilled)
            select_extended(b.K, seeds.default, recs, ids, kth)
        recover(b, ids, bad, n_bad)
    else:
        recover(b, ids, bad)
    ids = ids.astype(cp.int64)  # public contract (docs/design.md); the kernels write int32
    tm.mark("recover")

    if not stats:
        return ids
    st.screen, st.route = o["screen"], route
    st.fill_common(b, seeds, recs, kth, bad)
    vis, rec = st.visible, st.recovered
    default = st.seeds - st.explicit_seeds
    st.tau = cp.asnumpy(tau)
    st.screened = vis - default
    st.survivors = cp.asnumpy(popcount_rows(screened.surv, cp))
    tie = screened.tie_rejected  # the tie-aware screen's count (screen.tie_screen_wanted)
    st.tie_rejected = np.zeros(b.Qn, np.int64) if tie is None else cp.asnumpy(tie).astype(np.int64)
    st.refined = np.where(rec, vis - default, st.survivors)
    # every scoring with all heads: seeds, the certificate pass (explicit seeds again), the
    # survivors (again in an overflow extension), every visible key of a recovered query
    st.scored = st.seeds + st.survivors * (1 + st.overflows) + vis * rec
    if cert_scored is not None:
        cert_pass = cp.asnumpy(cert_scored).astype(np.int64)
        st.cert_seeds = cert_pass - st.explicit_seeds
        st.scored += cert_pass
    r_plan = cp.asnumpy(plan.r).astype(np.int64)
    st.bound_work = vis * bound_fraction(r_plan, b.heads)  # two aux rows per evaluation
    st.r = np.where(rec, 0, r_plan)  # 0 when dense (dosa_ref.options.STATS)
    st.omitted_positive = np.where(rec, 0, cp.asnumpy(plan.omitted_positive))
    st.aggregated = np.where(rec, 0, cp.asnumpy(plan.aggregated))
    _route_stats(st, route, b.heads)
    st.stage_ms = dict(tm.ms)
    st.bounds = screened.bounds
    return ids, st


def _route_stats(st, route: RouteChoice, heads: int) -> None:
    """The route choice in the statistics: the samples' bound work (docs/method.md §6
    "Cost") and, for DoSA, the sampled survival of the screen that ran and
    ``dosa_ref.cost.work_estimate`` with it."""
    if route.bound_work is not None:
        st.bound_work = st.bound_work + route.bound_work
    key = candidate_key(route.screen, route.r)
    if route.route == "dosa" and key in route.survival:
        m = route.survival[key]
        f = st.seeds / np.maximum(st.visible, 1)  # seeds are visible keys: 0 where none is
        st.est_survival = np.full(st.Qn, m)
        st.est_work = work_estimate(f, route.r, heads, m)


def _dense_route(b, st, tm, route: RouteChoice, seeds, stats: bool):
    """The chunk by the dense route (``dense.dense_ids``; exact like every route); with
    ``seeds`` (decision 2) their scoring and the anchors' count in the statistics."""
    cp = cupy_or_raise()
    ids = dense_ids(b).astype(cp.int64)
    b.raise_if_bad()  # deferred value checks: launched before, read after the dense launches
    tm.mark("dense")
    if not stats:
        return ids
    st.fill_seeds(b, seeds)
    vis, st.route, st.screen = st.visible, route, None
    st.dense[:] = True
    st.tau_final = np.full(b.Qn, np.nan)  # the dense route keeps no K-th record
    if seeds is not None:
        st.tau = cp.asnumpy(seeds.tau)
    st.refined = vis - (st.seeds - st.explicit_seeds)  # every visible non-default-seed key
    st.scored = st.seeds + vis  # the seeds were scored before the route was chosen
    _route_stats(st, route, b.heads)
    st.stage_ms = dict(tm.ms)
    return ids, st
