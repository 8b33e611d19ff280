"""Where the route stage's time goes: host wall time of each step, synchronized around it."""
import time, sys, json
import cupy as cp
import dosa_cupy
from dosa_cupy import cost, pipeline
from dosa_cupy.workload import make_gpu_workload

T = {}
def wrap(mod, name):
    f = getattr(mod, name)
    def g(*a, **k):
        cp.cuda.Device().synchronize(); t = time.perf_counter()
        r = f(*a, **k)
        cp.cuda.Device().synchronize(); T[name] = T.get(name, 0) + (time.perf_counter() - t) * 1e3
        return r
    setattr(mod, name, g)

for mod, names in ((cost, ["candidates", "_sample", "plan_rows"]), (pipeline, ["key_rho", "seed_stage", "sample_route", "plan_stage", "start", "dense_ids"])):
    for n in names:
        wrap(mod, n)
for regime, H, Qn, N in [("calibrated", 32, 4096, 131072), ("h64", 64, 4096, 1048576), ("isotropic", 32, 4096, 131072)]:
    wl = make_gpu_workload(regime, Qn, N, H, seed=3)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 2048, wl["ks"], wl["ke"])
    for _ in range(2):
        dosa_cupy.dosa_topk(*a)
    T.clear()
    reps = 5
    cp.cuda.Device().synchronize(); t = time.perf_counter()
    for _ in range(reps):
        dosa_cupy.dosa_topk(*a)
    cp.cuda.Device().synchronize(); tot = (time.perf_counter() - t) * 1e3 / reps
    print(json.dumps({"shape": f"{regime} {H}x{Qn}x{N}", "total_ms_sync_steps": round(tot, 2), **{k: round(v / reps, 3) for k, v in T.items()}}))
    del wl, a
    cp.get_default_memory_pool().free_all_blocks()
