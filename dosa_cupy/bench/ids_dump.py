"""Ids (and dense logits) of every GPU route on fixed workloads, for a before/after check of
a refactor: ``python3 ids_dump.py OUT.npz`` under one tree's PYTHONPATH, then again under the
other's, then ``python3 ids_dump.py --compare A.npz B.npz`` (bitwise).  The script uses the
public API only (dense_topk, dosa_topk, fused_topk, dense_logits, make_gpu_workload), so it
runs unchanged against older trees; docs/running_on_gpu.md "Before/after".
"""

from __future__ import annotations

import sys

CASES = [("calibrated", 32, 512, 65536), ("h64", 64, 256, 32768), ("structured", 32, 96, 16384),
         ("ties", 32, 33, 8192), ("adversarial", 64, 64, 8192), ("equal", 32, 9, 4100)]  # fmt: skip


def dump(path: str) -> int:
    import cupy as cp
    import numpy as np

    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    out = {}
    for regime, H, Qn, N in CASES:
        wl = make_gpu_workload(regime, Qn, N, H, seed=41)
        a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
        key = f"{regime}_{H}_{Qn}_{N}"
        out[key + "_dense"] = cp.asnumpy(dosa_cupy.dense_topk(*a))
        out[key + "_dosa"] = cp.asnumpy(dosa_cupy.dosa_topk(*a, route="dosa"))
        out[key + "_fused"] = cp.asnumpy(dosa_cupy.fused_topk(*a))
        out[key + "_pair"] = cp.asnumpy(dosa_cupy.dosa_topk(*a, screen="pair", r=6, route="dosa"))
        for scr, r in (("fp64", 14), ("fp64", 30), ("wg", 14), ("wg", 30)):  # each screen kernel
            ids = dosa_cupy.dosa_topk(*a, screen=scr, r=r, route="dosa")
            out[f"{key}_{scr}{r}"] = cp.asnumpy(ids)
        out[key + "_logits"] = cp.asnumpy(dosa_cupy.dense_logits(*a[:4], wl["ks"], wl["ke"]))
    np.savez(path, **out)
    print(f"dumped {len(out)} arrays to {path}")
    return 0


def compare(a_path: str, b_path: str) -> int:
    import numpy as np

    a, b = np.load(a_path), np.load(b_path)
    bad = [k for k in a.files if k not in b.files or a[k].tobytes() != b[k].tobytes()]
    print(f"before/after: {len(a.files)} arrays compared bitwise, {len(bad)} differ {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(compare(*argv[1:3]) if argv[:1] == ["--compare"] else dump(argv[0]))
