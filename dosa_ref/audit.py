"""Guard audit (docs/method.md §8): does U^num dominate the worst-case computed score that the
error model allows, for every (query, key)?

For each pair the *dominance margin* is

    m = α(Ŝ − err_scr + ρC + ε_raw) + ε_out − (s + err_ref)

with Ŝ the exact screening value of the stored FP8 rows, s the exact original score, and
err_scr / err_ref the error model's worst-case screening / scorer errors *for this pair*
(computed from the pair's own |q||k̄| sums, not from the envelope J, the Cauchy–Schwarz
step or the summary ρ that the guard uses).  m ≥ 0 means: whatever the screening kernel
and the scorer compute within the model, the rounded-up U^num is ≥ the computed score.
Two independent evaluations (``margins``):

  * interval arithmetic on all visible pairs (vectorized numpy, every operation widened
    outward, BLAS bounded with γ_n): a rigorous lower bound of m;
  * exact rational arithmetic (``fractions.Fraction``; FP8 and fp32 values are dyadic, so
    it is exact, with its own implementation of the model's coefficients) on a random
    sample and on every pair whose interval margin is small.

A pair with exact m < 0 is a violation: its inputs (query, keys, stored plan, model) are
written to ``violation_q{t}.npz``; ``audit_replay(path)`` re-checks it, once with the
stored plan and once with a plan rebuilt by the current code.

Also reported: the guard's cost (survival with vs without its allowances, at the seed τ of
an ``fp8_topk`` run and at the exact K-th score τ*), the slack decomposition of
U^num − s^ref (Prop. 6 components + the guard's parts), JSON + markdown, and a PNG of the
margin and slack distributions (if matplotlib is installed).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import zipfile

import numpy as np

from .certificate import upper_bound
from .error_model import ErrorModel
from .fp8 import dequantize, e4m3_values, key_rms, quantize_keys
from .margins import exact_margin, interval_margins, slack_parts
from .numeric import build_fp8_plan, default_plan, screen_bound
from .pipeline import fp8_topk
from .plan import PlanOptions, build_plan
from .scorer import score_keys, topk_of

__all__ = ["audit", "audit_replay", "main"]

# --------------------------------------------------------------------------------------
# Workload handling
# --------------------------------------------------------------------------------------


def _unpack(workload, scale_fmt: str):
    """→ (q, w, payload, scale, ks, ke) from a tuple/dict/object workload."""
    if isinstance(workload, (tuple, list)):
        if len(workload) == 6:
            return tuple(workload)
        if len(workload) == 5:
            q, w, k, ks, ke = workload
            p, s = quantize_keys(k, scale_fmt)
            return q, w, p, s, ks, ke
        raise ValueError("workload: expected (q, w, payload, scale, ks, ke) or (q, w, k, ks, ke)")

    def get(name):
        if isinstance(workload, dict):
            return workload.get(name)
        return getattr(workload, name, None)

    q, w, ks, ke = get("q"), get("w"), get("ks"), get("ke")
    if get("payload") is not None:
        return q, w, get("payload"), get("scale"), ks, ke
    if get("k") is None:
        raise ValueError("workload: needs q, w and k (or payload + scale)")
    p, s = quantize_keys(get("k"), scale_fmt)
    return q, w, p, s, ks, ke


# --------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------


def _plan_from_stored(d: dict) -> dict:
    return {
        "form": str(d["form"]),
        "R": d["R"],
        "q_payload": d["q_payload"],
        "omega": d["omega"],
        "aux_payload": d["aux_payload"],
        "aux_scale": d["aux_scale"],
        "C": np.float32(d["C"]),
        "eps_raw": float(d["eps_raw"]),
        "eps_out": float(d["eps_out"]),
        "valid": bool(d["valid"]),
    }


def _write_violation(path, t, q_t, w_t, payload, scale, rho, ids, fplan, model, margins):
    plan = fplan.plan
    ka = fplan.kernel_arrays()
    np.savez_compressed(
        path,
        query=np.int64(t),
        q_t=q_t,
        w_t=w_t,
        key_ids=np.asarray(ids, dtype=np.int64),
        payload=payload,
        scale=scale,
        rho=rho,
        margins=np.asarray([float(m) for m in margins]),
        model=np.array(model.to_json()),
        plan_R=plan.R,
        plan_A=plan.A,
        plan_options=np.array(json.dumps(plan.options.__dict__)),
        **{k_: np.asarray(v) for k_, v in ka.items()},
    )


def audit(
    workload,
    *,
    K: int = 2048,
    scale_fmt: str = "amax",
    error_model: ErrorModel | None = None,
    form: str = "base",
    sample: int = 256,
    small_margin: float = 1e-9,
    max_exact: int = 2048,
    out: str | None = None,
    progress=None,
    plan_hook=None,
    seed: int = 0,
    topk_options: dict | None = None,
) -> dict:
    """Audit U^num ≥ worst-case computed score on every visible (query, key) pair.

    Args:
        workload: (q, w, payload, scale, ks, ke), (q, w, k, ks, ke) (keys quantized with
            ``scale_fmt``), or an object / dict with those fields (``dosa_ref.workloads``).
        K: selection size of the ``fp8_topk`` run whose plans are audited.
        error_model: the model to audit (default ``ErrorModel()``, Hopper FP8, W = 17).
        sample: random pairs checked exactly; small_margin: pairs whose interval margin is
            below small_margin × pair scale are checked exactly too (at most max_exact).
        out: directory for audit.json, audit.md, audit.png and violation_*.npz.
        progress: callable(stage: str, done: int, total: int).
        plan_hook: callable(FP8ScreenPlan) → FP8ScreenPlan applied before checking (tests
            use it to plant a violation, e.g. scale C down).
    Returns the report dict (also written as JSON when ``out`` is given).
    """
    model = error_model or ErrorModel.hopper_fp8()
    q, w, payload, scale, ks, ke = _unpack(workload, scale_fmt)
    q = np.asarray(q, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    payload = np.asarray(payload, dtype=np.uint8)
    scale = np.asarray(scale, dtype=np.float32)
    Qn, H, D = q.shape
    N = payload.shape[0]
    ks = np.zeros(Qn, np.int64) if ks is None else np.asarray(ks, dtype=np.int64)
    ke = np.full(Qn, N, np.int64) if ke is None else np.asarray(ke, dtype=np.int64)
    prog = progress or (lambda *a: None)
    rng = np.random.default_rng(seed)

    # 1. The run whose plans we audit (also: ids == full scoring, guard cost at seed τ).
    res = fp8_topk(
        q,
        w,
        payload,
        scale,
        K,
        ks,
        ke,
        error_model=model,
        form=form,
        progress=lambda t: prog("fp8_topk", t + 1, Qn),
        **(topk_options or {}),
    )
    k = dequantize(payload, scale)
    kbar = e4m3_values(payload)
    rho = key_rms(payload)
    ref_ids = np.full((Qn, K), -1, dtype=np.int64)

    n_pairs = 0
    n_exact = 0
    violations = []
    min_margin = math.inf
    min_rel = math.inf
    min_exact_rel = math.inf
    computed_min = math.inf
    rel_hist = []
    parts_acc: dict[str, float] = {}
    parts_n = 0
    surv = {"guard": 0, "exact": 0, "screened": 0}
    for t in range(Qn):
        a_, b_ = int(ks[t]), int(ke[t])
        if b_ <= a_:
            prog("check", t + 1, Qn)
            continue
        ids = np.arange(a_, b_, dtype=np.int64)
        s_ref = score_keys(q[t], w[t], k[a_:b_])
        top, sc = topk_of(s_ref, ids, K)
        ref_ids[t, : top.size] = top
        fplan = res.plans[t]
        if fplan is None:
            fplan = build_fp8_plan(
                default_plan(q[t], w[t], kbar[a_ : min(b_, a_ + 1024)]), q[t], w[t], model, form
            )
        if plan_hook is not None:
            fplan = plan_hook(fplan)
        kb = kbar[a_:b_]
        al = scale[a_:b_].astype(np.float64)
        rh = rho[a_:b_].astype(np.float64)
        U = screen_bound(fplan, kb, scale[a_:b_], rho[a_:b_])
        computed_min = min(computed_min, float(np.min(U - s_ref)))
        iv = interval_margins(fplan, q[t], w[t], kb, al, rh, model)
        m = iv["margin"]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(iv["scale"] > 0, m / iv["scale"], np.where(m >= 0, np.inf, -np.inf))
        n_pairs += m.size
        min_margin = min(min_margin, float(np.min(m)))
        min_rel = min(min_rel, float(np.min(rel)))
        rel_hist.append(rel[np.isfinite(rel)])
        # Exact checks: sample + small margins.
        pick = set(rng.choice(m.size, size=min(sample // max(Qn, 1) + 1, m.size), replace=False))
        small = np.flatnonzero((m < small_margin * iv["scale"]) | ~np.isfinite(m))
        pick.update(small[: max(0, max_exact - n_exact)].tolist())
        bad_ids, bad_m = [], []
        for i in sorted(pick):
            ex = exact_margin(fplan, q[t], w[t], kb[i], al[i], rh[i], model, U[i], s_ref[i])
            n_exact += 1
            if ex["scale"] > 0:
                min_exact_rel = min(min_exact_rel, float(ex["margin"] / ex["scale"]))
            if ex["margin"] < 0 or ex["computed_margin"] < 0:
                bad_ids.append(a_ + i)
                bad_m.append(ex["margin"])
        if bad_ids:
            path = None
            if out:
                os.makedirs(out, exist_ok=True)
                path = os.path.join(out, f"violation_q{t}.npz")
                sel = np.asarray(bad_ids) - a_
                _write_violation(
                    path,
                    t,
                    q[t],
                    w[t],
                    payload[bad_ids],
                    scale[bad_ids],
                    rho[bad_ids],
                    bad_ids,
                    fplan,
                    model,
                    [bad_m[j] for j in range(len(bad_ids))],
                )
                del sel
            violations.append(
                {
                    "query": t,
                    "keys": [int(x) for x in bad_ids[:20]],
                    "count": len(bad_ids),
                    "min_margin": float(min(bad_m)),
                    "file": path,
                }
            )
        # Guard cost at τ* (exact K-th score) and slack decomposition.
        if top.size == K and fplan.plan is not None:
            tau_star = sc[-1]
            outside = np.ones(b_ - a_, dtype=bool)
            outside[top - a_] = False
            Ue = upper_bound(fplan.plan, k[a_:b_], form, "none")
            surv["guard"] += int(np.sum((U >= tau_star) & outside))
            surv["exact"] += int(np.sum((Ue >= tau_star) & outside))
            surv["screened"] += int(outside.sum())
            sub = rng.choice(b_ - a_, size=min(512, b_ - a_), replace=False)
            parts = slack_parts(
                fplan, q[t], w[t], k[a_:b_][sub], kb[sub], al[sub], rh[sub], U[sub], s_ref[sub]
            )
            for name, v in parts.items():
                parts_acc[name] = parts_acc.get(name, 0.0) + float(np.sum(v))
            parts_n += sub.size
        prog("check", t + 1, Qn)

    T = res.stats.totals()
    report = {
        "queries": Qn,
        "keys": N,
        "H": H,
        "D": D,
        "K": K,
        "form": form,
        "scale_fmt": scale_fmt,
        "error_model": model.to_dict(),
        "pairs_interval": n_pairs,
        "pairs_exact": n_exact,
        "violations": violations,
        "n_violations": int(sum(v["count"] for v in violations)),
        "ids_match_full_scoring": bool(np.array_equal(res.ids, ref_ids)),
        "min_margin_interval": min_margin,
        "min_margin_interval_rel": min_rel,
        "min_margin_exact_rel": min_exact_rel,
        "min_computed_margin": computed_min,
        "survival_guard_seed_tau": T.get("survival"),
        "survival_exact_seed_tau": T.get("survival_exact"),
        "guard_cost_pp_seed_tau": T.get("guard_cost_pp"),
        "survival_guard_tau_star": surv["guard"] / surv["screened"] if surv["screened"] else None,
        "survival_exact_tau_star": surv["exact"] / surv["screened"] if surv["screened"] else None,
        "recovered_queries": T.get("recovered"),
        "slack_mean": {k_: v / parts_n for k_, v in parts_acc.items()} if parts_n else {},
    }
    if report["survival_guard_tau_star"] is not None:
        report["guard_cost_pp_tau_star"] = 100.0 * (
            report["survival_guard_tau_star"] - report["survival_exact_tau_star"]
        )
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "audit.json"), "w") as f:
            json.dump(report, f, indent=2, default=float)
        with open(os.path.join(out, "audit.md"), "w") as f:
            f.write(format_markdown(report))
        report["png"] = _plot(out, np.concatenate(rel_hist) if rel_hist else np.zeros(0), report)
    return report


def format_markdown(rep: dict) -> str:
    lines = [
        "# DoSA guard audit",
        "",
        f"{rep['queries']} queries × {rep['keys']} keys, H={rep['H']}, D={rep['D']}, "
        f"K={rep['K']}, form={rep['form']}, scales={rep['scale_fmt']}",
        "",
        f"Error model: `{json.dumps(rep['error_model'])}`",
        "",
        "| check | value |",
        "|---|---|",
        f"| pairs checked (interval, all) | {rep['pairs_interval']} |",
        f"| pairs checked (exact rationals) | {rep['pairs_exact']} |",
        f"| violations | {rep['n_violations']} |",
        f"| ids == full scoring of the FP8 keys | {rep['ids_match_full_scoring']} |",
        f"| min dominance margin (interval, absolute) | {rep['min_margin_interval']:.4g} |",
        f"| min dominance margin / pair scale (interval) | {rep['min_margin_interval_rel']:.4g} |",
        f"| min dominance margin / pair scale (exact) | {rep['min_margin_exact_rel']:.4g} |",
        f"| min U^num − s^ref (computed, CPU) | {rep['min_computed_margin']:.4g} |",
    ]
    for key, label in (
        ("survival_exact_seed_tau", "survival, exact-arithmetic certificate (seed τ)"),
        ("survival_guard_seed_tau", "survival, numerical certificate U^num (seed τ)"),
        ("guard_cost_pp_seed_tau", "guard cost, percentage points (seed τ)"),
        ("survival_exact_tau_star", "survival, exact certificate (τ*)"),
        ("survival_guard_tau_star", "survival, U^num (τ*)"),
        ("guard_cost_pp_tau_star", "guard cost, percentage points (τ*)"),
    ):
        v = rep.get(key)
        if v is not None:
            lines.append(f"| {label} | {v:.4g} |")
    if rep["slack_mean"]:
        lines += [
            "",
            "## Mean slack U^num − s^ref, decomposed (score units)",
            "",
            "| part | mean |",
            "|---|---|",
        ]
        for k_, v in rep["slack_mean"].items():
            lines.append(f"| {k_} | {v:.4g} |")
    if rep["violations"]:
        lines += ["", "## Violations", ""]
        for v in rep["violations"]:
            lines.append(f"- query {v['query']}: {v['count']} keys, file `{v['file']}`")
    return "\n".join(lines) + "\n"


def _plot(out: str, rel: np.ndarray, rep: dict):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("audit: matplotlib is not installed; skipping the PNG", file=sys.stderr)
        return None
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    pos = rel[rel > 0]
    if pos.size:
        ax[0].hist(np.log10(pos), bins=60)
    ax[0].set_xlabel("log10(dominance margin / pair scale)")
    ax[0].set_ylabel("pairs")
    ax[0].set_title(f"margins ({int(np.sum(rel <= 0))} ≤ 0)")
    sm = rep["slack_mean"]
    names = [k_ for k_ in sm if k_ != "total"]
    ax[1].barh(names, [sm[k_] for k_ in names])
    ax[1].set_xlabel("mean slack (score units)")
    ax[1].set_title("slack decomposition of U^num − s^ref")
    fig.tight_layout()
    path = os.path.join(out, "audit.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def audit_replay(path: str) -> dict:
    """Re-check a violation file: exact margins with the stored plan and with a plan
    rebuilt from the stored query, R, A and options by the current code."""
    d = np.load(path, allow_pickle=False)
    model = ErrorModel.from_dict(json.loads(str(d["model"])))
    q_t, w_t = d["q_t"], d["w_t"]
    kb = e4m3_values(d["payload"])
    stored = _plan_from_stored(d)
    opts = PlanOptions(**json.loads(str(d["plan_options"])))
    plan = build_plan(q_t, w_t, np.full(q_t.shape[0], 0.5), 1, opts, R=d["plan_R"], A=d["plan_A"])
    rebuilt = build_fp8_plan(plan, q_t, w_t, model, stored["form"])
    out = {"file": path, "keys": d["key_ids"].tolist()}
    for name, fp in (("stored", stored), ("rebuilt", rebuilt)):
        ms = [
            exact_margin(fp, q_t, w_t, kb[i], d["scale"][i], d["rho"][i], model)["margin"]
            for i in range(kb.shape[0])
        ]
        out[name] = {
            "violations": int(sum(m < 0 for m in ms)),
            "min_margin": float(min(ms)) if ms else None,
        }
    return out


AUDIT_OUT = os.path.join(tempfile.gettempdir(), "dosa-audit")


def _replay_file_error(path: str) -> str | None:
    """Why ``path`` is not a violation file of ``audit`` (a reason, one line), or None."""
    try:
        with np.load(path, allow_pickle=False) as d:
            fields = set(d.files) if isinstance(d, np.lib.npyio.NpzFile) else set()
    except AttributeError:  # a .npy array: np.load returned no context manager
        fields = set()
    except OSError as e:
        return f"cannot read {path!r}: {e}"
    except (ValueError, EOFError, zipfile.BadZipFile):  # numpy's guesses say little here
        return f"{path!r} is not a .npz file"
    if not {"model", "q_t", "w_t", "payload", "key_ids"} <= fields:
        return f"{path!r} is not a violation_q*.npz written by dosa audit"
    return None


def main(argv: list[str] | None = None) -> int:
    """``dosa audit``: audit the numerical guard on a workload, or replay a violation."""
    from .cli import WORKLOAD_FLAGS
    from .cmdline import CommandParser, existing_file, name_in, nonnegative_int, positive_int
    from .workloads import regime_names

    ap = CommandParser(prog="dosa audit", description=main.__doc__)
    ap.add_argument(
        "--workload",
        type=name_in(regime_names(), "regime"),
        default="calibrated",
        metavar="NAME",
        help=f"dosa_ref.workloads regime: {', '.join(regime_names())} (default calibrated)",
    )
    ap.add_argument(
        "--load",
        type=existing_file,
        default=None,
        metavar="FILE",
        help=".npz or .safetensors workload (q, w, k, ks, ke; workloads.save_workload) "
        "instead of --workload",
    )
    ap.add_argument(
        "--queries", type=positive_int, default=16, metavar="Q", help="queries (default 16)"
    )
    ap.add_argument(
        "--keys",
        type=positive_int,
        default=16384,
        metavar="N",
        help="keys of the context, at least Q (default 16,384)",
    )
    ap.add_argument(
        "--heads",
        type=positive_int,
        default=None,
        metavar="H",
        help="heads (default: the regime's)",
    )
    ap.add_argument("--K", type=positive_int, default=2048, help="selection size (default 2048)")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="workload seed (default 0)")
    ap.add_argument(
        "--out",
        default=AUDIT_OUT,
        metavar="DIR",
        help="directory for audit.json, audit.md, audit.png and violation_q*.npz, created if "
        f"missing (default {AUDIT_OUT}, under the system temp dir: a run leaves nothing in "
        "the current directory)",
    )
    ap.add_argument(
        "--replay",
        type=existing_file,
        default=None,
        metavar="FILE",
        help="re-check a violation_q*.npz of an earlier audit (the other flags are ignored)",
    )
    ap.add_argument(
        "--scale-fmt", default="amax", choices=("amax", "ue8m0"), help="key scales (default amax)"
    )
    ap.add_argument(
        "--form", default="base", choices=("base", "abs"), help="bound form (default base)"
    )
    ap.add_argument(
        "--kept-bits",
        type=positive_int,
        default=None,
        metavar="W",
        help="truncating MMA kept bits W (default 17, Hopper FP8)",
    )
    ap.add_argument("--fp8-queries", action="store_true", help="quantize queries (folded)")
    ap.add_argument(
        "--sample",
        type=nonnegative_int,
        default=256,
        help="random pairs also checked in exact arithmetic (default 256)",
    )
    a = ap.parse_args(argv)
    if a.replay:
        why = _replay_file_error(a.replay)
        if why:
            ap.error(f"--replay: {why}")
        rep = audit_replay(a.replay)
        print(json.dumps(rep, indent=2))
        return 1 if rep["rebuilt"]["violations"] else 0
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out: {a.out!r} is a file, not a directory")
    if not a.load and a.queries > a.keys:
        ap.error(f"--queries: {a.queries} queries cannot exceed the context (--keys {a.keys})")
    if a.load:
        from .workloads import load_workload

        try:
            wl = load_workload(a.load)
        except ValueError as e:  # every one is about the file (its format or its tensors)
            ap.error(f"--load: {str(e).removeprefix('path: ')}")
    else:
        from .workloads import make_workload

        kw = {"seed": a.seed}
        if a.heads is not None:
            kw["H"] = a.heads
        with ap.value_errors(**WORKLOAD_FLAGS, name="--workload"):
            wl = make_workload(a.workload, a.queries, a.keys, **kw)
    q, w, p, s, ks, ke = _unpack(wl, a.scale_fmt)
    if a.fp8_queries:
        from .fp8 import quantize_queries

        qp, wf = quantize_queries(q, w, a.scale_fmt)
        q, w = e4m3_values(qp), wf.astype(np.float64)
    model = ErrorModel.hopper_fp8() if a.kept_bits is None else ErrorModel.hopper_fp8(a.kept_bits)
    from .progress import Progress

    Qn = np.asarray(q).shape[0]
    with Progress(2 * Qn, "audit") as bar:
        rep = audit(
            (q, w, p, s, ks, ke),
            K=a.K,
            scale_fmt=a.scale_fmt,
            error_model=model,
            form=a.form,
            sample=a.sample,
            out=a.out,
            progress=lambda *_: bar.update(1),
            seed=a.seed,
        )
    print(format_markdown(rep))
    print(
        f"written to {a.out}/ (audit.json, audit.md" + (", audit.png)" if rep.get("png") else ")")
    )
    return 1 if rep["n_violations"] or not rep["ids_match_full_scoring"] else 0


if __name__ == "__main__":
    from .cmdline import run_command

    sys.exit(run_command("dosa audit", main, sys.argv[1:]))
