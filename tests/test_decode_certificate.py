"""The certificate screen in decode on the FP8 arithmetic, emulated on the CPU
(``dosa_cupy.emulate.decode_survival``; docs/method.md §10 "The certificate in decode"): the
bound the GPU screen would evaluate is above every visible key's score, keeps every key at or
above the threshold, and prunes on a structured walk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---- the GPU screen's arithmetic, bit for bit (csrc/score_fp8.cu decode_screen_tma) ------


def _plans(qp, wq, kp, r):
    """The rows' plans as the decode step builds them (FP8 scorer and screen allowances),
    with numpy's build_plans (the specification of the fused planner)."""
    from dosa_cupy.emulate import _padded_heads
    from dosa_cupy.plan import build_plans, row_tiles

    q, w = _padded_heads(qp, wq)
    mts = row_tiles(r)
    sample = np.linspace(0, kp.shape[0] - 1, 256).astype(np.int64)
    return build_plans(q, w, kp, sample, r, mts, xp=np, scorer="fp8_fresh", screen="fp8_fresh")


def _thresholds(qp, wq, kp, ksc, ke, K, frac=0.5):
    """Each row's threshold record: the K-th record of its FP8 scores over a random share
    ``frac`` of its visible keys (witnesses), and the FP8 scores of all its visible keys."""
    from dosa_cupy.emulate import _padded_heads, make_records
    from dosa_ref.mma_model import fp8_fresh_scores

    q, w = _padded_heads(qp, wq)
    rng = np.random.default_rng(5)
    thr, scores = [], []
    for j in range(q.shape[0]):
        s = fp8_fresh_scores(q[j], w[j], kp[: ke[j]], ksc[: ke[j]])
        wit = np.flatnonzero(rng.random(ke[j]) < frac)
        thr.append(np.sort(make_records(s[wit], wit))[-K])
        scores.append(s)
    return np.array(thr, dtype=np.uint64), scores


@pytest.mark.parametrize("r", [14, 30])
def test_gpu_screen_emulation_keeps_every_record_at_or_above_the_threshold(r):
    """decode_screen_keep (the kernel's bits) keeps every key whose record reaches its row's
    threshold — the screen's exactness — and prunes the structured request."""
    from dosa_cupy.emulate import decode_screen_keep, record_score

    qp, wq, kp, ksc = _request(3)
    ke, K = np.array([4095, 4096]), 64
    pl = _plans(qp, wq, kp, r)
    thr, scores = _thresholds(qp, wq, kp, ksc, ke, K, frac=0.9)
    keep = decode_screen_keep(pl.rows, pl.omega, pl.sigma, pl.C, pl.eps_raw, pl.eps_out,
                              pl.valid, thr, kp, ksc, ke)  # fmt: skip
    for j in range(2):
        tau = record_score(thr[j : j + 1])[0]
        must = np.flatnonzero(scores[j] >= tau)
        assert must.size >= K and keep[must].all(), j
    assert not keep[ke.max() :].any()
    assert keep.mean() < 0.3, keep.mean()  # as decode_survival's float64 bound: 2–17 %


def test_gpu_screen_emulation_without_a_threshold_or_plan_keeps_every_visible_key():
    from dosa_cupy.emulate import decode_screen_keep

    qp, wq, kp, ksc = _request(4, N=256)
    pl = _plans(qp, wq, kp, 14)
    ke = np.array([200, 201])
    args = (pl.rows, pl.omega, pl.sigma, pl.C, pl.eps_raw, pl.eps_out)
    keep = decode_screen_keep(*args, pl.valid, np.zeros(2, np.uint64), kp, ksc, ke)
    np.testing.assert_array_equal(keep, np.arange(256) < 201)
    thr, _ = _thresholds(qp, wq, kp, ksc, ke, 8)
    keep = decode_screen_keep(*args, np.zeros(2, bool), thr, kp, ksc, ke)  # invalid plans
    np.testing.assert_array_equal(keep, np.arange(256) < 201)


@pytest.mark.parametrize("mts", [1, 2])
def test_plans_weigh_the_aux_rows_zero(mts):
    """The screen's chains run over every plan row with its ω, the aux rows' included: their
    ω must be 0 (the aux sum enters once, by −σ; proofs/gpu_screen_epilogue.py eval_dec)."""
    qp, wq, kp, _ = _request(6, N=256)
    pl = _plans(qp, wq, kp, 14 if mts == 1 else 30)
    assert pl.mts == mts
    np.testing.assert_array_equal(pl.omega[:, [16 * mts - 9, 16 * mts - 1]], 0.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_decode_key_rho_bounds_the_rms(seed):
    """ρ of the screen (key_rho_bound's arithmetic) ≥ ‖k̄‖ / √128 (proofs/decode_rho.py proves
    it; this draws keys of every code), and at most its largest lift above it: the f16
    chains' seven roundings, the fp32 sums' four and the product's one rounded up, kRhoLift
    and the root rounded up (error_model.md "The decode screen's ρ")."""
    from dosa_cupy.emulate import RHO_LIFT, decode_key_rho

    hi = np.sqrt(2 * float(RHO_LIFT) * (1 + 2.0**-11) ** 7 * (1 + 2.0**-23) ** 5) * (1 + 2.0**-23)

    k = np.random.default_rng(seed).integers(0, 256, (64, 128)).astype(np.uint8)
    k[(k & 0x7F) == 0x7F] = 0x7E  # no NaN codes
    rho = decode_key_rho(k).astype(np.float64)
    rms = np.sqrt((e4m3_values(k) ** 2).sum(axis=1) / 128)
    assert np.all(rho**2 >= rms**2)
    assert np.all(rho <= rms * hi)
