"""PNG figures of ``dosa bench`` rows (matplotlib, Agg backend, if installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .memplan import FP8_PEAK, HBM, ROUTES, x_floor
from .shapes import DOSA_STAGES, sort_key

SPEED_TICKS = (0.25, 0.5, 1.0, 2.0, 4.0)
ROUTE_LABEL = {
    "logits": "logits",
    "select": "own select",
    "torch_topk": "torch.topk",
    "dense_route": "dense route",
    "fused": "fused",
    "dosa": "DoSA",
}


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
    done = sorted((r for r in rows if "skipped" not in r), key=sort_key)
    tiles = sorted({r.get("tile", 0) for r in rows})
    regimes = list(dict.fromkeys(r.get("regime", "-") for r in sorted(rows, key=sort_key)))

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
