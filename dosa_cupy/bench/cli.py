"""``dosa bench`` command line: argument parsing and its modes.

Without a mode flag: the prefill routes (``--shapes`` / ``--sweep`` / ``--inputs``, and the
GPU-free ``--dry-run`` and ``--merge``).  A mode flag anywhere in the arguments hands the
other arguments to that mode's own ``main``: ``--decode`` (decode.py), ``--serving``
(serving.py: the serving API's calls, docs/serving.md), ``--profile-plan``
(profile_plan.py), ``--diag`` (diag.py), ``--screen-variants`` (screen_variants.py),
``--cp`` (context_parallel.py: a context split across GPUs, issue 29),
``--case NAME`` (cases.py: small runs to put under compute-sanitizer or Nsight Compute;
docs/running_on_gpu.md).  ``--dry-run`` also plans ``--serving`` and ``--cp`` without a GPU
(their arguments checked, their calls listed); the other modes have no GPU-free plan and say
so.

A bad argument is one line on stderr naming the flag, and exit code 2 (``dosa bench``, and
``python -m dosa_cupy.bench``); ``main(argv)`` called with a list raises the ValueError
(tests match its text).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# the shared command-line conventions (one-line argument errors); no GPU, no CuPy
from dosa_ref.cmdline import CommandParser, run_command

from .memplan import DEFAULT_LOGITS_GIB, GIB, estimate_seconds, floors_ms, memory_plan
from .prefill import bench_shape
from .report import load_rows, markdown, merge_rows, run_meta, utc_now, write_outputs
from .shapes import (
    DEFAULT_SHAPES,
    build_jobs,
    parse_part,
    parse_variants,
    part_index,
    rotate_of,
    shape_name,
)
from .timing import check_run_args, free, is_oom, no_gpu_exit


def _positive(name, v, lo=0.0, strict=True):
    if (v <= lo) if strict else (v < lo):
        rel = ">" if strict else ">="
        raise ValueError(f"{name}: expected a number {rel} {lo:g}, got {v!r}")
    return v


def _dry_run(a, jobs):
    print(
        f"# {len(jobs)} job(s); --logits-gib {a.logits_gib:g}; estimated times are a rough"
        " model (EST_* in memplan.py), not measurements"
    )
    total = 0.0
    for regime, tile, (H, Qn, N) in jobs:
        rot = rotate_of(a, regime)
        mem = memory_plan(H, Qn, N, a.K, a.logits_gib, rotate=rot)
        est = estimate_seconds(H, Qn, N, a.reps, rot, a.r)
        total += est
        fl = floors_ms(H, Qn, N, r=a.r)
        print(
            f"{regime} tile {tile} {shape_name(H, Qn, N)}: ~{est:.0f} s; floors ms: dense "
            f"route {fl['dense_route_floor_ms']:.1f}, fused {fl['fused_floor_ms']:.1f}, "
            f"screen {fl['screen_floor_ms']:.1f}; sub-chunks {mem['subchunk']}"
            + (f"; SKIP: {mem['skipped']}" if mem["skipped"] else "")
        )
        for n in mem["notes"]:
            print(f"#   {n}")
    print(f"# total ~{total:.0f} s (+ kernel compilation once per process)")
    if a.part is not None:
        _, p = parse_part(a.part)
        full = build_jobs(argparse.Namespace(**{**vars(a), "part": None}))
        cost = [estimate_seconds(*j[2], a.reps, a.rotate, a.r) for j in full]
        idx = part_index(cost, p)
        for k in range(p):
            n = sum(1 for x in idx if x == k)
            t = sum(c for c, x in zip(cost, idx, strict=True) if x == k)
            print(f"# part {k}/{p}: {n} job(s), ~{t:.0f} s")
    return 0


def _merge(a) -> int:
    if not a.out:
        raise ValueError("out: --merge needs --out DIR")
    missing = [f for f in a.merge if not Path(f).is_file()]
    if missing:
        raise ValueError(f"merge: no such file: {', '.join(missing)}")
    rows = merge_rows([load_rows(f) for f in a.merge])
    commits = list(dict.fromkeys(r["commit"] for r in rows if r.get("commit")))
    meta = run_meta(a.commit or (", ".join(commits) if commits else None))
    files = write_outputs(rows, Path(a.out), meta, with_plots=True)
    print(markdown(rows, meta))
    for f in files:
        print(f"# wrote {f}")
    print(f"# merged {len(rows)} row(s) from {len(a.merge)} file(s) into {a.out}")
    return 0


# mode flag → (module of this package, whether to check for a GPU before handing over; the
# decode and serving modes check their own arguments first)
MODES = {
    "--decode": ("decode", False),
    "--serving": ("serving", False),
    "--profile-plan": ("profile_plan", True),
    "--diag": ("diag", True),
    "--case": ("cases", True),
    "--screen-variants": ("screen_variants", True),
    "--cp": ("context_parallel", True),
}


def _serving_dry_run(argv: list[str]) -> int:
    """``--serving --dry-run``: the mode's arguments checked (``serving.parse_args``, which
    needs no GPU) and the calls each part would time listed; 0."""
    from . import serving as S

    a = S.parse_args(argv)
    ints = lambda xs: ", ".join(str(x) for x in xs)
    print(
        f"# --serving dry run: parts {','.join(a.parts)}; H {ints(a.heads)}; K {a.K}; "
        f"keys {a.keys}; regime {a.regime}; reps {a.reps} (small: x{S.SMALL_REPLAYS}), "
        f"warm {a.warm}, rotate {a.rotate}; no GPU used"
    )
    n = S.ragged_lengths(a.keys)
    for H in a.heads:
        if "small" in a.parts:
            print(
                f"H={H} small: Qn {ints(S.SMALL_QN)} x N {a.keys}: dosa_topk and "
                "dense_topk, check=True and check=False"
            )
        if "ragged" in a.parts:
            print(
                f"H={H} ragged: {len(n)} requests (Σ Qn {sum(S.RAGGED_QN)}, N_b {ints(n)}):"
                f" one ragged_topk call vs {len(n)} dosa_topk calls"
            )
        if "paged" in a.parts:
            print(
                f"H={H} paged: the ragged batch through paged_prefill_topk (and "
                "physical=True) vs the contiguous ragged_topk"
            )
        if "decode" in a.parts:
            bc = ", ".join(f"{B}x{c}" for B, c in S.DECODE_SHAPES)
            print(
                f"H={H} decode: B x ctx {bc}, next_n 1: DoSA eager, DoSA in a CUDA graph, "
                "the dense decode route"
            )
        if "graph" in a.parts:
            qn = [q for q in S.GRAPH_QN if q <= a.keys]
            print(
                f"H={H} graph: Qn {ints(qn)} captured (routes {', '.join(S.GRAPH_ROUTES)}) "
                "vs eager dosa_topk and dense_topk, check=False"
            )
    print(f"# would write {Path(a.out) / 'bench_serving.json'} and bench_serving.md")
    return 0


def _cp_dry_run(argv: list[str]) -> int:
    """``--cp --dry-run``: the mode's arguments checked and its plan printed; 0."""
    from . import context_parallel as C

    print(C.plan(C.parse_args(argv)))
    return 0


