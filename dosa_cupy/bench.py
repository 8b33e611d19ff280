"""``dosa bench``: the dense route, torch.topk, the fused route and DoSA on the same inputs
in one run (issue 5).  CUDA events, warm-up, medians over ≥ 10 replays, inputs rotated
between replays, ids cross-checked on every shape (DoSA == fused == dense bitwise;
torch.topk tie-agnostic: the same K values in the same order), JSON + markdown + PNG.

    python -m dosa_cupy.bench --shapes 32x4096x131072,64x4096x131072 --out DIR
    python -m dosa_cupy.bench --sweep --part 0/4 --max-seconds 420 --out DIR
    python -m dosa_cupy.bench --sweep --part 0/4 --dry-run          (plan only, no GPU)
    python -m dosa_cupy.bench --merge A/bench.json B/bench.json --out DIR   (no GPU)

Shapes are HxQnxN: a causal prefill chunk of the last Qn positions of an N-key context,
H heads, D = 128.  ``--regime`` takes a comma list (calibrated first by default).
``--inputs a.npz,b.safetensors,…`` runs workload files instead (``dosa_ref.workloads.
save_workload``: float q, w, k and ranges ks, ke, quantized on the GPU like the generated
regimes); files of one shape are that job's rotated input sets (the row's ``rotate``).

Sweep (``--sweep``, the issue's grid): N ∈ {128K, 256K, 512K, 768K, 1M} × Qn ∈ {4K, 8K,
16K, 32K} × H ∈ {32, 64}, only Qn ≤ N, most important first: Qn ascending, then N
descending, then H — so Qn=4096 at 1M (H=32, H=64) run first.  ``--filter`` keeps shapes
whose HxQnxN contains one of its comma-separated substrings.  ``--part I/P`` (0 ≤ I < P)
then cuts the filtered job list into P *contiguous* slices of about equal estimated time
(``estimate_seconds``; each job goes to the part holding the midpoint of its time in the
cumulative sum): part 0 holds the most important shapes, and each part is short enough for
one device call when P is chosen with ``--dry-run``.  ``--max-seconds S`` starts no new
shape once S seconds have passed since start-up; bench.json and bench.md are rewritten
after every finished shape, so a killed run keeps what it finished.

Memory: a route whose working set (``memory_plan``; dense logits Qn·N·4 bytes, DoSA bitmask
Qn·N/8 + records Qn·buffer·8 + seed records + plan temporaries, fused records) exceeds
``--logits-gib`` (default 40 GiB) runs over query sub-chunks of the largest power-of-two
size that fits, all sub-chunks between the same two events; rows record the sub-chunk
sizes, and ids are compared over the concatenated sub-chunks.  A shape that cannot fit is
skipped with a printed reason and a row {"skipped": reason}.

Floors (recorded per row, printed as "×floor" = measured time / floor): see ``floors_ms``.
Outputs in --out: bench.json, bench.md, and at most four PNGs (speedup.png heatmaps per H
like the paper's Fig. 4, survival.png per-query survival CDFs, stages.png DoSA time by
stage, floors.png time as a multiple of each route's floor).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# H200 ceilings measured in /work/shared/NUMERICS.md ("Measured on an H200", 2026-11-30):
# fp8 GEMM (torch._scaled_mm, 8192³) 1455 TFLOP/s bounds any MMA pass; the device-to-device
# copy 4.24 TB/s bounds any pass that must write or read the fp32 logits.
FP8_PEAK = 1455e12  # FLOP/s
HBM = 4.24e12  # bytes/s
D = 128  # head dimension of the kernels
KEY_BYTES = D + 4  # e4m3 payload + fp32 scale per key
SCREEN_TILE = 16  # MMA rows per screening tile (r retained heads + 2 aux rows, pipeline.py)
GIB = 1 << 30

CONTEXTS = (131072, 262144, 524288, 786432, 1048576)
CHUNKS = (4096, 8192, 16384, 32768)
HEADS = (32, 64)
DEFAULT_SHAPES = "32x4096x131072,64x4096x131072"
DEFAULT_LOGITS_GIB = 40.0
WARM = 2
DOSA_STAGES = ("prepare", "seeds", "plan", "screen", "refine", "select", "recover")
FUSED_STAGES = ("seeds", "score+filter", "select", "recover")
ROUTES = ("logits", "select", "torch_topk", "dense_route", "fused", "dosa")
SPEED_TICKS = (0.25, 0.5, 1.0, 2.0, 4.0)
ROUTE_LABEL = {
    "logits": "logits",
    "select": "own select",
    "torch_topk": "torch.topk",
    "dense_route": "dense route",
    "fused": "fused",
    "dosa": "DoSA",
}

# Time model for balancing parts and --dry-run only (not a measurement): each route as a
# multiple of its floor, from the v6 calibrated run (docs/records/benchmarks.md, Qn=4096,
# N=1M: logits
# 3.6-4.0×, own select 7×, torch.topk 13× the one-read floor, fused 4×, DoSA ≈ 4× the
# screen floor + 0.3 of the dense MMA floor), and host workload generation per key and per
# query·head (dosa_ref.workloads on the CPU: ~9 s per 1M keys, ~7 µs per query·head).
EST_X = {"logits": 4.0, "select": 7.0, "torch_topk": 13.0, "fused": 4.0, "screen": 4.0}
EST_REFINE = 0.3
EST_HOST_KEY_S = 9e-6
EST_HOST_QH_S = 7e-6
# build_plans keeps about this many float64 [Hp, D] temporaries per query alive at its peak
# (qf, qjs, d, the where/product temporaries; plan.py) — an estimate, not a bound.
PLAN_F64_TEMPS = 8


# --------------------------------------------------------------------------- pure helpers


def shape_name(H: int, Qn: int, N: int) -> str:
    return f"{H}x{Qn}x{N}"


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """ "HxQnxN,..." → [(H, Qn, N)] (ValueError naming ``shapes`` on bad input)."""
    out = []
    for sh in spec.split(","):
        sh = sh.strip()
        if not sh:
            continue
        parts = sh.split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shapes: expected HxQnxN, got {sh!r}")
        H, Qn, N = (int(p) for p in parts)
        if not (1 <= H <= 64 and 1 <= Qn <= N):
            raise ValueError(f"shapes: need 1 <= H <= 64 and 1 <= Qn <= N, got {sh!r}")
        out.append((H, Qn, N))
    if not out:
        raise ValueError(f"shapes: no shape in {spec!r}")
    return out


def sweep_shapes() -> list[tuple[int, int, int]]:
    """The issue's grid, most important first: Qn ascending, N descending, H ascending."""
    grid = [(H, Qn, N) for H in HEADS for Qn in CHUNKS for N in CONTEXTS if Qn <= N]
    return sorted(grid, key=lambda s: (s[1], -s[2], s[0]))


def filter_shapes(shapes, filt: str | None):
    """Shapes whose HxQnxN contains one of the comma-separated substrings of ``filt``."""
    if not filt:
        return list(shapes)
    keys = [f.strip() for f in filt.split(",") if f.strip()]
    return [s for s in shapes if any(k in shape_name(*s) for k in keys)]


