"""bench.json / bench.md of ``dosa bench``: run metadata, the markdown tables, merging
the rows of partial runs (no GPU)."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from pathlib import Path

from ..cost import candidate_key, sample_scale
from . import peers
from .memplan import FP8_PEAK, HBM, row_floors, x_floor
from .shapes import DOSA_STAGES, FUSED_STAGES, shape_name, sort_key
from .timing import WARM


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


def device_name(cp) -> str | None:
    """The name of GPU 0, or None when the runtime cannot say (decoration only: a
    measurement never fails for it)."""
    try:
        return cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        return None


def run_meta(commit=None) -> dict:
    """Date (UTC) and commit: ``commit`` > $DOSA_COMMIT > git > "unknown" (the device copy
    of the tree has no .git, so pass --commit there)."""
    c = commit or os.environ.get("DOSA_COMMIT") or git_commit() or "unknown"
    return {"date_utc": utc_now(), "commit": c}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def cell(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def md_table(intro: str, cols, rows) -> str:
    """``intro`` (a heading or a paragraph, with its blank lines) and a markdown table of
    ``rows`` with ``cols`` = (header, row → cell text) pairs; "" when there are no rows
    (a part that did not run, a run without the data)."""
    if not rows:
        return ""
    head = "| " + " | ".join(h for h, _ in cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = "".join("| " + " | ".join(f(r) for _, f in cols) + " |\n" for r in rows)
    return intro + head + body


def _shape_cols(r) -> str:
    return f"{r.get('regime', '-')} | {r['H']} | {r['Qn']} | {r['N']}"


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
    done = sorted((r for r in rows if "skipped" not in r), key=sort_key)
    skipped = sorted((r for r in rows if "skipped" in r), key=sort_key)
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
        "regime | tile | H | Qn | N | K | logits ms | ×fl | TFLOP/s | FP8 logits ms | ×fl "
        "| select ms | ×fl "
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
            f"{r['N']} | {r.get('K', '-')} | {cell(r.get('logits_ms'))} | "
            f"{cell(x['logits'], '{:.1f}')} | {cell(r.get('logits_tflops'), '{:.0f}')} | "
            f"{cell(r.get('fp8_logits_ms'))} | {cell(x['fp8_logits'], '{:.1f}')} | "
            f"{cell(r.get('select_ms'))} | {cell(x['select'], '{:.1f}')} | "
            f"{cell(r.get('torch_topk_ms'))} | {cell(x['torch_topk'], '{:.1f}')} | "
            f"{cell(r.get('dense_route_ms'))} | {cell(x['dense_route'], '{:.1f}')} | "
            f"{cell(r.get('fused_ms'))} | {cell(x['fused'], '{:.1f}')} | "
            f"{cell(r.get('dosa_ms'))} | {cell(x['dosa'], '{:.1f}')} | "
            f"{cell(r.get('speedup_vs_dense'), '{:.2f}×')} | "
            f"{cell(r.get('speedup_vs_fused'), '{:.2f}×')} | "
            f"{cell(r.get('survival_pooled', r.get('survival_mean')), '{:.4f}')} | "
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
                    f"{opts} | {cell(v.get('ms'))} | {cell(rel, '{:.2f}×')} | "
                    f"{cell(v.get('speedup_vs_dense'), '{:.2f}×')} | "
                    f"{cell(v.get('speedup_vs_fused'), '{:.2f}×')} | "
                    f"{cell(v.get('survival_pooled'), '{:.4f}')} | "
                    f"{v.get('ids_equal_dense', 'error: ' + v.get('error', '?'))} |\n"
                )
    paired = [(r, n, v) for r in done for n, v in (r.get("variants") or {}).items()
              if v.get("paired_ms") and r.get("dosa_paired_ms")]  # fmt: skip
    if paired:
        out.append(
            "\nPaired (`--paired`): the DoSA call and each variant without a memo timed in turn, "
            "one call of each per replay (twice `--reps` replays; docs/benchmark_method.md), "
            "medians:\n\n| regime | H | Qn | N | variant | DoSA ms | variant ms | "
            "DoSA / variant |\n|" + "---|" * 8 + "\n"
        )
        for r, n, v in paired:
            out.append(
                f"| {r.get('regime', '-')} | {r['H']} | {r['Qn']} | {r['N']} | {n} | "
                f"{cell(r['dosa_paired_ms'])} | {cell(v['paired_ms'])} | "
                f"{cell(r['dosa_paired_ms'] / v['paired_ms'], '{:.3f}×')} |\n"
            )
    memo = [(r, n, v) for r in done for n, v in (r.get("variants") or {}).items()
            if v.get("mean_ms")]  # fmt: skip
    if memo:
        out.append(
            "\nMemo variants (`route_memo=1`): the median above is the remembered route's; over "
            "at least two refresh cycles, their sampled calls included, the mean per call is "
            + "; ".join(
                f"{r.get('regime', '-')} H {r['H']} N {r['N']} {n} {v['mean_ms']:.2f} ms "
                f"({cell(r['dense_route_ms'] / v['mean_ms'], '{:.2f}×')} the dense route)"
                for r, n, v in memo
            )
            + ".\n"
        )
    out.append(peers.markdown(done, cell, _shape_cols))
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
                    cell(fl.get(k))
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
                + " | ".join(cell(ds.get(s)) for s in DOSA_STAGES)
                + " | "
                + " | ".join(cell(fs.get(s)) for s in FUSED_STAGES)
                + " |\n"
            )
        out.append(route_table(done))
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
                f"{cell(r.get('survival_pooled'), '{:.4f}')} | "
                f"{cell(r.get('survival_mean'), '{:.4f}')} | {cell(q(0.1), '{:.4f}')} | "
                f"{cell(q(0.5), '{:.4f}')} | "
                f"{cell(q(0.9) if qs else r.get('survival_p90'), '{:.4f}')} | "
                f"{cell(q(1.0), '{:.4f}')} | {r.get('overflowed', '-')} | "
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
    return sorted(merged.values(), key=sort_key)


def load_rows(path) -> list:
    """Rows of a bench.json (a list of rows, or {"rows": [...]})."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "H" in r for r in rows):
        raise ValueError(f"merge: {path} is not a bench.json (list of rows)")
    return rows


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
    if not with_plots:
        return []
    from .plots import plots  # matplotlib only when figures are asked for

    return plots(rows, out)


