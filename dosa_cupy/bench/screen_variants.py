"""``dosa bench --screen-variants [--H 32] [--N 1048576] [--Qn 4096] [--only A,B] [--wgt | --fp8
[--r 6|14|30]] [--out DIR]``: the screen kernels on one captured launch of a calibrated DoSA
call — ``screen_mt1`` (mma.sync) and builds of the Hopper screen (``csrc/screen_sm90a.cu``:
warpgroups per block, fp32 pre-test) — timed with CUDA events (median of 10 after 2 warm-ups) on
the same arguments, each build's survivor bitmask compared bitwise with ``screen_mt1``'s.
``--wgt``: the transposed screen instead (``csrc/screen_wgt.cu``, the launch of a
``screen="wgt"``, r = 6 call: its 8-row build) — the default build and the builds of
``WGT_VARIANTS`` (staging, accumulators, warpgroups, queries per block, the ring build — its
image kernel and the screen timed together), each compared bitwise with the default's words.
``--fp8``: the FP8 build's fp32-guard kernel (``screen="wgt"``, r = ``--r``, its captured launch,
the group images built by the call) against its builds of ``FP8_VARIANTS`` on the same arguments,
with the MMA work's rate and its share of the FP8 tensor-core rate. Method:
docs/benchmark_method.md; records: docs/records/benchmarks.md "Hopper screen" and the nineteenth
session's section."""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from dosa_ref.cmdline import CommandParser

from .memplan import FP8_PEAK
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
FP8_RATE_TFLOPS = FP8_PEAK / 1e12
# name → (screen_wgt.cu's defines, warpgroups per block, queries per block, the ring build:
# screen_wgt_image_rows* then screen_wgt_ring_rows*): its builds
WGT_VARIANTS = {
    "stage8": (("DOSA_WGT_STAGE8=1",), 3, 384, False),
    "one_acc": (("DOSA_WGT_TWO_ACC=0",), 3, 384, False),
    "g2": (("DOSA_WGT_GROUPS=2",), 2, 384, False),
    "qg768": ((), 3, 768, False),
    "stage8_qg768": (("DOSA_WGT_STAGE8=1",), 3, 768, False),
    "words": (("DOSA_WGT_WORDS=1",), 3, 384, False),
    "stage8_words": (("DOSA_WGT_STAGE8=1", "DOSA_WGT_WORDS=1"), 3, 384, False),
    "ring": ((), 3, 384, True),
    "ring_qg768": ((), 3, 768, True),
}

# name → the kernel's suffix (screen_wgt.cu's FP8 ring builds): the fp32 guard's kernel with
# and without the pipelined halves, the fp64 guard (the default build's own is skipped)
FP8_VARIANTS = {"g32p": "_g32p", "g32": "_g32", "f64": ""}


