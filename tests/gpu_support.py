"""Shared GPU-test support: CuPy detection and the ``gpu`` decorator (marked ``gpu`` and
skipped with a reason on machines without CuPy or an NVIDIA GPU)."""

import types

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # pragma: no cover - CPU machines
    cp = None
    HAVE_GPU = False


def _sm90a() -> bool:
    if not HAVE_GPU:
        return False
    from dosa_cupy import sm90a

    return sm90a.available()


# sm_90a kernels (wgmma, TMA) need a compute-capability-9.0 GPU where the sm_90a build loads
needs_sm90a = pytest.mark.skipif(
    not _sm90a(), reason="needs a compute-capability-9.0 GPU (sm_90a build)"
)


def ptxas_report(spec, tmp_path) -> str:
    """The ptxas report (-v) of building ``spec`` (a ``_build.KernelSpec`` for sm_90a) with
    the machine's nvcc, after asserting that the cubin was written: CI has no GPU, and for
    sm_90 the sm_90a code compiles to nothing, so only this build sees its errors, spills
    and serialised wgmma."""
    import subprocess

    from dosa_cupy import _build

    out = tmp_path / "k.cubin"
    cmd = _build.nvcc_command(spec, out)
    res = subprocess.run(cmd[:-1] + ["-Xptxas", "-v", cmd[-1]], capture_output=True, text=True)
    assert res.returncode == 0 and out.stat().st_size > 0, res.stderr
    return res.stderr


def gpu(f):
    """GPU test: marked ``gpu`` and skipped with a reason without CuPy / a GPU."""
    f = pytest.mark.skipif(not HAVE_GPU, reason="needs CuPy and an NVIDIA GPU")(f)
    return pytest.mark.gpu(f)


def guard_violations(logits, bounds):
    """(number of visible (query, key) with s > U^num, min(U^num − s) over them): the
    guard check of docs/method.md §8 on dense logits fp32 [Qn, N] and ``debug_bounds`` U fp64
    [Qn, N] (NaN where not visible)."""
    s = logits.astype(cp.float64)
    vis = ~cp.isnan(bounds)
    slack = cp.where(vis, bounds - s, cp.inf)
    return int(cp.sum(vis & (s > bounds))), float(slack.min())


def positive_f32(x):
    """x > 0 on the fp32 bits (csrc/common.cuh dosa::positive_f32: +0 < x ≤ +inf, subnormals
    counted, NaN not): bool array of x's shape."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return (b - np.uint32(1)) < np.uint32(0x7F800000)  # uint32 wraps: +0 is not positive


def numpy_as_cupy():
    """numpy standing in for CuPy in CPU tests of host code (every numpy name, and
    ``asnumpy``), to put in place of a module's ``cupy_or_raise``."""
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.asnumpy = np.asarray
    return shim


def replay_decode_walk(walk, dev, K: int, label: str = "", scorer: str = "f16") -> None:
    """A decode walk replayed from a CUDA graph: the step (check_layout=False, the default
    buffer, return_stats=False, out=) runs eagerly on step 0, is captured once in a CuPy
    stream graph, and is replayed on every later step copied into the same buffers; at
    every step its ids equal an eager selector's and ``dense_decode_topk``'s bitwise, and
    the graph selector's ring was pushed once per step (it advances on the device).
    ``walk``: steps of (q [B, n, H, 128], w [B, n, H], lengths [B]) device arrays; ``dev``:
    [cache payload, cache scale, block table]; ``scorer``: every selector's and the dense
    route's canonical scorer."""
    from dosa_cupy import decode as dec

    B, n = walk[0][0].shape[:2]
    static = [x.copy() for x in walk[0]]
    out = cp.empty((B, n, K), dtype=cp.int64)
    sel_g = dec.DecodeSelectorGPU(K, check_layout=False, scorer=scorer)
    sel_e = dec.DecodeSelectorGPU(K, scorer=scorer)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()  # the copies (legacy stream) before the capture stream
    with stream:
        sel_g.step(*static[:2], *dev, static[2], return_stats=False, out=out)  # step 0, eager
        stream.begin_capture()
        sel_g.step(*static[:2], *dev, static[2], return_stats=False, out=out)
        graph = stream.end_capture()
    stream.synchronize()
    first = sel_e.step(*walk[0][:2], *dev, walk[0][2], return_stats=False).ids
    assert cp.array_equal(first, out), f"{label} step 0: eager != the graph selector's"
    dense0 = dec.dense_decode_topk(*walk[0][:2], *dev, walk[0][2], K, scorer=scorer)
    assert cp.array_equal(first, dense0)
    for t in range(1, len(walk)):
        for dst, src in zip(static, walk[t], strict=True):
            dst[...] = src
        out.fill(7)  # stale ids must not survive a replay
        cp.cuda.Device().synchronize()  # the non-blocking stream does not wait for them
        graph.launch(stream)
        stream.synchronize()
        eager = sel_e.step(*walk[t][:2], *dev, walk[t][2], return_stats=False).ids
        dense = dec.dense_decode_topk(*walk[t][:2], *dev, walk[t][2], K, scorer=scorer)
        assert cp.array_equal(eager, dense), f"{label} step {t}: eager != dense"
        assert cp.array_equal(out, eager), f"{label} step {t}: replay != eager"
        assert cp.array_equal(out, dense), f"{label} step {t}: replay != dense"
    assert int(sel_g._ws.ctr[0]) == len(walk)  # one push per step, eager and replays
