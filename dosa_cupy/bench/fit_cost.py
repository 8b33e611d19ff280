"""Fit the route choice's cost model (dosa_cupy/cost.py, docs/method.md §9 "Route choice")
to measured stage times: ``python -m dosa_cupy.bench.fit_cost FILE.json ...`` prints the
constants of a ``cost.CostModel``; with ``--predictions``, each row's decision — the model's
predictions it used — beside the times the same row measured (``predictions``).

Each file is a ``dosa bench`` JSON (a list of shape rows); every row gives
- the dense route's logits time and selection time (``logits_ms``, ``select_ms``) at its
  visible pairs and heads,
- DoSA's stage split (``dosa_stage_ms``) with its pooled survival, and each variant's.
The fits are least squares of non-negative linear models (docs/method.md §9 lists them):
logits = l0 + flop / R (one R per head count), selection = s0 + s1 · rows · N,
refinement = f0 · Qn · N + f1 · survivors · H (the survivor bitmask is read whole), DoSA's
selection and recovery = g0 + g1 · kept records, the plan = p1 · Qn · H.
The early test's floor is the smallest DoSA call measured (``dosa_ms``).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from dosa_ref.cmdline import CommandParser

from ..cost import logits_flop

__all__ = ["fit", "main", "predictions", "predictions_md"]


def _nnls2(x, y):
    """(a, b) ≥ 0 minimizing Σ (a + b x − y)²: ``_nnls`` with an intercept column."""
    x = np.asarray(x, float)
    return tuple(_nnls(np.stack([np.ones_like(x), x], axis=1), y))


def _nnls(X, y):
    """c ≥ 0 minimizing ‖X c − y‖ (no intercept): least squares, refitted without the
    columns whose coefficient came out negative."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    keep = list(range(X.shape[1]))
    while True:
        c = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
        if (c >= 0).all():
            out = np.zeros(X.shape[1])
            out[keep] = c
            return [float(v) for v in out]
        keep = [k for k, v in zip(keep, c, strict=True) if v >= 0]


def _dosa_points(row):
    """(H, visible, survival, kept, stage_ms, Qn·N) of the row's DoSA runs (default and
    variants) that screened: a run its route sent dense has no refine stage to fit."""
    out = []
    if "refine" in (row.get("dosa_stage_ms") or {}):
        out.append((row["survival_pooled"], row.get("kept_mean", 0.0), row["dosa_stage_ms"]))
    for v in (row.get("variants") or {}).values():
        if "refine" in (v.get("stage_ms") or {}) and v.get("survival_pooled") is not None:
            out.append((v["survival_pooled"], None, v["stage_ms"]))
    return [(row["H"], row["visible_pairs"], *p, row["Qn"] * row["N"]) for p in out]


def fit(rows: list) -> dict:
    """The cost model's constants (ms, FLOP) fitted to bench rows."""
    rates, l0s = {}, []
    for H in sorted({r["H"] for r in rows}):
        sub = [r for r in rows if r["H"] == H and r.get("logits_ms")]
        flop = [logits_flop(r["visible_pairs"], H) for r in sub]
        l0, inv = _nnls2(flop, [r["logits_ms"] for r in sub])
        rates[H] = 1.0 / inv if inv > 0 else float("inf")
        l0s.append(l0)
    sel = [r for r in rows if r.get("select_ms")]
    s0, s1 = _nnls2([r["Qn"] * r["N"] for r in sel], [r["select_ms"] for r in sel])
    pts = [p for r in rows for p in _dosa_points(r)]
    f0, f1 = _nnls([[p[5], p[2] * p[1] * p[0]] for p in pts],
                            [p[4]["refine"] for p in pts])  # fmt: skip
    planned = [(r, p) for r in rows for p in _dosa_points(r) if "plan" in p[4]]
    (p1,) = _nnls([[r["Qn"] * p[0]] for r, p in planned], [p[4]["plan"] for r, p in planned])
    kept = [(r, p) for r in rows for p in _dosa_points(r) if p[3] is not None]
    g0, g1 = _nnls2([p[3] * r["Qn"] for r, p in kept],
                    [p[4]["select"] + p[4].get("recover", 0.0) for r, p in kept])  # fmt: skip
    return {
        "logits_flop_per_ms": {int(h): v for h, v in rates.items()},
        "logits_fixed_ms": float(np.median(l0s)),
        "select_fixed_ms": s0,
        "select_ms_per_key": s1,
        "refine_ms_per_key": f0,
        "refine_ms_per_key_head": f1,
        "finish_fixed_ms": g0,
        "finish_ms_per_record": g1,
        "dosa_floor_ms": float(min(r["dosa_ms"] for r in rows if r.get("dosa_ms"))),
        "plan_ms_per_query_head": p1,
    }


