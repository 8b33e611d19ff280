"""Workload generators, save/load and the calibration entry points (dosa_ref.workloads)."""

from __future__ import annotations

import numpy as np
import pytest

from dosa_ref import dosa_topk, index_scores, topk_ids
from dosa_ref.calibration import CALIBRATION_TARGETS, calibration_table, format_calibration
from dosa_ref.workloads import (
    REGIMES,
    Workload,
    load_workload,
    make_workload,
    save_workload,
)

SMALL = dict(Qn=4, N=512, D=32)


def _arrays_equal(a: Workload, b: Workload) -> bool:
    return all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a.arrays(), b.arrays(), strict=True)
    )


# --------------------------------------------------------------------------- generators


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_shapes_dtypes_and_causal_ranges(name):
    wl = make_workload(name, **SMALL, seed=3)
    Qn, N, D = SMALL["Qn"], SMALL["N"], SMALL["D"]
    H = REGIMES[name].H
    assert wl.q.shape == (Qn, H, D) and wl.q.dtype == np.float32
    assert wl.w.shape == (Qn, H) and wl.w.dtype == np.float32
    assert wl.k.shape == (N, D) and wl.k.dtype == np.float32
    assert wl.ks.dtype == np.int32 and wl.ke.dtype == np.int32
    assert wl.shape == (Qn, H, D, N)
    # Causal prefill: the chunk is the last Qn positions; query t sees [0, N - Qn + t + 1).
    np.testing.assert_array_equal(wl.ks, np.zeros(Qn))
    np.testing.assert_array_equal(wl.ke, N - Qn + 1 + np.arange(Qn))
    assert wl.ke[-1] == N
    assert all(np.all(np.isfinite(a)) for a in (wl.q, wl.w, wl.k))
    assert wl.name == name
    assert wl.params["seed"] == 3 and wl.params["N"] == N and wl.params["H"] == H
    assert REGIMES[name].doc.strip()


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_determinism_by_seed(name):
    a = make_workload(name, **SMALL, seed=7)
    b = make_workload(name, **SMALL, seed=7)
    c = make_workload(name, **SMALL, seed=8)
    assert _arrays_equal(a, b)
    assert a.params == b.params
    assert not np.array_equal(a.k, c.k) and not np.array_equal(a.q, c.q)


def test_head_count_override_and_bad_arguments():
    assert make_workload("h64", **SMALL).q.shape[1] == 64
    assert make_workload("h64", **SMALL, H=16).q.shape[1] == 16
    with pytest.raises(ValueError, match="name"):
        make_workload("nope", **SMALL)
    with pytest.raises(ValueError, match="Qn"):
        make_workload("calibrated", Qn=10, N=5, D=8)
    with pytest.raises(ValueError, match="N"):
        make_workload("calibrated", Qn=1, N=0, D=8)


