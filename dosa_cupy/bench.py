"""``dosa bench``: the dense route, torch.topk and DoSA on the same inputs in one run
(issue 5).  CUDA events, warm-up, medians over ≥ 10 replays, inputs rotated between
replays, ids cross-checked (DoSA == dense bitwise; torch.topk tie-agnostic: same K-th
value), JSON + markdown output, shape filter.

    python -m dosa_cupy.bench --shapes 32x4096x131072,64x4096x131072 --reps 10 --out DIR
    (shape = HxQnxN; --regime structured|gaussian|...)

TFLOP/s counts 2·H·D multiply-adds per visible (query, key) pair for the dense logits.
Floors (NUMERICS.md ceilings): fp8 MMA 1455 TFLOP/s; HBM copy 4.24 TB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FP8_PEAK = 1455e12
HBM = 4.24e12


def _median_ms(cp, fn, reps, warm=2, rotate=None):
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


def bench_shape(H, Qn, N, K, regime, reps, rot, opts, log):
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.dense import _dense_logits_raw, select_rows
    from dosa_cupy.prepare import check_inputs, pad_heads
    from dosa_cupy.workload import make_gpu_workload

    sets = []
    for i in range(rot):
        wl = make_gpu_workload(regime, Qn, N, H, seed=100 + i)
        for k in ("kf", "qf", "wf"):
            wl.pop(k)
        q, w, kp, ksc, K_, ks, ke = check_inputs(
            wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"]
        )
        qp, wp = pad_heads(q, w)
        sets.append(dict(q=q, w=w, qp=qp, wp=wp, kp=kp, ksc=ksc, ks=ks, ke=ke))
    vis = float(cp.sum((sets[0]["ke"] - sets[0]["ks"]).astype(cp.float64)))
    flops = 2.0 * H * 128 * vis
    res = dict(H=H, Qn=Qn, N=N, K=K, regime=regime, visible_pairs=vis, dense_flop=flops)

    lg_holder = {}

    def logits(s):
        lg_holder["lg"] = _dense_logits_raw(s["qp"], s["wp"], s["kp"], s["ksc"], s["ks"], s["ke"])

    res["logits_ms"], _ = _median_ms(cp, logits, reps, rotate=sets)
    res["logits_tflops"] = flops / res["logits_ms"] / 1e9
    # floors: MMA floor and the logits write (Qn·N·4 bytes) + keys read
    res["logits_floor_ms"] = max(flops / FP8_PEAK, (Qn * N * 4 + N * 132) / HBM) * 1e3
    lgs = [
        _dense_logits_raw(s["qp"], s["wp"], s["kp"], s["ksc"], s["ks"], s["ke"]) for s in sets[:1]
    ]
    s0 = sets[0]

    def own_select(_):
        lg_holder["ids"] = select_rows(lgs[0], K, s0["ks"], s0["ke"])

    res["select_ms"], _ = _median_ms(cp, own_select, reps)
    res["select_floor_ms"] = (Qn * N * 4) / HBM * 1e3
    dense_ids = select_rows(lgs[0], K, s0["ks"], s0["ke"])
    try:
        import torch

        tl = torch.from_dlpack(lgs[0])

        def ttopk(_):
            torch.topk(tl, K, dim=1)

        res["torch_topk_ms"], _ = _median_ms(cp, ttopk, reps)
        tv, _ti = torch.topk(tl, K, dim=1)
        own_vals = cp.take_along_axis(lgs[0], cp.maximum(dense_ids, 0).astype(cp.int64), axis=1)
        res["torch_kth_match"] = bool(
            cp.all(cp.asarray(tv[:, -1]) == own_vals[:, -1]) | cp.any(dense_ids < 0, axis=1).all()
        )
    except ImportError:
        res["torch_topk_ms"] = None
    lgs.clear()

    def dense_route(s):
        dosa_cupy.dense.__dict__["_dense_topk_raw"](
            s["qp"], s["wp"], s["kp"], s["ksc"], K, s["ks"], s["ke"]
        )

    res["dense_route_ms"], _ = _median_ms(cp, dense_route, reps, rotate=sets)

    def dosa(s):
        lg_holder["dosa"] = dosa_cupy.dosa_topk(
            s["q"], s["w"], s["kp"], s["ksc"], K, s["ks"], s["ke"], **opts
        )

    res["dosa_ms"], _ = _median_ms(cp, dosa, reps, rotate=sets)

    def fused(s):
        lg_holder["fused"] = dosa_cupy.fused_topk(
            s["q"], s["w"], s["kp"], s["ksc"], K, s["ks"], s["ke"]
        )

    res["fused_ms"], _ = _median_ms(cp, fused, reps, rotate=sets)
    fids, fst = dosa_cupy.fused_topk(
        s0["q"], s0["w"], s0["kp"], s0["ksc"], K, s0["ks"], s0["ke"], return_stats=True,
        timing=True,
    )  # fmt: skip
    res["fused_ids_equal_dense"] = bool(cp.array_equal(fids, dense_ids))
    res["fused_stage_ms"] = fst.stage_ms
    ids, st = dosa_cupy.dosa_topk(
        s0["q"], s0["w"], s0["kp"], s0["ksc"], K, s0["ks"], s0["ke"], return_stats=True,
        timing=True, **opts,
    )  # fmt: skip
    res["dosa_ids_equal_dense"] = bool(cp.array_equal(ids, dense_ids))
    res["dosa_stage_ms"] = st.stage_ms
    scr = np.maximum(st.screened, 1)
    res["survival_mean"] = float(np.mean(st.survivors / scr))
    res["survival_p90"] = float(np.quantile(st.survivors / scr, 0.9))
    res["kept_mean"] = float(st.kept.mean())
    res["overflowed"] = int(st.overflowed.sum())
    res["recovered"] = int(st.recovered.sum())
    res["speedup_vs_dense"] = res["dense_route_ms"] / res["dosa_ms"]
    res["speedup_vs_fused"] = res["fused_ms"] / res["dosa_ms"]
    log(json.dumps(res))
    return res


def markdown(rows):
    head = (
        "| tile | H | Qn | N | logits ms | TFLOP/s | select ms | torch.topk ms | dense route ms "
        "| fused ms | DoSA ms | DoSA speedup vs dense | vs fused | survival | ids equal |\n|"
        + "---|" * 15
        + "\n"
    )
    out = [head]
    for r in rows:
        tt = r.get("torch_topk_ms")
        out.append(
            f"| {r.get('tile', 128)} | {r['H']} | {r['Qn']} | {r['N']} | {r['logits_ms']:.2f} | "
            f"{r['logits_tflops']:.0f} | {r['select_ms']:.2f} | "
            f"{'-' if tt is None else f'{tt:.2f}'} | {r['dense_route_ms']:.2f} | "
            f"{r['fused_ms']:.2f} | {r['dosa_ms']:.2f} | {r['speedup_vs_dense']:.2f} | "
            f"{r['speedup_vs_fused']:.2f} | {r['survival_mean']:.4f} | "
            f"{r['dosa_ids_equal_dense'] and r['fused_ids_equal_dense']} |\n"
        )
    return "".join(out)


def plots(rows, out: Path) -> list[Path]:
    """PNG plots (matplotlib, if installed): DoSA speedup heatmap over context × chunk per
    H and tile (like the paper's Fig. 4), time split by stage, survival per shape."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    groups = sorted({(r["H"], r.get("tile", 0), r["regime"]) for r in rows})
    for H, tile, regime in groups:
        rs = [r for r in rows if r["H"] == H and r.get("tile", 0) == tile and r["regime"] == regime]
        Ns = sorted({r["N"] for r in rs})
        Qs = sorted({r["Qn"] for r in rs})
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for ax, key, title in (
            (axes[0], "speedup_vs_dense", "DoSA speedup vs dense route"),
            (axes[1], "speedup_vs_fused", "DoSA speedup vs fused route"),
        ):
            grid = np.full((len(Qs), len(Ns)), np.nan)
            for r in rs:
                grid[Qs.index(r["Qn"]), Ns.index(r["N"])] = r[key]
            im = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=2.0, origin="lower")
            for i in range(len(Qs)):
                for j in range(len(Ns)):
                    if np.isfinite(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(Ns)), [f"{n // 1024}K" for n in Ns])
            ax.set_yticks(range(len(Qs)), [str(q) for q in Qs])
            ax.set_xlabel("context N (keys)")
            ax.set_ylabel("query chunk Qn")
            ax.set_title(f"{title}\nH={H}, {regime}, tile {tile}", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        f = out / f"speedup_H{H}_{regime}_t{tile}.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        files.append(f)
    # stage split and survival, one bar per row
    labels = [f"H{r['H']} Q{r['Qn']} N{r['N'] // 1024}K t{r.get('tile', 0)}" for r in rows]
    stages = ["prepare", "seeds", "plan", "screen", "refine", "select", "recover"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5))
    left = np.zeros(len(rows))
    for st in stages:
        v = np.array([r["dosa_stage_ms"].get(st, 0.0) for r in rows])
        axes[0].barh(labels, v, left=left, label=st)
        left += v
    axes[0].plot([r["dense_route_ms"] for r in rows], labels, "k|", ms=14, label="dense route")
    axes[0].set_xlabel("ms")
    axes[0].set_title("DoSA time by stage (timing run, synchronized per stage)", fontsize=9)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[1].barh(labels, [r["survival_mean"] for r in rows], color="tab:orange")
    axes[1].set_xlabel("mean survival (screened keys kept)")
    axes[1].set_xlim(0, 1)
    fig.tight_layout()
    f = out / "stages_survival.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    files.append(f)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="dosa bench", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="32x4096x131072,64x4096x131072", help="HxQnxN,...")
    ap.add_argument("--filter", default=None, help="only shapes whose HxQnxN contains this")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument(
        "--regime",
        default="calibrated",
        help="dosa_cupy.workload regime or a dosa_ref.workloads regime (calibrated first)",
    )
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rotate", type=int, default=2)
    ap.add_argument("--r", type=int, default=14, help="retained heads (14: one 16-row tile)")
    ap.add_argument("--out", default=None, help="directory for bench.json / bench.md")
    ap.add_argument("--tile", default="256", help="key tile sizes to run, e.g. 128,256")
    a = ap.parse_args(argv)
    if a.reps < 10:
        raise ValueError(f"reps: at least 10 replays, got {a.reps}")
    if a.regime == "calibrated":
        try:
            import dosa_ref.workloads  # noqa: F401
        except ImportError:
            print("# dosa_ref.workloads unavailable: regime 'structured' instead of 'calibrated'")
            a.regime = "structured"
    from dosa_cupy._build import set_tile

    rows = []
    for tile in (int(x) for x in a.tile.split(",")):
        set_tile(tile)
        for sh in a.shapes.split(","):
            if a.filter and a.filter not in sh:
                continue
            H, Qn, N = (int(x) for x in sh.split("x"))
            r = a.r
            t0 = time.time()
            row = bench_shape(
                H, Qn, N, a.K, a.regime, a.reps, a.rotate, {"r": r}, lambda s: print(s)
            )
            row["tile"] = tile
            rows.append(row)
            print(f"# {sh} tile={tile} done in {time.time() - t0:.1f}s", flush=True)
    md = markdown(rows)
    for r in rows:
        md += (
            f"\nstages H={r['H']} Qn={r['Qn']} N={r['N']}: DoSA "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["dosa_stage_ms"].items())
            + "; fused "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["fused_stage_ms"].items())
            + "\n"
        )
    print(md)
    if a.out:
        p = Path(a.out)
        p.mkdir(parents=True, exist_ok=True)
        (p / "bench.json").write_text(json.dumps(rows, indent=1))
        (p / "bench.md").write_text(md)
        for f in plots(rows, p):
            print(f"# wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
