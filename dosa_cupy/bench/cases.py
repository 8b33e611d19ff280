"""Small GPU runs to put under an external tool: ``dosa bench --case NAME``.

    compute-sanitizer --tool memcheck python3 -m dosa_cupy.bench --case sanitizer
    ncu -k regex:screen --launch-count 1 python3 -m dosa_cupy.bench --case screen
    ncu -k regex:dense_logits --launch-count 1 python3 -m dosa_cupy.bench --case dense-logits

``sanitizer``: tiny calibrated (H=32) and structured (H=64) workloads, a records buffer of
16 so that the overflow and recovery paths run too, DoSA and the fused route with and
without caller seeds; exit code 1 unless every route's ids equal the dense route's.
``screen`` / ``dense-logits``: one call at a size where the kernel's launch is typical.
Commands and the whole device run: docs/running_on_gpu.md.
"""

from __future__ import annotations

from dosa_ref.cmdline import CommandParser

SANITIZER_SHAPES = ((32, "calibrated"), (64, "structured"))  # (H, regime), Qn=16, N=4096


def sanitizer() -> int:
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    ok = True
    for H, regime in SANITIZER_SHAPES:
        wl = make_gpu_workload(regime, 16, 4096, H, seed=1)
        a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
        dense = dosa_cupy.dense_topk(*a)
        seeds = cp.random.RandomState(3).randint(-1, 4096, (16, 300)).astype(cp.int32)
        for kw in ({}, {"seed_ids": seeds}):
            ids = dosa_cupy.dosa_topk(*a, buffer=16, route="dosa", **kw)  # the screen, not dense
            fused = dosa_cupy.fused_topk(*a, **kw)
            same = bool(cp.array_equal(dense, ids) and cp.array_equal(dense, fused))
            ok &= same
            print(f"sanitizer-case H={H} {regime} seed_ids={'seed_ids' in kw}: ids equal {same}")
    return 0 if ok else 1


def screen() -> int:
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("calibrated", 1024, 262144, 32, seed=1)
    dosa_cupy.dosa_topk(
        wl["q"],
        wl["w"],
        wl["k_payload"],
        wl["k_scale"],
        2048,
        wl["ks"],
        wl["ke"],
        r=14,
        route="dosa",
    )
    cp.cuda.Device().synchronize()
    return 0


def dense_logits() -> int:
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("gaussian", 1024, 131072, 32, seed=1, causal=False)
    dosa_cupy.dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"])
    cp.cuda.Device().synchronize()
    return 0


CASES = {"sanitizer": sanitizer, "screen": screen, "dense-logits": dense_logits}


def main(argv=None) -> int:
    ap = CommandParser(prog="dosa bench --case", description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(CASES))
    return CASES[ap.parse_args(argv).name]()