def test_regime_geometry():
    """The calibrated regime has the advertised structure; isotropic does not."""
    wl = make_workload("calibrated", Qn=32, N=4096, D=64, seed=0)
    npos = (wl.w > 0).sum(axis=1)
    assert np.all(npos < wl.q.shape[1] // 4)  # a few positive heads per query
    cos = wl.k @ wl.k.mean(0) / (np.linalg.norm(wl.k, axis=1) * np.linalg.norm(wl.k.mean(0)))
    assert np.median(cos) > 0.5  # shared mean direction
    iso = make_workload("isotropic", Qn=4, N=4096, D=64, seed=0)
    mean = iso.k.mean(0)
    assert np.linalg.norm(mean) < 0.2 * np.sqrt(np.mean(np.sum(iso.k**2, axis=1)))
    many = make_workload("many_positive", Qn=32, N=512, D=32, seed=0)
    assert (many.w > 0).mean() > 0.35


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_dosa_topk_exact_on_each_regime(name):
    """Certificate pruning returns exactly the brute-force Top-K on every regime."""
    wl = make_workload(name, Qn=4, N=1024, D=32, seed=1)
    K = 32
    want = topk_ids(index_scores(wl.q, wl.w, wl.k, wl.ks, wl.ke), K)
    for seeds in ("local+anchor", "local+anchor+certificate"):
        res = dosa_topk(
            wl.q,
            wl.w,
            wl.k,
            K,
            wl.ks,
            wl.ke,
            seeds=seeds,
            window=64,
            sinks=4,
            n_anchors=2,
            cert_seeds=64,
        )
        np.testing.assert_array_equal(res.ids, want)
        assert res.stats.screened.sum() > 0  # the screening path really ran


# --------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_round_trip_bitwise(tmp_path, suffix):
    wl = make_workload("calibrated", **SMALL, seed=5)
    path = save_workload(wl, tmp_path / f"wl{suffix}", K=64)
    back = load_workload(path)
    assert _arrays_equal(wl, back)
    assert back.name == "calibrated"
    assert back.params["K"] == 64
    assert {k: v for k, v in back.params.items() if k != "K"} == wl.params
    # Without K, no K comes back.
    back2 = load_workload(save_workload(wl, tmp_path / f"nok{suffix}"))
    assert "K" not in back2.params and _arrays_equal(wl, back2)


def test_safetensors_names_and_metadata(tmp_path):
    from safetensors import safe_open

    wl = make_workload("isotropic", **SMALL)
    path = save_workload(wl, tmp_path / "wl.safetensors", K=8)
    with safe_open(str(path), framework="np") as f:
        assert sorted(f.keys()) == ["k", "ke", "ks", "q", "w"]
        meta = f.metadata()
    assert meta["name"] == "isotropic" and meta["K"] == "8"


def _write(path, arrays):
    if path.suffix == ".npz":
        np.savez(path, **arrays)
    else:
        from safetensors.numpy import save_file

        save_file(arrays, str(path))


def _base_arrays():
    wl = make_workload("calibrated", Qn=3, N=64, D=8, seed=2)
    return dict(zip(("q", "w", "k", "ks", "ke"), wl.arrays(), strict=True))


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.parametrize("missing", ["q", "w", "k", "ks", "ke"])
def test_missing_tensor_raises(tmp_path, suffix, missing):
    arrays = _base_arrays()
    del arrays[missing]
    path = tmp_path / f"bad{suffix}"
    _write(path, arrays)
    with pytest.raises(ValueError, match=rf"^{missing}: tensor missing"):
        load_workload(path)


def _corrupt(name):
    a = _base_arrays()
    if name == "q_nan":
        a["q"] = a["q"].copy()
        a["q"][0, 0, 0] = np.nan
    elif name == "k_inf":
        a["k"] = a["k"].copy()
        a["k"][1, 2] = np.inf
    elif name == "w_shape":
        a["w"] = a["w"][:, :-1].copy()
    elif name == "k_dim":
        a["k"] = a["k"][:, :-1].copy()
    elif name == "q_rank":
        a["q"] = a["q"][0].copy()
    elif name == "ks_gt_ke":
        a["ks"] = a["ke"].copy()
        a["ks"][1] = a["ke"][1] + 1
    elif name == "ke_past_N":
        a["ke"] = a["ke"].copy()
        a["ke"][-1] = a["k"].shape[0] + 1
    elif name == "ks_negative":
        a["ks"] = a["ks"].copy()
        a["ks"][0] = -1
    elif name == "ks_float":
        a["ks"] = a["ks"].astype(np.float32)
    elif name == "ke_shape":
        a["ke"] = a["ke"][:-1].copy()
    elif name == "w_int":
        a["w"] = a["w"].astype(np.int32)
    return a


CORRUPT = {
    "q_nan": "q",
    "k_inf": "k",
    "w_shape": "w",
    "k_dim": "k",
    "q_rank": "q",
    "ks_gt_ke": "ks",
    "ke_past_N": "ke",
    "ks_negative": "ks",
    "ks_float": "ks",
    "ke_shape": "ke",
    "w_int": "w",
}


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_invalid_tensor_raises_naming_it(tmp_path, suffix, case):
    path = tmp_path / f"bad{suffix}"
    _write(path, _corrupt(case))
    with pytest.raises(ValueError, match=rf"^{CORRUPT[case]}:"):
        load_workload(path)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_unreadable_file_raises(tmp_path, suffix):
    path = tmp_path / f"junk{suffix}"
    path.write_bytes(b"\x00not a tensor file at all" * 10)
    with pytest.raises(ValueError, match="cannot read"):
        load_workload(path)
    truncated = tmp_path / f"trunc{suffix}"
    good = save_workload(make_workload("calibrated", **SMALL), tmp_path / f"good{suffix}")
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError):
        load_workload(truncated)


def test_bad_suffix_and_save_validates(tmp_path):
    wl = make_workload("calibrated", **SMALL)
    with pytest.raises(ValueError, match="path"):
        save_workload(wl, tmp_path / "wl.pt")
    with pytest.raises(ValueError, match="path"):
        load_workload(tmp_path / "wl.h5")
    bad = Workload(wl.q, wl.w, wl.k, wl.ke, wl.ks)  # ks > ke
    with pytest.raises(ValueError, match="^ks:"):
        save_workload(bad, tmp_path / "bad.npz")
    assert not (tmp_path / "bad.npz").exists()


# --------------------------------------------------------------------------- calibration


def test_calibration_smoke():
    rows = calibration_table(Qn=2, N=600, seed=0, progress=False, layers=1, K=16, window=32)
    paper = [r for r in rows if r["criterion"] != "-"]
    assert [r["statistic"] for r in paper] == list(CALIBRATION_TARGETS)
    for r in rows:
        assert set(r) >= {"statistic", "target", "measured", "within_50pct"}
        assert isinstance(r["within_50pct"], bool)
    for r in paper:
        assert 0.0 <= r["measured"] <= 1.0
    observed = {r["statistic"]: r["measured"] for r in rows if r["criterion"] == "-"}
    assert observed["fully scored fraction (full certificate)"] > 0.0  # anchors can pass 1
    assert 0.0 <= observed["visible keys scoring exactly 0"] <= 1.0
    assert 0.0 <= observed["positive heads per query (mean)"] <= 32
    table = format_calibration(rows)
    assert table.count("\n") == len(rows) + 1
    assert "2.65%" in table and "95.06%" in table
    with pytest.raises(ValueError, match="layers"):
        calibration_table(Qn=2, N=600, progress=False, layers=0, K=16)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_float64_tensors_load_without_narrowing(tmp_path, suffix):
    """Tensors dumped in float64 keep their exact values (no silent cast to float32)."""
    wl = make_workload("calibrated", **SMALL)
    arrays = dict(
        q=wl.q.astype(np.float64) / 3, w=wl.w.astype(np.float64), k=wl.k, ks=wl.ks, ke=wl.ke
    )
    path = tmp_path / f"f64{suffix}"
    _write(path, arrays)
    back = load_workload(path)
    assert back.q.dtype == np.float64 and np.array_equal(back.q, arrays["q"])
