"""``dosa bench --screen-variants [--H 32] [--N 1048576] [--Qn 4096] [--only A,B] [--out DIR]``: the
screen kernels on one captured launch of a calibrated DoSA call — ``screen_mt1`` (mma.sync)
and builds of the Hopper screen (``csrc/screen_sm90a.cu``: warpgroups per block,
fp32 pre-test) — timed with CUDA events (median of 10 after 2 warm-ups) on the same
arguments, each build's survivor bitmask compared bitwise with ``screen_mt1``'s.  Method:
docs/benchmark_method.md; records: docs/records/benchmarks.md "Hopper screen".
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from dosa_ref.cmdline import CommandParser

from .timing import median_ms

# name → the build's defines (screen_sm90a.cu's knobs; DOSA_WG_GROUPS always given)
VARIANTS = {
    "g2": ("DOSA_WG_GROUPS=2",),
    "g3": ("DOSA_WG_GROUPS=3",),
    "g4": ("DOSA_WG_GROUPS=4",),
    # diagnostic builds (not exact: survivors differ), to split the time of the default
    "diag_noguard": ("DOSA_WG_GROUPS=3", "DOSA_WG_DIAG=1"),
    "diag_noepilogue": ("DOSA_WG_GROUPS=3", "DOSA_WG_DIAG=2"),
    "diag_nomma": ("DOSA_WG_GROUPS=3", "DOSA_WG_DIAG=3"),
    "diag_noreduce": ("DOSA_WG_GROUPS=3", "DOSA_WG_DIAG=4"),
}
SURV, QG_ARG = 18, 17  # positions of surv and QG in the screen kernels' arguments


def groups_of(defines) -> int:
    return int(next(d for d in defines if d.startswith("DOSA_WG_GROUPS=")).split("=")[1])


def _median_ms(cp, launch) -> float:
    """Median of 10 timed launches after 2 warm-ups (the bench's own ``timing.median_ms``)."""
    return median_ms(cp, lambda _: launch(), reps=10)[0]


def capture_screen(args_, cp):
    """(kernel, grid, block, args, shared_mem) of the screen launch of one DoSA call."""
    import dosa_cupy
    from dosa_cupy import screen

    cap, orig = {}, screen.kernel

    def recording(name, smem=0, spec=None):
        f = orig(name, smem, spec)

        def run(grid, block, a, shared_mem=0):
            if name.startswith("screen"):
                cap["screen"] = (f, grid, block, a, shared_mem)
            return f(grid, block, a, shared_mem=shared_mem)

        return run

    screen.kernel = recording
    try:
        # screen_mt1 at r = 14, whatever "auto" would pick: the variants are timed against it
        dosa_cupy.dosa_topk(*args_, screen="fp64", r=14, route="dosa")
    finally:
        screen.kernel = orig
    return cap["screen"]


def main(argv: list[str]) -> int:
    ap = CommandParser(prog="dosa bench --screen-variants", description=__doc__)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--N", type=int, default=1048576)
    ap.add_argument("--Qn", type=int, default=4096)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma list of variant names (default: all)")
    a = ap.parse_args(argv)
    import cupy as cp

    from dosa_cupy import _build, sm90a
    from dosa_cupy._build import tile
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("calibrated", a.Qn, a.N, a.H, seed=11)
    args_ = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
    f, grid, block, kargs, smem = capture_screen(args_, cp)
    surv = kargs[SURV]
    surv.fill(0xDEADBEEF)
    f(grid, block, kargs, shared_mem=smem)
    ref = surv.copy()
    flop = float(cp.sum(cp.clip(wl["ke"] - wl["ks"], 0, None))) * 16 * 128 * 2
    res = {
        "H": a.H,
        "N": a.N,
        "Qn": a.Qn,
        "mt1_ms": _median_ms(cp, lambda: f(grid, block, kargs, shared_mem=smem)),
    }
    print(f"screen_mt1 {res['mt1_ms']:.2f} ms ({flop / res['mt1_ms'] / 1e9:.0f} TFLOP/s MMA work)")
    T, res["variants"] = tile(), {}
    names = a.only.split(",") if a.only else list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; known: {list(VARIANTS)}")
    for name in names:
        defs = VARIANTS[name]
        g = _build.kernel("screen_wg_mt1", sm90a.smem_bytes(T), sm90a.spec(T, defs))
        qg = 96 if groups_of(defs) == 3 else 128  # queries per block (4 per warpgroup)
        ga = list(kargs)
        ga[QG_ARG] = np.int32(qg)
        gg, gb = (grid[0], (a.Qn + qg - 1) // qg), (128 * groups_of(defs),)
        surv.fill(0xDEADBEEF)
        launch = functools.partial(g, gg, gb, tuple(ga), shared_mem=sm90a.smem_bytes(T))
        launch()
        same = bool(cp.array_equal(surv, ref))
        ms = _median_ms(cp, launch)
        res["variants"][name] = {"ms": ms, "survivors_equal": same, "defines": list(defs)}
        print(f"{name:8s} {ms:7.2f} ms  x{res['mt1_ms'] / ms:.2f} vs mt1  "
              f"{flop / ms / 1e9:.0f} TFLOP/s  survivors equal: {same}")  # fmt: skip
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"screen_variants_H{a.H}_N{a.N}.json"), "w") as fh:
            json.dump(res, fh, indent=1)
    exact = [v for n, v in res["variants"].items() if not n.startswith("diag_")]
    return 0 if all(v["survivors_equal"] for v in exact) else 1
