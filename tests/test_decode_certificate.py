"""The certificate screen in decode on the FP8 arithmetic, emulated on the CPU
(``dosa_cupy.emulate.decode_survival``; docs/method.md §10 "The certificate in decode"): the
bound the GPU screen would evaluate is above every visible key's score, keeps every key at or
above the threshold, and prunes on a structured walk."""

from __future__ import annotations

import numpy as np
import pytest

from dosa_cupy.emulate import decode_survival
from dosa_ref.fp8 import e4m3_values, quantize_keys, quantize_queries


def _request(seed: int, N: int = 4096, H: int = 64, n: int = 2):
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((8, 128))
    topics /= np.linalg.norm(topics, axis=1, keepdims=True)
    kf = rng.standard_normal((N, 128))
    kf += 1.5 * (rng.exponential(1.0, (N, 8)) ** 2 * (rng.random((N, 8)) < 0.3)) @ topics
    kp, ksc = quantize_keys(kf.astype(np.float32))[:2]
    base = 2.0 * topics[rng.integers(0, 8)]
    qf = base[None, None, :] + 0.3 * rng.standard_normal((n, H, 128))
    w = np.abs(rng.standard_normal((n, H)))
    qp, wq = quantize_queries(qf.astype(np.float32), w.astype(np.float32))
    return qp, wq, kp, ksc


def _scores(qp, wq, kp, ksc, e):
    kv = e4m3_values(kp[:e])
    return (wq.astype(np.float64) @ np.maximum(e4m3_values(qp) @ kv.T, 0)) * ksc[:e]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("r", [6, 14, 30])
def test_decode_bound_holds_keeps_the_top_and_prunes(seed, r):
    qp, wq, kp, ksc = _request(seed)
    N, K = kp.shape[0], 64
    ke = np.array([N - 1, N])
    tau = np.array([np.sort(_scores(qp[j], wq[j], kp, ksc, ke[j]))[-K] for j in range(2)])
    out = decode_survival(qp, wq, kp, ksc, ke, tau, r=r)
    assert out["violations"] == 0
    for j in range(2):  # every key at or above τ survives (it is below its bound)
        assert out["survivors"][j] >= int((_scores(qp[j], wq[j], kp, ksc, ke[j]) >= tau[j]).sum())
    np.testing.assert_array_equal(out["visible"], ke)
    # heads near one direction, all positive: the bound is tight enough to prune (2–17 %)
    assert np.all(out["survival"] < 0.3), out["survival"]


def test_decode_without_a_threshold_keeps_every_key():
    qp, wq, kp, ksc = _request(2, N=512)
    out = decode_survival(qp, wq, kp, ksc, np.array([300, 512]), np.full(2, -np.inf), r=14)
    np.testing.assert_array_equal(out["survivors"], [300, 512])
    np.testing.assert_array_equal(out["survival"], [1.0, 1.0])
    assert out["violations"] == 0
