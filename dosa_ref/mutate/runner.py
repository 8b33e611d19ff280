"""Running mutants: a private copy of the tree per mutant, the target's tests under pytest,
the score and the report, and the command line (``dosa mutate``; docs/mutation.md)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .generate import Mutant, generate, match_equivalent, sample
from .targets import TARGETS, Target

_COPY = ("dosa_ref", "dosa_cupy", "proofs", "tests", "docs", "pyproject.toml")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.so")


def _make_copy(root: Path, dest: Path):
    dest.mkdir(parents=True)
    for name in _COPY:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_IGNORE)
        elif src.exists():
            shutil.copy2(src, dest / name)


def _pytest(copy: Path, tests: list[str], timeout: float) -> tuple[str, str, float]:
    """Run the tests in ``copy``: ('passed' | 'failed' | 'timeout', first failure, s)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(copy),
        PYTHONDONTWRITEBYTECODE="1",
        HYPOTHESIS_PROFILE="ci",
        PYTHONHASHSEED="0",
    )
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:randomly", "--no-header", "-rfE", *tests]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", "", time.perf_counter() - t0
    dt = time.perf_counter() - t0
    text = out.decode(errors="replace")
    if proc.returncode == 0:
        return "passed", "", dt
    m = re.search(r"^(FAILED|ERROR) (\S+)", text, re.M)
    first = m.group(2) if m else text.strip().splitlines()[-1] if text.strip() else ""
    if proc.returncode != 1 and not m:  # usage error, nothing collected, crash
        return "error", f"pytest exit {proc.returncode}: {first}", dt
    return "failed", first, dt


def run(
    root: Path, mutants: list[Mutant], jobs: int, timeout: float, tests=None, log=print
) -> dict:
    """Run every non-equivalent mutant (``tests``: optional test paths replacing every
    target's own list); returns the baseline seconds per module."""
    targets = {t.path: t for t in TARGETS}
    if tests:
        targets = {p: Target(p, tuple(tests), t.skip) for p, t in targets.items()}
    tmp = Path(tempfile.mkdtemp(prefix="dosa-mutate-"))
    try:
        copies = []
        for i in range(jobs):
            _make_copy(root, tmp / f"w{i}")
            copies.append(tmp / f"w{i}")
        originals = {m.path: (root / m.path).read_bytes() for m in mutants}
        # Baseline: every test set must pass on the unmutated copy.
        base = {}
        for path in sorted(originals):
            tests = tests_for(copies[0], targets[path])
            status, first, dt = _pytest(copies[0], tests, timeout * 4)
            if status != "passed":
                raise RuntimeError(f"tests for {path} do not pass unmutated: {first}")
            base[path] = dt
            log(f"baseline {path}: {len(tests)} test files pass in {dt:.1f} s")
        todo = [m for m in mutants if m.equivalent is None]
        for m in mutants:
            if m.equivalent is not None:
                m.status = "equivalent"
        lock = threading.Lock()
        free = list(copies)
        done = [0]

        def one(m: Mutant):
            with lock:
                copy = free.pop()
            try:
                f = copy / m.path
                f.write_bytes(m.apply(originals[m.path]))
                try:
                    limit = max(timeout, 3 * base[m.path])
                    status, first, dt = _pytest(copy, tests_for(copy, targets[m.path]), limit)
                finally:
                    f.write_bytes(originals[m.path])
                m.status = {"passed": "survived", "failed": "killed"}.get(status, status)
                m.detail, m.seconds = first, dt
                with lock:
                    done[0] += 1
                    log(f"[{done[0]}/{len(todo)}] {m.status:8s} {m.id} ({dt:.1f} s) {first}")
            finally:
                with lock:
                    free.append(copy)

        with ThreadPoolExecutor(max_workers=jobs) as ex:
            list(ex.map(one, todo))
        return base
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tests_for(root: Path, target: Target) -> list[str]:
    return [t for t in target.tests if (root / t).exists()]


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def score(mutants: list[Mutant]) -> tuple[int, int, int, int, float]:
    """(killed, timeouts, survived, equivalent, score) over the mutants that were run."""
    k = sum(m.status == "killed" for m in mutants)
    t = sum(m.status == "timeout" for m in mutants)
    s = sum(m.status == "survived" for m in mutants)
    e = sum(m.status == "equivalent" for m in mutants)
    n = k + t + s
    return k, t, s, e, (k + t) / n if n else float("nan")


def _strict(mutants: list[Mutant]) -> float:
    k, t, s, _, _ = score(mutants)
    c = sum(m.status == "equivalent" and m.equivalent.kind == "contract" for m in mutants)
    n = k + t + s + c
    return (k + t) / n if n else float("nan")


