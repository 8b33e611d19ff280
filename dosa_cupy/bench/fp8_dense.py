"""The FP8 dense logits kernel (csrc/dense_fp8.cu) against DeepGEMM and the project's f16
dense logits, on the same inputs in one run (docs/benchmark_method.md).

``python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x131072,... [--variants ...] [--reps 20]``:
per shape, the kernel's logits checked bit for bit against ``dosa_ref.mma_model
.fp8_fresh_scores`` (chained builds: ``fp8_chained_scores``; DeepGEMM's against
``deepgemm_scores``) on sampled queries and keys, its −inf pattern against the visibility
ranges, then medians (CUDA events, warm-up, three rotated query sets) of every kernel, the
TFLOP/s on the visible pairs and the multiple of the FP8 floor (1,455 TFLOP/s). One markdown
table on stdout.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from dosa_cupy.scorer import (
    FP8_DENSE,
    FP8_DENSE_SPEC,
    FP8_SPEC,
    fp8_available,
    fp8_dense_logits,
    fp8_dense_smem,
)

FP8_PEAK = 1455e12  # docs/numerics.md "Measured on an H200 (ceilings)"


# the builds of csrc/dense_fp8.cu: (columns per MMA, query tiles per stage, consumer
# warpgroups, fresh steps): the canonical scorer's dense logits (three consumer warpgroups,
# steps 0 and 1 in flight, then 2 and 3) and DeepGEMM's arithmetic in the same frame (one k128
# chain, timing only).  The schedules measured slower are in git and in docs/records/
# benchmarks.md ("FP8 dense logits: lean builds" and the sections before it).
VARIANTS = {
    "lean_n128q4_w3_seq": (128, 4, 3, True),
    "lean_n128q4_w3_next": (128, 4, 3, True),  # the next tile's steps 0, 1 during the epilogue
    "lean_qt8_w3_pipe4": (64, 8, 3, True),  # four buffers: the next tile's steps as they free
    "n128_w4_chained": (128, 1, 4, False),
}
# the fastest fresh build of each H: the dense route's (dosa_cupy.scorer.FP8_DENSE)
BEST = {H: build[0] for H, build in FP8_DENSE.items()}


def as_workload(c: dict) -> dict:
    """The workload dict ``fp8_logits`` takes, from a ``dosa bench`` sub-chunk (q, w, kp,
    ksc, ks, ke): the same arrays, no copy."""
    return dict(q=c["q"], w=c["w"], k_payload=c["kp"], k_scale=c["ksc"], ks=c["ks"],
                ke=c["ke"])  # fmt: skip


def as_subchunk(wl: dict) -> dict:
    """The other way: a ``dosa bench`` sub-chunk (what the f16 routes and the peers take)
    from a workload of make_gpu_workload, the same arrays."""
    return dict(q=wl["q"], w=wl["w"], kp=wl["k_payload"], ksc=wl["k_scale"], ks=wl["ks"],
                ke=wl["ke"])  # fmt: skip


@functools.cache
def _builds(H: int, dev: int) -> bool:
    try:
        _dense_kernel(BEST[H], H)
        return True
    except Exception:
        return False


def available(H: int) -> bool:
    """True where the FP8 dense logits run: H of ``BEST`` on a compute-capability-9.0 GPU
    (``scorer.fp8_available``) whose sm_90a build of csrc/dense_fp8.cu builds and loads (the
    first call builds it)."""
    if H not in BEST or not fp8_available():
        return False
    import cupy as cp

    return _builds(H, cp.cuda.Device().id)


def _dense_kernel(variant: str, H: int):
    from dosa_cupy._build import kernel

    return kernel(f"dense_fp8_h{H}_{variant}", smem_bytes(*VARIANTS[variant][:3]),
                  FP8_DENSE_SPEC)  # fmt: skip


smem_bytes = fp8_dense_smem  # dynamic shared memory of a build (columns, query tiles, warpgroups)


def fp8_logits(wl: dict, variant: str, out=None):
    """fp32 [Qn, N] logits of the dense_fp8 build ``variant`` (VARIANTS) for a workload of
    make_gpu_workload (``scorer.fp8_dense_logits`` with that build)."""
    nc, qt, cwg, _ = VARIANTS[variant]
    return fp8_dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], wl["ks"],
                            wl["ke"], build=(variant, nc, qt, cwg), out=out)  # fmt: skip


def fp8_scores_at(wl: dict, ids):
    """fp32 [Qn, M]: the FP8 scorer's scores of the keys ids int32 [Qn, M] (−1: none, −inf
    out) of each query, gathered (csrc/score_fp8.cu ``score_fp8_ids_h{H}``) — the dense
    logits' bits at those keys."""
    import cupy as cp

    from dosa_cupy._build import kernel

    q, w, kp, ksc = wl["q"], wl["w"], wl["k_payload"], wl["k_scale"]
    Qn, H, _ = q.shape
    ids = cp.ascontiguousarray(ids, dtype=cp.int32)
    M = int(ids.shape[1])
    out = cp.empty((Qn, M), dtype=cp.float32)
    f = kernel(f"score_fp8_ids_h{H}", 0, FP8_SPEC)
    if Qn and M:
        f(((M + 63) // 64, Qn), (128,), (q, w, kp, ksc, ids, np.int32(M), out))
    return out


def check(wl: dict, lg, rng, model=None, nq: int = 6, nk: int = 1536) -> dict:
    """Bits of sampled visible logits ``lg`` (CuPy [Qn, ≥ N], rows may be padded) that
    differ from ``model(q_codes, w, k_codes, alpha)`` (default ``fp8_fresh_scores``) and
    entries of the first N columns whose −inf pattern differs from the visibility ranges."""
    import cupy as cp

    from dosa_ref.mma_model import fp8_fresh_scores

    model = model or fp8_fresh_scores
    N = wl["k_payload"].shape[0]
    Qn = lg.shape[0]
    cols = cp.arange(N, dtype=cp.int32)[None, :]
    vis = (cols >= wl["ks"][:, None]) & (cols < wl["ke"][:, None])
    pattern = int(cp.sum(vis == cp.isneginf(lg[:, :N])))
    q, w = cp.asnumpy(wl["q"]), cp.asnumpy(wl["w"])
    kp, ksc = cp.asnumpy(wl["k_payload"]), cp.asnumpy(wl["k_scale"])
    ks, ke = cp.asnumpy(wl["ks"]), cp.asnumpy(wl["ke"])
    bad = 0
    for t in rng.choice(Qn, nq, replace=False):
        lo, hi = int(ks[t]), int(ke[t])
        if hi <= lo:
            continue
        ids = np.unique(np.concatenate([np.arange(lo, min(hi, lo + 64)),
                                        rng.integers(lo, hi, nk)]))  # fmt: skip
        want = model(q[t], w[t], kp[ids], ksc[ids])
        got = cp.asnumpy(lg[t, cp.asarray(ids)])
        bad += int((want.view(np.uint32) != got.view(np.uint32)).sum())
    return {"model_mismatch": bad, "inf_pattern_mismatch": pattern}


def check_deepgemm(wl: dict, logits) -> dict:
    """DeepGEMM's logits (``logits(c)``, a bench_shape sub-chunk) against
    ``dosa_ref.mma_model.deepgemm_scores`` with the head sum's products contracted to fmaf
    and not: mismatching bits of each on the same sampled entries."""
    import cupy as cp

    from dosa_ref.mma_model import deepgemm_scores

    from .peers import padded_rows

    lg = padded_rows(logits(as_subchunk(wl)), cp)
    out = {}
    for name, fused in (("fused", True), ("unfused", False)):
        r = check(wl, lg, np.random.default_rng(0),
                  lambda *a, f=fused: deepgemm_scores(*a, fused=f))  # fmt: skip
        out[f"{name}_mismatch"] = r["model_mismatch"]
    out["inf_pattern_mismatch"] = r["inf_pattern_mismatch"]
    return out


def run(shapes, variants, reps: int, out=sys.stdout) -> list:
    import cupy as cp

    import dosa_cupy
    from dosa_cupy.bench.peers import discover
    from dosa_cupy.bench.timing import free, median_ms_interleaved
    from dosa_cupy.cost import logits_flop
    from dosa_cupy.workload import make_gpu_workload
    from dosa_ref.mma_model import fp8_chained_scores, fp8_fresh_scores

    peers = discover(None)
    rows = []
    for H, Qn, N in shapes:
        sets = [make_gpu_workload("calibrated", Qn, N, H, seed=s) for s in (11, 12, 13)]
        wl = sets[0]
        visible = float(cp.sum(cp.maximum(wl["ke"] - wl["ks"], 0)))
        res = {"H": H, "Qn": Qn, "N": N}
        for v in variants:
            model = fp8_fresh_scores if VARIANTS[v][3] else fp8_chained_scores
            res[f"check_{v}"] = check(wl, fp8_logits(wl, v), np.random.default_rng(0), model)
        if peers is not None and peers.logits is not None:
            res["check_deepgemm"] = check_deepgemm(wl, peers.logits)
        buf = cp.empty((Qn, N), dtype=cp.float32)
        cs = [as_subchunk(s) for s in sets]
        fns = {f"fp8_{v}": (lambda i, v=v, b=buf, S=sets: fp8_logits(S[i], v, b)) for v in variants}
        fns["f16_dense"] = lambda i, c=cs: dosa_cupy.dense_logits(
            c[i]["q"], c[i]["w"], c[i]["kp"], c[i]["ksc"], c[i]["ks"], c[i]["ke"])  # fmt: skip
        if peers is not None and peers.logits is not None:
            fns["deepgemm"] = lambda i, c=cs, f=peers.logits: f(c[i])
        times = median_ms_interleaved(cp, fns, reps, rotate=[0, 1, 2])
        for name, (ms, _) in times.items():
            res[name] = ms
        rows.append(res)
        free(cp)
        flop = logits_flop(visible, H)
        print(f"\n### H = {H}, Qn = {Qn}, N = {N} (visible pairs {visible:.3e})", file=out)
        for k in [*variants, "deepgemm"]:
            if f"check_{k}" in res:
                print(f"check {k}: {res[f'check_{k}']}", file=out)
        print("| kernel | ms | TFLOP/s (visible) | × FP8 floor | / DeepGEMM |", file=out)
        print("|---|---|---|---|---|", file=out)
        dg = res.get("deepgemm")
        for name in fns:
            ms = res[name]
            tf = flop / (ms * 1e-3) / 1e12
            rel = f"{ms / dg:.2f}" if dg else "—"
            print(f"| {name} | {ms:.3f} | {tf:.0f} | {ms / (flop / FP8_PEAK * 1e3):.2f} | {rel} |",
                  file=out)  # fmt: skip
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fp8_dense", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x4096x131072,32x4096x131072")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="builds to time (VARIANTS)")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    except ValueError:
        ap.error("--shapes: HxQnxN[,...] integers")
    qts = a.variants.split(",")
    if any(len(s) != 3 or s[0] not in (32, 64) for s in shapes) or set(qts) - set(VARIANTS):
        ap.error(f"--shapes: H of 32 or 64; --variants: of {','.join(VARIANTS)}")
    run(shapes, qts, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