# the modes that can plan a run without a GPU under --dry-run (the others say so)
DRY_RUNS = {"--serving": _serving_dry_run, "--cp": _cp_dry_run}


def run_mode(flag: str, argv: list[str]) -> int:
    """Hand ``argv`` (without ``flag``) to the mode's ``main``; with ``--dry-run``, to the
    mode's plan (``DRY_RUNS``), or one line saying it has none (2)."""
    import importlib

    name, check = MODES[flag]
    rest = [x for x in argv if x != flag]
    helps = {"-h", "--help"} & set(rest)
    if "--dry-run" in rest and not helps:
        rest = [x for x in rest if x != "--dry-run"]
        if flag in DRY_RUNS:
            return DRY_RUNS[flag](rest)
        print(
            f"dosa bench {flag}: --dry-run: not available in this mode (it has no GPU-free "
            f"plan; the default mode and {', '.join(DRY_RUNS)} have one)",
            file=sys.stderr,
        )
        return 2
    if check and not helps:
        rc = no_gpu_exit(f"dosa bench {flag}")
        if rc is not None:
            return rc
    return importlib.import_module(f"{__package__}.{name}").main(rest)


def main(argv=None) -> int:
    """``dosa bench``: ``argv`` as on the command line; exit code.  None: the process's own
    command line (python -m dosa_cupy.bench), where a bad value is one line and exit code 2
    (``dosa_ref.cmdline.run_command``; ``dosa bench`` gets that from ``dosa_ref.cli.main``)."""
    if argv is None:
        return run_command("dosa bench", _main, sys.argv[1:])
    return _main(list(argv))


