"""The native FP8 scorer as the canonical scorer of a call (``scorer="fp8"``, dosa_cupy/scorer.py;
docs/error_model.md "A native FP8 scorer"): the dense route selects the Top-K of the host
model ``dosa_ref.mma_model.fp8_fresh_scores``, and every other route of the call — DoSA with
each screen, the overflow extension, explicit and certificate seeds, recovery, the captured
step — returns the FP8 dense route's ids bitwise.  Needs a compute-capability-9.0 GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gpu_support import cp, gpu, needs_sm90a

import dosa_cupy
from dosa_cupy import cost, pipeline, sm90a
from dosa_cupy import scorer as scorer_mod
from dosa_cupy.workload import make_gpu_workload
from dosa_ref.mma_model import fp8_fresh_scores
from dosa_ref.scorer import topk_ids

# the sampled decision's rates, and one that never takes the dense route
SAMPLED = dataclasses.replace(cost.H200_FP8, dosa_floor_ms=0.0)
NEVER_DENSE = dataclasses.replace(SAMPLED, logits_flop_per_ms={32: 1.0, 64: 1.0})


def _args(regime, Qn, N, H, K=256, seed=7):
    wl = make_gpu_workload(regime, Qn, N, H, seed=seed)
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 48, 32, 20])
def test_fp8_dense_route_selects_the_host_models_topk(H):
    """The FP8 dense route's ids are ``topk_ids`` of the host model's fp32 scores of the
    padded problem (heads padded to 32 / 64 with zero rows and weights: the canonical FP8
    scorer is defined on the padded heads, whose tree the model follows)."""
    from dosa_cupy.prepare import pad_heads

    q, w, kp, ksc, K, ks, ke = _args("calibrated", 12, 3000, H, K=200)
    got = cp.asnumpy(dosa_cupy.dense_topk(q, w, kp, ksc, K, ks, ke, scorer="fp8"))
    qn, wn = (cp.asnumpy(a) for a in pad_heads(q, w, "fp8"))
    kn, an = cp.asnumpy(kp), cp.asnumpy(ksc)
    ksn, ken = cp.asnumpy(ks), cp.asnumpy(ke)
    s = np.full((12, 3000), -np.inf)
    for t in range(12):
        s[t, ksn[t] : ken[t]] = fp8_fresh_scores(qn[t], wn[t], kn[ksn[t] : ken[t]],
                                                 an[ksn[t] : ken[t]])  # fmt: skip
    assert np.array_equal(got, topk_ids(s, K))
    lg = cp.asnumpy(dosa_cupy.dense_logits(q, w, kp, ksc, ks, ke, scorer="fp8"))
    assert np.array_equal(lg.view(np.uint32), s.astype(np.float32).view(np.uint32))


@gpu
@needs_sm90a
@pytest.mark.parametrize("regime", ["calibrated", "h64", "many_positive", "ties", "equal"])
@pytest.mark.parametrize("H", [32, 64])
def test_fp8_every_route_equals_the_fp8_dense_route(regime, H, monkeypatch):
    """DoSA with every screen (the tie-aware build where τ = 0), a small buffer (the exact
    overflow extension), explicit and certificate seeds, the route choice's branches, and
    the fused route (with and without a small buffer, and explicit seeds) all return the
    FP8 dense route's ids."""
    if regime == "h64" and H == 32:
        pytest.skip("h64 is a 64-head regime")
    a = _args(regime, 300, 20000, H)
    dense = dosa_cupy.dense_topk(*a, scorer="fp8")
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    screens = [("fp64", 14), ("fp64", 30), ("pair", 6)]
    if sm90a.available():
        screens += [("wg", 14), ("wg", 30)]
    for screen, r in screens:
        for extra in ({}, {"buffer": 64}, {"tie_reject": False}):
            ids, st = dosa_cupy.dosa_topk(*a, scorer="fp8", route="dosa", screen=screen, r=r,
                                          return_stats=True, **extra)  # fmt: skip
            assert st.route.route == "dosa"
            assert cp.array_equal(ids, dense), (screen, r, extra)
    seed_ids = cp.asarray(cp.asnumpy(dense)[:, ::7])
    ids = dosa_cupy.dosa_topk(*a, scorer="fp8", route="dosa", seed_ids=seed_ids)
    assert cp.array_equal(ids, dense)
    ids = dosa_cupy.dosa_topk(*a, scorer="fp8", route="dosa", screen="fp64", cert_seeds=512)
    assert cp.array_equal(ids, dense)
    for model in (SAMPLED, NEVER_DENSE):
        monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="", m=model: m)
        ids = dosa_cupy.dosa_topk(*a, scorer="fp8")
        assert cp.array_equal(ids, dense)
    from dosa_cupy import seeds

    for extra in ({}, {"buffer": 16}, {"seed_ids": seed_ids}):
        ids, st = dosa_cupy.fused_topk(*a, scorer="fp8", return_stats=True, **extra)
        assert cp.array_equal(ids, dense), ("fused", list(extra))
        if "buffer" in extra:
            assert st.overflows.any()  # the exact extension ran
    monkeypatch.setattr(seeds, "GRID_Y", 1)  # one block row of queries per launch
    assert cp.array_equal(dosa_cupy.fused_topk(*a, scorer="fp8"), dense)


@gpu
@needs_sm90a
def test_fp8_recovery_and_capture_equal_the_fp8_dense_route(monkeypatch):
    """Queries with an invalid key scale in range are recovered by the FP8 dense route, and
    the captured prefill step (eager first step, then replays) returns the same ids."""
    q, w, kp, ksc, K, ks, ke = _args("calibrated", 200, 12000, 64)
    ksc = ksc.copy()
    ksc[5000] = cp.nan  # a NaN scale: the queries that see key 5000 are recovered
    dense = dosa_cupy.dense_topk(q, w, kp, ksc, K, ks, ke, scorer="fp8", check=False)
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    ids, st = dosa_cupy.dosa_topk(q, w, kp, ksc, K, ks, ke, scorer="fp8", route="dosa",
                                  check=False, return_stats=True)  # fmt: skip
    assert st.recovered.any() and cp.array_equal(ids, dense)
    from dosa_cupy.capture import PrefillSelectorGPU

    sel = PrefillSelectorGPU(K, scorer="fp8", route="dosa", screen="fp64")
    a = _args("calibrated", 256, 16384, 64)
    want = dosa_cupy.dense_topk(*a, scorer="fp8")
    for _ in range(2):  # the shape's first (eager) step, then a step on its arena
        out = cp.empty((256, K), dtype=cp.int64)
        sel.step(*a[:4], a[5], a[6], out=out).finish()
        assert cp.array_equal(out, want)


@gpu
def test_scorer_option_is_checked():
    a = _args("calibrated", 8, 1000, 32)
    with pytest.raises(ValueError, match="^scorer: expected one of"):
        dosa_cupy.dosa_topk(*a, scorer="bf16")
    if not scorer_mod.fp8_available():
        with pytest.raises(ValueError, match="^scorer: 'fp8' needs"):
            dosa_cupy.dense_topk(*a, scorer="fp8")
