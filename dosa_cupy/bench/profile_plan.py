"""Where the plan, seed and route stages spend their time (issue 5 and issue 28 analysis;
docs/records/notes.md).

``dosa bench --profile-plan [--Qn 4096] [--N 131072] [--H 32,64] [--scorer f16|fp8]``

For ``plan.build_plans`` (the specification), ``plan.build_plans_fused`` (the
pipeline's planner), ``seeds.seed_stage``, ``route.route_stage`` (the sampled decision,
with the lines of ``route._sample``, ``plan.plan_stage`` and ``screen.auto_pick``) and the
pipeline's finish (``select.select_ids``, ``select.recovery_queries`` and ``select.recover``
on a call's records, its value checks read back as ``dosa_topk`` reads them) on the
calibrated regime: CUDA-event
medians of 10 calls, the host time until the call returns (no synchronization; ≈ the event
time means the stage is bound by Python and launch overhead, not by the GPU), and a
per-source-line split taken with a device synchronization after every line (a trace
function on the stage's own frame; slower in total than the free-running call, but it
attributes time to lines).
"""

from __future__ import annotations

import linecache
import statistics
import sys
import time

from dosa_ref.cmdline import CommandParser


def _line_split(fn, args, cp, inner=()):
    """{(function, line number): seconds} of ``fn``'s own frame and of the frames of the
    functions ``inner`` it calls, synchronizing after each line; a line that calls an inner
    function is charged only with what the callee's lines do not take."""
    codes = {fn.__code__, *(f.__code__ for f in inner)}
    acc: dict[tuple, float] = {}
    state = {"line": None, "t": 0.0}

    def tracer(frame, event, arg):
        if frame.f_code not in codes:
            return None
        if event in ("line", "return", "call"):
            cp.cuda.Device().synchronize()
            now = time.perf_counter()
            if state["line"] is not None:
                acc[state["line"]] = acc.get(state["line"], 0.0) + now - state["t"]
            state["t"] = now
            if event == "line":
                state["line"] = (frame.f_code.co_name, frame.f_lineno)
            elif event == "return" and frame.f_back is not None and frame.f_back.f_code in codes:
                state["line"] = (frame.f_back.f_code.co_name, frame.f_back.f_lineno)
            else:
                state["line"] = None if event == "return" else state["line"]
        return tracer

    cp.cuda.Device().synchronize()
    sys.settrace(lambda f, e, a: tracer(f, e, a) if f.f_code in codes else None)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return acc


def _report(name, fn, args, cp, inner=()):
    for _ in range(2):
        fn(*args)
    ts, hs = [], []
    for _ in range(10):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        t0 = time.perf_counter()
        fn(*args)
        hs.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    print(f"{name}: event median {statistics.median(ts):.2f} ms, host return median "
          f"{statistics.median(hs):.2f} ms")  # fmt: skip
    split = _line_split(fn, args, cp, inner)
    tot = sum(split.values())
    print(f"  per-line (synchronized, total {tot * 1e3:.2f} ms), top 15:")
    for (fname, ln), s in sorted(split.items(), key=lambda x: -x[1])[:15]:
        src = linecache.getline(_file(fname, fn, inner), ln).strip()[:80]
        print(f"  {s * 1e3:7.2f} ms  {fname}:{ln}: {src}")


def _file(fname, fn, inner):
    """The source file of the traced function named ``fname``."""
    return next(f.__code__.co_filename for f in (fn, *inner) if f.__code__.co_name == fname)


def _prepare(args, scorer):
    """What ``dosa_topk`` times as its prepare stage: ``options.start`` (the checks, the
    padded batch), the value checks read back, ρ per key."""
    from dosa_cupy import options, prepare

    _, _, _, b, _ = options.start(*args, {"scorer": scorer})
    b.raise_if_bad()
    return prepare.key_rho(b.kp)


def _finish(K, sd, recs, b, valid):
    """The pipeline's stages after refinement (pipeline.dosa_topk): the exact selection,
    the query-level recovery and the int64 ids."""
    from dosa_cupy import select

    ids, _ = select.select_ids(K, sd.default, recs)
    select.recover(b, ids, select.recovery_queries(b) | ~valid)
    return ids.astype("int64")