AFTER_ROUTE = ("plan", "screen", "refine", "select", "recover")  # DoSA from the decision on


def predictions(rows: list) -> list[dict]:
    """Each bench row's route decision beside what it measured: the prediction the decision
    used for the dense route (``predicted_ms["dense"]``) against the dense route's time, and
    for DoSA's winning or best candidate (its time from the decision on: the chunk's plan and
    what follows) against DoSA's stages after the route stage (``dosa_stage_ms``; a chunk
    sent dense has none).  A row whose decision was not sampled has no candidate."""
    out = []
    for r in rows:
        for rc in r.get("dosa_routes") or []:
            pred = rc.get("predicted_ms") or {}
            cands = {k: v for k, v in pred.items() if k != "dense"}
            best = min(cands, key=lambda k: (cands[k], k)) if cands else None
            stages = r.get("dosa_stage_ms") or {}
            after = (
                sum(stages[k] for k in AFTER_ROUTE if k in stages) if "screen" in stages else None
            )
            out.append({
                "regime": r.get("regime"), "H": r["H"], "Qn": r["Qn"], "N": r["N"],
                "route": rc["route"], "reason": rc["reason"],
                "dense_predicted_ms": pred.get("dense"), "dense_ms": r.get("dense_route_ms"),
                "candidate": best, "dosa_predicted_ms": cands.get(best),
                "dosa_after_route_ms": after if rc["route"] == "dosa" else None,
                "survival": (rc.get("survival") or {}).get(best),
            })  # fmt: skip
    return out


def predictions_md(rows: list) -> str:
    """``predictions`` as a markdown table (ms)."""

    def c(v, f="{:.2f}"):
        return "-" if v is None else f.format(v)

    lines = ["| regime | H | Qn | N | route (reason) | dense predicted | dense measured | "
             "candidate | its prediction | DoSA after the decision, measured | sampled "
             "survival |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in predictions(rows):
        lines.append(
            f"| {p['regime']} | {p['H']} | {p['Qn']} | {p['N']} | {p['route']} ({p['reason']}) "
            f"| {c(p['dense_predicted_ms'])} | {c(p['dense_ms'])} | {p['candidate'] or '-'} "
            f"| {c(p['dosa_predicted_ms'])} | {c(p['dosa_after_route_ms'])} "
            f"| {c(p['survival'], '{:.4f}')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = CommandParser(prog="python -m dosa_cupy.bench.fit_cost",
                       description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("json", nargs="+", help="dosa bench JSON files")
    ap.add_argument("--predictions", action="store_true",
                    help="each row's decision beside its measured times, not a fit")  # fmt: skip
    a = ap.parse_args(argv if argv is not None else sys.argv[1:])
    rows = []
    for path in a.json:
        rows += [r for r in json.load(open(path)) if isinstance(r, dict) and "H" in r]
    if a.predictions:
        print(predictions_md(rows))
        return
    for k, v in fit(rows).items():
        print(f"{k} = {v!r}")


if __name__ == "__main__":
    main()