def _main(argv: list[str]) -> int:
    t_start = time.monotonic()
    for flag in MODES:
        if flag in argv:
            return run_mode(flag, argv)
    ap = CommandParser(
        prog="dosa bench",
        description="the dense route, torch.topk, the fused route and DoSA on the same inputs",
        epilog="modes: " + ", ".join(MODES) + " (see python -m dosa_cupy.bench.cli's doc); "
        "--dry-run plans the default mode and " + ", ".join(DRY_RUNS) + " without a GPU",
    )
    ap.add_argument("--shapes", default=None, help=f"HxQnxN,... (default {DEFAULT_SHAPES})")
    ap.add_argument("--sweep", action="store_true", help="the issue's N × Qn × H grid")
    ap.add_argument(
        "--filter",
        default=None,
        help="keep shapes whose HxQnxN contains one of these comma-separated substrings",
    )
    ap.add_argument(
        "--part",
        default=None,
        help="I/P: run the I-th (0-based) of P contiguous time-balanced slices of the job list",
    )
    ap.add_argument(
        "--max-seconds", type=float, default=None, help="start no new shape after this many seconds"
    )
    ap.add_argument(
        "--logits-gib",
        type=float,
        default=DEFAULT_LOGITS_GIB,
        help="per-route working-set budget (dense logits, DoSA bitmask + records, "
        "fused records); larger routes run over query sub-chunks",
    )
    ap.add_argument(
        "--K", type=int, default=2048, help="selection size in [1, 4096] (default 2048)"
    )
    ap.add_argument(
        "--regime",
        default="calibrated",
        help="comma list of dosa_cupy.workload or dosa_ref.workloads regimes (calibrated first)",
    )
    ap.add_argument(
        "--inputs",
        default=None,
        help="comma list of .npz / .safetensors workloads (dosa_ref.workloads.save_workload: "
        "float q, w, k, int ks, ke) instead of generated shapes; files of one shape are "
        "that job's rotated input sets",
    )
    ap.add_argument("--reps", type=int, default=10, help="timed replays, at least 10 (default)")
    ap.add_argument("--rotate", type=int, default=2, help="input sets replayed in turn (default 2)")
    ap.add_argument(
        "--r", type=int, default=14, help="retained heads (default 14: one 16-row tile)"
    )
    ap.add_argument(
        "--scorer",
        default="f16",
        choices=("f16", "fp8"),
        help="the canonical scorer of every route of the run (dosa_cupy/scorer.py; fp8: "
        "sm_90a only); default f16",
    )
    ap.add_argument("--out", default=None, help="directory for bench.json / bench.md / PNGs")
    ap.add_argument(
        "--tile", default="256", help="key tile sizes to run, e.g. 128,256 (default 256)"
    )
    ap.add_argument(
        "--serial-setup",
        action="store_true",
        help="generate the rotated input sets one after another (default: threads)",
    )
    ap.add_argument(
        "--commit",
        default=None,
        help="commit recorded in the outputs (default: "
        "$DOSA_COMMIT, else git rev-parse HEAD, else 'unknown')",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print the jobs, sub-chunks, floors and estimated times; no GPU",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:k=v,...",
        help="another DoSA route with these options, timed in the same run "
        "(e.g. cert:cert_seeds=2048; route_memo=1: one RouteMemo shared by the variant's "
        "calls; graph=1: its calls replay captured steps, capture.StepGraphs); repeatable",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="also time the DoSA call and every variant without a memo in turn, one call of "
        "each per replay (twice --reps replays): the comparison of builds under trial that "
        "no drift between blocks of replays can tilt",
    )
    ap.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time DeepGEMM (+ torch.topk / own select / FlashInfer) on the same inputs "
        "(default: when deep_gemm / flashinfer are importable; peers.py)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="merge bench.json files of several parts into --out (no GPU)",
    )
    a = ap.parse_args(argv)
    if a.merge:
        return _merge(a)
    variants = parse_variants(a.variant)
    check_run_args(a.reps, a.rotate, a.K)
    _positive("logits-gib", a.logits_gib)
    if a.max_seconds is not None:
        _positive("max-seconds", a.max_seconds, strict=False)
    if "calibrated" in a.regime.split(",") and not a.inputs:
        try:
            import dosa_ref.workloads  # noqa: F401
        except ImportError:
            print("# dosa_ref.workloads unavailable: regime 'structured' instead of 'calibrated'")
            a.regime = a.regime.replace("calibrated", "structured")
    jobs = build_jobs(a)
    if a.dry_run:
        return _dry_run(a, jobs)
    if not jobs:
        print("# no shape selected (check --filter / --part)")
    rc = no_gpu_exit("dosa bench")
    if rc is not None:
        return rc
    import cupy as cp

    from dosa_cupy._build import set_tile

    from .peers import discover

    peers = discover(a.peers)
    for note in peers.notes if peers else ():
        print(f"# peers: {note}", flush=True)
    dev_gib = cp.cuda.Device().mem_info[1] / GIB
    meta = run_meta(a.commit)
    rows, bad = [], []
    for n, (regime, tile, (H, Qn, N)) in enumerate(jobs):
        elapsed = time.monotonic() - t_start
        if a.max_seconds is not None and elapsed >= a.max_seconds:
            rest = ",".join(shape_name(*j[2]) for j in jobs[n:])
            print(
                f"# --max-seconds {a.max_seconds:g}: stopped after {elapsed:.0f} s; not run "
                f"({len(jobs) - n}): {rest}",
                flush=True,
            )
            break
        set_tile(tile)
        sh = shape_name(H, Qn, N)
        rot = rotate_of(a, regime)
        mem = memory_plan(H, Qn, N, a.K, a.logits_gib, rotate=rot, device_gib=dev_gib)
        for note in mem["notes"]:
            print(f"# {regime} {sh}: {note}", flush=True)
        t0 = time.time()
        base = dict(H=H, Qn=Qn, N=N, K=a.K, regime=regime, r=a.r, tile=tile)
        row, oom = None, None
        if mem["skipped"]:
            row = dict(base, skipped=mem["skipped"])
        else:
            try:
                row = bench_shape(
                    H, Qn, N, a.K, regime, a.reps, rot, {"r": a.r, "scorer": a.scorer}, print,
                    mem=mem,
                    parallel_setup=not a.serial_setup, variants=variants,
                    inputs=(getattr(a, "input_groups", None) or {}).get(regime), peers=peers,
                    paired=getattr(a, "paired", False),
                )  # fmt: skip
                row["tile"] = tile
            except Exception as e:
                if not is_oom(e):
                    raise
                oom = f"out of memory: {str(e)[:200]}"
        if oom:
            # after the except block: its traceback held the shape's device arrays
            row = dict(base, skipped=oom)
            free(cp)
        row.update(date_utc=utc_now(), commit=meta["commit"])
        if "skipped" in row:
            print(f"# SKIPPED {regime} {sh}: {row['skipped']}", flush=True)
        elif not row["ids_equal"]:
            bad.append(f"{regime} {sh} tile {tile}")
            print(f"# IDS MISMATCH {regime} {sh} tile {tile}", flush=True)
        rows.append(row)
        if a.out:
            write_outputs(rows, Path(a.out), meta)
        print(
            f"# {regime} {sh} tile={tile} done in {time.time() - t0:.1f}s "
            f"(elapsed {time.monotonic() - t_start:.0f} s)",
            flush=True,
        )
    md = markdown(rows, meta)
    print(md)
    if a.out:
        for f in write_outputs(rows, Path(a.out), meta, with_plots=True):
            print(f"# wrote {f}")
    if bad:
        print(f"# ids differ between routes: {'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0