def _report_finish(args, o, scorer, cp) -> None:
    """Refinement and ``_finish`` on one call's survivors: its batch from ``options.start``
    with the value checks read back (so recovery takes the path ``dosa_topk`` takes), seeds,
    an r = 14 plan screened by "fp64" — then ``refine_stage`` (its records' buffer, the
    kernel, the overflow test) and the finish, each timed and split by line."""
    from dosa_cupy import options, plan, refine, screen, seeds, select
    from dosa_cupy.prepare import key_rho

    _, _, _, b, _ = options.start(*args, {"scorer": scorer})
    b.raise_if_bad()
    sd = seeds.seed_stage(b, o)
    pl = plan.plan_stage(b, sd.pool, 14, o)
    o2 = options.resolved(o, screen="fp64")
    surv = screen.screen_stage(b, pl, sd, key_rho(b.kp), o2, False).surv
    refine_args = (b, sd.tau, surv, int(o["buffer"]))
    inner = (refine.RefineLaunch.per_query, select.RecordBuffer.__init__, select.extend_flagged)
    _report("refine (refine_stage)", refine.refine_stage, refine_args, cp, inner)
    recs = refine.refine_stage(*refine_args)
    inner = (select.select_ids, select.recovery_queries, select.recover)
    _report("finish (select, recovery, ids)", _finish, (b.K, sd, recs, b, pl.valid), cp, inner)


def main(argv=None) -> int:
    import cupy as cp

    from dosa_cupy import options, plan, prepare, route, screen, seeds
    from dosa_cupy._build import device_name
    from dosa_cupy.cost import model_for
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import key_rho, pad_batch
    from dosa_cupy.workload import make_gpu_workload

    ap = CommandParser(prog="dosa bench --profile-plan")
    ap.add_argument("--Qn", type=int, default=4096)
    ap.add_argument("--N", type=int, default=131072)
    ap.add_argument("--H", default="32,64")
    ap.add_argument("--scorer", choices=("f16", "fp8"), default="f16")
    a = ap.parse_args(argv)
    for H in (int(x) for x in a.H.split(",")):
        wl = make_gpu_workload("calibrated", a.Qn, a.N, H, seed=5)
        b = pad_batch(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"],
                      scorer=a.scorer)  # fmt: skip
        o = resolve_options(check_options({"scorer": a.scorer}), b.K)
        print(f"== H={H} Qn={a.Qn} N={a.N} scorer={a.scorer}")
        args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
        inner = (options.start, prepare.pad_batch, prepare.check_inputs, prepare.pad_heads,
                 prepare.ValueCheck.__init__, prepare.ValueCheck.raise_if_bad)  # fmt: skip
        _report("prepare (pipeline's start, checks, ρ)", _prepare, (args, a.scorer), cp, inner)
        _report("seeds (seed_stage)", seeds.seed_stage, (b, o), cp)
        sd = seeds.seed_stage(b, o)
        rho = key_rho(b.kp)
        model = model_for(b.scorer, device_name())
        inner = (route._sample, plan.plan_stage, screen.auto_pick)
        _report("route (route_stage)", route.route_stage, (b, sd, rho, o, model), cp, inner)
        pool = sd.pool
        ns = min(o["p_sample"], int(pool.size))
        sample = pool[cp.linspace(0, pool.size - 1, ns).astype(cp.int64)] if ns else None
        _report("plan (build_plans)", plan.build_plans, (b.q, b.w, b.kp, sample, 14, 1, 17), cp)
        # the pipeline's planner (one kernel per chunk, one block per query), same method
        fused = plan.build_plans_fused
        _report("plan (build_plans_fused)", fused, (b.q, b.w, b.kp, sample, 14, 1, 17), cp)
        try:  # the newest part: a failure here keeps the lines above and the next H
            _report_finish(args, o, a.scorer, cp)
        except Exception as e:  # noqa: BLE001 — reported, not raised
            print(f"finish: not profiled ({type(e).__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