def parse_part(spec: str | None) -> tuple[int, int]:
    """ "I/P" → (I, P) with 0 ≤ I < P; None → (0, 1)."""
    if spec is None:
        return 0, 1
    parts = str(spec).split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"part: expected I/P with integers 0 <= I < P, got {spec!r}")
    i, p = int(parts[0]), int(parts[1])
    if not 0 <= i < p:
        raise ValueError(f"part: expected I/P with 0 <= I < P, got {spec!r}")
    return i, p


def part_index(costs, parts: int) -> list[int]:
    """Contiguous, time-balanced split: item j goes to the part holding the midpoint of its
    cost in the cumulative sum (non-decreasing in j, so each part is a contiguous slice)."""
    total = float(sum(costs))
    if total <= 0:
        return [min(parts - 1, j * parts // max(1, len(costs))) for j in range(len(costs))]
    out, cum = [], 0.0
    for c in costs:
        out.append(min(parts - 1, int(parts * (cum + 0.5 * c) / total)))
        cum += c
    return out


def select_part(items, part: int, parts: int, cost) -> list:
    """The items of part ``part`` of ``parts`` (``part_index`` over ``cost(item)``)."""
    idx = part_index([cost(x) for x in items], parts)
    return [x for x, k in zip(items, idx, strict=True) if k == part]


def causal_pairs(Qn: int, N: int) -> float:
    """Visible (query, key) pairs of a causal chunk: query t sees N − Qn + t + 1 keys."""
    return float(Qn) * (N - Qn) + Qn * (Qn + 1) / 2.0


def screen_rows(r: int) -> int:
    """MMA rows the screen runs per query: one 16-row tile for r ≤ 14, two beyond
    (``mts`` in pipeline.dosa_topk: r retained rows + 2 aux rows per tile)."""
    return SCREEN_TILE * (1 if r <= 14 else 2)


def floors_ms(H, Qn, N, pairs=None, survival=None, r: int = 14) -> dict:
    """Physical floors (ms) of each route on one H200 (docs/numerics.md ceilings).

    logits: max(MMA 2·H·D·pairs / FP8_PEAK, write the logits + read the keys / HBM);
    own select and torch.topk: one read of the logits (Qn·N·4 / HBM);
    dense route: logits floor + one read of the logits;
    fused: the dense MMA floor (every visible pair scored with all heads, no logits);
    DoSA: the screen's MMA floor (2·16·D·pairs, one tile of screening rows) + survival × the
    dense MMA floor (refinement of survivors); only when ``survival`` is given.
    """
    pairs = causal_pairs(Qn, N) if pairs is None else float(pairs)

    def mma(rows):
        return 2.0 * rows * D * pairs / FP8_PEAK * 1e3

    logits_bytes = float(Qn) * N * 4
    logits = max(mma(H), (logits_bytes + N * KEY_BYTES) / HBM * 1e3)
    read = logits_bytes / HBM * 1e3
    out = {
        "logits_floor_ms": logits,
        "select_floor_ms": read,
        "torch_topk_floor_ms": read,
        "dense_route_floor_ms": logits + read,
        "fused_floor_ms": mma(H),
        "screen_floor_ms": mma(screen_rows(r)),
    }
    if survival is not None:
        out["dosa_floor_ms"] = out["screen_floor_ms"] + float(survival) * mma(H)
    return out


def largest_pow2_subchunk(Qn: int, bytes_per_query: float, budget: float) -> int:
    """Qn if Qn queries fit in ``budget`` bytes, else the largest power of two < Qn that
    fits, else 0 (one query does not fit)."""
    if Qn * bytes_per_query <= budget:
        return int(Qn)
    s = 1 << max(0, (int(Qn) - 1).bit_length() - 1)  # largest power of two < Qn (Qn ≥ 2)
    while s >= 1 and s * bytes_per_query > budget:
        s //= 2
    return int(s) if s >= 1 and s < Qn else 0


def memory_plan(
    H,
    Qn,
    N,
    K=2048,
    budget_gib=DEFAULT_LOGITS_GIB,
    buffer=65536,
    window=2048,
    sinks=16,
    n_anchors=4,
    rotate=2,
    device_gib=None,
) -> dict:
    """Working set per query of each route and the query sub-chunk each one runs with.

    Returns {"subchunk": {route: queries}, "bytes_per_query": {...}, "inputs_gib",
    "notes": [why a route is sub-chunked], "skipped": reason or None}.  Routes: dense
    (fp32 logits row, N·4; torch.topk reads the same rows), dosa (survivor bitmask N/8,
    compact records buffer·8, seed records (sinks + window + n_anchors·K)·8, plan
    temporaries), dosa_stats (dosa + the survivor popcount of return_stats: one uint8
    per bitmask byte, N/8 bytes; refine_stream.popcount_rows), fused (records + seed
    records).  Not counted: the exact extension of an overflowing refine (sized by the
    largest count, unknown in advance) and query-level recovery (dense route over ≤ 8 GiB
    chunks) — both caught at run time.
    """
    budget = float(budget_gib) * GIB
    Hp = -(-int(H) // 16) * 16
    seed_rec = (sinks + window + n_anchors * K) * 8
    nw_bytes = -(-int(N) // 32) * 4
    plan_b = PLAN_F64_TEMPS * Hp * D * 8
    bpq = {
        "dense": int(N) * 4,
        "dosa": nw_bytes + buffer * 8 + seed_rec + plan_b,
        "dosa_stats": nw_bytes + nw_bytes + buffer * 8 + seed_rec + plan_b,
        "fused": buffer * 8 + seed_rec,
    }
    # rotated input sets: e4m3 queries (+ padded copy), fp32 weights, keys, ranges
    inputs = rotate * (Qn * (Hp + H) * D + Qn * (Hp + H) * 4 + N * KEY_BYTES + Qn * 8)
    out = {
        "budget_gib": float(budget_gib),
        "bytes_per_query": bpq,
        "inputs_gib": inputs / GIB,
        "subchunk": {},
        "notes": [],
        "skipped": None,
    }
    for route, b in bpq.items():
        sub = largest_pow2_subchunk(int(Qn), b, budget)
        out["subchunk"][route] = sub
        if sub == 0:
            out["skipped"] = (
                f"{route}: one query needs {b / 2**20:.2f} MiB > budget {budget_gib:g} GiB"
            )
        elif sub < Qn:
            out["notes"].append(
                f"{route}: {Qn} queries × {b / 2**20:.2f} MiB = {Qn * b / GIB:.1f} GiB > "
                f"budget {budget_gib:g} GiB → {-(-Qn // sub)} sub-chunks of {sub} queries"
            )
    if out["skipped"] is None and device_gib is not None:
        peak = inputs + max(min(Qn, s) * bpq[k] for k, s in out["subchunk"].items())
        if peak > float(device_gib) * GIB:
            out["skipped"] = (
                f"inputs {inputs / GIB:.1f} GiB + largest route working set exceed the "
                f"device's {device_gib:.0f} GiB"
            )
    return out


def estimate_seconds(H, Qn, N, reps=10, rotate=2, r=14) -> float:
    """Rough wall time of one shape (EST_* model above); for part balancing and --dry-run."""
    f = floors_ms(H, Qn, N, r=r)
    mma_h = f["fused_floor_ms"]
    logits = EST_X["logits"] * f["logits_floor_ms"]
    select = EST_X["select"] * f["select_floor_ms"]
    torch_topk = EST_X["torch_topk"] * f["select_floor_ms"]
    fused = EST_X["fused"] * mma_h
    dosa = EST_X["screen"] * f["screen_floor_ms"] + EST_REFINE * mma_h
    per_replay = logits + select + torch_topk + (logits + select) + fused + dosa
    # timed replays + warm-ups, then one untimed pass of each for the ids and the stats
    gpu_ms = (reps + WARM + 1) * per_replay
    # rotated sets are generated in threads: two took ~1.5× one set on 2 CPU cores
    host = (1 + 0.5 * (rotate - 1)) * (EST_HOST_KEY_S * N + EST_HOST_QH_S * Qn * H)
    return gpu_ms / 1e3 + host


def x_floor(row) -> dict:
    """Measured time / floor per route (None where either is missing)."""
    fl = row_floors(row)
    out = {}
    for k in ROUTES:
        t, f = row.get(f"{k}_ms"), fl.get(f"{k}_floor_ms")
        out[k] = (t / f) if (t is not None and f) else None
    return out


def row_floors(row) -> dict:
    """Floors stored in the row, or computed from it (rows of older runs lack some)."""
    sv = row.get("survival_pooled", row.get("survival_mean"))
    fl = floors_ms(
        row["H"], row["Qn"], row["N"], row.get("visible_pairs"), sv, int(row.get("r", 14))
    )
    fl.update({k: v for k, v in row.items() if k.endswith("_floor_ms") and v is not None})
    return fl


def git_commit(cwd=None) -> str:
    """``git rev-parse HEAD`` (+ "+dirty" with uncommitted tracked changes), or None."""
    try:
        kw = dict(cwd=cwd or Path(__file__).resolve().parent, capture_output=True, text=True)
        h = subprocess.run(["git", "rev-parse", "HEAD"], timeout=10, **kw)
        if h.returncode != 0:
            return None
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **kw)
        return h.stdout.strip() + ("+dirty" if d.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_meta(commit=None) -> dict:
    """Date (UTC) and commit: ``commit`` > $DOSA_COMMIT > git > "unknown" (the device copy
    of the tree has no .git, so pass --commit there)."""
    c = commit or os.environ.get("DOSA_COMMIT") or git_commit() or "unknown"
    return {"date_utc": _utc_now(), "commit": c}


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _f(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def _sort_key(r):
    return (str(r.get("regime", "")), int(r.get("tile", 0)), r["H"], r["Qn"], r["N"])


def parse_variants(specs) -> dict[str, dict]:
    """``--variant NAME:key=value[,key=value]`` (repeatable) → {NAME: DoSA options}.

    Each variant is one more DoSA route timed in the same run on the same inputs (e.g.
    ``cert:cert_seeds=2048``); values are ints where they parse as ints, else strings.
    ValueError naming ``--variant`` for a malformed spec or a repeated name.
    """
    out: dict[str, dict] = {}
    for spec in specs or ():
        name, sep, body = spec.partition(":")
        if not sep or not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"--variant: expected NAME:key=value[,key=value], got {spec!r}")
        if name in out:
            raise ValueError(f"--variant: the name {name!r} is given twice")
        opts = {}
        for kv in filter(None, body.split(",")):
            k, eq, v = kv.partition("=")
            if not eq or not k:
                raise ValueError(f"--variant: expected key=value in {spec!r}, got {kv!r}")
            opts[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
        out[name] = opts
    return out


def ids_equal(r) -> bool | None:
    """All routes returned identical ids (torch.topk: same values) for this row."""
    if "skipped" in r:
        return None
    checks = [r.get("dosa_ids_equal_dense"), r.get("fused_ids_equal_dense")]
    checks += [v.get("ids_equal_dense") for v in (r.get("variants") or {}).values()]
    if r.get("torch_topk_ms") is not None:
        checks.append(r.get("torch_values_equal", r.get("torch_kth_match")))
    return all(bool(c) for c in checks if c is not None)


def markdown(rows, meta=None) -> str:
    """bench.md: header (date, commit), routes with ×floor, floors, stages, survival."""
    if meta is None:
        commits = list(dict.fromkeys(r["commit"] for r in rows if r.get("commit")))
        meta = run_meta(", ".join(commits) if commits else None)
    done = sorted((r for r in rows if "skipped" not in r), key=_sort_key)
    skipped = sorted((r for r in rows if "skipped" in r), key=_sort_key)
    dates = sorted(r["date_utc"] for r in rows if r.get("date_utc"))
    reps = sorted({r["reps"] for r in done if r.get("reps")})
    devices = sorted({r["device"] for r in done if r.get("device")})
    out = [
        "# dosa bench (causal prefill)\n\n",
        f"Date (UTC): {meta['date_utc']}"
        + (f" (shapes finished {dates[0]} … {dates[-1]})" if dates else "")
        + f"; commit: {meta['commit']}"
        + (f"; device: {', '.join(devices)}" if devices else "")
        + ".\n\n",
        f"D=128; medians of {'/'.join(map(str, reps)) or '≥10'} replays after {WARM} "
        "warm-ups, rotated input sets, CUDA events.  ×fl = time / the route's floor "
        f"(fp8 MMA {FP8_PEAK / 1e12:.0f} TFLOP/s, HBM {HBM / 1e12:.2f} TB/s; docs/numerics.md; "
        "DoSA's floor uses the pooled survival).  sub = query sub-chunk of the dense route "
        "(− = whole chunk); a sub-chunked route is timed over all its sub-chunks, and own "
        "select / torch.topk then add up per-sub-chunk medians.  ids equal: DoSA == fused "
        "== dense bitwise, torch.topk the same values.\n\n",
    ]
    cols = (
        "regime | tile | H | Qn | N | K | logits ms | ×fl | TFLOP/s | select ms | ×fl "
        "| torch.topk ms | ×fl | dense route ms | ×fl | fused ms | ×fl | DoSA ms | ×fl "
        "| vs dense | vs fused | survival | sub | ids equal"
    )
    n = cols.count("|") + 1
    out.append(f"| {cols} |\n|" + "---|" * n + "\n")
    for r in done:
        x = x_floor(r)
        sub = r.get("dense_subchunk")
        out.append(
            f"| {r.get('regime', '-')} | {r.get('tile', '-')} | {r['H']} | {r['Qn']} | "
            f"{r['N']} | {r.get('K', '-')} | {_f(r.get('logits_ms'))} | "
            f"{_f(x['logits'], '{:.1f}')} | {_f(r.get('logits_tflops'), '{:.0f}')} | "
            f"{_f(r.get('select_ms'))} | {_f(x['select'], '{:.1f}')} | "
            f"{_f(r.get('torch_topk_ms'))} | {_f(x['torch_topk'], '{:.1f}')} | "
            f"{_f(r.get('dense_route_ms'))} | {_f(x['dense_route'], '{:.1f}')} | "
            f"{_f(r.get('fused_ms'))} | {_f(x['fused'], '{:.1f}')} | "
            f"{_f(r.get('dosa_ms'))} | {_f(x['dosa'], '{:.1f}')} | "
            f"{_f(r.get('speedup_vs_dense'), '{:.2f}×')} | "
            f"{_f(r.get('speedup_vs_fused'), '{:.2f}×')} | "
            f"{_f(r.get('survival_pooled', r.get('survival_mean')), '{:.4f}')} | "
            f"{'-' if sub is None or sub >= r['Qn'] else sub} | {ids_equal(r)} |\n"
        )
    if any(r.get("variants") for r in done):
        out.append(
            "\nDoSA variants (same run, same inputs; `--variant`):\n\n| regime | H | Qn | N "
            "| variant | options | DoSA ms | vs base DoSA | vs dense | vs fused | survival "
            "| ids equal |\n|" + "---|" * 12 + "\n"
        )
        for r in done:
            for name, v in (r.get("variants") or {}).items():
                opts = ",".join(f"{k}={val}" for k, val in v.get("options", {}).items())
                rel = r["dosa_ms"] / v["ms"] if r.get("dosa_ms") and v.get("ms") else None
                out.append(
                    f"| {r.get('regime', '-')} | {r['H']} | {r['Qn']} | {r['N']} | {name} | "
                    f"{opts} | {_f(v.get('ms'))} | {_f(rel, '{:.2f}×')} | "
                    f"{_f(v.get('speedup_vs_dense'), '{:.2f}×')} | "
                    f"{_f(v.get('speedup_vs_fused'), '{:.2f}×')} | "
                    f"{_f(v.get('survival_pooled'), '{:.4f}')} | "
                    f"{v.get('ids_equal_dense', 'error: ' + v.get('error', '?'))} |\n"
                )
    if done:
        out.append(
            "\nFloors (ms):\n\n| regime | H | Qn | N | logits | select (one read) | "
            "dense route | fused (MMA) | screen (MMA) | DoSA |\n|" + "---|" * 10 + "\n"
        )
        for r in done:
            fl = row_floors(r)
            out.append(
                f"| {r.get('regime', '-')} | {r['H']} | {r['Qn']} | {r['N']} | "
                + " | ".join(
                    _f(fl.get(k))
                    for k in (
                        "logits_floor_ms",
                        "select_floor_ms",
                        "dense_route_floor_ms",
                        "fused_floor_ms",
                        "screen_floor_ms",
                        "dosa_floor_ms",
                    )
                )
                + " |\n"
            )
        out.append(
            "\nStage split (ms; a timing run synchronized per stage, sub-chunks summed):\n\n"
            "| regime | tile | H | Qn | N | DoSA: "
            + " | ".join(DOSA_STAGES)
            + " | fused: "
            + " | ".join(FUSED_STAGES)
            + " |\n|"
            + "---|" * (5 + len(DOSA_STAGES) + len(FUSED_STAGES))
            + "\n"
        )
        for r in done:
            ds, fs = r.get("dosa_stage_ms") or {}, r.get("fused_stage_ms") or {}
            out.append(
                f"| {r.get('regime', '-')} | {r.get('tile', '-')} | {r['H']} | {r['Qn']} | "
                f"{r['N']} | "
                + " | ".join(_f(ds.get(s)) for s in DOSA_STAGES)
                + " | "
                + " | ".join(_f(fs.get(s)) for s in FUSED_STAGES)
                + " |\n"
            )
        out.append(
            "\nSurvival per query (survivors / screened keys; pooled = Σ survivors / "
            "Σ screened):\n\n| regime | H | Qn | N | pooled | mean | p10 | p50 | p90 | max "
            "| overflowed | recovered |\n|" + "---|" * 12 + "\n"
        )
        for r in done:
            qs = r.get("survival_quantiles")

            def q(p, qs=qs):
                return None if not qs else qs[round(p * (len(qs) - 1))]

            out.append(
                f"| {r.get('regime', '-')} | {r['H']} | {r['Qn']} | {r['N']} | "
                f"{_f(r.get('survival_pooled'), '{:.4f}')} | "
                f"{_f(r.get('survival_mean'), '{:.4f}')} | {_f(q(0.1), '{:.4f}')} | "
                f"{_f(q(0.5), '{:.4f}')} | "
                f"{_f(q(0.9) if qs else r.get('survival_p90'), '{:.4f}')} | "
                f"{_f(q(1.0), '{:.4f}')} | {r.get('overflowed', '-')} | "
                f"{r.get('recovered', '-')} |\n"
            )
    subbed = [r for r in done if r.get("memory_notes")]
    if subbed:
        out.append("\nSub-chunked routes (working set over --logits-gib):\n\n")
        for r in subbed:
            out.append(
                f"- {r.get('regime', '-')} {shape_name(r['H'], r['Qn'], r['N'])}: "
                + "; ".join(r["memory_notes"])
                + "\n"
            )
    if skipped:
        out.append("\nSkipped:\n\n")
        for r in skipped:
            out.append(
                f"- {r.get('regime', '-')} tile {r.get('tile', '-')} "
                f"{shape_name(r['H'], r['Qn'], r['N'])}: {r['skipped']}\n"
            )
    return "".join(out)


def merge_rows(row_lists) -> list:
    """Rows of several partial runs, one per (regime, tile, H, Qn, N, K, r): a finished row
    replaces a skipped one, and a later file replaces an earlier one."""
    merged = {}
    for rows in row_lists:
        for r in rows:
            k = (
                r.get("regime"),
                r.get("tile"),
                r["H"],
                r["Qn"],
                r["N"],
                r.get("K"),
                r.get("r"),
            )
            old = merged.get(k)
            if old is None or "skipped" in old or "skipped" not in r:
                merged[k] = r
    return sorted(merged.values(), key=_sort_key)


def load_rows(path) -> list:
    """Rows of a bench.json (a list of rows, or {"rows": [...]})."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "H" in r for r in rows):
        raise ValueError(f"merge: {path} is not a bench.json (list of rows)")
    return rows


def _short_n(n):
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"


def _label(r, tiles, regimes):
    s = f"H{r['H']} Q{_short_n(r['Qn'])} N{_short_n(r['N'])}"
    if len(tiles) > 1:
        s += f" t{r.get('tile', '-')}"
    if len(regimes) > 1:
        s += f" {r.get('regime', '-')}"
    return s


def plots(rows, out: Path) -> list[Path]:
    """PNG plots (matplotlib with the Agg backend, if installed; [] otherwise), at most 4:
    speedup.png (DoSA speedup heatmaps over context × chunk per (regime, tile, H), vs the
    dense route and vs the fused route, like the paper's Fig. 4), survival.png (per-query
    survival CDF per (regime, H) and pooled survival vs N), stages.png (DoSA time by stage,
    absolute and as a fraction), floors.png (each route's time / its floor)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError:
        print("# matplotlib not installed: no plots (pip install matplotlib)")
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    done = sorted((r for r in rows if "skipped" not in r), key=_sort_key)
    tiles = sorted({r.get("tile", 0) for r in rows})
    regimes = list(dict.fromkeys(r.get("regime", "-") for r in sorted(rows, key=_sort_key)))

    # 1. speedup heatmaps: one row of two panels per (regime, tile, H)
    groups = sorted({(r.get("regime", "-"), r.get("tile", 0), r["H"]) for r in rows})
    if groups:
        fig, axes = plt.subplots(
            len(groups), 2, figsize=(11, 3.4 * len(groups) + 0.4), squeeze=False
        )
        norm = LogNorm(vmin=0.25, vmax=4.0)  # centred on 1× on a log scale
        im = None
        for gi, (regime, tile, H) in enumerate(groups):
            rs = [
                r
                for r in rows
                if (r.get("regime", "-"), r.get("tile", 0), r["H"]) == (regime, tile, H)
            ]
            Ns = sorted({r["N"] for r in rs})
            Qs = sorted({r["Qn"] for r in rs})
            for ax, key, title in (
                (axes[gi][0], "speedup_vs_dense", "DoSA speedup vs dense route"),
                (axes[gi][1], "speedup_vs_fused", "DoSA speedup vs fused route"),
            ):
                grid = np.full((len(Qs), len(Ns)), np.nan)
                skip = np.zeros((len(Qs), len(Ns)), dtype=bool)
                for r in rs:
                    i, j = Qs.index(r["Qn"]), Ns.index(r["N"])
                    if "skipped" in r:
                        skip[i, j] = True
                    elif r.get(key) is not None:
                        grid[i, j] = r[key]
                im = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", norm=norm, origin="lower")
                for i in range(len(Qs)):
                    for j in range(len(Ns)):
                        if np.isfinite(grid[i, j]):
                            txt, c = f"{grid[i, j]:.2f}×", "black"
                        else:
                            txt, c = ("skip" if skip[i, j] else ""), "gray"
                        ax.text(j, i, txt, ha="center", va="center", fontsize=8, color=c)
                ax.set_xticks(range(len(Ns)), [_short_n(n) for n in Ns])
                ax.set_yticks(range(len(Qs)), [_short_n(q) for q in Qs])
                ax.set_xlabel("context N (keys)")
                ax.set_ylabel("query chunk Qn")
                ax.set_title(f"{title}\nH={H}, {regime}, tile {tile}", fontsize=9)
        fig.tight_layout()
        if im is not None:
            cb = fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, label="speedup")
            cb.set_ticks(SPEED_TICKS, labels=[f"{t:g}×" for t in SPEED_TICKS])
            cb.minorticks_off()
        files.append(_save(fig, out / "speedup.png", plt))

    if not done:
        return files

    # 2. survival: per-query CDF per (regime, H), then pooled survival vs N
    sgroups = sorted({(r.get("regime", "-"), r["H"]) for r in done})
    first_tile = {}
    for r in done:  # survival does not depend on the key tile: one row per shape
        first_tile.setdefault((r.get("regime", "-"), r["H"], r["Qn"], r["N"]), r)
    srows = list(first_tile.values())
    fig, axes = plt.subplots(1, len(sgroups) + 1, figsize=(4.2 * (len(sgroups) + 1), 3.8))
    axes = np.atleast_1d(axes)
    cmap = plt.get_cmap("viridis")
    Nall = sorted({r["N"] for r in srows})
    Qall = sorted({r["Qn"] for r in srows})
    styles = ["-", "--", "-.", ":"]
    for ax, (regime, H) in zip(axes, sgroups, strict=False):
        for r in srows:
            qs = r.get("survival_quantiles")
            if (r.get("regime", "-"), r["H"]) != (regime, H) or not qs:
                continue
            c = cmap(Nall.index(r["N"]) / max(1, len(Nall) - 1))
            ls = styles[Qall.index(r["Qn"]) % len(styles)]
            ax.plot(qs, np.linspace(0, 1, len(qs)), ls, color=c, lw=1.2)
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("survival of a query (survivors / screened)")
        ax.set_ylabel("fraction of queries")
        ax.set_title(f"per-query survival CDF, H={H}, {regime}", fontsize=9)
        ax.grid(alpha=0.3)
        if ax.lines:  # colour = context N, line style = chunk Qn
            from matplotlib.lines import Line2D

            hs = [
                Line2D([], [], color=cmap(i / max(1, len(Nall) - 1)), label=f"N {_short_n(n)}")
                for i, n in enumerate(Nall)
            ] + [
                Line2D([], [], ls=styles[i % len(styles)], color="k", label=f"Qn {_short_n(q)}")
                for i, q in enumerate(Qall)
            ]
            ax.legend(handles=hs, fontsize=6, ncol=2, loc="lower right")
    ax = axes[-1]
    for regime, H in sgroups:
        for qi, Qn in enumerate(Qall):
            rs = sorted(
                (r for r in srows if (r.get("regime", "-"), r["H"], r["Qn"]) == (regime, H, Qn)),
                key=lambda r: r["N"],
            )
            if rs:
                ax.plot(
                    [r["N"] for r in rs],
                    [r.get("survival_pooled", r.get("survival_mean")) for r in rs],
                    styles[qi % len(styles)],
                    marker="o",
                    ms=3,
                    label=f"{regime} H={H} Qn={_short_n(Qn)}",
                )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context N (keys)")
    ax.set_ylabel("pooled survival")
    ax.set_title("survival per regime and shape", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)
    fig.tight_layout()
    files.append(_save(fig, out / "survival.png", plt))

    # 3. time per route (log scale) and DoSA's split by stage (fraction, total in ms)
    labels = [_label(r, tiles, regimes) for r in done]
    y = np.arange(len(done))
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.3 * len(done) + 1.8), squeeze=False)
    a0, a1 = axes[0]
    for key, mk, name in (
        ("dosa_ms", "o", "DoSA"),
        ("dense_route_ms", "|", "dense route (logits + own select)"),
        ("fused_ms", "x", "fused"),
        ("dense_torch_ms", "+", "logits + torch.topk"),
    ):
        v = [r.get(key) for r in done]
        if any(t is not None for t in v):
            a0.plot([np.nan if t is None else t for t in v], y, mk, ms=7, label=name)
    a0.set_yticks(y, labels, fontsize=7)
    a0.set_xscale("log")
    a0.set_xlabel("ms (log scale)")
    a0.set_title("time per route (medians of the timed replays)", fontsize=9)
    a0.grid(alpha=0.3, which="both", axis="x")
    a0.legend(fontsize=7, loc="lower right")
    tot = np.array([sum((r.get("dosa_stage_ms") or {}).values()) for r in done], dtype=float)
    safe = np.where(tot > 0, tot, np.nan)
    left = np.zeros(len(done))
    for st in DOSA_STAGES:
        v = np.array([(r.get("dosa_stage_ms") or {}).get(st, 0.0) for r in done]) / safe
        a1.barh(y, v, left=left, label=st)
        left += np.nan_to_num(v)
    for i, t in enumerate(tot):
        a1.text(1.01, i, f"{t:.1f} ms", va="center", fontsize=6)
    a1.set_yticks(y, [""] * len(done))
    a1.set_xlim(0, 1.12)
    a1.set_xlabel("fraction of DoSA time (timing run, synchronized per stage)")
    a1.set_title("DoSA time by stage", fontsize=9)
    a1.legend(fontsize=7, loc="lower left", ncol=4)
    for a in (a0, a1):
        a.invert_yaxis()
    fig.tight_layout()
    files.append(_save(fig, out / "stages.png", plt))

    # 4. each route's time as a multiple of its floor
    grid = np.array(
        [[np.nan if v is None else v for v in x_floor(r).values()] for r in done], dtype=float
    )
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(done) + 2.2))
    vmax = max(2.0, float(np.nanmax(grid))) if np.isfinite(grid).any() else 2.0
    im = ax.imshow(grid, cmap="magma_r", norm=LogNorm(vmin=1, vmax=vmax), aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isfinite(grid[i, j]):
                dark = np.log(grid[i, j]) > 0.6 * np.log(vmax)
                ax.text(j, i, f"{grid[i, j]:.1f}×", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")  # fmt: skip
    ax.set_xticks(range(len(ROUTES)), [ROUTE_LABEL[k] for k in ROUTES], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(done)), labels, fontsize=7)
    ax.set_title(
        f"time / physical floor (fp8 MMA {FP8_PEAK / 1e12:.0f} TFLOP/s, HBM {HBM / 1e12:.2f} TB/s)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, fraction=0.04, label="× floor")
    fig.tight_layout()
    files.append(_save(fig, out / "floors.png", plt))
    return files


def _save(fig, path, plt):
    fig.savefig(path, dpi=100, bbox_inches="tight")  # keep colorbar labels in the frame
    plt.close(fig)
    return path


def write_outputs(rows, out: Path, meta, with_plots=False) -> list[Path]:
    """bench.json and bench.md (atomically: a kill mid-write leaves the previous pair), and
    the plots when asked."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("bench.json", json.dumps(rows, indent=1)), ("bench.md", None)):
        body = markdown(rows, meta) if text is None else text
        tmp = out / (name + ".tmp")
        tmp.write_text(body)
        os.replace(tmp, out / name)
    return plots(rows, out) if with_plots else []


# --------------------------------------------------------------------------- GPU part


def _median_ms(cp, fn, reps, warm=WARM, rotate=None):
    for i in range(warm):
        fn(rotate[i % len(rotate)] if rotate else None)
    ts = []
    for i in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        arg = rotate[i % len(rotate)] if rotate else None
        a.record()
        fn(arg)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(ts), ts


def _spans(Qn, sub):
    return [(a, min(Qn, a + sub)) for a in range(0, Qn, max(1, sub))]


def _slices(s, sub):
    """Query sub-chunks of an input set (contiguous views along the query axis)."""
    return [
        dict(s, **{k: s[k][a:b] for k in ("q", "w", "qp", "wp", "ks", "ke")})
        for a, b in _spans(s["q"].shape[0], sub)
    ]


def _free(cp):
    """Give cached blocks back between routes: the next route allocates other sizes, and
    torch's allocator draws on the same device memory."""
    cp.get_default_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")  # only if the bench imported it (None: blocked import)
    if torch is not None:
        torch.cuda.empty_cache()


def _survival(survivors, screened) -> dict:
    s = np.asarray(survivors, dtype=np.float64)
    n = np.asarray(screened, dtype=np.float64)
    per_q = s / np.maximum(n, 1)
    qs = np.quantile(per_q, np.linspace(0, 1, 101)) if per_q.size else []
    return {
        "survival_pooled": float(s.sum() / max(n.sum(), 1)),
        "survival_mean": float(per_q.mean()) if per_q.size else float("nan"),
        "survival_p90": float(np.quantile(per_q, 0.9)) if per_q.size else float("nan"),
        # 101 quantiles (0 %, 1 %, …, 100 %) keep the per-query CDF without Qn floats a row
        "survival_quantiles": [float(f"{v:.6g}") for v in qs],
    }


def _stats_run(fn, s, sub, K, opts):
    """ids and stats of one route over sub-chunks of set ``s`` (per-query arrays
    concatenated, stage times summed)."""
    import cupy as cp

    ids, parts, stage = [], [], {}
    for c in _slices(s, sub):
        i, st = fn(c["q"], c["w"], c["kp"], c["ksc"], K, c["ks"], c["ke"],
                   return_stats=True, timing=True, **opts)  # fmt: skip
        ids.append(i)
        parts.append(st)
        for k, v in st.stage_ms.items():
            stage[k] = stage.get(k, 0.0) + v
    cat = {}
    for k in ("survivors", "screened", "kept", "overflowed", "recovered"):
        vals = [getattr(p, k) for p in parts]
        cat[k] = None if any(v is None for v in vals) else np.concatenate(vals)
    return cp.concatenate(ids), cat, stage


def bench_shape(H, Qn, N, K, regime, reps, rot, opts, log, mem=None, parallel_setup=True,
                variants=None, inputs=None):  # fmt: skip
    """One shape: every route timed on the same rotated inputs, ids cross-checked, floors,
    survival and stage split.  ``mem``: ``memory_plan`` of the shape (sub-chunk sizes);
    ``parallel_setup``: generate the rotated input sets in threads; ``inputs``: workload
    files (``--inputs``), one rotated input set each (then ``rot`` = their number)."""
    import cupy as cp

    import dosa_cupy
    from dosa_cupy import workload
    from dosa_cupy.dense import _dense_logits_raw, _dense_topk_raw, select_rows
    from dosa_cupy.prepare import check_inputs, pad_heads

    if inputs is not None and len(inputs) != rot:
        raise ValueError(f"inputs: {len(inputs)} file(s) for {rot} rotated input set(s)")
    mem = mem or memory_plan(H, Qn, N, K, rotate=rot)
    sub = dict(mem["subchunk"])
    t0 = time.time()

    def make_set(seed):
        if inputs is not None:
            wl = workload.load_gpu_workload(inputs[seed - 100])
            if (wl["q"].shape[1], wl["q"].shape[0], wl["k_payload"].shape[0]) != (H, Qn, N):
                raise ValueError(f"inputs: {inputs[seed - 100]} is not {shape_name(H, Qn, N)}")
        else:
            wl = workload.make_gpu_workload(regime, Qn, N, H, seed=seed)
        for k in ("kf", "qf", "wf"):
            wl.pop(k)
        q, w, kp, ksc, _, ks, ke = check_inputs(
            wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"]
        )
        qp, wp = pad_heads(q, w)
        return dict(q=q, w=w, qp=qp, wp=wp, kp=kp, ksc=ksc, ks=ks, ke=ke)

    seeds = [100 + i for i in range(rot)]
    if parallel_setup and rot > 1:
        # The calibrated regimes are generated by numpy on the host (~10 s per 1M keys);
        # numpy releases the GIL in its fills and matmuls, so the rotated sets overlap.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=rot) as ex:
            sets = list(ex.map(make_set, seeds))
    else:
        sets = [make_set(sd) for sd in seeds]
    cp.cuda.Device().synchronize()
    vis = float(cp.sum((sets[0]["ke"] - sets[0]["ks"]).astype(cp.float64)))
    flops = 2.0 * H * D * vis
    res = dict(
        H=H, Qn=Qn, N=N, K=K, regime=regime, r=int(opts.get("r", 14)), reps=reps,
        rotate=rot, visible_pairs=vis, dense_flop=flops, setup_s=time.time() - t0,
        dense_subchunk=sub["dense"], dosa_subchunk=sub["dosa"],
        stats_subchunk=sub["dosa_stats"], fused_subchunk=sub["fused"],
        memory_budget_gib=mem["budget_gib"], memory_notes=list(mem["notes"]),
    )  # fmt: skip
    try:
        res["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # the name is decoration; never fail a measurement for it
        res["device"] = None
    dchunks = [_slices(s, sub["dense"]) for s in sets]

    # Dense logits alone (each sub-chunk's buffer released before the next is allocated).
    def logits(cs):
        for c in cs:
            lg = _dense_logits_raw(c["qp"], c["wp"], c["kp"], c["ksc"], c["ks"], c["ke"])
            del lg

    res["logits_ms"], _ = _median_ms(cp, logits, reps, rotate=dchunks)
    res["logits_tflops"] = flops / res["logits_ms"] / 1e9
    _free(cp)

    # Own exact selection and torch.topk on the logits of set 0, one sub-chunk at a time
    # (time = Σ over sub-chunks of the per-sub-chunk median); the dense ids come from here.
    try:
        import torch
    except ImportError:
        torch = None
    sel_ms, tt_ms, dense_parts = 0.0, 0.0, []
    t_kth, t_vals = True, True
    for c in dchunks[0]:
        lg = _dense_logits_raw(c["qp"], c["wp"], c["kp"], c["ksc"], c["ks"], c["ke"])
        arg = [(lg, c["ks"], c["ke"])]
        m, _ = _median_ms(cp, lambda a: select_rows(a[0], K, a[1], a[2]), reps, rotate=arg)
        sel_ms += m
        ids_c = select_rows(lg, K, c["ks"], c["ke"])
        dense_parts.append(ids_c)
        if torch is not None:
            tl = torch.from_dlpack(lg)
            m, _ = _median_ms(cp, lambda a: torch.topk(a, K, dim=1), reps, rotate=[tl])
            tt_ms += m
            tv = cp.from_dlpack(torch.topk(tl, K, dim=1).values)
            own = cp.take_along_axis(lg, cp.maximum(ids_c, 0).astype(cp.int64), axis=1)
            own = cp.where(ids_c >= 0, own, -cp.inf)  # −1 pads ↔ −inf (invisible) values
            t_vals &= bool(cp.array_equal(tv, own))
            t_kth &= bool(cp.all(tv[:, -1] == own[:, -1]))
            del tl, tv, own
        del lg, arg
        _free(cp)
    dense_ids = cp.concatenate(dense_parts)
    del dense_parts
    res["select_ms"] = sel_ms
    res["torch_topk_ms"] = tt_ms if torch is not None else None
    if torch is not None:
        res["torch_values_equal"] = t_vals
        res["torch_kth_match"] = t_kth

    def dense_route(s):
        _dense_topk_raw(s["qp"], s["wp"], s["kp"], s["ksc"], K, s["ks"], s["ke"],
                        chunk=sub["dense"])  # fmt: skip

    res["dense_route_ms"], _ = _median_ms(cp, dense_route, reps, rotate=sets)
    _free(cp)

    def route(fn, o):
        def run(cs):
            for c in cs:
                fn(c["q"], c["w"], c["kp"], c["ksc"], K, c["ks"], c["ke"], **o)

        return run

    # the fused route has no plan: r (and the plan's other options) are DoSA's alone
    fused_opts = {k: v for k, v in opts.items() if k not in ("r", "mma_bits", "p_sample")}
    dosa_cs = [_slices(s, sub["dosa"]) for s in sets]
    res["dosa_ms"], _ = _median_ms(cp, route(dosa_cupy.dosa_topk, opts), reps, rotate=dosa_cs)
    _free(cp)
    fused_cs = [_slices(s, sub["fused"]) for s in sets]
    res["fused_ms"], _ = _median_ms(
        cp, route(dosa_cupy.fused_topk, fused_opts), reps, rotate=fused_cs
    )
    _free(cp)

    fids, _, fstage = _stats_run(dosa_cupy.fused_topk, sets[0], sub["fused"], K, fused_opts)
    res["fused_ids_equal_dense"] = bool(cp.array_equal(fids, dense_ids))
    res["fused_stage_ms"] = fstage
    del fids
    _free(cp)
    # Variants: more DoSA routes (other options) on the same inputs, same run.
    for name, vopts in (variants or {}).items():
        vo = dict(opts, **vopts)
        v = {"options": vopts}
        res.setdefault("variants", {})[name] = v
        try:
            v["ms"], _ = _median_ms(cp, route(dosa_cupy.dosa_topk, vo), reps, rotate=dosa_cs)
            _free(cp)
            vids, vst, vstage = _stats_run(
                dosa_cupy.dosa_topk, sets[0], sub["dosa_stats"], K, vo
            )  # fmt: skip
        except Exception as e:  # an experimental option must not lose the shape's row
            if _is_oom(e):
                raise
            v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"# variant {name} failed: {v['error']}")
            _free(cp)
            continue
        v["ids_equal_dense"] = bool(cp.array_equal(vids, dense_ids))
        v["stage_ms"] = vstage
        v["survival_pooled"] = _survival(vst["survivors"], vst["screened"])["survival_pooled"]
        v["speedup_vs_dense"] = res["dense_route_ms"] / v["ms"]
        v["speedup_vs_fused"] = res["fused_ms"] / v["ms"]
        del vids
        _free(cp)
    ids, st, stage = _stats_run(dosa_cupy.dosa_topk, sets[0], sub["dosa_stats"], K, opts)
    res["dosa_ids_equal_dense"] = bool(cp.array_equal(ids, dense_ids))
    res["dosa_stage_ms"] = stage
    del ids
    res.update(_survival(st["survivors"], st["screened"]))
    res["kept_mean"] = float(st["kept"].mean())
    res["overflowed"] = int(st["overflowed"].sum())
    res["recovered"] = int(st["recovered"].sum())
    res["speedup_vs_dense"] = res["dense_route_ms"] / res["dosa_ms"]
    res["speedup_vs_fused"] = res["fused_ms"] / res["dosa_ms"]
    if res["torch_topk_ms"] is not None:
        # the route users run today: logits + torch.topk (sum of the two medians)
        res["dense_torch_ms"] = res["logits_ms"] + res["torch_topk_ms"]
        res["speedup_vs_dense_torch"] = res["dense_torch_ms"] / res["dosa_ms"]
    res.update(floors_ms(H, Qn, N, vis, res["survival_pooled"], res["r"]))
    res["x_floor"] = x_floor(res)
    res["ids_equal"] = ids_equal(res)
    res["seconds"] = time.time() - t0
    del sets, dchunks, dosa_cs, fused_cs, dense_ids
    _free(cp)
    log(json.dumps(res))
    return res


GPU_HINT = "pip install 'dosa[gpu]' (CuPy) and run on a machine with an NVIDIA GPU"


def gpu_missing() -> str | None:
    """Why this process cannot time GPU routes, in one line (None when it can): CuPy is not
    importable, or it finds no usable CUDA device."""
    try:
        import cupy as cp

        cp.cuda.Device().mem_info  # noqa: B018 - the first call that needs a device
    except Exception as e:
        what = "CuPy is not importable" if isinstance(e, ImportError) else "no usable CUDA GPU"
        return f"{what} ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return None


def no_gpu_exit(prog: str) -> int | None:
    """2 after a one-line message on stderr when there is no GPU to run on, else None."""
    why = gpu_missing()
    if why is None:
        return None
    print(f"{prog}: {why}; {GPU_HINT}", file=sys.stderr)
    return 2


def _is_oom(e) -> bool:
    return "OutOfMemory" in type(e).__name__ or "out of memory" in str(e).lower()


# --------------------------------------------------------------------------- CLI


def _positive(name, v, lo=0.0, strict=True):
    if (v <= lo) if strict else (v < lo):
        rel = ">" if strict else ">="
        raise ValueError(f"{name}: expected a number {rel} {lo:g}, got {v!r}")
    return v


def build_jobs(a) -> list[tuple[str, int, tuple[int, int, int]]]:
    """(regime, tile, shape) in run order: regimes as given, shapes in importance order,
    tiles innermost; then ``--filter`` and ``--part``."""
    from dosa_cupy._build import TILES

    if a.sweep and a.shapes is not None:
        raise ValueError("shapes: --sweep runs the issue's grid; give --sweep or --shapes")
    if getattr(a, "inputs", None):
        return _file_jobs(a)
    shapes = sweep_shapes() if a.sweep else parse_shapes(a.shapes or DEFAULT_SHAPES)
    shapes = filter_shapes(shapes, a.filter)
    try:
        tiles = [int(x) for x in str(a.tile).split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}") from e
    if not tiles or any(t not in TILES for t in tiles):
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}")
    regimes = [x.strip() for x in str(a.regime).split(",") if x.strip()]
    if not regimes:
        raise ValueError(f"regime: expected a regime name, got {a.regime!r}")
    jobs = [(g, t, s) for g in regimes for s in shapes for t in tiles]
    i, p = parse_part(a.part)
    return select_part(
        jobs, i, p, lambda j: estimate_seconds(*j[2], reps=a.reps, rotate=a.rotate, r=a.r)
    )


def input_groups(paths) -> dict[str, list[str]]:
    """``--inputs`` files grouped by shape: {"file:<stem>[+n]": [paths]} in the given order;
    the files of one group are the rotated input sets of one job (same H, Qn, N)."""
    from dosa_cupy.workload import inputs_shape

    by_shape: dict[tuple[int, int, int], list[str]] = {}
    for p in paths:
        by_shape.setdefault(inputs_shape(p), []).append(p)
    out = {}
    for shape, fs in by_shape.items():
        extra = f"+{len(fs) - 1}" if len(fs) > 1 else ""
        # the shape in the label keeps groups apart whose first files share a stem
        out[f"file:{Path(fs[0]).stem}{extra}@{shape_name(*shape)}"] = fs
    return out


def _file_jobs(a):
    """Jobs of ``--inputs``: one per shape group, regime label ``file:…`` (a.input_groups)."""
    from dosa_cupy._build import TILES

    if a.sweep or a.shapes is not None:
        raise ValueError("inputs: the shapes come from the files; drop --sweep / --shapes")
    if a.part is not None or a.filter:
        raise ValueError("inputs: --part / --filter select generated shapes; list the files")
    paths = [x.strip() for x in str(a.inputs).split(",") if x.strip()]
    if not paths:
        raise ValueError(
            f"inputs: expected a comma list of .npz / .safetensors files, got {a.inputs!r}"
        )
    a.input_groups = input_groups(paths)
    tiles = [int(x) for x in str(a.tile).split(",") if x.strip()]
    if not tiles or any(t not in TILES for t in tiles):
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}")
    from dosa_cupy.workload import inputs_shape

    return [(g, t, inputs_shape(fs[0])) for g, fs in a.input_groups.items() for t in tiles]


def _rotate_of(a, regime) -> int:
    """Rotated input sets of a job: the group's files for ``--inputs``, else --rotate."""
    groups = getattr(a, "input_groups", None) or {}
    return len(groups[regime]) if regime in groups else a.rotate


def _dry_run(a, jobs):
    print(
        f"# {len(jobs)} job(s); --logits-gib {a.logits_gib:g}; estimated times are a rough"
        " model (EST_* in bench.py), not measurements"
    )
    total = 0.0
    for regime, tile, (H, Qn, N) in jobs:
        rot = _rotate_of(a, regime)
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
    rows = merge_rows([load_rows(f) for f in a.merge])
    commits = list(dict.fromkeys(r["commit"] for r in rows if r.get("commit")))
    meta = run_meta(a.commit or (", ".join(commits) if commits else None))
    files = write_outputs(rows, Path(a.out), meta, with_plots=True)
    print(markdown(rows, meta))
    for f in files:
        print(f"# wrote {f}")
    print(f"# merged {len(rows)} row(s) from {len(a.merge)} file(s) into {a.out}")
    return 0


def main(argv=None) -> int:
    t_start = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--decode" in argv:  # `dosa bench --decode`: the decode benchmark's own arguments
        from dosa_cupy.bench_decode import main as decode_main

        return decode_main([x for x in argv if x != "--decode"])
    ap = argparse.ArgumentParser(prog="dosa bench", description=__doc__.split("\n")[0])
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
    ap.add_argument("--K", type=int, default=2048)
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
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rotate", type=int, default=2)
    ap.add_argument("--r", type=int, default=14, help="retained heads (14: one 16-row tile)")
    ap.add_argument("--out", default=None, help="directory for bench.json / bench.md / PNGs")
    ap.add_argument("--tile", default="256", help="key tile sizes to run, e.g. 128,256")
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
        "(e.g. cert:cert_seeds=2048); repeatable",
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
    if a.reps < 10:
        raise ValueError(f"reps: at least 10 replays, got {a.reps}")
    if a.rotate < 1:
        raise ValueError(f"rotate: expected at least 1 input set, got {a.rotate}")
    if not 1 <= a.K <= 4096:
        raise ValueError(f"K: expected an integer in [1, 4096], got {a.K}")
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
        rot = _rotate_of(a, regime)
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
                    H, Qn, N, a.K, regime, a.reps, rot, {"r": a.r}, print, mem=mem,
                    parallel_setup=not a.serial_setup, variants=variants,
                    inputs=(getattr(a, "input_groups", None) or {}).get(regime),
                )  # fmt: skip
                row["tile"] = tile
            except Exception as e:
                if not _is_oom(e):
                    raise
                oom = f"out of memory: {str(e)[:200]}"
        if oom:
            # after the except block: its traceback held the shape's device arrays
            row = dict(base, skipped=oom)
            _free(cp)
        row.update(date_utc=_utc_now(), commit=meta["commit"])
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


if __name__ == "__main__":
    sys.exit(main())