def report(root: Path, mutants: list[Mutant], args, base: dict, seconds: float) -> str:
    k, t, s, e, sc = score(mutants)
    srcs = {m.path: (root / m.path).read_bytes() for m in mutants}
    lines = [
        "# Mutation run",
        "",
        f"seed {args.seed}, {len(mutants)} mutants, {args.jobs} jobs, "
        f"timeout {args.timeout:.0f} s, wall {seconds / 60:.1f} min",
        "",
        f"**score {100 * sc:.1f} %** = (killed {k} + timeouts {t}) / "
        f"(run {k + t + s}); survived {s}; equivalent (excluded) {e}; "
        f"tool errors (excluded, listed below) {sum(m.status == 'error' for m in mutants)}",
        "",
        f"strict score (contract-equivalent mutants counted as survivors): "
        f"{100 * _strict(mutants):.1f} %",
        "",
        "| module | mutants | killed | timeout | survived | equivalent | tests (baseline s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in sorted(srcs):
        ms = [m for m in mutants if m.path == p]
        c = {
            x: sum(m.status == x for m in ms)
            for x in ("killed", "timeout", "survived", "equivalent")
        }
        lines.append(
            f"| {p} | {len(ms)} | {c['killed']} | {c['timeout']} | {c['survived']} | "
            f"{c['equivalent']} | {base.get(p, float('nan')):.1f} |"
        )
    lines += ["", "## Survivors", ""]
    surv = [m for m in mutants if m.status == "survived"]
    if not surv:
        lines.append("none")
    for m in surv:
        lines += [
            f"### {m.id} ({m.scope})",
            "",
            "```diff",
            m.diff(srcs[m.path]).rstrip(),
            "```",
            "",
        ]
    for m in mutants:
        if m.status == "error":
            lines.append(f"- tool error {m.id}: {m.detail}")
    lines += ["", "## Equivalent (excluded)", ""]
    for m in mutants:
        if m.status == "equivalent":
            e_ = m.equivalent
            lines.append(f"- {m.id} ({e_.kind}): `{m.before}` → `{m.after}` — {e_.why}")
    lines += [
        "",
        "## Killed / timed out",
        "",
        "| mutant | edit | first failing test |",
        "|---|---|---|",
    ]
    for m in mutants:
        if m.status in ("killed", "timeout"):
            edit = f"`{m.after}`".replace("|", "\\|")
            lines.append(f"| {m.id} | {edit} | {m.detail or m.status} |".replace("\n", " "))
    return "\n".join(lines) + "\n"


def select_targets(spec: str | None) -> list[Target]:
    if not spec:
        return list(TARGETS)
    out = []
    for name in spec.split(","):
        name = name.strip()
        # a path, a dotted module, or the stem of the mutant ids (cupy_<stem> for dosa_cupy's
        # modules, generate.py); a bare stem names a dosa_cupy module only when no dosa_ref
        # module has it
        hits = [t for t in TARGETS if name in (t.path, t.path.replace("/", ".")[:-3], t.id_stem)]
        if not hits:
            hits = [t for t in TARGETS if name == Path(t.path).stem]
        if not hits:
            raise ValueError(f"modules: unknown module {name!r}; expected some of "
                             f"{[t.path for t in TARGETS]}")  # fmt: skip
        out += [h for h in hits if h not in out]
    return out


def main(argv: list[str]) -> int:
    """``dosa mutate``: generate, run and report mutants (see the module docstring)."""
    from ..cli import require_test_deps
    from ..cmdline import (
        CommandParser,
        existing_dir,
        nonnegative_int,
        positive_float,
        positive_int,
        unit_fraction,
    )

    ap = CommandParser(prog="dosa mutate", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--modules",
        help="comma list (path, stem; cupy_<stem> for dosa_cupy's when "
        "dosa_ref has the stem too); default all",
    )
    ap.add_argument(
        "--max-mutants", type=positive_int, default=80, help="mutants sampled (default 80)"
    )
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="sample seed (default 0)")
    ap.add_argument("--report", metavar="FILE", help="write the markdown report here")
    ap.add_argument("--list", action="store_true", help="list the sampled mutants, run nothing")
    ap.add_argument("--all", action="store_true", help="every mutant (ignores --max-mutants)")
    ap.add_argument("--ids", help="comma list of mutant ids to run (from --list)")
    ap.add_argument("--jobs", type=positive_int, default=2, help="mutants run at once (default 2)")
    ap.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        help="seconds per mutant (min; default 120)",
    )
    ap.add_argument("--min-score", type=unit_fraction, help="exit 1 when the score (0..1) is lower")
    ap.add_argument(
        "--root",
        type=existing_dir,
        default=None,
        help="repository root (default: this checkout)",
    )
    ap.add_argument("--tests", help="comma list of test paths run for every module (override)")
    a = ap.parse_args(argv)
    root = Path(a.root) if a.root else Path(__file__).resolve().parents[2]
    if a.tests:
        missing = [t for t in a.tests.split(",") if not (root / t).exists()]
        if missing:
            ap.error(f"--tests: no such test path under {str(root)!r}: {', '.join(missing)}")
    if a.report and Path(a.report).is_dir():
        ap.error(f"--report: {a.report!r} is a directory; give a file name")
    if not a.list:  # --list runs no test: it needs neither pytest nor hypothesis
        rc = require_test_deps("dosa mutate")
        if rc is not None:
            return rc
    pools = {t.path: generate(root, t) for t in select_targets(a.modules)}
    if a.ids:
        want = set(a.ids.split(","))
        chosen = [m for ms in pools.values() for m in ms if m.id in want]
        if len(chosen) != len(want):
            missing = want - {m.id for m in chosen}
            raise ValueError(f"ids: unknown mutant ids {sorted(missing)}")
    elif a.all:
        chosen = [m for ms in pools.values() for m in ms]
    else:
        chosen = sample(pools, a.max_mutants, a.seed)
    for m in chosen:
        m.equivalent = match_equivalent(m)
    if a.list:
        total = sum(len(v) for v in pools.values())
        print(f"{len(chosen)} of {total} mutants (seed {a.seed})")
        for m in chosen:
            tag = "  [equivalent]" if m.equivalent else ""
            print(f"{m.id}\t{m.scope}\t{m.before}  ->  {m.after}{tag}")
        return 0
    t0 = time.perf_counter()
    base = run(root, chosen, a.jobs, a.timeout, a.tests.split(",") if a.tests else None)
    text = report(root, chosen, a, base, time.perf_counter() - t0)
    k, t, s, e, sc = score(chosen)
    print(f"score {100 * sc:.1f} % (killed {k}, timeouts {t}, survived {s}, equivalent {e})")
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(text)
        print(f"report: {a.report}")
    else:
        print(text)
    if a.min_score is not None and not (sc >= a.min_score):
        return 1
    return 0