def route_table(rows) -> str:
    """The route choice beside the measurements (dosa_cupy/cost.py): per shape, the route
    of each sub-chunk (reason, screen/r), the model's dense-route time against the measured
    one, DoSA's predicted time (its stages up to the choice, measured, plus the chosen
    candidate's predicted rest; the dense time when dense was chosen) against the measured
    DoSA time, the chosen candidate's sampled screen time scaled to the chunk against the
    measured screen stage, and the fraction of visible keys fully scored."""
    nan = float("nan")

    def names(r):
        return "; ".join(sorted({
            f"{x['route']} ({x['reason']}"
            + (f", {candidate_key(x['screen'], x['r'])})" if x["screen"] else ")")
            for x in r["dosa_routes"]
        }))  # fmt: skip

    def dense(r):
        return sum(x["predicted_ms"].get("dense", nan) for x in r["dosa_routes"])

    def dosa(r):  # the stages before the choice, measured, + the chosen candidate's rest
        st = r.get("dosa_stage_ms") or {}
        before = sum(st.get(k, 0.0) for k in ("prepare", "seeds", "route"))
        rest = sum(
            x["predicted_ms"].get(
                candidate_key(x["screen"], x["r"]), x["predicted_ms"].get("dense", nan)
            )
            for x in r["dosa_routes"]
        )
        return before + rest

    def scaled_screen(r):  # the chosen candidates' samples scaled as route.route_stage does
        routes, total = r["dosa_routes"], 0.0
        for x in routes:
            key = candidate_key(x["screen"], x["r"]) if x["screen"] else None
            n = (x.get("sample") or {}).get(key)
            if x["route"] != "dosa" or not n or key not in (x.get("sample_ms") or {}):
                return nan
            qn = r["Qn"] / len(routes)  # the sub-chunk's queries
            total += x["sample_ms"][key] * sample_scale(x["screen"], qn, n)
        return total

    cols = [
        ("regime", lambda r: str(r.get("regime", "-"))), ("H", lambda r: str(r["H"])),
        ("Qn", lambda r: str(r["Qn"])), ("N", lambda r: str(r["N"])), ("route", names),
        ("dense predicted", lambda r: cell(dense(r))),
        ("dense measured", lambda r: cell(r.get("dense_route_ms"))),
        ("DoSA predicted", lambda r: cell(dosa(r))),
        ("DoSA measured", lambda r: cell(r.get("dosa_ms"))),
        ("screen: sample scaled", lambda r: cell(scaled_screen(r))),
        ("screen measured", lambda r: cell((r.get("dosa_stage_ms") or {}).get("screen"))),
        ("fully scored", lambda r: cell(r.get("scored_fraction"), "{:.4f}")),
    ]  # fmt: skip
    intro = "\nRoute choice (dosa_cupy/cost.py; predictions of the committed model, ms):\n\n"
    return md_table(intro, cols, [r for r in rows if r.get("dosa_routes")])
