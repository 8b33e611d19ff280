"""dosa: the command line of the DoSA reference (CPU) and of its GPU package.

    dosa demo            dense scoring vs DoSA per seed strategy on a generated workload;
                         checks that the ids are identical
    dosa fuzz            the hypothesis property suite (the tests marked `property`) under a
                         profile: ci (default; derandomized, 60 examples per property),
                         dev (200 random examples), nightly (20,000 random examples)
    dosa calibrate       a regime's certificate statistics beside the paper's values
    dosa audit           the FP8 numerical guard's dominance audit on a workload, or the
                         replay of a violation file
    dosa proofs          every executable proof of the method's statements (python -m proofs)
    dosa mutate          mutation testing of the soundness-critical code (docs/mutation.md)
    dosa bench           the GPU benchmark, and its modes --decode, --serving, ... (CuPy,
                         an NVIDIA GPU; --dry-run plans a run without one)
    dosa train-indexer   train the trained regime's indexers (GPU, PyTorch)

dosa COMMAND --help lists a command's flags and their defaults.  A bad argument is one
line on stderr naming the flag, and exit code 2.  fuzz and mutate run the test suite: they
need the test extra (pip install 'dosa[test]'); bench and train-indexer the GPU extras.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .cmdline import (
    CommandParser,
    _arg_type,
    name_in,
    nonnegative_int,
    positive_int,
    run_command,
)
from .progress import Progress

DEMO_SMALL = dict(queries=24, keys=16384)
DEMO_LARGE = dict(queries=256, keys=131072)
DEMO_STRATEGIES = ("local", "anchor", "certificate", "local+anchor+certificate")

# The hypothesis profiles of tests/conftest.py, one line each for the help texts
# (tests/test_cli.py checks that both name the same profiles).
FUZZ_PROFILES = {
    "ci": "the default: derandomized, 60 examples per property (minutes on 2 cores)",
    "dev": "200 random examples per property (a longer local run)",
    "nightly": "20,000 random examples per property (long runs; tens of minutes)",
}
# tests/conftest.py marks every hypothesis test `property` (pyproject.toml registers it)
FUZZ_MARK = "property and not gpu"
TEST_DEPS = ("pytest", "hypothesis")
TEST_HINT = "pip install 'dosa[test]'"

# The library's argument names (the head of its ``ValueError("name: reason")``) → the flags
# of the workload commands (demo, calibrate, audit) that carry them.
WORKLOAD_FLAGS = {"Qn": "--queries", "N": "--keys", "H": "--heads", "seed": "--seed"}


# --------------------------------------------------------------------------- arguments


@_arg_type
def strategy_list(text: str) -> list[str]:
    """A comma list of seed strategies, each names joined by '+' (``local,anchor+local``);
    "explicit" needs seed ids, which no command line gives."""
    from .options import parse_strategies

    out = [s.strip() for s in text.split(",") if s.strip()]
    if not out:
        raise ValueError(f"expected a comma list of seed strategies, got {text!r}")
    for s in out:
        try:
            names = parse_strategies(s)
        except ValueError as e:  # "seeds: unknown strategy ...": the flag is named already
            raise ValueError(str(e).partition(": ")[2]) from None
        if "explicit" in names:
            raise ValueError(f"'explicit' takes seed ids, which no command line gives: {s!r}")
    return out


def _regime_type(what: str = "regime") -> Callable[[str], str]:
    from .workloads import regime_names

    return name_in(regime_names(), what)


def _add_regime(ap: argparse.ArgumentParser) -> None:
    """The ``--regime`` flag of the workload commands (demo, calibrate)."""
    ap.add_argument(
        "--regime",
        type=_regime_type(),
        default="calibrated",
        metavar="NAME",
        help=f"workload regime: {_regimes()} (default calibrated; docs/workloads.md)",
    )


def _regimes() -> str:
    from .workloads import regime_names

    return ", ".join(regime_names())


def _importable(name: str) -> bool:
    if name in sys.modules:  # None: an import blocked on purpose (tests do this)
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def require_test_deps(prog: str) -> int | None:
    """2 after one line on stderr when pytest or hypothesis (the ``test`` extra, no longer
    runtime dependencies) is not importable; None when both are."""
    missing = [m for m in TEST_DEPS if not _importable(m)]
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    print(f"{prog}: {' and '.join(missing)} {verb} not installed; {TEST_HINT}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- commands


def _pct(x: float) -> str:
    """A fraction as a percentage; "-" where it is undefined (nan: a 0/0)."""
    return f"{100 * x:.2f}%" if np.isfinite(x) else "-"


def _fmt(x, spec=".3g"):
    if isinstance(x, float) and np.isnan(x):
        return "-"
    return format(x, spec) if isinstance(x, float) else str(x)


DEMO_LEGEND = (
    "survival = Σ keys passing the screen / Σ keys screened; pruning = 1 - survival",
    "fully scored = Σ keys scored for the selection (seeds, certificate seeds, refined "
    "keys; every key of a dense query) / Σ visible keys",
    "anchors scored = the anchor queries' full scoring / Σ visible keys (not in fully scored)",
    "work ratio = (every scoring + the bounds' cost) / dense scoring; above 1: DoSA did more",
    "- = undefined (survival, pruning: no key screened, every query dense); definitions: "
    "dosa_ref.options.SelectStats",
    "slack = mean Prop. 6 components of U - s on a key sample",
)


def demo(argv: list[str]) -> int:
    """Dense scoring vs DoSA per seed strategy on a generated workload; checks the ids."""
    from . import dosa_topk, index_scores, topk_ids
    from .workloads import make_workload

    small, large = DEMO_SMALL, DEMO_LARGE
    ap = CommandParser(prog="dosa demo", description=demo.__doc__)
    ap.add_argument(
        "--large",
        action="store_true",
        help=f"{large['queries']} queries x {large['keys']:,} keys (default size: "
        f"{small['queries']} x {small['keys']:,})",
    )
    ap.add_argument(
        "--queries",
        type=positive_int,
        metavar="Q",
        help=f"queries of the chunk (default {small['queries']}; {large['queries']} with --large)",
    )
    ap.add_argument(
        "--keys",
        type=positive_int,
        metavar="N",
        help=f"keys of the context, at least Q (default {small['keys']:,}; "
        f"{large['keys']:,} with --large)",
    )
    ap.add_argument(
        "--heads",
        type=positive_int,
        metavar="H",
        help="indexer heads (default: the regime's, 32; 64 for h64 and trained)",
    )
    _add_regime(ap)
    ap.add_argument("--K", type=positive_int, default=2048, help="selection size (default 2048)")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="workload seed (default 0)")
    ap.add_argument(
        "--strategies",
        type=strategy_list,
        default=",".join(DEMO_STRATEGIES),
        metavar="LIST",
        help="comma list of seed strategies, each names from local, anchor, certificate "
        f"joined by '+' (default {','.join(DEMO_STRATEGIES)})",
    )
    a = ap.parse_args(argv)
    size = dict(large if a.large else small)
    for name in ("queries", "keys"):
        if getattr(a, name) is not None:
            size[name] = getattr(a, name)
    if size["queries"] > size["keys"]:
        ap.error(
            f"--queries: the chunk ({size['queries']}) cannot be longer than the context "
            f"(--keys {size['keys']})"
        )
    # H: the regime's own head count (h64 has 64) unless --heads overrides it.  No progress
    # report here: a bad value found by make_workload must stay the only line on stderr.
    with ap.value_errors(**WORKLOAD_FLAGS, name="--regime"):
        wl = make_workload(a.regime, size["queries"], size["keys"], H=a.heads, seed=a.seed)
    Qn, H, D = wl.q.shape
    N = wl.k.shape[0]
    # flushed: with stdout a pipe or a file, the header would otherwise wait for the table
    print(
        f"workload {a.regime}: {Qn} queries x {N} keys, H={H}, D={D}, K={a.K} (causal chunk)",
        flush=True,
    )
    with Progress(Qn, "dense") as bar:
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
    for strat in a.strategies:
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
                _pct(tot["survival"]),
                _pct(tot["pruning"]),
                _pct(tot["scored_fraction"]),
                _pct(tot["anchor_scored_fraction"]),
                _fmt(tot["work_ratio"]),
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
        "anchors scored",
        "work ratio",
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
    print("\n" + "\n".join(DEMO_LEGEND))
    if not ok_all:
        print("ERROR: DoSA ids differ from dense Top-K", file=sys.stderr)
        return 1
    print("all strategies returned ids identical to dense Top-K")
    return 0


def fuzz(argv: list[str]) -> int:
    """Run the hypothesis property suite on the CPU: the tests marked ``property`` (every
    hypothesis test; tests/conftest.py marks them) under a hypothesis profile."""
    ap = CommandParser(
        prog="dosa fuzz",
        description=" ".join(fuzz.__doc__.split()),  # raw text below: the profiles' lines
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="profiles (tests/conftest.py):\n"
        + "\n".join(f"  {k:<8} {v}" for k, v in FUZZ_PROFILES.items())
        + f"\n\nruns: python -m pytest -q -m '{FUZZ_MARK}' tests/ [PYTEST_ARG ...]",
    )
    ap.add_argument(
        "--profile",
        default="ci",
        choices=tuple(FUZZ_PROFILES),
        help="hypothesis profile (default ci; listed below)",
    )
    ap.add_argument(
        "pytest_args",
        nargs="*",
        metavar="PYTEST_ARG",
        help="more pytest arguments, after --: dosa fuzz -- -x -k select",
    )
    a = ap.parse_args(argv)
    rc = require_test_deps("dosa fuzz")
    if rc is not None:
        return rc
    tests = Path(__file__).resolve().parents[1] / "tests"
    if not tests.is_dir():
        print(
            f"dosa fuzz: tests folder not found at {tests} (run from a source checkout)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ, HYPOTHESIS_PROFILE=a.profile)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", FUZZ_MARK, str(tests), *a.pytest_args]
    print("+", shlex.join(cmd), f"(HYPOTHESIS_PROFILE={a.profile})", flush=True)
    return subprocess.call(cmd, env=env)


def calibrate(argv: list[str]) -> int:
    """Print a regime's certificate statistics (default: calibrated) beside the paper's."""
    from .calibration import calibration_table, format_calibration

    default = {k: p.default for k, p in inspect.signature(calibration_table).parameters.items()}
    ap = CommandParser(prog="dosa calibrate", description=calibrate.__doc__)
    ap.add_argument(
        "--queries",
        type=positive_int,
        default=default["Qn"],
        metavar="Q",
        help=f"queries per workload (default {default['Qn']})",
    )
    ap.add_argument(
        "--keys",
        type=positive_int,
        default=default["N"],
        metavar="N",
        help=f"keys per workload, at least Q (default {default['N']:,})",
    )
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="first seed (default 0)")
    _add_regime(ap)
    ap.add_argument(
        "--heads", type=positive_int, default=None, metavar="H", help="H (default: the regime's)"
    )
    ap.add_argument(
        "--layers",
        type=positive_int,
        default=default["layers"],
        help=f"workloads (seeds) pooled (default {default['layers']})",
    )
    a = ap.parse_args(argv)
    if a.queries > a.keys:
        ap.error(f"--queries: {a.queries} queries cannot exceed the context (--keys {a.keys})")
    with ap.value_errors(**WORKLOAD_FLAGS, name="--regime"):
        rows = calibration_table(
            Qn=a.queries, N=a.keys, seed=a.seed, name=a.regime, H=a.heads, layers=a.layers
        )
    print(f"regime {a.regime}" + (f", H={a.heads}" if a.heads else ""))
    print(format_calibration(rows))
    if a.regime == "trained":  # the Top-K over window offsets (docs/workloads.md §1.2)
        from .trained_stats import format_topk_distribution, trained_topk_distribution

        dist = trained_topk_distribution(a.queries, a.keys, a.heads, a.seed)
        print(format_topk_distribution(dist))
    return 0


def proofs(argv: list[str]) -> int:
    """Run every executable proof (``python -m proofs``; ``dosa proofs --help``)."""
    # In this process, not a subprocess: its argument errors are then one line as well.
    try:
        runner = importlib.import_module("proofs.__main__")
    except ModuleNotFoundError as e:
        if not _missing(e, "proofs.__main__"):
            raise
        print(
            "dosa proofs: the proofs package is not importable here (it ships with dosa)",
            file=sys.stderr,
        )
        return 2
    return runner.main(argv, prog="dosa proofs")


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
    """``dosa COMMAND ARGS``: run the command and return its exit code (``--help``: the
    module docstring).  Bad arguments exit 2 after one line on stderr (``run_command``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in COMMANDS:
        fn = COMMANDS[cmd]
    elif plugin_target(cmd) is not None:
        fn = functools.partial(run_plugin, cmd)
    else:
        known = ", ".join([*COMMANDS, *PLUGINS])
        print(f"dosa: unknown command {cmd!r} (choose from {known}; dosa --help)", file=sys.stderr)
        return 2
    return run_command(f"dosa {cmd}", fn, rest)


if __name__ == "__main__":
    sys.exit(main())
