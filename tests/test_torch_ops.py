"""The torch custom operators (dosa_cupy/torch_ops.py; docs/serving.md): their schemas, the
fake implementations that torch.compile traces through (CPU), and on the GPU the operators
against the dense routes, under torch.compile, and the decode operator in a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu

torch = pytest.importorskip("torch", reason="torch is not installed (the torch operators)")
T = pytest.importorskip("dosa_cupy.torch_ops")


def test_schemas():
    pre = str(torch.ops.dosa.prefill_topk.default._schema)
    assert pre == (
        "dosa::prefill_topk(Tensor q, Tensor w, Tensor k_payload, Tensor k_scale, SymInt K, "
        'Tensor? ks=None, Tensor? ke=None, str route="auto", bool check=True) -> Tensor'
    )
    dec = str(torch.ops.dosa.decode_topk.default._schema)
    assert dec.startswith("dosa::decode_topk(SymInt handle, SymInt K, Tensor q, Tensor w,")


def test_fake_implementations_give_shapes_and_dtypes():
    m = dict(device="meta")
    q = torch.empty((5, 32, 128), dtype=torch.uint8, **m)
    w, kp = torch.empty((5, 32), **m), torch.empty((99, 128), dtype=torch.uint8, **m)
    ksc = torch.empty(99, **m)
    ids = torch.ops.dosa.prefill_topk(q, w, kp, ksc, 7)
    assert ids.shape == (5, 7) and ids.dtype == torch.int64
    qd = torch.empty((3, 2, 64, 128), dtype=torch.uint8, **m)
    out = torch.ops.dosa.decode_topk(1, 11, qd, qd, qd, qd, qd, qd)
    assert out.shape == (3, 2, 11) and out.dtype == torch.int64


def test_ragged_schema_and_fake():
    sch = str(torch.ops.dosa.ragged_topk.default._schema)
    assert sch == (
        "dosa::ragged_topk(Tensor q, Tensor w, Tensor k_payload, Tensor k_scale, SymInt K, "
        'Tensor cu_seqlens_q, Tensor cu_seqlens_k, bool causal=True, str ids_dtype="int64", '
        'Tensor? page_table=None, str route="auto", bool check=True) -> Tensor'
    )
    m = dict(device="meta")
    q = torch.empty((9, 64, 128), dtype=torch.uint8, **m)
    w, kp = torch.empty((9, 64), **m), torch.empty((99, 128), dtype=torch.uint8, **m)
    ksc, cu = torch.empty(99, **m), torch.empty(3, dtype=torch.int32, **m)
    ids = torch.ops.dosa.ragged_topk(q, w, kp, ksc, 5, cu, cu)
    assert ids.shape == (9, 5) and ids.dtype == torch.int64
    ids = torch.ops.dosa.ragged_topk(q, w, kp, ksc, 5, cu, cu, ids_dtype="int32", page_table=cu)
    assert ids.shape == (9, 5) and ids.dtype == torch.int32
    with pytest.raises(ValueError, match="^ids_dtype:"):
        torch.ops.dosa.ragged_topk(q, w, kp, ksc, 5, cu, cu, ids_dtype="int16")
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        T.ragged_topk(torch.zeros((2, 16, 128), dtype=torch.uint8), torch.zeros(2, 16),
                      torch.zeros((4, 128), dtype=torch.uint8), torch.zeros(4), 2,
                      torch.tensor([0, 2]), torch.tensor([0, 4]))  # fmt: skip


def test_traced_graph_holds_the_operator():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(q, w, kp, ksc):
        return torch.ops.dosa.prefill_topk(q, w, kp, ksc, 7, route="dense") + 1

    args = (torch.zeros((5, 32, 128), dtype=torch.uint8), torch.zeros(5, 32),
            torch.zeros((99, 128), dtype=torch.uint8), torch.zeros(99))  # fmt: skip
    g = make_fx(f, tracing_mode="fake")(*args)
    calls = [n for n in g.graph.nodes if n.op == "call_function"]
    assert str(calls[0].target) == "dosa.prefill_topk.default"
    assert calls[0].args[4] == 7 and "dense" in (*calls[0].args, *calls[0].kwargs.values())


def test_unknown_selector_and_cpu_tensors_are_refused():
    q = torch.zeros((1, 1, 16, 128), dtype=torch.uint8)
    with pytest.raises(ValueError, match="handle"):
        T.decode_topk(12345, 8, q, q, q, q, q, q)
    with pytest.raises(ValueError, match="handle"):
        T.release_selector(12345)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        T.prefill_topk(torch.zeros((2, 16, 128), dtype=torch.uint8), torch.zeros(2, 16),
                       torch.zeros((4, 128), dtype=torch.uint8), torch.zeros(4), 2)  # fmt: skip


def test_selector_handles_are_never_reused(monkeypatch):
    from dosa_cupy import decode

    class Stub:
        def __init__(self, K, history, check_layout, scorer):
            self.K, self.released = K, False

        def release(self):
            self.released = True

    monkeypatch.setattr(decode, "DecodeSelectorGPU", Stub)
    a, b = T.decode_selector(8), T.decode_selector(16)
    assert a != b and T._SELECTORS[b].K == 16
    sel = T._SELECTORS[b]
    T.release_selector(b)
    assert sel.released and b not in T._SELECTORS
    c = T.decode_selector(8)
    assert c not in (a, b)  # a graph still holding b cannot reach c's state
    with pytest.raises(ValueError, match="K: selector"):
        T.decode_topk(c, 9, *(torch.zeros(1, 1, 16, 128, dtype=torch.uint8),) * 6)
    T.release_selector(a)
    T.release_selector(c)


@gpu
def test_gpu_prefill_operator_equals_the_dense_route():
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("calibrated", 96, 16384, 32, seed=4)
    names = ("q", "w", "k_payload", "k_scale", "ks", "ke")
    t = {k: torch.from_dlpack(wl[k]) for k in names}
    dense = dosa_cupy.dense_topk(*(wl[k] for k in names[:4]), 256, wl["ks"], wl["ke"])
    for route in ("auto", "dosa", "dense"):
        ids = torch.ops.dosa.prefill_topk(t["q"], t["w"], t["k_payload"], t["k_scale"], 256,
                                          t["ks"], t["ke"], route=route)  # fmt: skip
        assert ids.dtype == torch.int64 and ids.is_cuda
        assert cp.array_equal(cp.from_dlpack(ids), dense), route

    @torch.compile(fullgraph=True)
    def f(q, w, kp, ksc, ks, ke):
        return torch.ops.dosa.prefill_topk(q, w, kp, ksc, 256, ks, ke, route="dosa")

    ids = f(t["q"], t["w"], t["k_payload"], t["k_scale"], t["ks"], t["ke"])
    assert cp.array_equal(cp.from_dlpack(ids), dense)


@gpu
def test_gpu_decode_operator_in_a_torch_graph():
    """The decode operator steps a registered selector: eagerly, then captured in a
    torch.cuda.CUDAGraph and replayed on new inputs; every step equals the dense decode."""
    from test_gpu_decode import _graph_walk_inputs

    from dosa_cupy import decode as dec

    B, n, H, K, steps = 2, 2, 64, 256, 4
    walk, dev = _graph_walk_inputs(B, n, H, seed=21, steps=steps)
    tw = [[torch.from_dlpack(x) for x in step] for step in walk]
    tdev = [torch.from_dlpack(x) for x in dev]
    h = T.decode_selector(K)
    static = [x.clone() for x in tw[0]]
    ids = torch.ops.dosa.decode_topk(h, K, static[0], static[1], *tdev, static[2])
    dense = dec.dense_decode_topk(*walk[0][:2], *dev, walk[0][2], K)
    assert cp.array_equal(cp.from_dlpack(ids), dense)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.dosa.decode_topk(h, K, static[0], static[1], *tdev, static[2])
    for t in range(1, steps):
        for dst, src in zip(static, tw[t], strict=True):
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        dense = dec.dense_decode_topk(*walk[t][:2], *dev, walk[t][2], K)
        assert cp.array_equal(cp.from_dlpack(out), dense), f"step {t}"
    T.release_selector(h)
    with pytest.raises(ValueError, match="handle"):
        T.release_selector(h)


@gpu
def test_gpu_ragged_operator_equals_the_serving_call():
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    qn, nk = [5, 40, 1], [3000, 9000, 4100]
    parts = [make_gpu_workload("calibrated", m, n, 32, seed=b)
             for b, (m, n) in enumerate(zip(qn, nk, strict=True))]  # fmt: skip
    names = ("q", "w", "k_payload", "k_scale")
    cat = [cp.concatenate([p[k] for p in parts]) for k in names]
    cu_q = cp.asarray(np.concatenate([[0], np.cumsum(qn)]).astype(np.int32))
    cu_k = cp.asarray(np.concatenate([[0], np.cumsum(nk)]).astype(np.int32))
    want = dosa_cupy.ragged_topk(*cat, 256, cu_q, cu_k)
    t = [torch.from_dlpack(x) for x in (*cat, cu_q, cu_k)]
    for dt in ("int64", "int32"):
        ids = torch.ops.dosa.ragged_topk(*t[:4], 256, *t[4:], ids_dtype=dt)
        assert ids.is_cuda and str(ids.dtype) == f"torch.{dt}"
        assert cp.array_equal(cp.from_dlpack(ids).astype(cp.int64), want), dt
