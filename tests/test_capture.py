"""The graph-capturable prefill step (dosa_cupy/capture.py; docs/serving.md "Prefill capture").

CPU: the options a captured step refuses, each with a ValueError naming the argument, and
the arena's block arithmetic.  GPU: a step captured once (CuPy stream capture and
``torch.cuda.CUDAGraph``) and replayed on new inputs copied into the same arrays equals
the dense route bitwise after ``finish`` on every regime; overflowed and invalid-scale
queries are flagged in the replay and completed by ``finish``; bad input raises there.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu

from dosa_cupy import capture as C

# ---------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"seed_ids": np.zeros((1, 1), np.int64)}, "seed_ids"),
        ({"cert_seeds": 64}, "cert_seeds"),
        ({"return_stats": True}, "return_stats"),
        ({"debug_bounds": True}, "debug_bounds"),
        ({"timing": True}, "timing"),
        ({"stream": "shared"}, "stream"),
        ({"planner": "cupy"}, "planner"),
        ({"screen": "pair"}, "screen"),
        ({"screen": "nope"}, "screen"),
        ({"seeds": "local+anchor+certificate"}, "seeds"),
        ({"route": "fused"}, "route"),
        ({"check": 1}, "check"),
        ({"r": 0}, "r"),
    ],
)
def test_refused_options_name_their_argument(kw, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        C.PrefillSelectorGPU(64, **kw)


@pytest.mark.parametrize("K", [0, 4097, 2.0, True, np.zeros(2, np.int64)])
def test_bad_K(K):
    with pytest.raises(ValueError, match="^K:"):
        C.PrefillSelectorGPU(K)


def test_accepted_options():
    sel = C.PrefillSelectorGPU(np.asarray(16), route="dosa", screen="fp64", seeds="local",
                               check=False)  # fmt: skip
    assert sel.K == 16 and sel.check is False


def test_counter_rounds_every_block_up():
    seen = []
    c = C._Counter(lambda n: seen.append(n) or n)
    for n in (1, 256, 257, 0, 1000):
        c.malloc(n)
    assert seen == [1, 256, 257, 0, 1000]  # passed through unchanged
    assert c.nbytes == 256 + 256 + 512 + 0 + 1024


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------

FIELDS = ("q", "w", "k_payload", "k_scale", "ks", "ke")


def _sets(regime, Qn, N, H, n, seed=0):
    from dosa_cupy.workload import make_gpu_workload

    out = []
    for s in range(n):
        try:
            wl = make_gpu_workload(regime, Qn, N, H, seed=seed + s)
        except ModuleNotFoundError as e:  # the trained regime without its encoder and corpus
            pytest.skip(str(e))
        out.append([cp.ascontiguousarray(wl[f]) for f in FIELDS])
    return out


def _dense(x, K):
    from dosa_cupy import dense_topk

    return dense_topk(*x[:4], K, x[4], x[5])


def _replay_cupy(sel, sets, K, out_dtype=np.int64, mutate=None):
    """Eager first step on sets[0], capture of a step on static copies, replays on every
    set copied in; yields (set index, ids after replay, rows re-run by finish, ids before
    finish)."""
    static = [a.copy() for a in sets[0]]
    out = cp.empty((static[0].shape[0], K), dtype=out_dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        sel.step(*static, out=out).finish()  # the shape's first step: decides, measures
        stream.begin_capture()
        h = sel.step(*static, out=out)
        graph = stream.end_capture()
    stream.synchronize()
    for i, x in enumerate(sets):
        for dst, src in zip(static, x, strict=True):
            dst[...] = src
        if mutate is not None:
            mutate(i, static)
        cp.cuda.Device().synchronize()
        out.fill(7)  # stale ids must not survive a replay
        cp.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        before = out.copy()
        with stream:
            n = h.finish()
        stream.synchronize()
        yield i, out, n, before, static


CASES = [
    ("calibrated", 512, 16384, 32, 256, {}),
    ("calibrated", 300, 12000, 64, 2048, {"screen": "wg"}),
    ("h64", 512, 16384, 64, 512, {}),
    ("many_positive", 256, 16384, 32, 256, {"r": 30}),
    ("structured", 384, 8192, 64, 512, {"screen": "fp64"}),
    ("gaussian", 256, 8192, 32, 256, {"screen": "fast32"}),
    ("ties", 512, 16384, 32, 256, {}),
    ("equal", 256, 8192, 32, 128, {}),
    ("isotropic", 256, 16384, 32, 256, {}),
    ("trained", 256, 16384, 64, 512, {}),
]


@gpu
@pytest.mark.parametrize("regime,Qn,N,H,K,kw", CASES)
def test_captured_replay_equals_dense(regime, Qn, N, H, K, kw):
    """Captured once, replayed on three new input sets: ids == dense_topk bitwise after
    ``finish``; rows not re-run were already final in the replay."""
    sel = C.PrefillSelectorGPU(K, route="dosa", **kw)
    sets = _sets(regime, Qn, N, H, 3, seed=11)
    for i, out, n, before, static in _replay_cupy(sel, sets, K):
        dense = _dense(static, K)
        assert cp.array_equal(out, dense), f"{regime} set {i}: replay != dense"
        redo = cp.any(before != dense, axis=1)
        assert int(redo.sum()) <= n, "a row differed from dense without being flagged"
        assert bool(cp.all(cp.where(redo[:, None], before == C.FLAGGED, True)))


@gpu
@pytest.mark.parametrize("route", ["auto", "dense"])
def test_captured_route_choices(route):
    """route="auto" (the cost model's choice on the first step, kept) and "dense"."""
    K = 256
    sel = C.PrefillSelectorGPU(K, route=route)
    sets = _sets("calibrated", 64, 16384, 64, 2, seed=3)
    for i, out, n, _, static in _replay_cupy(sel, sets, K, out_dtype=np.int32):
        assert n == 0
        assert cp.array_equal(out, _dense(static, K).astype(cp.int32)), f"set {i}"


@gpu
def test_overflow_is_flagged_and_finished():
    """buffer=16 compact records: most queries overflow in the replay, their rows read
    FLAGGED, and ``finish`` completes them exactly."""
    K = 64
    sel = C.PrefillSelectorGPU(K, route="dosa", buffer=16, check=False)
    sets = _sets("ties", 256, 8192, 32, 2, seed=5)
    flagged = 0
    for i, out, n, before, static in _replay_cupy(sel, sets, K):
        flagged += n
        rows = cp.all(before == C.FLAGGED, axis=1)
        assert int(rows.sum()) == n
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"
    assert flagged > 0


@gpu
def test_invalid_scales_in_a_replay_are_finished():
    """A replay whose inputs hold NaN / negative key scales: the queries that see them are
    flagged and re-run on the dense route (query-level recovery outside the graph)."""
    K = 128

    def spoil(i, x):
        if i == 1:
            x[3][[100, 5000]] = cp.asarray([np.nan, -1.0], dtype=cp.float32)

    sel = C.PrefillSelectorGPU(K, route="dosa", check=False)
    sets = _sets("calibrated", 256, 8192, 32, 2, seed=8)
    for i, out, n, _, static in _replay_cupy(sel, sets, K, mutate=spoil):
        assert (n > 0) == (i == 1)
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"


@gpu
def test_bad_input_in_a_replay_raises_in_finish():
    """check=True: the value checks run inside the graph; ``finish`` raises naming q."""
    K = 64

    def spoil(i, x):
        if i == 1:
            x[0][3, 0, 5] = 0x7F  # an e4m3 NaN code

    sel = C.PrefillSelectorGPU(K, route="dosa")
    sets = _sets("calibrated", 128, 4096, 32, 2, seed=2)
    with pytest.raises(ValueError, match="^q:"):
        for i, out, _, _, static in _replay_cupy(sel, sets, K, mutate=spoil):
            assert i == 0 and cp.array_equal(out, _dense(static, K))


@gpu
def test_captured_in_a_torch_graph():
    """The step captured by torch.cuda.CUDAGraph (CuPy launching on torch's capture
    stream, capture mode "global": no allocation, no synchronization in the step)."""
    torch = pytest.importorskip("torch")
    K = 256
    sets = _sets("h64", 256, 16384, 64, 3, seed=21)
    static = [a.copy() for a in sets[0]]
    out = cp.empty((256, K), dtype=cp.int64)
    sel = C.PrefillSelectorGPU(K, route="dosa")
    sel.step(*static, out=out).finish()
    sel.step(*static, out=out).finish()  # the arena's first step (outside the capture)
    cp.cuda.Device().synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            h = sel.step(*static, out=out)
    for i, x in enumerate(sets[1:]):
        for dst, src in zip(static, x, strict=True):
            dst[...] = src
        cp.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        h.finish()
        assert cp.array_equal(out, _dense(static, K)), f"set {i + 1}"
