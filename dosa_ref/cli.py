"""``dosa`` command line: demo, fuzz, calibrate, audit, proofs, bench.

dosa demo [--large] [--queries Q --keys N --heads H --regime NAME]
dosa fuzz [--profile ci|nightly] [-- pytest args]
dosa calibrate [--queries Q --keys N]
dosa audit ...            (dosa_ref.audit; see ``dosa audit --help``)
dosa proofs               (python -m proofs)
dosa bench ...            (dosa_cupy.bench; needs a GPU)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .progress import Progress

DEMO_SMALL = dict(queries=24, keys=16384)
DEMO_LARGE = dict(queries=256, keys=131072)
DEMO_STRATEGIES = ("local", "anchor", "certificate", "local+anchor+certificate")


def _fmt(x, spec=".3g"):
    if isinstance(x, float) and np.isnan(x):
        return "-"
    return format(x, spec) if isinstance(x, float) else str(x)


def demo(argv: list[str]) -> int:
    """Dense scoring vs DoSA per seed strategy on a generated workload; checks ids."""
    from . import dosa_topk, index_scores, topk_ids
    from .workloads import make_workload

    ap = argparse.ArgumentParser(prog="dosa demo", description=demo.__doc__)
    ap.add_argument("--large", action="store_true", help="256 queries x 131,072 keys")
    ap.add_argument("--queries", type=int)
    ap.add_argument("--keys", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--regime", default="calibrated")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategies", default=",".join(DEMO_STRATEGIES))
    a = ap.parse_args(argv)
    size = dict(DEMO_LARGE if a.large else DEMO_SMALL)
    for name in ("queries", "keys"):
        if getattr(a, name) is not None:
            size[name] = getattr(a, name)
    # H: the regime's own head count (h64 has 64) unless --heads overrides it.
    wl = make_workload(a.regime, size["queries"], size["keys"], H=a.heads, seed=a.seed)
    Qn, H, D = wl.q.shape
    N = wl.k.shape[0]
    print(f"workload {a.regime}: {Qn} queries x {N} keys, H={H}, D={D}, K={a.K} (causal chunk)")
    with Progress(Qn, "dense ") as bar:
        t0 = time.perf_counter()
        scores = np.full((Qn, N), -np.inf)
        for t in range(Qn):
            scores[t : t + 1] = index_scores(
                wl.q[t : t + 1], wl.w[t : t + 1], wl.k, wl.ks[t : t + 1], wl.ke[t : t + 1]
            )
            bar.update()
        ref = topk_ids(scores, a.K)
        t_dense = time.perf_counter() - t0
    rows = []
    ok_all = True
    for strat in a.strategies.split(","):
        with Progress(Qn, f"{strat:>24}") as bar:
            t0 = time.perf_counter()
            res = dosa_topk(
                wl.q, wl.w, wl.k, a.K, wl.ks, wl.ke, seeds=strat, slack_sample=256, progress=bar
            )
            t_dosa = time.perf_counter() - t0
        same = bool(np.array_equal(res.ids, ref))
        ok_all &= same
        tot = res.stats.totals()
        rows.append(
            [
                strat,
                _fmt(float(np.mean(res.stats.r))),
                _fmt(tot["tau_gap_median"]),
                f"{100 * tot['survival']:.2f}%",
                f"{100 * tot['pruning']:.2f}%",
                f"{100 * tot['scored_fraction']:.2f}%",
                _fmt(tot.get("slack_positive", float("nan"))),
                _fmt(tot.get("slack_missed_negative", float("nan"))),
                _fmt(tot.get("slack_cancellation", float("nan"))),
                f"{t_dosa:.2f}",
                "yes" if same else "NO",
            ]
        )
    head = [
        "seeds",
        "mean r",
        "tau gap (med)",
        "survival",
        "pruning",
        "fully scored",
        "slack +proj",
        "slack missed-neg",
        "slack cancel",
        "DoSA s",
        "ids == dense",
    ]
    print(f"\ndense route (float64, all heads, all visible keys): {t_dense:.2f} s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(
        "\nsurvival = keys passing screening / keys screened; fully scored = (seeds + "
        "survivors) / visible keys; slack = mean Prop. 6 components of U - s on a key sample."
    )
    if not ok_all:
        print("ERROR: DoSA ids differ from dense Top-K", file=sys.stderr)
        return 1
    print("all strategies returned ids identical to dense Top-K")
    return 0


def fuzz(argv: list[str]) -> int:
    """Run the hypothesis property suite (CPU) under a profile."""
    ap = argparse.ArgumentParser(prog="dosa fuzz", description=fuzz.__doc__)
    ap.add_argument("--profile", default="ci", choices=("ci", "dev", "nightly"))
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    tests = Path(__file__).resolve().parents[1] / "tests"
    if not tests.is_dir():
        print(f"tests folder not found at {tests} (run from a source checkout)", file=sys.stderr)
        return 2
    env = dict(os.environ, HYPOTHESIS_PROFILE=a.profile)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not gpu", str(tests), *a.pytest_args]
    print("+", " ".join(cmd), f"(HYPOTHESIS_PROFILE={a.profile})")
    return subprocess.call(cmd, env=env)


def calibrate(argv: list[str]) -> int:
    """Print the calibrated regime's statistics beside the paper's targets."""
    from .workloads import calibration_table, format_calibration

    ap = argparse.ArgumentParser(prog="dosa calibrate", description=calibrate.__doc__)
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--keys", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    kw = {k: v for k, v in (("Qn", a.queries), ("N", a.keys)) if v is not None}
    rows = calibration_table(seed=a.seed, **kw)
    print(format_calibration(rows))
    return 0


def proofs(argv: list[str]) -> int:
    """Run every executable proof (python -m proofs)."""
    return subprocess.call([sys.executable, "-m", "proofs", *argv])


COMMANDS = {
    "demo": demo,
    "fuzz": fuzz,
    "calibrate": calibrate,
    "proofs": proofs,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "audit":
        from .audit import main as audit_main

        return audit_main(rest)
    if cmd == "bench":
        try:
            if "--decode" in rest:
                rest = [a for a in rest if a != "--decode"]
                from dosa_cupy.bench_decode import main as bench_main
            else:
                from dosa_cupy.bench import main as bench_main
        except ImportError as e:
            print(f"dosa bench needs the GPU extra (cupy): {e}", file=sys.stderr)
            return 2
        return bench_main(rest)
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
