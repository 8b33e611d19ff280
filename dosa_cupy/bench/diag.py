"""Survival diagnostics: how the retained-head budget r changes screening survival at the
scorer's error model (``scorer.MMA_BITS``; issue 5 notes).  ``dosa bench --diag``."""

from __future__ import annotations

import sys

import numpy as np


def main(argv=None) -> int:
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.scorer import MMA_BITS
    from dosa_cupy.workload import make_gpu_workload

    Qn, N, K = 256, 65536, 2048
    print("| regime | H | r | W | survival | kept/query | ids equal |")
    print("|---|---|---|---|---|---|---|")
    for regime in ("structured", "gaussian"):
        for H in (32, 64):
            wl = make_gpu_workload(regime, Qn, N, H, seed=1)
            a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])
            dense = dosa_cupy.dense_topk(*a)
            for r in (14, 30):
                ids, st = dosa_cupy.dosa_topk(
                    *a, r=r, screen="fp64", route="dosa", return_stats=True
                )  # r as given, not auto's; screened, never the dense route
                sv = float(np.mean(st.survivors / np.maximum(st.screened, 1)))
                eq = bool(cp.array_equal(ids, dense))
                print(
                    f"| {regime} | {H} | {r} | {MMA_BITS} | {sv:.4f} | {st.kept.mean():.0f} |"
                    f" {eq} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
