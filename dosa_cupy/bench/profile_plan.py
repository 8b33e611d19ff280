"""Where the plan and seed stages spend their time (issue 5 analysis; docs/records/notes.md).

``dosa bench --profile-plan [--Qn 4096] [--N 131072] [--H 32,64]``

For ``plan.build_plans`` (the specification), ``plan.build_plans_fused`` (the
pipeline's planner) and ``seeds.seed_stage`` on the calibrated regime: CUDA-event
medians of 10 calls, the host time until the call returns (no synchronization; ≈ the event
time means the stage is bound by Python and launch overhead, not by the GPU), and a
per-source-line split taken with a device synchronization after every line (a trace
function on the stage's own frame; slower in total than the free-running call, but it
attributes time to lines).
"""

from __future__ import annotations

import statistics
import sys
import time

from dosa_ref.cmdline import CommandParser


def _line_split(fn, args, cp):
    """{line number: seconds} of ``fn``'s own frame, synchronizing after each line."""
    code = fn.__code__
    acc: dict[int, float] = {}
    state = {"line": None, "t": 0.0}

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event in ("line", "return"):
            cp.cuda.Device().synchronize()
            now = time.perf_counter()
            if state["line"] is not None:
                acc[state["line"]] = acc.get(state["line"], 0.0) + now - state["t"]
            state["line"], state["t"] = frame.f_lineno, now
        return tracer

    cp.cuda.Device().synchronize()
    sys.settrace(lambda f, e, a: tracer if f.f_code is code else None)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return acc


def _report(name, fn, args, cp, src_lines):
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
    split = _line_split(fn, args, cp)
    tot = sum(split.values())
    print(f"  per-line (synchronized, total {tot * 1e3:.2f} ms), top 15:")
    for ln, s in sorted(split.items(), key=lambda x: -x[1])[:15]:
        print(f"  {s * 1e3:7.2f} ms  L{ln}: {src_lines[ln - 1].strip()[:90]}")


def main(argv=None) -> int:
    import inspect

    import cupy as cp

    from dosa_cupy import plan, seeds
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import pad_batch
    from dosa_cupy.workload import make_gpu_workload

    ap = CommandParser(prog="dosa bench --profile-plan")
    ap.add_argument("--Qn", type=int, default=4096)
    ap.add_argument("--N", type=int, default=131072)
    ap.add_argument("--H", default="32,64")
    a = ap.parse_args(argv)
    for H in (int(x) for x in a.H.split(",")):
        wl = make_gpu_workload("calibrated", a.Qn, a.N, H, seed=5)
        b = pad_batch(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
        o = resolve_options(check_options({}), b.K)
        print(f"== H={H} Qn={a.Qn} N={a.N}")
        src = inspect.getsource(sys.modules[seeds.__name__]).splitlines()
        _report("seeds (seed_stage)", seeds.seed_stage, (b, o), cp, src)
        pool = seeds.seed_stage(b, o).pool
        ns = min(o["p_sample"], int(pool.size))
        sample = pool[cp.linspace(0, pool.size - 1, ns).astype(cp.int64)] if ns else None
        src = inspect.getsource(sys.modules[plan.__name__]).splitlines()
        _report(
            "plan (build_plans)", plan.build_plans, (b.q, b.w, b.kp, sample, 14, 1, 17), cp, src
        )
        # the pipeline's planner (one kernel per chunk, one block per query), same method
        fused = plan.build_plans_fused
        _report("plan (build_plans_fused)", fused, (b.q, b.w, b.kp, sample, 14, 1, 17), cp, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