def wgt_words_bytes(defines, rows: int, tile_keys: int) -> int:
    """The shared memory a ``DOSA_WGT_WORDS=1`` build adds (screen_wgt.cu Rows::kWordsBytes,
    its 8- and 16-row builds: two buffers of Q queries' tile words and rows t), else 0."""
    if "DOSA_WGT_WORDS=1" not in defines or rows == 32:
        return 0
    q = 128 // rows
    return 2 * (q * (tile_keys // 32) + q) * 4


def groups_of(defines) -> int:
    return int(next(d for d in defines if d.startswith("DOSA_WG_GROUPS=")).split("=")[1])


def _median_ms(cp, launch) -> float:
    """Median of 10 timed launches after 2 warm-ups (the bench's own ``timing.median_ms``)."""
    return median_ms(cp, lambda _: launch(), reps=10)[0]


def _selected(only: str | None, known: dict) -> list:
    """The variant names of ``--only`` (default: all of ``known``)."""
    names = only.split(",") if only else list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; known: {list(known)}")
    return names


def _timed_build(cp, launch, surv, ref) -> tuple[bool, float]:
    """(survivor words equal to ``ref``, median ms) of a variant's ``launch`` writing
    ``surv`` (filled with a pattern first, so an unwritten word differs)."""
    surv.fill(0xDEADBEEF)
    launch()
    return bool(cp.array_equal(surv, ref)), _median_ms(cp, launch)


def _write(out: str | None, name: str, res: dict) -> None:
    """``res`` as ``out``/``name`` (JSON) where ``--out`` is given."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as fh:
            json.dump(res, fh, indent=1)


def capture_screen(args_, cp, **options):
    """(kernel, grid, block, args, shared_mem, name) of the screen launch of one DoSA call
    (default ``screen="fp64"``, r = 14; ``options`` replace them)."""
    import dosa_cupy
    from dosa_cupy import screen

    cap, orig = {}, screen.kernel

    def recording(name, smem=0, spec=None):
        f = orig(name, smem, spec)

        def run(grid, block, a, shared_mem=0):
            if name.startswith("screen"):
                cap["screen"] = (f, grid, block, a, shared_mem, name)
            return f(grid, block, a, shared_mem=shared_mem)

        return run

    screen.kernel = recording
    try:
        # screen_mt1 at r = 14, whatever "auto" would pick: the variants are timed against it
        dosa_cupy.dosa_topk(*args_, **{"screen": "fp64", "r": 14, "route": "dosa", **options})
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
    ap.add_argument("--r", type=int, default=6, choices=(6, 14, 30),
                    help="--fp8: the plan's retained heads (6: the 8-row build, 14: 16 rows, "
                    "30: 32 rows)")  # fmt: skip
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--wgt", action="store_true", help="the transposed screen's builds")
    which.add_argument("--fp8", action="store_true", help="the FP8 screen's builds")
    a = ap.parse_args(argv)
    import cupy as cp

    from dosa_cupy import _build, sm90a
    from dosa_cupy._build import tile
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("calibrated", a.Qn, a.N, a.H, seed=11)
    args_ = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
    if a.wgt:
        return _wgt_main(a, args_, cp)
    if a.fp8:
        return _fp8_main(a, args_, wl, cp)
    f, grid, block, kargs, smem, _ = capture_screen(args_, cp)
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
    for name in _selected(a.only, VARIANTS):
        defs = VARIANTS[name]
        g = _build.kernel("screen_wg_mt1", sm90a.smem_bytes(T), sm90a.spec(T, defs))
        qg = 96 if groups_of(defs) == 3 else 128  # queries per block (4 per warpgroup)
        ga = list(kargs)
        ga[QG_ARG] = np.int32(qg)
        gg, gb = (grid[0], (a.Qn + qg - 1) // qg), (128 * groups_of(defs),)
        launch = functools.partial(g, gg, gb, tuple(ga), shared_mem=sm90a.smem_bytes(T))
        same, ms = _timed_build(cp, launch, surv, ref)
        res["variants"][name] = {"ms": ms, "survivors_equal": same, "defines": list(defs)}
        print(f"{name:8s} {ms:7.2f} ms  x{res['mt1_ms'] / ms:.2f} vs mt1  "
              f"{flop / ms / 1e9:.0f} TFLOP/s  survivors equal: {same}")  # fmt: skip
    _write(a.out, f"screen_variants_H{a.H}_N{a.N}.json", res)
    exact = [v for n, v in res["variants"].items() if not n.startswith("diag_")]
    return 0 if all(v["survivors_equal"] for v in exact) else 1


def _ring_launch(cp, spec, nrow: int, grid, args: tuple, Qn: int):
    """The ring build on the default build's arguments ``args`` (surv and Uout last): one
    launch of screen_wgt_image_rows{nrow} (an image per query group) and one of
    screen_wgt_ring_rows{nrow}, as screen.ScreenLaunch makes them."""
    from dosa_cupy import _build, screen

    groups = -(-Qn // (128 // nrow))
    image = cp.empty(groups * screen.wgt_image_bytes(nrow), dtype=cp.uint8)
    sm = screen.wgt_ring_smem_bytes(nrow)
    img = _build.kernel(f"screen_wgt_image_rows{nrow}", 0, spec)
    ring = _build.kernel(f"screen_wgt_ring_rows{nrow}", sm, spec)
    null = np.uint64(0)
    block = (screen.WGT_THREADS,)

    def launch():
        img((groups,), block, args[:-2] + (null, null, image))
        ring(grid, block, args + (image,), shared_mem=sm)

    return launch


def _wgt_main(a, args_, cp) -> int:
    """``--wgt``: the transposed screen's default build against ``WGT_VARIANTS``."""
    from dosa_cupy import _build, screen

    # the plain default build (tie_reject off: the _tie variants take two more arguments;
    # the ring build off whatever screen.WGT_RING says: it is a variant here)
    ring_on, screen.WGT_RING = screen.WGT_RING, False
    try:
        f, grid, block, kargs, smem, name = capture_screen(args_, cp, screen="wgt", r=6,
                                                           tie_reject=False)  # fmt: skip
    finally:
        screen.WGT_RING = ring_on
    nrow = int(name.removeprefix("screen_wgt_rows"))
    surv = kargs[SURV]
    surv.fill(0xDEADBEEF)
    f(grid, block, kargs, shared_mem=smem)
    ref = surv.copy()
    ms0 = _median_ms(cp, lambda: f(grid, block, kargs, shared_mem=smem))
    res = {"H": a.H, "N": a.N, "Qn": a.Qn, "kernel": name, "default_ms": ms0}
    print(f"{name} (default build) {res['default_ms']:.2f} ms")
    res["variants"] = {}
    for vname in _selected(a.only, WGT_VARIANTS):
        defs, groups, qg, ring = WGT_VARIANTS[vname]
        tile_keys = 128 * groups
        sm = screen.wgt_smem_bytes(nrow, tile_keys) + wgt_words_bytes(defs, nrow, tile_keys)
        spec = _build.KernelSpec("screen_wgt.cu", defs, sm90a=True)
        ga = list(kargs)
        ga[QG_ARG] = np.int32(qg)
        gg = (-(-a.N // tile_keys), -(-a.Qn // qg))
        if ring:
            launch = _ring_launch(cp, spec, nrow, gg, tuple(ga), a.Qn)
        else:
            g = _build.kernel(f"screen_wgt_rows{nrow}", sm, spec)
            launch = functools.partial(g, gg, (128 * groups,), tuple(ga), shared_mem=sm)
        same, ms = _timed_build(cp, launch, surv, ref)
        res["variants"][vname] = {"ms": ms, "survivors_equal": same, "defines": list(defs),
                                  "groups": groups, "qg": qg, "ring": ring}  # fmt: skip
        print(f"{vname:12s} {ms:7.2f} ms  x{res['default_ms'] / ms:.3f} vs default  "
              f"survivors equal: {same}")  # fmt: skip
    _write(a.out, f"screen_variants_wgt_H{a.H}_N{a.N}.json", res)
    return 0 if all(v["survivors_equal"] for v in res["variants"].values()) else 1


def _fp8_main(a, args_, wl, cp) -> int:
    """``--fp8``: the FP8 build's default fp32-guard kernel of ``--r``
    (``screen_wgt_fp8_ring_rows{n}_g32p``, or ``_g32`` without ``screen.WGT_PIPE``) against
    the other ``FP8_VARIANTS`` on its captured launch (the
    f64 guard's words differ where the two guards fall on either side of τ; any other build's
    are compared bitwise).  The MMA work is
    counted as issued: every block's key tile against every query of its block row, the
    build's plan rows per query (8, 16 or 32), 128 dims; the share is of the FP8 rate that
    docs/numerics.md measured on the H200 (1,455 TFLOP/s)."""
    from dosa_cupy import _build, screen

    f, grid, block, kargs, smem, name = capture_screen(args_, cp, screen="wgt", r=a.r,
                                                       tie_reject=False)  # fmt: skip
    own = "_g32p" if screen.WGT_PIPE else "_g32"
    if not name.endswith(own):
        raise ValueError(f"--fp8: the call screened with {name}, not the FP8 build's fp32 guard")
    surv = kargs[SURV]
    surv.fill(0xDEADBEEF)
    f(grid, block, kargs, shared_mem=smem)
    ref = surv.copy()
    rows = int(name.removesuffix(own).rsplit("rows", 1)[1])
    qpad = grid[1] * int(kargs[QG_ARG])
    work = float(grid[0] * screen.WGT_TILE) * qpad * rows * 128 * 2  # issued MMA work (flop)
    visible = float(cp.sum(cp.clip(wl["ke"] - wl["ks"], 0, None))) * rows * 128 * 2

    def rates(ms: float) -> dict:
        return {"ms": ms, "tflops_issued": work / ms / 1e9,
                "fp8_rate_share": work / ms / 1e9 / FP8_RATE_TFLOPS,
                "tflops_visible": visible / ms / 1e9}  # fmt: skip

    ms0 = _median_ms(cp, lambda: f(grid, block, kargs, shared_mem=smem))
    res = {"H": a.H, "N": a.N, "Qn": a.Qn, "kernel": name, "default": rates(ms0),
           "variants": {}}  # fmt: skip
    print(f"{name} (default build) {ms0:.2f} ms, {work / ms0 / 1e9:.0f} TFLOP/s issued "
          f"({work / ms0 / 1e9 / FP8_RATE_TFLOPS:.1%} of the FP8 rate)")  # fmt: skip
    for vname in _selected(a.only, FP8_VARIANTS):
        if FP8_VARIANTS[vname] == own:
            continue
        g = _build.kernel(
            f"screen_wgt_fp8_ring_rows{rows}{FP8_VARIANTS[vname]}", smem, screen.WGT_SPEC
        )
        launch = functools.partial(g, grid, block, kargs, shared_mem=smem)
        same, ms = _timed_build(cp, launch, surv, ref)
        res["variants"][vname] = {**rates(ms), "survivors_equal": same}
        print(f"{vname:8s} {ms:7.2f} ms  x{ms0 / ms:.3f} vs default  "
              f"{work / ms / 1e9:.0f} TFLOP/s issued  survivors equal: {same}")  # fmt: skip
    # the default again after the variants (a drift of the clocks shows here)
    res["default_again_ms"] = _median_ms(cp, lambda: f(grid, block, kargs, shared_mem=smem))
    print(f"{name} (default build, again) {res['default_again_ms']:.2f} ms")
    res["r"] = a.r
    _write(a.out, f"screen_variants_fp8_H{a.H}_N{a.N}_r{a.r}.json", res)
    exact = [v for n, v in res["variants"].items() if n != "f64"]
    return 0 if all(v["survivors_equal"] for v in exact) else 1
