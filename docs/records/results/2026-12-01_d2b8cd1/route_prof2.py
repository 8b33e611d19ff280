"""Session 10: where sample_route's 3-5 ms go (the route stage of the timing run). Host wall
time of each step with a device synchronization around it, per call, medians of 5 calls after 2
warm-ups; the pieces of _sample (ScreenLaunch.of incl. pair_plan, the launch, popcount_rows, the
read-back) wrapped separately. Run: PYTHONPATH=. python3 .dev/route_prof2.py"""
import json, statistics, time
import cupy as cp
import dosa_cupy
from dosa_cupy import cost, pipeline, screen, refine
from dosa_cupy.workload import make_gpu_workload

T = {}


def wrap(mod, name, key=None):
    f = getattr(mod, name)
    key = key or f"{mod.__name__.split('.')[-1]}.{name}"

    def g(*a, **k):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        r = f(*a, **k)
        cp.cuda.Device().synchronize()
        T.setdefault(key, []).append((time.perf_counter() - t) * 1e3)
        return r

    setattr(mod, name, g)


wrap(cost, "candidates"); wrap(cost, "_sample"); wrap(cost, "plateau_rows"); wrap(cost, "popcount_rows")
wrap(screen, "pair_plan"); wrap(screen, "pair_gather"); wrap(cost, "tie_screen_flag")
wrap(pipeline, "sample_route"); wrap(pipeline, "plan_stage"); wrap(pipeline, "seed_stage")
orig_of = screen.ScreenLaunch.of.__func__
def of(cls, *a, **k):
    cp.cuda.Device().synchronize(); t = time.perf_counter()
    r = orig_of(cls, *a, **k)
    cp.cuda.Device().synchronize(); T.setdefault("ScreenLaunch.of", []).append((time.perf_counter() - t) * 1e3)
    return r
screen.ScreenLaunch.of = classmethod(of)
for regime, H, Qn, N in [("calibrated", 32, 4096, 131072), ("isotropic", 32, 4096, 131072),
                         ("h64", 64, 4096, 131072), ("isotropic", 64, 4096, 1048576)]:
    wl = make_gpu_workload(regime, Qn, N, H, seed=3)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
    for _ in range(2):
        dosa_cupy.dosa_topk(*a)
    T.clear()
    for _ in range(5):
        dosa_cupy.dosa_topk(*a)
    print(json.dumps({"shape": f"{regime} {H}x{Qn}x{N}",
                      **{k: [round(statistics.median(v), 3), len(v) // 5] for k, v in T.items()}}))
    del wl, a
    cp.get_default_memory_pool().free_all_blocks()
