"""Where a prefill call waits for its host (docs/records/benchmarks.md "a prefill call's host
and GPU timelines"): at the entry and exit of the pipeline's stage functions, the host's clock
and a CUDA event recorded on the stream (no synchronization), for isolated ``dosa_topk``
calls.  At each point, GPU − host is how far the queued work runs behind the host: 0 where the
GPU has caught up and waits for the host's next launch, large where the host is ahead.

    python -m dosa_cupy.bench.host_lag --regime calibrated --H 64 --N 131072

Scenarios: ``dosa`` (route="dosa"), ``memo`` (a remembered DoSA or dense choice),
``sampled`` (route="auto" with a fresh memo: the sampled decision on every call), ``auto``
(route="auto"), ``dense``.  Each call is synchronized before it, so the table shows one call
alone, not a stream of calls (``dosa bench`` times those).  Recording an event costs the host
a few microseconds per point.  Not a benchmark: ``dosa bench`` is (docs/benchmark_method.md).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import statistics
import sys
import time
from collections import defaultdict

from dosa_ref.cmdline import CommandParser

from .kernel_times import call_flags

__all__ = ["POINTS", "main", "probed", "summarize"]

# module of dosa_cupy → the functions whose entry and exit are marked (as the module calls
# them: a function imported into ``pipeline`` is marked where ``pipeline`` calls it)
POINTS = {
    "pipeline": ("start", "early_choice", "memo_recall", "head_prefetch", "key_rho",
                 "seed_stage", "route_stage", "tie_prefetch", "plan_stage", "screen_stage",
                 "refine_stage", "overflow_counts", "select_ids", "recover", "extend_records",
                 "_dense_route"),
    "route": ("_head_counts", "_samples", "_sample", "plan_stage"),
    "seeds": ("anchor_pool", "launch_fp8_ranges", "tau_of_seeds"),
}  # fmt: skip

SCENARIOS = ("dosa", "memo", "sampled", "auto", "dense")


@contextlib.contextmanager
def probed(mark, points=None):
    """The functions of ``points`` (default ``POINTS``) call ``mark(name + ">")`` on entry and
    ``mark(name + "<")`` on exit inside the block, and are restored after it (also when it
    raises).  ValueError naming ``points`` for a function a module does not have."""
    points = POINTS if points is None else points
    saved = []
    for m, names in points.items():
        mod = importlib.import_module(f"dosa_cupy.{m}")
        for name in names:
            if not callable(getattr(mod, name, None)):
                raise ValueError(f"points: dosa_cupy.{m} has no function {name!r}")
            saved.append((mod, name, getattr(mod, name)))
    try:
        for mod, name, f in saved:
            setattr(mod, name, _marked(f, name, mark))
        yield
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)


def _marked(f, name, mark):
    @functools.wraps(f)
    def inner(*a, **k):
        mark(name + ">")
        try:
            return f(*a, **k)
        finally:
            mark(name + "<")

    return inner


def summarize(calls: list[list[tuple[str, float, float]]]) -> list[tuple[str, float, float]]:
    """(point, host ms, GPU ms) medians over ``calls``, each a list of (point, host ms, GPU
    ms) since its call's start in the order reached.  A point reached several times in a call
    is numbered from its second time on (``plan_stage#2``); points not reached in every call
    are left out; the order is the first call's."""
    rows: dict = defaultdict(list)
    order: list = []
    for log in calls:
        seen: dict = defaultdict(int)
        for name, h, g in log:
            seen[name] += 1
            key = name if seen[name] == 1 else f"{name}#{seen[name]}"
            if key not in rows:
                order.append(key)
            rows[key].append((h, g))
    return [(k, statistics.median(h for h, _ in rows[k]), statistics.median(g for _, g in rows[k]))
            for k in order if len(rows[k]) == len(calls)]  # fmt: skip


def _scenario(name: str, cost):
    memo = cost.RouteMemo(refresh=10**6)  # one per scenario, kept across its calls
    return {
        "dosa": lambda: {"route": "dosa"},
        "memo": lambda: {"route": "auto", "route_memo": memo},
        "sampled": lambda: {"route": "auto", "route_memo": cost.RouteMemo()},
        "auto": lambda: {"route": "auto"},
        "dense": lambda: {"route": "dense"},
    }[name]


def _run(a) -> None:
    import cupy as cp

    from dosa_cupy import cost
    from dosa_cupy.pipeline import dosa_topk
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload(a.regime, a.Qn, a.N, a.H, seed=a.seed)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], a.K, wl["ks"], wl["ke"])
    print(f"== {a.regime} H {a.H} Qn {a.Qn} N {a.N} K {a.K}: ms since the call's start, "
          f"medians of {a.calls} isolated calls; host / GPU (GPU − host)")  # fmt: skip
    for s in a.scenarios:
        options = _scenario(s, cost)
        for _ in range(2):  # builds, loads, a memo's first (sampled) call
            dosa_topk(*args, scorer=a.scorer, **options())
        logs = []
        for _ in range(a.calls):
            opts = options()
            cp.cuda.Device().synchronize()
            log = []

            def mark(name, log=log):
                e = cp.cuda.Event()
                e.record()
                log.append((name, time.perf_counter(), e))

            with probed(mark):
                mark("call>")
                dosa_topk(*args, scorer=a.scorer, **opts)
                mark("call<")
            cp.cuda.Device().synchronize()
            h0, e0 = log[0][1], log[0][2]
            logs.append([(n, (h - h0) * 1e3, cp.cuda.get_elapsed_time(e0, e)) for n, h, e in log])
        rows = summarize(logs)
        print(f"-- {s}: host {rows[-1][1]:.3f}, GPU done {rows[-1][2]:.3f}")
        for name, h, g in rows:
            print(f"   {name:24s} {h:8.3f} {g:8.3f} ({g - h:+.3f})")


def main(argv=None) -> None:
    ap = CommandParser(prog="python -m dosa_cupy.bench.host_lag",
                       description=__doc__.split("\n")[0])  # fmt: skip
    call_flags(ap)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args(argv)
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    bad = sorted(set(a.scenarios) - set(SCENARIOS))
    if bad or not a.scenarios or a.calls < 1:
        ap.error(f"--scenarios: expected some of {','.join(SCENARIOS)}, --calls ≥ 1")
    with ap.value_errors(Qn="--Qn", N="--N", H="--H", regime="--regime"):
        _run(a)


if __name__ == "__main__":
    main(sys.argv[1:])
