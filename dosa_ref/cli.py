"""``dosa`` command line: demo, fuzz, calibrate, audit, proofs, mutate, bench.

dosa demo [--large] [--queries Q --keys N --heads H --regime NAME]
dosa fuzz [--profile ci|nightly] [-- pytest args]
dosa calibrate [--queries Q --keys N --regime NAME --heads H]
dosa audit ...            (dosa_ref.audit; see ``dosa audit --help``)
dosa proofs               (python -m proofs)
dosa mutate ...           (dosa_ref.mutate)
dosa bench ...            (the GPU benchmark; needs CuPy and an NVIDIA GPU)
dosa bench --decode ...   (its decode mode)
dosa train-indexer ...    (the trained regime's indexers; GPU, PyTorch)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
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
    """Print a regime's certificate statistics (default: calibrated) beside the paper's."""
    from .calibration import calibration_table, format_calibration

    ap = argparse.ArgumentParser(prog="dosa calibrate", description=calibrate.__doc__)
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--keys", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regime", default="calibrated", help="a dosa_ref.workloads regime")
    ap.add_argument("--heads", type=int, default=None, help="H (default: the regime's)")
    ap.add_argument("--layers", type=int, default=4, help="workloads (seeds) pooled")
    a = ap.parse_args(argv)
    kw = {k: v for k, v in (("Qn", a.queries), ("N", a.keys)) if v is not None}
    rows = calibration_table(seed=a.seed, name=a.regime, H=a.heads, layers=a.layers, **kw)
    print(f"regime {a.regime}" + (f", H={a.heads}" if a.heads else ""))
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

# Commands implemented outside this module, as "module:function" strings resolved only when
# the command runs: the reference never imports the GPU package (a string is no import edge;
# tests/test_cli.py scans for one; docs/running_on_gpu.md).  An installed distribution's
# entry points of the group ``dosa.commands`` (pyproject.toml) take precedence; this table is
# the fallback for a checkout installed before they existed, or not installed at all.
PLUGIN_GROUP = "dosa.commands"
PLUGINS = {
    "audit": "dosa_ref.audit:main",
    "bench": "dosa_cupy.bench.cli:main",
    "mutate": "dosa_ref.mutate:main",
    "train-indexer": "dosa_cupy.train_indexer:main",
}
GPU_HINT = "pip install 'dosa[gpu]' (CuPy) and run on a machine with an NVIDIA GPU"
HINTS = {
    "bench": GPU_HINT,
    "train-indexer": "pip install 'dosa[gpu,train]' (CuPy, PyTorch) and run on a machine with "
    "an NVIDIA GPU",
}


def plugin_target(name: str) -> str | None:
    """ "module:function" of command ``name``: its ``dosa.commands`` entry point if one is
    installed, else the built-in table ``PLUGINS``; None for an unknown command."""
    try:
        eps = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    except Exception:  # broken metadata of some other distribution: use the table
        eps = ()
    for ep in eps:
        if ep.name == name:
            return ep.value
    return PLUGINS.get(name)


def _missing(err: ModuleNotFoundError, module: str) -> bool:
    """The import failed because ``module`` itself (or a package above it) does not exist,
    not because of an import inside it."""
    parts = module.split(".")
    return err.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


def run_plugin(name: str, argv: list[str]) -> int:
    """Import command ``name``'s target and call it with ``argv``; a missing module or a
    missing CuPy is a one-line message and exit code 2, not a traceback."""
    target = plugin_target(name)
    module, _, attr = target.partition(":")
    hint = HINTS.get(name)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("cupy", "cupy_backends"):
            print(f"dosa {name}: CuPy is not installed; {hint or GPU_HINT}", file=sys.stderr)
            return 2
        if not _missing(e, module):
            raise
        extra = f"; {hint}" if hint else ""
        print(
            f"dosa {name}: not available here (module {module} not found){extra}", file=sys.stderr
        )
        return 2
    fn = getattr(mod, attr or "main", None)
    if fn is None:
        print(f"dosa {name}: {module} has no function {attr or 'main'!r}", file=sys.stderr)
        return 2
    return fn(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in COMMANDS:
        return COMMANDS[cmd](rest)
    if plugin_target(cmd) is not None:
        return run_plugin(cmd, rest)
    print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
