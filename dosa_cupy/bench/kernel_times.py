"""GPU time per kernel of one ``dosa_topk`` call, by Nsight Compute (docs/records/benchmarks.md
"where each kernel's time goes"): which launches a stage's milliseconds are made of.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file k.csv \\
        python -m dosa_cupy.bench.kernel_times run --regime calibrated --H 64 --N 131072
    python -m dosa_cupy.bench.kernel_times summary k.csv

``run`` makes the workload, calls ``dosa_topk`` twice (compilation, the memory pool), then once
between ``cudaProfilerStart`` and ``cudaProfilerStop``, so only that call's kernels are
profiled; it asks for no statistics (they add kernels of their own).  ncu runs the kernels one
at a time at base clocks, so every kernel is slower than in ``dosa bench``, and the timed
samples of ``route="auto"`` are not the bench's: profile a fixed route ("dosa" or "dense").
``run --graph``: the profiled call is a replay of the call's captured step
(``dosa_topk(graph=StepGraphs())``, its fourth call; ncu profiles a graph's kernel nodes one
by one): with ``--route auto``, the prefix of the route chosen in the graph (docs/method.md §9
"A route chosen inside a graph") and the body it ran, with the copies in and out.
``summary`` reads ncu's CSV and prints each kernel name's launches and milliseconds, largest
first, and the total.  Not a benchmark: ``dosa bench`` is (docs/benchmark_method.md).
"""

from __future__ import annotations

import csv
import sys
from collections import OrderedDict

from dosa_ref.cmdline import CommandParser

__all__ = ["call_flags", "main", "parse_ncu_csv", "summarize"]

METRIC = "gpu__time_duration.sum"
_MS_PER_UNIT = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
                "msecond": 1.0, "s": 1e3, "second": 1e3}  # fmt: skip


def parse_ncu_csv(text: str) -> list[tuple[str, float]]:
    """(kernel name without its parameter list, milliseconds) of every launch in ncu's
    ``--csv`` output ``text`` (its lines that are not CSV, such as ``==PROF==`` notes, are
    skipped), in launch order; only the rows of ``gpu__time_duration.sum``.  ValueError
    naming ``text`` for a unit it does not know."""
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    out = []
    for r in rows:
        if r.get("Metric Name") != METRIC:
            continue
        unit = r["Metric Unit"]
        if unit not in _MS_PER_UNIT:
            raise ValueError(f"text: unknown unit {unit!r} of {METRIC}")
        value = float(r["Metric Value"].replace(",", ""))
        out.append((r["Kernel Name"].split("(")[0].strip(), value * _MS_PER_UNIT[unit]))
    return out


def summarize(launches: list[tuple[str, float]]) -> list[tuple[str, int, float]]:
    """(name, launches, milliseconds) per kernel name of ``parse_ncu_csv``'s list, the
    largest total first (ties in order of first launch)."""
    by: OrderedDict = OrderedDict()
    for name, ms in launches:
        n, t = by.get(name, (0, 0.0))
        by[name] = (n + 1, t + ms)
    return sorted(((k, n, t) for k, (n, t) in by.items()), key=lambda x: -x[2])


def _run(a) -> None:
    import cupy as cp

    from dosa_cupy.pipeline import dosa_topk
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload(a.regime, a.Qn, a.N, a.H, seed=a.seed)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], a.K, wl["ks"], wl["ke"])
    opts = {"scorer": a.scorer, "route": a.route}
    warm = 2
    if a.graph:  # calls 1 and 2 run eagerly and capture; 3 is the first replay
        from dosa_cupy.capture import StepGraphs

        opts["graph"], warm = StepGraphs(), 3
    for _ in range(warm):
        dosa_topk(*args, **opts)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    dosa_topk(*args, **opts)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()


def _summary(paths: list[str]) -> None:
    for path in paths:
        with open(path) as f:
            launches = parse_ncu_csv(f.read())
        total = sum(ms for _, ms in launches)
        print(f"== {path}: {len(launches)} launches, {total:.3f} ms of GPU time")
        for name, n, ms in summarize(launches):
            print(f"  {ms:9.3f} ms  x{n:<4d} {name}")


def call_flags(ap) -> None:
    """The flags of one prefill call's workload (``workload.make_gpu_workload``) and scorer:
    --regime, --H, --Qn, --N, --K, --seed, --scorer (also ``bench.host_lag``'s)."""
    ap.add_argument("--regime", default="calibrated")
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--Qn", type=int, default=4096)
    ap.add_argument("--N", type=int, default=131072)
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scorer", default="fp8", choices=("fp8", "f16"))


def main(argv=None) -> None:
    ap = CommandParser(prog="python -m dosa_cupy.bench.kernel_times",
                       description=__doc__.split("\n")[0])  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one call between profiler start and stop (under ncu)")
    call_flags(r)
    r.add_argument("--route", default="dosa", choices=("dosa", "dense", "auto"))
    r.add_argument(
        "--graph",
        action="store_true",
        help="profile a replayed call (dosa_topk(graph=StepGraphs())): with --route auto, the "
        "prefix of a route chosen in the graph and the body it ran",
    )
    s = sub.add_parser("summary", help="per-kernel totals of ncu --csv files")
    s.add_argument("csv", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "summary":
        _summary(a.csv)
        return
    with ap.value_errors(Qn="--Qn", N="--N", H="--H", regime="--regime"):
        _run(a)


if __name__ == "__main__":
    main(sys.argv[1:])
