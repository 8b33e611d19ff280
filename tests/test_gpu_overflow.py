"""The GPU scorer's domain (docs/method.md §1 "The scorer's domain"): where a visible key with a
valid scale has a non-finite fp32 score, every prefill route raises the dense route's own
ValueError (``prepare.SCORE_OVERFLOW``) with the value checks on; where the envelope flags a
query whose scores are all finite, every route returns the dense route's ids (the query is
recovered); with ``check=False`` a flagged query's ids are the dense route's on every
route; decode scans every key and equals the dense decode route on overflowing steps.

Weights are driven past fp32 (up to 3e38 per head) on one query of a chunk; the dense
logits computed by the test decide which case it is (``scorer.overflowing_scores``).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu

import dosa_cupy
from dosa_cupy.prepare import SCORE_OVERFLOW, envelope_queries

try:
    from dosa_cupy.prepare import pad_heads
    from dosa_cupy.scorer import overflowing_scores
    from dosa_cupy.workload import make_gpu_workload
except Exception:  # pragma: no cover - CPU machines: every test below is skipped
    pass

K = 256
ROUTES = (
    dict(route="auto"),
    dict(route="dosa"),
    dict(route="dosa", screen="pair", r=6),
    dict(route="dense"),
)
# weight of every head of query 3: past fp32 / flagged by the envelope but finite
SCALES = {"overflow": 3e38, "flagged_finite": 1e30}

pytestmark = pytest.mark.route_choice  # the routes are named explicitly per call


def _chunk(case: str, H: int):
    wl = make_gpu_workload("calibrated", 16, 8192, H, seed=31)
    w = wl["w"].copy()
    w[3] = cp.float32(SCALES[case])
    wl["w"] = w
    args = (wl["q"], w, wl["k_payload"], wl["k_scale"])
    return wl, args


def _overflows(wl, args) -> bool:
    q, w, kp, ksc = args
    ks, ke = wl["ks"].astype(cp.int32), wl["ke"].astype(cp.int32)
    qp, wp = pad_heads(q, w)
    return overflowing_scores(qp, wp, kp, ksc, ks, ke)


@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_overflowing_scores_raise_on_every_prefill_route(H):
    wl, args = _chunk("overflow", H)
    assert _overflows(wl, args), "the case must overflow fp32"
    assert bool(envelope_queries(args[1], args[3])[3])
    with pytest.raises(ValueError, match="overflows fp32") as e:
        dosa_cupy.dense_topk(*args, K, wl["ks"], wl["ke"])
    assert str(e.value) == SCORE_OVERFLOW
    for opts in ROUTES:
        with pytest.raises(ValueError, match="overflows fp32"):
            dosa_cupy.dosa_topk(*args, K, wl["ks"], wl["ke"], **opts)
    with pytest.raises(ValueError, match="overflows fp32"):
        dosa_cupy.dense_logits(*args, wl["ks"], wl["ke"])
    Qn, N = args[0].shape[0], args[2].shape[0]
    cu_q = cp.asarray([0, Qn], dtype=cp.int32)
    cu_k = cp.asarray([0, N], dtype=cp.int32)
    with pytest.raises(ValueError, match="overflows fp32"):
        dosa_cupy.ragged_topk(*args, K, cu_q, cu_k)
    from dosa_cupy.capture import PrefillSelectorGPU

    out = cp.empty((Qn, K), dtype=cp.int64)
    with pytest.raises(ValueError, match="overflows fp32"):
        PrefillSelectorGPU(K).step(*args, wl["ks"], wl["ke"], out=out).finish()


@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_flagged_finite_queries_return_the_dense_ids_on_every_route(H):
    wl, args = _chunk("flagged_finite", H)
    assert bool(envelope_queries(args[1], args[3])[3]), "the envelope must flag query 3"
    assert not _overflows(wl, args), "the case must stay finite"
    dense = dosa_cupy.dense_topk(*args, K, wl["ks"], wl["ke"])
    for opts in ROUTES:
        ids, st = dosa_cupy.dosa_topk(*args, K, wl["ks"], wl["ke"], return_stats=True, **opts)
        assert cp.array_equal(ids, dense), opts
        if opts["route"] == "dosa":
            assert bool(st.recovered[3]), opts


@gpu
def test_unchecked_overflow_is_the_dense_routes_answer_on_every_route():
    wl, args = _chunk("overflow", 32)
    dense = dosa_cupy.dense_topk(*args, K, wl["ks"], wl["ke"], check=False)
    for opts in ROUTES:
        ids = dosa_cupy.dosa_topk(*args, K, wl["ks"], wl["ke"], check=False, **opts)
        assert cp.array_equal(ids, dense), opts


@gpu
def test_decode_equals_the_dense_decode_route_on_overflowing_steps():
    from dosa_cupy import decode as dec
    from dosa_ref.fp8 import quantize_keys, quantize_queries

    rs = np.random.default_rng(5)
    B, n, H, L = 2, 2, 32, 3000
    mb = -(-L // dec.PAGE)
    kp, ksc = quantize_keys(rs.standard_normal((B * mb * dec.PAGE, 128)).astype(np.float32))
    kv = cp.asarray(kp.reshape(B * mb, dec.PAGE, 128))
    kv_scale = cp.asarray(ksc.reshape(B * mb, dec.PAGE))
    table = cp.asarray(rs.permutation(B * mb).reshape(B, mb).astype(np.int32))
    lengths = cp.asarray([L, L - 700], dtype=cp.int32)
    sel = dec.DecodeSelectorGPU(K)
    for step in range(3):
        qf = rs.standard_normal((B * n, H, 128)).astype(np.float32)
        wf = rs.standard_normal((B * n, H)).astype(np.float32)
        qp, wq = quantize_queries(qf, wf)
        wq = wq.reshape(B, n, H)
        wq[0, step % n] = 3e38  # one overflowing row per step
        args = (cp.asarray(qp.reshape(B, n, H, 128)), cp.asarray(wq), kv, kv_scale, table)
        got = sel.step(*args, lengths, return_stats=False).ids
        want = dec.dense_decode_topk(*args, lengths, K)
        assert cp.array_equal(got, want), f"step {step}"
