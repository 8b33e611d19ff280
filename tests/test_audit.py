"""Guard audit (dosa_ref.audit): zero violations on a generated workload, a planted
violation is found, written and replayed; exact and interval margins agree."""

import dataclasses
import json
import os

import numpy as np
import pytest

from dosa_ref.audit import audit, audit_replay, main
from dosa_ref.error_model import ErrorModel
from dosa_ref.fp8 import e4m3_values, key_rms, quantize_keys, quantize_queries
from dosa_ref.margins import exact_margin, interval_margins
from dosa_ref.numeric import build_fp8_plan, default_plan


def small_workload(seed=0, Qn=3, H=8, D=32, N=1500, fp8q=True):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(D)
    q = 0.7 * base + rng.standard_normal((Qn, H, D))
    w = -np.abs(rng.standard_normal((Qn, H)))
    w[:, 0] *= -1
    if fp8q:
        qp, wf = quantize_queries(q, w)
        q, w = e4m3_values(qp), wf.astype(np.float64)
    k = rng.standard_normal((N, D)) + 1.5 * base / np.linalg.norm(base)
    ke = N - Qn + 1 + np.arange(Qn)
    return q, w, k, np.zeros(Qn, np.int64), ke


def test_audit_clean_and_outputs(tmp_path):
    q, w, k, ks, ke = small_workload()
    calls = []
    rep = audit(
        (q, w, k, ks, ke),
        K=16,
        out=str(tmp_path),
        sample=64,
        progress=lambda *a: calls.append(a),
    )
    assert rep["n_violations"] == 0 and rep["violations"] == []
    assert rep["ids_match_full_scoring"]
    assert rep["pairs_interval"] == int(np.sum(ke - ks))
    assert rep["pairs_exact"] >= 60
    assert rep["min_margin_interval"] >= 0 and rep["min_computed_margin"] >= 0
    assert rep["min_margin_exact_rel"] >= rep["min_margin_interval_rel"] - 1e-12
    assert rep["survival_guard_tau_star"] >= rep["survival_exact_tau_star"]
    assert {"envelope_screen", "envelope_scorer", "norm", "cert_cancellation"} <= set(
        rep["slack_mean"]
    )
    assert calls and calls[-1][0] == "check"
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["n_violations"] == 0
    assert "guard audit" in (tmp_path / "audit.md").read_text()
    try:
        import matplotlib  # noqa: F401

        assert os.path.exists(tmp_path / "audit.png")
    except ImportError:
        assert rep["png"] is None


def test_audit_finds_planted_violation_and_replays(tmp_path):
    q, w, k, ks, ke = small_workload(seed=1, fp8q=False)

    def shrink_c(fp):
        return dataclasses.replace(fp, C=np.float32(fp.C * 0.0), eps_raw=0.0)

    rep = audit((q, w, k, ks, ke), K=16, out=str(tmp_path), sample=16, plan_hook=shrink_c)
    assert rep["n_violations"] > 0
    v = rep["violations"][0]
    assert v["min_margin"] < 0 and os.path.exists(v["file"])
    rr = audit_replay(v["file"])
    assert rr["stored"]["violations"] > 0  # the stored (planted) plan still violates
    assert rr["rebuilt"]["violations"] == 0  # the current code's plan does not
    assert main(["--replay", v["file"]]) == 0


def test_interval_margin_below_exact_margin():
    q, w, k, ks, ke = small_workload(seed=2, Qn=1, N=200, fp8q=False)
    payload, scale = quantize_keys(k)
    kbar = e4m3_values(payload)
    rho = key_rms(payload)
    model = ErrorModel()
    for form in ("base", "abs"):
        fp = build_fp8_plan(default_plan(q[0], w[0], kbar, 3), q[0], w[0], model, form)
        iv = interval_margins(fp, q[0], w[0], kbar, scale.astype(float), rho.astype(float), model)
        for i in range(0, 200, 25):
            ex = exact_margin(fp, q[0], w[0], kbar[i], scale[i], rho[i], model)
            assert float(ex["margin"]) >= iv["margin"][i]
            assert ex["margin"] >= 0


def test_main_on_saved_workload(tmp_path):
    pytest.importorskip("dosa_ref.workloads")
    from dosa_ref import workloads

    if not hasattr(workloads, "load_workload"):
        pytest.skip("dosa_ref.workloads.load_workload not available")
    q, w, k, ks, ke = small_workload(seed=3, Qn=2, N=600)
    path = tmp_path / "wl.npz"
    np.savez(path, q=q, w=w, k=k, ks=ks, ke=ke)
    out = tmp_path / "out"
    rc = main(["--load", str(path), "--K", "8", "--out", str(out), "--sample", "8"])
    assert rc == 0 and (out / "audit.json").exists()
