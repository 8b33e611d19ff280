"""``dosa bench`` without a GPU: sweep grid and order, parts, filter, memory sub-chunks,
floors, markdown, --merge and plots on synthetic rows (CuPy is never imported here)."""

import contextlib
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from dosa_cupy import bench as B
from dosa_cupy import cost
from dosa_cupy.bench import decode as BD
from dosa_cupy.bench import decode_peers as DP
from dosa_cupy.bench import peers as P
from dosa_cupy.bench.timing import spans

MI = 1 << 20
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "records" / "results"


def _row(H, Qn, N, regime="calibrated", tile=256, speed=1.5, surv=0.01, **kw):
    """A plausible finished row: routes at fixed multiples of their floors."""
    pairs = B.causal_pairs(Qn, N)
    fl = B.floors_ms(H, Qn, N, pairs, surv)
    qs = [surv * (0.2 + 1.6 * i / 100) for i in range(101)]
    r = dict(
        H=H, Qn=Qn, N=N, K=2048, regime=regime, r=14, tile=tile, reps=10, rotate=2,
        visible_pairs=pairs, logits_ms=4 * fl["logits_floor_ms"],
        logits_tflops=2 * H * 128 * pairs / (4 * fl["logits_floor_ms"]) / 1e9,
        select_ms=7 * fl["select_floor_ms"], torch_topk_ms=13 * fl["select_floor_ms"],
        dense_route_ms=4 * fl["logits_floor_ms"] + 7 * fl["select_floor_ms"],
        fused_ms=4 * fl["fused_floor_ms"], survival_pooled=surv, survival_mean=surv,
        survival_p90=qs[90], survival_quantiles=qs, kept_mean=2100.0, overflowed=0,
        recovered=0, dosa_ids_equal_dense=True, fused_ids_equal_dense=True,
        torch_values_equal=True, torch_kth_match=True, dense_subchunk=min(Qn, 8192),
        memory_notes=[] if Qn <= 8192 else ["dense: … → 4 sub-chunks of 8192 queries"],
        dosa_stage_ms={"prepare": 1.0, "seeds": 2.0, "plan": 3.0, "screen": 50.0,
                       "refine": 5.0, "select": 1.0, "recover": 0.1},
        fused_stage_ms={"seeds": 2.0, "score+filter": 90.0, "select": 1.0, "recover": 0.1},
        commit="abc1234", date_utc="2026-11-30 06:00:00Z", device="NVIDIA H200",
    )  # fmt: skip
    r["dosa_ms"] = r["dense_route_ms"] / speed
    r["speedup_vs_dense"] = speed
    r["speedup_vs_fused"] = r["fused_ms"] / r["dosa_ms"]
    r.update(fl)
    r.update(kw)
    return r


def _jobs(shapes):
    return [("calibrated", 256, s) for s in shapes]


# --------------------------------------------------------------------------- grid, parts


def test_sweep_grid_and_importance_order():
    sh = B.sweep_shapes()
    grid = {(H, Q, N) for H in (32, 64) for Q in B.CHUNKS for N in B.CONTEXTS}
    assert set(sh) == grid and len(sh) == len(grid) == 40
    assert all(Q <= N for _, Q, N in sh)
    # Qn=4096 at 1M for H=32 then H=64 first, then the rest of Qn=4096, then larger Qn
    assert sh[:2] == [(32, 4096, 1048576), (64, 4096, 1048576)]
    assert all(Q == 4096 for _, Q, _ in sh[:10])
    assert [Q for _, Q, _ in sh] == sorted(Q for _, Q, _ in sh)
    for Q in B.CHUNKS:
        ns = [N for _, q, N in sh if q == Q]
        assert ns == sorted(ns, reverse=True)


def test_filter_and_parse_shapes():
    sh = B.sweep_shapes()
    assert B.filter_shapes(sh, None) == sh
    one_m = B.filter_shapes(sh, "x1048576")
    assert len(one_m) == 8 and all(N == 1048576 for *_, N in one_m)
    both = B.filter_shapes(sh, "32x4096x1048576, 64x32768x")
    assert both == [(32, 4096, 1048576)] + [s for s in sh if s[:2] == (64, 32768)]
    assert B.parse_shapes("32x4096x131072, 64x8x64") == [(32, 4096, 131072), (64, 8, 64)]
    for bad in ("32x4096", "32x4096xN", "65x8x64", "32x128x64", ""):
        with pytest.raises(ValueError, match="shapes"):
            B.parse_shapes(bad)


@pytest.mark.parametrize("spec", ["3/2", "2/2", "0/0", "-1/2", "1", "a/b", "1/2/3"])
def test_parse_part_rejects(spec):
    with pytest.raises(ValueError, match="part"):
        B.parse_part(spec)


def test_parse_part_accepts():
    assert B.parse_part(None) == (0, 1)
    assert B.parse_part("0/1") == (0, 1)
    assert B.parse_part("3/4") == (3, 4)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 7, 40, 60])
def test_parts_are_contiguous_balanced_and_cover(P):
    jobs = _jobs(B.sweep_shapes())

    def cost(j):
        return B.estimate_seconds(*j[2])

    parts = [B.select_part(jobs, i, P, cost) for i in range(P)]
    assert [j for p in parts for j in p] == jobs  # each job once, in order: contiguous
    total = sum(cost(j) for j in jobs)
    big = max(cost(j) for j in jobs)
    assert all(sum(cost(j) for j in p) <= total / P + big for p in parts)
    assert jobs[0] in parts[0]  # the most important shape runs in part 0


def test_part_index_degenerate():
    assert B.part_index([], 3) == []
    assert B.part_index([0.0, 0.0, 0.0, 0.0], 2) == [0, 0, 1, 1]
    assert B.part_index([5.0], 4) == [2]


def test_estimate_grows_with_work():
    e = B.estimate_seconds
    assert e(32, 4096, 1 << 20) < e(64, 4096, 1 << 20) < e(64, 8192, 1 << 20)
    assert e(32, 4096, 1 << 17) < e(32, 4096, 1 << 20)


# --------------------------------------------------------------------------- memory


def test_largest_pow2_subchunk():
    f = B.largest_pow2_subchunk
    G = B.GIB
    assert f(4096, 4 * MI, 40 * G) == 4096  # 16 GiB fits whole
    assert f(32768, 4 * MI, 40 * G) == 8192  # 128 GiB → 32 GiB sub-chunks
    assert f(16384, 4 * MI, 40 * G) == 8192  # 64 GiB → 32 GiB
    assert f(10241, 4 * MI, 40 * G) == 8192
    assert f(3000, 1.0, 1500) == 1024  # non-power-of-two chunk: a power of two below it
    assert f(1, 10.0, 5.0) == 0  # one query does not fit
    assert f(8, 10.0, 5.0) == 0


def test_largest_pow2_subchunk_exact_fit_is_whole():
    assert B.largest_pow2_subchunk(10240, 4 * MI, 40 * B.GIB) == 10240


def test_memory_plan_for_the_sweep():
    for H, Qn, N in B.sweep_shapes():
        m = B.memory_plan(H, Qn, N)
        assert m["skipped"] is None
        for route, sub in m["subchunk"].items():
            assert 1 <= sub <= Qn and Qn % sub == 0
            assert sub * m["bytes_per_query"][route] <= 40 * B.GIB
            if sub < Qn:  # the largest power of two that fits
                assert 2 * sub * m["bytes_per_query"][route] > 40 * B.GIB
        assert len(m["notes"]) == sum(s < Qn for s in m["subchunk"].values())
    m = B.memory_plan(64, 32768, 1 << 20)
    assert m["subchunk"]["dense"] == 8192  # 128 GiB of logits
    assert m["bytes_per_query"]["dense"] == 4 << 20
    assert m["bytes_per_query"]["dosa"] >= (1 << 20) // 8 + 65536 * 8  # bitmask + records
    assert m["bytes_per_query"]["fused"] >= 65536 * 8
    assert m["subchunk"]["dosa_stats"] < 32768  # the stats popcount needs N bytes a query
    assert any(n.startswith("dense:") and "4 sub-chunks of 8192" in n for n in m["notes"])
    assert B.memory_plan(32, 4096, 1 << 20)["notes"] == []


def test_memory_plan_skips_with_a_reason():
    m = B.memory_plan(32, 4096, 1 << 20, budget_gib=1e-4)
    assert m["skipped"] and "one query needs" in m["skipped"]
    m = B.memory_plan(32, 4096, 1 << 20, device_gib=0.5)
    assert m["skipped"] and "device" in m["skipped"]
    m = B.memory_plan(32, 32768, 1 << 20, budget_gib=8)
    assert m["skipped"] is None and m["subchunk"]["dense"] == 2048


# --------------------------------------------------------------------------- floors


def test_causal_pairs():
    for Qn, N in ((1, 1), (3, 5), (7, 7), (16, 100)):
        assert B.causal_pairs(Qn, N) == sum(N - Qn + t + 1 for t in range(Qn))


def test_floors_values():
    Qn, N = 4096, 1 << 20
    p = B.causal_pairs(Qn, N)
    f = B.floors_ms(32, Qn, N, p, survival=0.01)
    mma32 = 2 * 32 * 128 * p / 1455e12 * 1e3
    read = Qn * N * 4 / 4.24e12 * 1e3
    assert f["logits_floor_ms"] == pytest.approx(mma32, rel=1e-12)  # MMA-bound
    assert f["logits_floor_ms"] == pytest.approx(
        24.1, abs=0.1
    )  # docs/records/notes.md "Counting first"
    assert f["select_floor_ms"] == pytest.approx(read, rel=1e-12)
    assert f["select_floor_ms"] == pytest.approx(4.05, abs=0.01)
    assert f["torch_topk_floor_ms"] == f["select_floor_ms"]
    assert f["dense_route_floor_ms"] == pytest.approx(mma32 + read, rel=1e-12)
    assert f["fused_floor_ms"] == pytest.approx(mma32, rel=1e-12)
    screen = 2 * 16 * 128 * p / 1455e12 * 1e3
    assert f["screen_floor_ms"] == pytest.approx(screen, rel=1e-12)
    assert f["dosa_floor_ms"] == pytest.approx(screen + 0.01 * mma32, rel=1e-12)
    assert "dosa_floor_ms" not in B.floors_ms(32, Qn, N)  # needs the survival
    assert B.floors_ms(32, Qn, N, r=30)["screen_floor_ms"] == pytest.approx(2 * screen)
    assert B.floors_ms(32, Qn, N)["logits_floor_ms"] == f["logits_floor_ms"]  # default pairs
    # few heads: writing the logits dominates the MMA
    g = B.floors_ms(1, Qn, N)
    assert g["logits_floor_ms"] == pytest.approx((Qn * N * 4 + N * 132) / 4.24e12 * 1e3)


def test_x_floor_and_row_floors_for_old_rows():
    r = _row(32, 4096, 1 << 20)
    x = B.x_floor(r)
    assert x["logits"] == pytest.approx(4) and x["select"] == pytest.approx(7)
    assert x["torch_topk"] == pytest.approx(13) and x["fused"] == pytest.approx(4)
    old = {k: v for k, v in r.items() if "floor" not in k and k != "survival_pooled"}
    assert B.row_floors(old)["dosa_floor_ms"] == pytest.approx(r["dosa_floor_ms"])
    assert B.x_floor(dict(r, torch_topk_ms=None))["torch_topk"] is None


def test_ids_equal():
    r = _row(32, 4096, 1 << 20)
    assert B.ids_equal(r) is True
    assert B.ids_equal(dict(r, torch_values_equal=False)) is False
    assert B.ids_equal(dict(r, torch_values_equal=False, torch_topk_ms=None)) is True
    assert B.ids_equal(dict(r, dosa_ids_equal_dense=False)) is False
    assert B.ids_equal({"H": 1, "Qn": 1, "N": 1, "skipped": "x"}) is None


# --------------------------------------------------------------------------- reports


def _rows():
    rows = [_row(H, Q, N, speed=0.5 + 0.01 * i) for i, (H, Q, N) in enumerate(B.sweep_shapes())]
    rows[-1] = {k: rows[-1][k] for k in ("H", "Qn", "N", "K", "regime", "r", "tile")}
    rows[-1]["skipped"] = "dense: one query needs 9216.00 MiB > budget 8 GiB"
    return rows


def test_markdown_table(tmp_path):
    rows = _rows()
    md = B.markdown(rows, {"date_utc": "2026-11-30 07:00:00Z", "commit": "deadbeef"})
    lines = md.splitlines()
    assert lines[0].startswith("# dosa bench")
    assert "Date (UTC): 2026-11-30 07:00:00Z" in md and "commit: deadbeef" in md
    h = next(i for i, ln in enumerate(lines) if ln.startswith("| regime | tile | H |"))
    head = lines[h]
    table = lines[h + 2 : lines.index("", h)]
    assert len(table) == len(rows) - 1  # the skipped row is listed below, not in the table
    assert all(ln.startswith("| calibrated | 256 |") for ln in table)
    assert head.count("×fl") == 7 and all(ln.count("|") == head.count("|") for ln in table)
    r0 = next(ln for ln in table if "| 32 | 4096 | 1048576 |" in ln)
    assert "| 4.0 |" in r0 and "| 7.0 |" in r0 and "| 13.0 |" in r0 and "True" in r0
    assert "| 0.50× |" in r0
    big = next(ln for ln in table if "| 32 | 32768 | 1048576 |" in ln)
    assert "| 8192 |" in big  # sub-chunked dense route
    assert "Stage split" in md and "Floors (ms)" in md and "Survival per query" in md
    assert "Skipped:" in md and "dense: one query needs 9216.00 MiB" in md
    assert "Sub-chunked routes" in md


def test_markdown_default_meta_and_recorded_runs():
    md = B.markdown([_row(32, 4096, 131072)])
    assert "commit: abc1234" in md  # the rows' own commit
    for name in ("bench_run12.json", "bench_run14_calibrated.json"):
        rows = B.load_rows(RESULTS / name)
        md = B.markdown(rows)
        assert md.count("\n| ") >= len(rows)
        assert "×fl" in md


def test_merge_and_plots(tmp_path, capsys):
    cupy_before = "cupy" in sys.modules
    rows = _rows()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    late = dict(rows[3], dosa_ms=1.0, speedup_vs_dense=9.0)  # a re-run of rows[3]
    skip0 = {k: rows[0][k] for k in ("H", "Qn", "N", "K", "regime", "r", "tile")}
    a.write_text(json.dumps(rows[:20]))
    b.write_text(json.dumps([dict(skip0, skipped="oom")] + rows[20:] + [late]))
    out = tmp_path / "merged"
    assert B.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads((out / "bench.json").read_text())
    assert len(merged) == len(rows)
    key = {(r["H"], r["Qn"], r["N"]): r for r in merged}
    assert "skipped" not in key[rows[0]["H"], rows[0]["Qn"], rows[0]["N"]]  # finished wins
    assert key[rows[3]["H"], rows[3]["Qn"], rows[3]["N"]]["speedup_vs_dense"] == 9.0  # later
    md = (out / "bench.md").read_text()
    assert "commit: abc1234" in md and "| 9.00× |" in md
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 6 and not any(f.endswith(".tmp") for f in files)
    if not cupy_before:
        assert "cupy" not in sys.modules
    pytest.importorskip("matplotlib")
    assert {"speedup.png", "survival.png", "stages.png", "floors.png"} <= set(files)
    assert all((out / f).stat().st_size > 1000 for f in files if f.endswith(".png"))
    assert "merged 40 row(s) from 2 file(s)" in capsys.readouterr().out


def test_plots_old_rows_and_without_matplotlib(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    rows = B.load_rows(RESULTS / "bench_run14_calibrated.json")
    files = B.plots(rows, tmp_path / "old")
    assert 1 <= len(files) <= 4 and all(f.stat().st_size > 0 for f in files)
    only_skipped = [dict(H=32, Qn=4096, N=1 << 20, regime="calibrated", tile=256, skipped="x")]
    assert [f.name for f in B.plots(only_skipped, tmp_path / "s")] == ["speedup.png"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import → ImportError
    assert B.plots(rows, tmp_path / "none") == []
    assert "matplotlib not installed" in capsys.readouterr().out


def test_merge_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="out"):
        B.main(["--merge", str(tmp_path / "x.json")])
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"a": 1}))
    with pytest.raises((ValueError, KeyError)):
        B.main(["--merge", str(p), "--out", str(tmp_path / "o")])


def test_write_outputs_rewrites_atomically(tmp_path):
    rows = _rows()[:3]
    meta = {"date_utc": "d", "commit": "c"}
    B.write_outputs(rows[:1], tmp_path, meta)
    B.write_outputs(rows, tmp_path, meta)
    assert len(json.loads((tmp_path / "bench.json").read_text())) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]


# --------------------------------------------------------------------------- CLI


def test_dry_run_sweep_part(capsys):
    cupy_before = "cupy" in sys.modules
    assert B.main(["--sweep", "--dry-run", "--part", "0/4", "--regime", "structured"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert lines[0].startswith("structured tile 256 32x4096x1048576:")
    assert lines[1].startswith("structured tile 256 64x4096x1048576:")
    assert "# part 3/4:" in out and "total" in out
    if not cupy_before:
        assert "cupy" not in sys.modules


def test_dry_run_notes_sub_chunks(capsys):
    argv = ["--shapes", "64x32768x1048576", "--dry-run", "--regime", "structured"]
    assert B.main(argv + ["--logits-gib", "40"]) == 0
    out = capsys.readouterr().out
    assert "'dense': 8192" in out and "dense: 32768 queries" in out
    assert B.main(argv + ["--logits-gib", "0.001"]) == 0
    assert "SKIP:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,name",
    [
        (["--part", "3/2"], "part"),
        (["--reps", "9"], "reps"),
        (["--rotate", "0"], "rotate"),
        (["--K", "0"], "K"),
        (["--logits-gib", "0"], "logits-gib"),
        (["--max-seconds", "-1"], "max-seconds"),
        (["--tile", "64"], "tile"),
        (["--tile", "a"], "tile"),
        (["--shapes", "32x4096"], "shapes"),
        (["--sweep", "--shapes", "32x4096x131072"], "shapes"),
    ],
)
def test_cli_rejects_bad_values(argv, name):
    with pytest.raises(ValueError, match=name):
        B.main(argv + ["--dry-run", "--regime", "structured"])


def test_cli_defaults_keep_working(capsys):
    # the devrun scripts' call, planned only
    argv = ["--regime", "calibrated", "--shapes", "32x4096x1048576,64x4096x1048576"]
    assert B.main(argv + ["--tile", "128,256", "--r", "14", "--reps", "10", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("32x4096x1048576") == 2 and out.count("64x4096x1048576") == 2
    assert B.main(["--dry-run", "--filter", "64x"]) == 0  # default shapes, filtered
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert len(lines) == 1 and "64x4096x131072" in lines[0]


# --------------------------------------------------------------------------- GPU path, faked
# The GPU path cannot run in CI; a numpy stand-in for CuPy and the kernels drives its
# control flow (sub-chunks, id concatenation, stats, skips, --max-seconds, outputs).


def _fake_gpu(monkeypatch, oom_shapes=()):
    import types

    import dosa_cupy
    from dosa_cupy import dense, prepare, workload
    from dosa_cupy import scorer as scorer_mod

    calls = {"logits_rows": [], "dosa_rows": [], "fused_rows": []}

    class Event:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    cp = types.ModuleType("cupy")
    for name in (
        "sum",
        "float64",
        "int64",
        "int32",
        "concatenate",
        "array_equal",
        "inf",
        "take_along_axis",
        "maximum",
        "where",
        "all",
        "asarray",
        "from_dlpack",
        "sort",
    ):
        setattr(cp, name, getattr(np, name))  # fmt: skip
    dev = types.SimpleNamespace(synchronize=lambda: None, mem_info=(100 * B.GIB, 139 * B.GIB))
    cp.cuda = types.SimpleNamespace(
        Event=Event,
        get_elapsed_time=lambda a, b: 1e3 * (b.t - a.t),
        Device=lambda *a: dev,
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"fake GPU"}),
    )
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)

    def make(regime, Qn, N, H, seed=0):
        rs = np.random.default_rng([seed, Qn, N, H])
        ke = np.arange(N - Qn + 1, N + 1, dtype=np.int32)
        return dict(
            q=rs.integers(0, 120, (Qn, H, 128), dtype=np.uint8),
            w=rs.standard_normal((Qn, H)).astype(np.float32),
            k_payload=rs.integers(0, 120, (N, 128), dtype=np.uint8),
            k_scale=np.ones(N, np.float32), ks=np.zeros(Qn, np.int32), ke=ke,
            kf=None, qf=None, wf=None,
        )  # fmt: skip

    def logits(q, w, kp, ksc, ks, ke, scorer="f16"):
        calls["logits_rows"].append(q.shape[0])
        return scores(q, kp, ks, ke)

    def scores(q, kp, ks, ke):
        s = (q[:, :, :4].astype(np.float32).sum((1, 2))[:, None] * kp[None, :, 0]).astype(
            np.float32
        ) + np.arange(kp.shape[0], dtype=np.float32)[None, :] * 1e-3
        cols = np.arange(kp.shape[0])[None, :]
        return np.where((cols >= ks[:, None]) & (cols < ke[:, None]), s, -np.inf)

    def select(lg, K, ks, ke, work=None):  # dense.select_rows: each row's range [ks, ke)
        lg = np.asarray(lg)
        assert lg.flags.c_contiguous  # the kernels read rows of lg.shape[1] entries
        if ks is not None:
            cols = np.arange(lg.shape[1])[None, :]
            lg = np.where((cols >= np.asarray(ks)[:, None]) & (cols < np.asarray(ke)[:, None]),
                          lg, -np.inf)  # fmt: skip
        ids = np.argsort(-lg, axis=1, kind="stable")[:, :K].astype(np.int32)
        ids = np.where(np.take_along_axis(lg, ids, 1) > -np.inf, ids, -1)
        if work is None:
            return ids
        work.ids[...] = ids
        return work.ids

    def topk_raw(q, w, kp, ksc, K, ks, ke, chunk=None, scorer="f16"):
        chunk = chunk or q.shape[0]
        return np.concatenate(
            [select(logits(q[a:b], w[a:b], kp, ksc, ks[a:b], ke[a:b]), K, ks[a:b], ke[a:b])
             for a, b in spans(q.shape[0], chunk)]
        )  # fmt: skip

    def route(name):
        def fn(q, w, kp, ksc, K, ks, ke, return_stats=False, timing=False, **o):
            if (q.shape[1], kp.shape[0]) in oom_shapes:
                raise type("OutOfMemoryError", (MemoryError,), {})("out of memory (fake)")
            calls[f"{name}_rows"].append(q.shape[0])
            ids = select(scores(q, kp, ks, ke), K, ks, ke)  # no dense logits on this route
            if not return_stats:
                return ids
            n = q.shape[0]
            st = types.SimpleNamespace(
                survivors=np.arange(n) % 7, screened=np.full(n, 100), kept=np.full(n, K),
                overflowed=np.zeros(n, bool), recovered=np.zeros(n, bool),
                stage_ms={s: 1.0 for s in (B.DOSA_STAGES if name == "dosa" else B.FUSED_STAGES)},
                visible=np.full(n, 100), scored=np.full(n, 5), anchor_scored=10,
                route=cost.RouteChoice("dosa", "sampled", "pair", 6,
                                       predicted_ms={"dense": 2.0, "pair/6": 1.5},
                                       survival={"pair/6": 0.03},
                                       sample_ms={"pair/6": 0.04},
                                       sample={"pair/6": 4}) if name == "dosa" else None,
            )  # fmt: skip
            return ids, st

        return fn

    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` → ImportError
    monkeypatch.setattr(workload, "make_gpu_workload", make)
    monkeypatch.setattr(prepare, "check_inputs", lambda q, w, kp, ksc, K, ks, ke: (
        q, w, kp, ksc, K, ks, ke))  # fmt: skip
    monkeypatch.setattr(prepare, "pad_heads", lambda q, w, scorer="f16": (q, w))
    monkeypatch.setattr(scorer_mod, "dense_logits_raw", logits)
    monkeypatch.setattr(dense, "select_rows", select)
    monkeypatch.setattr(dense, "_select_rows", select)
    monkeypatch.setattr(dense, "rows_work", lambda rows, n, K: types.SimpleNamespace(
        ids=np.full((rows, K), 3, np.int32)))  # fmt: skip
    monkeypatch.setattr(dense, "_dense_topk_raw", topk_raw)
    monkeypatch.setattr(dosa_cupy, "dosa_topk", route("dosa"))
    monkeypatch.setattr(dosa_cupy, "fused_topk", route("fused"))
    return calls


def test_bench_shape_sub_chunks_with_a_fake_gpu(monkeypatch):
    calls = _fake_gpu(monkeypatch)
    H, Qn, N, K = 16, 64, 2048, 8
    mem = B.memory_plan(H, Qn, N, K)
    assert mem["subchunk"] == dict.fromkeys(("dense", "dosa", "dosa_stats", "fused"), Qn)
    mem["subchunk"].update(dense=16, dosa=32, dosa_stats=8, fused=64)  # as if over budget
    mem["notes"] = ["dense: (test)"]
    logs = []
    r = B.bench_shape(H, Qn, N, K, "structured", 10, 2, {"r": 14}, logs.append, mem=mem)
    assert max(calls["logits_rows"]) == 16  # never more logits rows than the sub-chunk
    assert r["dense_subchunk"] == 16 and r["memory_notes"] == mem["notes"]
    assert r["dosa_ids_equal_dense"] and r["fused_ids_equal_dense"] and r["ids_equal"]
    assert r["torch_topk_ms"] is None and "torch_values_equal" not in r
    assert r["visible_pairs"] == B.causal_pairs(Qn, N)
    surv = np.tile(np.arange(8) % 7, Qn // 8) / 100  # the fake's stats per 8-query sub-chunk
    assert r["survival_pooled"] == pytest.approx(surv.mean())
    assert len(r["survival_quantiles"]) == 101 and r["survival_quantiles"][-1] == 0.06
    assert (r["dosa_subchunk"], r["stats_subchunk"], r["fused_subchunk"]) == (32, 8, 64)
    assert set(calls["dosa_rows"]) == {32, 8} and set(calls["fused_rows"]) == {64}
    assert r["dosa_stage_ms"]["screen"] == Qn // 8  # 1 ms per stats sub-chunk, summed
    # the route choice of each stats sub-chunk; Σ scored over Σ visible, anchors apart
    assert len(r["dosa_routes"]) == Qn // 8
    assert r["dosa_routes"][0] == {"route": "dosa", "reason": "sampled", "screen": "pair",
                                   "r": 6, "predicted_ms": {"dense": 2.0, "pair/6": 1.5},
                                   "survival": {"pair/6": 0.03},
                                   "sample_ms": {"pair/6": 0.04}, "sample": {"pair/6": 4},
                                   "spent_ms": 0.0}  # fmt: skip
    assert r["scored_fraction"] == pytest.approx(0.05)
    assert r["anchor_scored_fraction"] == pytest.approx(10 * (Qn // 8) / (100 * Qn))
    table = B.route_table([r])
    assert "| dosa (sampled, pair/6) | 16.00 |" in table  # 8 sub-chunks × 2 ms predicted
    # each sub-chunk's 0.04 ms sample of 4 queries scaled to its Qn / 8 queries (the pair
    # screen by whole block rows), summed; beside the screen stage's measured Qn / 8 ms
    sub = Qn // 8
    scaled = 8 * 0.04 * -(-sub // 4)
    assert f"| {scaled:.2f} | {float(Qn // 8):.2f} |" in table
    for k in ("logits", "dense_route", "fused", "dosa"):
        assert r[f"{k}_floor_ms"] > 0 and r["x_floor"][k] is not None
    assert r["device"] == "fake GPU" and json.loads(logs[-1])["N"] == N


def test_main_with_a_fake_gpu(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch, oom_shapes={(16, 4096)})
    out = tmp_path / "run"
    argv = ["--shapes", "16x64x2048,16x64x4096,16x32x2048", "--K", "8", "--regime",
            "structured", "--out", str(out), "--commit", "cafe123"]  # fmt: skip
    assert B.main(argv) == 0
    text = capsys.readouterr().out
    rows = json.loads((out / "bench.json").read_text())
    assert [(r["Qn"], r["N"]) for r in rows] == [(64, 2048), (64, 4096), (32, 2048)]
    assert "out of memory" in rows[1]["skipped"] and "# SKIPPED" in text
    assert all(r["commit"] == "cafe123" and r["date_utc"] for r in rows)
    assert "commit: cafe123" in (out / "bench.md").read_text()
    # --max-seconds 0: nothing starts, the (empty) outputs are still written
    out2 = tmp_path / "stop"
    assert B.main(argv[:-4] + ["--out", str(out2), "--max-seconds", "0"]) == 0
    assert json.loads((out2 / "bench.json").read_text()) == []
    assert "not run (3): 16x64x2048,16x64x4096,16x32x2048" in capsys.readouterr().out


def test_parse_variants():
    v = B.parse_variants(["cert:cert_seeds=2048", "fp:screen=fp64,r=14,window=-1"])
    assert v == {"cert": {"cert_seeds": 2048}, "fp": {"screen": "fp64", "r": 14, "window": -1}}
    assert B.parse_variants(None) == {} and B.parse_variants([]) == {}
    assert B.parse_variants(["p:tie_reject=False,screen=wg"]) == {
        "p": {"tie_reject": False, "screen": "wg"}
    }
    assert B.parse_variants(["n:builds=staged+f16screen"]) == {"n": {"builds": "staged+f16screen"}}
    for bad in (["nocolon"], [":a=1"], ["x:a"], ["x:=1"], ["a b:c=1"], ["x:a=1", "x:b=2"],
                ["x:builds=staged+nope"]):  # fmt: skip
        with pytest.raises(ValueError, match="--variant"):
            B.parse_variants(bad)


def test_variants_with_a_fake_gpu(monkeypatch):
    """Each variant is one more DoSA route of the same run: timed, ids checked against the
    dense route, stages and survival recorded; a variant whose ids differ fails ids_equal;
    bench.md gets a variants table."""
    _fake_gpu(monkeypatch)
    H, Qn, N, K = 16, 64, 2048, 8
    variants = {"cert": {"cert_seeds": 8}}
    r = B.bench_shape(H, Qn, N, K, "structured", 10, 2, {"r": 14}, lambda s: None,
                      variants=variants)  # fmt: skip
    v = r["variants"]["cert"]
    assert v["options"] == {"cert_seeds": 8} and v["ids_equal_dense"] and r["ids_equal"]
    assert v["ms"] > 0 and v["speedup_vs_dense"] == r["dense_route_ms"] / v["ms"]
    assert v["stage_ms"]["screen"] > 0 and 0 <= v["survival_pooled"] <= 1
    md = B.markdown([dict(r, tile=256, commit="c", date_utc="d")])
    assert "DoSA variants" in md and "| cert | cert_seeds=8 |" in md
    assert "mean_ms" not in v and "Memo variants" not in md
    r["variants"]["cert"]["ids_equal_dense"] = False
    assert B.ids_equal(r) is False


def test_paired_variants_are_timed_in_turn_under_their_builds(monkeypatch):
    """``--paired``: the DoSA call and each variant without a memo timed in turn (one
    interleaved timing of 2·reps replays, the DoSA call under a name no variant can take),
    each variant's calls under its own builds and the DoSA call under none; a memo variant
    and a failed one are left out; bench.md gets the paired table."""
    _fake_gpu(monkeypatch)
    import dosa_cupy
    from dosa_cupy import seeds
    from dosa_cupy.bench import prefill

    seen, flags = [], []
    real_il = prefill.median_ms_interleaved

    def spy(cp, fns, reps, **kw):
        seen.append((sorted(fns), reps))
        return real_il(cp, fns, reps, **kw)

    real = dosa_cupy.dosa_topk

    def topk(*a, **kw):
        if kw.get("screen") == "broken":
            raise RuntimeError("kernel not found")
        flags.append((kw.get("cert_seeds"), seeds.SIDE_STREAM))
        return real(*a, **kw)

    monkeypatch.setattr(prefill, "median_ms_interleaved", spy)
    monkeypatch.setattr(dosa_cupy, "dosa_topk", topk)
    variants = {"b": {"builds": "onestream", "cert_seeds": 8}, "memo": {"route_memo": 1},
                "bad": {"screen": "broken"}}  # fmt: skip
    r = B.bench_shape(16, 64, 2048, 8, "structured", 10, 2, {"r": 14}, lambda s: None,
                      variants=variants, paired=True)  # fmt: skip
    assert seen == [(sorted([prefill.BASE, "b"]), 20)]
    assert r["dosa_paired_ms"] > 0 and r["variants"]["b"]["paired_ms"] > 0
    assert "paired_ms" not in r["variants"]["memo"] and "paired_ms" not in r["variants"]["bad"]
    # the variant's calls under its build (the side stream off), every other call without
    assert all(side is (cert is None) for cert, side in flags) and (8, False) in flags
    md = B.markdown([dict(r, tile=256, commit="c", date_utc="d")])
    assert "Paired (`--paired`)" in md and "| b |" in md.split("Paired (`--paired`)")[1]
    plain = B.bench_shape(16, 64, 2048, 8, "structured", 10, 2, {"r": 14}, lambda s: None,
                          variants={"b": {"builds": "onestream"}})  # fmt: skip
    assert "dosa_paired_ms" not in plain and len(seen) == 1  # off without --paired


def test_a_memo_variant_reports_its_mean_over_two_refresh_cycles(monkeypatch):
    """A ``route_memo=1`` variant is timed over two refresh cycles of its memo (its sampled
    calls among the timed ones): the median and the mean per call, the mean in bench.md."""
    _fake_gpu(monkeypatch)
    from dosa_cupy.bench import prefill

    seen = []
    real = prefill.median_ms

    def spy(cp, fn, reps, **kw):
        seen.append(reps)
        return real(cp, fn, reps, **kw)

    monkeypatch.setattr(prefill, "median_ms", spy)
    r = B.bench_shape(16, 64, 2048, 8, "structured", 10, 2, {"r": 14}, lambda s: None,
                      variants={"memo": {"route_memo": 1}})  # fmt: skip
    v = r["variants"]["memo"]
    assert 32 in seen and v["mean_ms"] > 0 and v["ids_equal_dense"]
    md = B.markdown([dict(r, tile=256, commit="c", date_utc="d")])
    assert "Memo variants" in md and "memo" in md.split("Memo variants")[1]


def test_failing_variant_keeps_the_row(monkeypatch):
    """An experimental option that raises is recorded as an error; the row survives."""
    _fake_gpu(monkeypatch)
    import dosa_cupy

    real = dosa_cupy.dosa_topk

    def flaky(*a, **kw):
        if kw.get("screen") == "broken":
            raise RuntimeError("kernel not found")
        return real(*a, **kw)

    monkeypatch.setattr(dosa_cupy, "dosa_topk", flaky)
    r = B.bench_shape(16, 64, 2048, 8, "structured", 10, 2, {"r": 14}, lambda s: None,
                      variants={"bad": {"screen": "broken"}, "ok": {"cert_seeds": 8}})  # fmt: skip
    assert "kernel not found" in r["variants"]["bad"]["error"]
    assert r["variants"]["ok"]["ids_equal_dense"] and r["ids_equal"]
    md = B.markdown([dict(r, tile=256, commit="c", date_utc="d")])
    assert "error: RuntimeError: kernel not found" in md


# --------------------------------------------------------------------------- --inputs files


def _save_inputs(tmp_path, specs):
    from dosa_ref.workloads import make_workload, save_workload

    paths = []
    for i, (name, Qn, N, H, ext) in enumerate(specs):
        p = tmp_path / f"{name}{i}.{ext}"
        save_workload(make_workload("calibrated", Qn, N, H=H, seed=i), p)
        paths.append(str(p))
    return paths


def test_inputs_shape_and_groups(tmp_path):
    from dosa_cupy.workload import inputs_shape

    paths = _save_inputs(tmp_path, [("a", 8, 512, 16, "npz"), ("b", 8, 512, 16, "safetensors"),
                                    ("c", 4, 256, 32, "npz")])  # fmt: skip
    assert [inputs_shape(p) for p in paths] == [(16, 8, 512), (16, 8, 512), (32, 4, 256)]
    groups = B.input_groups(paths)
    assert groups == {"file:a0+1@16x8x512": paths[:2], "file:c2@32x4x256": paths[2:]}
    # first files with one stem in two folders stay two groups
    (tmp_path / "d").mkdir()
    other = _save_inputs(tmp_path / "d", [("c", 8, 512, 16, "npz")])[0]
    same = B.input_groups([paths[2], other])
    assert sorted(same.values()) == sorted([[paths[2]], [other]])
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not a zip")
    for p in (bad, tmp_path / "missing.safetensors", tmp_path / "y.txt"):
        with pytest.raises(ValueError, match="^inputs:"):
            inputs_shape(p)


def test_inputs_dry_run_and_conflicts(tmp_path, capsys):
    paths = _save_inputs(tmp_path, [("a", 8, 512, 16, "npz"), ("a", 8, 512, 16, "npz")])
    assert B.main(["--inputs", ",".join(paths), "--dry-run", "--K", "8"]) == 0
    out = capsys.readouterr().out
    assert "file:a0+1@16x8x512 tile 256 16x8x512" in out and "1 job(s)" in out
    for extra in (["--sweep"], ["--shapes", "16x8x512"], ["--part", "0/2"], ["--filter", "16x"]):
        with pytest.raises(ValueError, match="^inputs:"):
            B.main(["--inputs", paths[0], "--dry-run", *extra])


def test_inputs_with_a_fake_gpu(monkeypatch, tmp_path):
    """--inputs: each file is one rotated input set of its shape's job, loaded through
    workload.load_gpu_workload (faked: CuPy is not here), ids cross-checked as usual."""
    from dosa_cupy import workload

    _fake_gpu(monkeypatch)
    fake = workload.make_gpu_workload  # the fake generator of _fake_gpu
    loaded = []

    def load(path):
        loaded.append(path)
        H, Qn, N = workload.inputs_shape(path)
        return fake("file", Qn, N, H, seed=len(loaded))

    monkeypatch.setattr(workload, "load_gpu_workload", load)
    paths = _save_inputs(tmp_path, [("a", 16, 1024, 16, "npz"), ("a", 16, 1024, 16, "safetensors"),
                                    ("b", 8, 512, 16, "npz")])  # fmt: skip
    out = tmp_path / "run"
    assert B.main(["--inputs", ",".join(paths), "--K", "8", "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())
    assert [(r["regime"], r["Qn"], r["N"], r["rotate"]) for r in rows] == [
        ("file:a0+1@16x16x1024", 16, 1024, 2), ("file:b2@16x8x512", 8, 512, 1)]  # fmt: skip
    assert all(r["ids_equal"] for r in rows) and sorted(loaded) == sorted(paths)


# --------------------------------------------------------------------------- peers
# DeepGEMM / FlashInfer cannot run here: numpy stand-ins drive peers.run through
# bench_shape (sub-chunks, ids as sets, failures), then the ratios and the report.


def test_set_overlap():
    own = np.array([[5, 1, 9, -1], [0, 1, 2, 3], [-1, -1, -1, -1]])
    same = np.array([[9, 5, 1, -1], [3, 2, 1, 0], [-1, -1, -1, -1]])
    o = P.set_overlap(same, own, np)
    assert o == {"overlap_min": 1.0, "overlap_pooled": 1.0, "rows_same_set": 3, "rows": 3}
    # torch.topk's ids at −inf positions (row 0: 7 instead of a pad) never count
    near = np.array([[9, 5, 2, 7], [3, 2, 1, 8], [4, 6, 7, 8]])
    o = P.set_overlap(near, own, np)
    assert o["overlap_min"] == pytest.approx(2 / 3) and o["overlap_pooled"] == pytest.approx(5 / 7)
    assert o["rows_same_set"] == 1  # the row without a valid id
    with pytest.raises(ValueError, match="peer_ids"):
        P.set_overlap(near[:2], own, np)


class _Tensor:
    """What padded_rows reads of a torch tensor, over a numpy buffer."""

    def __init__(self, buf, rows, n, stride):
        self.buf, self.shape, self._stride = buf, (rows, n), stride

    def stride(self):
        return (self._stride, 1)

    def storage_offset(self):
        return 0

    def element_size(self):
        return self.buf.itemsize

    def untyped_storage(self):
        return types.SimpleNamespace(nbytes=lambda: self.buf.nbytes)

    def as_strided(self, shape, strides):
        return _Tensor(self.buf, shape[0], shape[1], strides[0])

    def contiguous(self):
        (rows, n), s = self.shape, self._stride
        v = np.concatenate([self.buf[i * s : i * s + n] for i in range(rows)])
        return _Tensor(v, rows, n, n)

    @property
    def arr(self):
        return self.buf[: self.shape[0] * self._stride].reshape(self.shape[0], self._stride)


def test_padded_rows_reads_the_row_stride():
    xp = types.SimpleNamespace(from_dlpack=lambda t: t.arr)
    buf = np.arange(3 * 8, dtype=np.float32)
    full = P.padded_rows(_Tensor(buf, 3, 5, 8), xp)  # rows padded from 5 to 8 columns
    assert full.shape == (3, 8) and np.array_equal(full[:, :5], buf.reshape(3, 8)[:, :5])
    assert P.padded_rows(_Tensor(buf, 3, 8, 8), xp).shape == (3, 8)  # already contiguous
    short = P.padded_rows(_Tensor(buf[:21], 3, 5, 8), xp)  # the last row's padding is absent
    assert short.shape == (3, 5) and np.array_equal(short, buf.reshape(3, 8)[:, :5])


def _fake_peers(fail=()):
    """Peer logits = the fake's scores + a low-bit change on key 0 (a near-tie moves);
    selects as numpy argsorts; names in ``fail`` raise."""
    from dosa_cupy import scorer

    def logits(c):
        lg = scorer.dense_logits_raw(c["q"], c["w"], c["kp"], c["ksc"], c["ks"], c["ke"]).copy()
        lg[:, 0] = np.where(np.isfinite(lg[:, 0]), lg[:, 0] + 1e-6, lg[:, 0])
        return lg

    def select(name):
        def sel(lg, c, K):
            if name in fail:
                raise RuntimeError(f"{name} broke")
            return np.argsort(-lg, axis=1, kind="stable")[:, :K]

        return sel

    names = ("torch.topk", "select_rows", "flashinfer.top_k")
    return P.Peers(logits=logits, selects={n: select(n) for n in names},
                   on_own=("flashinfer.top_k",), notes=["x not importable"])  # fmt: skip


def test_peers_with_a_fake_gpu(monkeypatch):
    _fake_gpu(monkeypatch)
    mem = B.memory_plan(16, 64, 2048, 8)
    mem["subchunk"]["dense"] = 16  # peers run over the dense route's sub-chunks
    r = B.bench_shape(16, 64, 2048, 8, "structured", 10, 2, {"r": 14}, lambda s: None,
                      mem=mem, peers=_fake_peers(fail=("select_rows",)))  # fmt: skip
    pr = r["peers"]
    assert pr["notes"] == ["x not importable"]
    routes = pr["routes"]
    assert routes["deepgemm"]["kind"] == "logits" and routes["deepgemm"]["ms"] > 0
    assert "overlap_min" not in routes["deepgemm"]
    assert "select_rows broke" in routes["deepgemm+select_rows"]["error"]
    for name in ("deepgemm+torch.topk", "deepgemm+flashinfer.top_k", "flashinfer.top_k"):
        v = routes[name]
        assert v["ms"] > 0 and v["rows"] == 64 and 0.9 <= v["overlap_min"] <= 1.0
    assert routes["flashinfer.top_k"]["kind"] == "select" and r["ids_equal"]
    full = {k: routes[k]["ms"] for k in ("deepgemm+torch.topk", "deepgemm+flashinfer.top_k")}
    assert pr["best"] == min(full, key=full.get) and pr["best_ms"] == min(full.values())
    assert pr["vs_best"]["DoSA"] == pytest.approx(pr["best_ms"] / r["dosa_ms"])
    assert pr["vs_best"][pr["best"]] == 1.0 and "deepgemm" not in pr["vs_best"]
    md = B.markdown([dict(r, tile=256, commit="c", date_utc="d")])
    assert "Peers (same run, same inputs" in md and "| deepgemm+torch.topk" in md
    assert "error: RuntimeError: select_rows broke" in md and "Peers not timed: x not" in md
    assert f"| {pr['best']} (best) | route |" in md


def test_attach_ratios_and_report_without_peer_routes():
    r = _row(32, 4096, 1 << 17)
    assert "Peers" not in B.markdown([r])  # rows of runs without peers: no section
    P.attach_ratios(r)
    assert "peers" not in r
    r["peers"] = {"notes": ["deep_gemm not importable (ImportError: x)"], "routes": {}}
    P.attach_ratios(r)
    assert "best" not in r["peers"]
    md = B.markdown([r])
    assert "| DoSA | project |" in md and "Peers not timed: deep_gemm not importable" in md
    r["peers"]["routes"] = {"deepgemm+select_rows": {"kind": "route", "ms": 2 * r["dosa_ms"]}}
    r["variants"] = {"pair": {"ms": r["dosa_ms"] / 2}}
    P.attach_ratios(r)
    assert r["peers"]["vs_best"]["DoSA"] == pytest.approx(2.0)
    assert r["peers"]["vs_best"]["DoSA variant pair"] == pytest.approx(4.0)
    assert r["peers"]["vs_best"]["fused"] == pytest.approx(2 * r["dosa_ms"] / r["fused_ms"])


def test_fp8_logits_in_the_row_the_table_and_against_deepgemm():
    """A row's FP8 dense logits: × the logits floor (the same work), a table cell, and in the
    peers table DeepGEMM's logits time over the project's f16 and FP8 logits."""
    r = _row(32, 4096, 1 << 17)
    fl = B.row_floors(r)["logits_floor_ms"]
    r.update(fp8_logits_ms=3 * fl, fp8_logits_build="qt8_w3_fresh")
    assert B.x_floor(r)["fp8_logits"] == pytest.approx(3.0)
    assert B.x_floor(_row(32, 4096, 1 << 17))["fp8_logits"] is None
    r["peers"] = {"notes": [], "routes": {"deepgemm": {"kind": "logits", "ms": 1.5 * fl}}}
    P.attach_ratios(r)
    vs = r["peers"]["vs_deepgemm_logits"]
    assert vs["dense logits (FP8 qt8_w3_fresh)"] == pytest.approx(0.5)
    assert vs["dense logits (f16)"] == pytest.approx(1.5 * fl / r["logits_ms"])
    md = B.markdown([r])
    assert "| dense logits (FP8 qt8_w3_fresh) | project logits |" in md and "| 0.50× |" in md
    assert "| 3.0 |" in md.split("| regime | tile | H |")[1].splitlines()[2]


def test_discover_without_torch(monkeypatch):
    assert P.discover(False) is None
    monkeypatch.setitem(sys.modules, "torch", None)
    p = P.discover(None)
    assert p.logits is None and not p.on_own and "torch" in p.notes[0]


def test_peers_flag(capsys):
    for flag in ("--peers", "--no-peers"):
        assert B.main(["--dry-run", flag, "--regime", "structured"]) == 0
    capsys.readouterr()


# --------------------------------------------------------------------------- decode peers
# `dosa bench --decode` with numpy stand-ins for CuPy, the project's decode routes, torch
# and deep_gemm (bench/decode.py, bench/decode_peers.py): the DeepGEMM cache layout, the
# key-read floor, the tail mask before torch.topk, notes when a peer is absent.


def test_decode_key_floor_and_x_floor():
    fl = BD.key_floor_ms(np.array([1000, 3000], np.int32))
    assert fl == pytest.approx(4000 * 132 / 4.24e12 * 1e3)  # each request's keys read once
    assert BD.key_floor_ms([0, 0]) == 0.0
    xf = BD.x_floors({"dense_ms": 2 * fl, "dosa_ms": fl, "dg_logits_ms": None}, fl)
    assert xf == {"dense": pytest.approx(2.0), "dosa": pytest.approx(1.0), "dg_logits": None,
                  "dg_topk": None, "dosa_graph": None, "dg_graph": None, "dosa_b2b": None,
                  "dg_b2b": None, "dg_select_b2b": None}  # fmt: skip
    assert BD.x_floors({"dense_ms": 1.0}, 0.0)["dense"] is None


def test_pack_deepgemm_kv_layout():
    rs = np.random.default_rng(0)
    kv = rs.integers(0, 256, (3, 64, 128), dtype=np.uint8)
    sc = rs.uniform(0.1, 2.0, (3, 64)).astype(np.float32)
    out = DP.pack_deepgemm_kv(kv, sc, np)
    assert out.shape == (3, 64, 1, 132) and out.dtype == np.uint8 and out.flags.c_contiguous
    flat = out.reshape(3, 64 * 132)
    for b in range(3):  # per block: the 64×128 payload bytes, then the 64 fp32 scales
        assert np.array_equal(flat[b, : 64 * 128], kv[b].ravel())
        assert flat[b, 64 * 128 :].tobytes() == sc[b].astype("<f4").tobytes()
    assert flat[1, 64 * 128 + 4 * 5 : 64 * 128 + 4 * 6].tobytes() == np.float32(sc[1, 5]).tobytes()
    assert flat[2, 128 * 7 + 3] == kv[2, 7, 3]  # token 7's payload at 7·128, not 7·132
    with pytest.raises(ValueError, match="expected"):
        DP.pack_deepgemm_kv(kv[:, :32], sc[:, :32], np)


def _dec_scores(q, w, kv, sc, bt):
    """The fakes' decode scorer: fp32 [B, n, L] = Σ_h w·relu(q_h·k)·scale, nothing masked."""
    from dosa_cupy.decode import physical_rows

    B, L = bt.shape[0], bt.shape[1] * 64
    rows = physical_rows(bt, np.broadcast_to(np.arange(L), (B, L)))
    k = kv.reshape(-1, 128)[rows].astype(np.float64) * sc.reshape(-1)[rows][..., None]
    s = np.maximum(np.einsum("bjhd,bld->bjhl", q.astype(np.float64), k), 0)
    return np.einsum("bjh,bjhl->bjl", w.astype(np.float64), s).astype(np.float32)


class _TorchT(np.ndarray):
    """A numpy array with the one in-place torch method the decode peers call."""

    def masked_fill_(self, mask, v):
        np.copyto(self, v, where=np.broadcast_to(np.asarray(mask), self.shape))
        return self

    def clone(self):
        return self.copy()

    def copy_(self, src):
        np.copyto(self, np.asarray(src))
        return self

    # the view methods of bench.peers.padded_rows (DeepGEMM's padded rows taken whole)
    def _root(self):
        a = self
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    def stride(self):
        return tuple(s // self.itemsize for s in self.strides)

    def storage_offset(self):
        at = self.__array_interface__["data"][0] - self._root().__array_interface__["data"][0]
        return at // self.itemsize

    def element_size(self):
        return self.itemsize

    def untyped_storage(self):
        return types.SimpleNamespace(nbytes=lambda: self._root().nbytes)

    def as_strided(self, shape, strides):
        st = tuple(s * self.itemsize for s in strides)
        return np.lib.stride_tricks.as_strided(self, shape, st).view(_TorchT)

    def contiguous(self):
        return np.ascontiguousarray(self).view(_TorchT)


def _fake_torch():
    import ml_dtypes

    t = types.ModuleType("torch")
    as_t = lambda x, device=None: np.asarray(x).view(_TorchT)
    t.as_tensor, t.from_dlpack = as_t, as_t
    t.float32, t.int32, t.float8_e4m3fn = np.float32, np.int32, ml_dtypes.float8_e4m3fn
    t.arange = lambda n, device=None, dtype=None: np.arange(n, dtype=dtype).view(_TorchT)
    t.topk = lambda x, K, dim=-1: types.SimpleNamespace(
        indices=np.argsort(-np.asarray(x), axis=dim, kind="stable")[..., :K].astype(np.int64)
    )
    t.cuda = types.SimpleNamespace(
        empty_cache=lambda: None, current_stream=lambda: types.SimpleNamespace(cuda_stream=0)
    )
    return t


def _fake_deep_gemm(calls, fail=False):
    """DeepGEMM's two paged calls over numpy: checks the arguments as the C++ host does,
    unpacks the fused cache, and leaves 1e30 garbage past each row's visible end."""
    import ml_dtypes

    dg = types.ModuleType("deep_gemm")
    dg.get_num_sms = lambda: 4

    def meta(context_lens, block_kv, num_sms):
        assert context_lens.ndim == 2 and context_lens.dtype == np.int32 and block_kv == 64
        calls["meta"] += 1
        return np.zeros((num_sms + 1, 2), np.int32)

    def logits(*, q, kv_cache, weights, context_lens, block_table, schedule_meta,
               max_context_len, clean_logits, logits_dtype):  # fmt: skip
        if fail:
            raise RuntimeError("Assertion error: num_heads == 32 or num_heads == 64")
        calls["logits"] += 1
        q8, q_sf = q
        assert q_sf is None and q8.dtype == ml_dtypes.float8_e4m3fn and q8.ndim == 4
        B, n, H, _ = q8.shape
        assert not clean_logits and logits_dtype is np.float32  # 2-D lengths: no cleaning
        assert context_lens.shape == (B, n) and weights.shape == (B * n, H)
        assert schedule_meta.shape == (5, 2) and block_table.dtype == np.int32
        nb = kv_cache.shape[0]
        assert kv_cache.shape == (nb, 64, 1, 132) and kv_cache.dtype == np.uint8
        flat = np.asarray(kv_cache).reshape(nb, -1)
        kv, sc = flat[:, : 64 * 128].reshape(nb, 64, 128), flat[:, 64 * 128 :].copy()
        s = _dec_scores(q8.view(np.uint8), weights.reshape(B, n, H), kv, sc.view(np.float32),
                        block_table).reshape(B * n, -1)  # fmt: skip
        out = np.full((B * n, max_context_len + 256), 1e30, np.float32)  # row-padded buffer
        cols = np.arange(s.shape[1])[None, :]
        out[:, : s.shape[1]] = np.where(cols < context_lens.reshape(-1, 1), s, 1e30)
        return out[:, :max_context_len].view(_TorchT)

    dg.get_paged_mqa_logits_metadata, dg.fp8_fp4_paged_mqa_logits = meta, logits
    return dg


def _fake_decode(monkeypatch, torch=None, deep_gemm=None):
    """A numpy CuPy (``_fake_gpu``'s) and numpy stand-ins for the project's decode routes;
    torch / deep_gemm: fake modules, or None (not importable)."""
    import dosa_cupy.decode as dec
    from dosa_cupy import dense

    _fake_gpu(monkeypatch)
    cp = sys.modules["cupy"]
    for name in ("zeros", "empty", "arange", "ascontiguousarray", "uint8", "float32"):
        setattr(cp, name, getattr(np, name))
    cp.asnumpy = cp.from_dlpack = np.asarray
    cp.cuda.ExternalStream = lambda ptr: contextlib.nullcontext()  # torch's capture stream
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "deep_gemm", deep_gemm)

    def make_cache(cp, B, ctx, seed):
        rs = np.random.default_rng(seed)
        mb = -(-ctx // 64)
        nb = B * mb + 1
        kv = rs.integers(0, 8, (nb, 64, 128), dtype=np.uint8)
        sc = rs.uniform(0.5, 1.5, (nb, 64)).astype(np.float32)
        return kv, sc, rs.permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32), None

    def query_walk(cp, B, n, H, steps, topics, seed):
        rs = np.random.default_rng(seed + 1)
        q = [rs.integers(0, 8, (B, n, H, 128), dtype=np.uint8) for _ in range(steps)]
        return [(x, rs.standard_normal((B, n, H)).astype(np.float32)) for x in q]

    def paged_logits(q, w, kv, sc, bt, lengths, check_values=True):
        s = _dec_scores(q, w, kv, sc, bt)
        ke = dec.visible_ends(lengths, q.shape[1])
        return np.where(np.arange(s.shape[2]) < ke[..., None], s, -np.inf).astype(np.float32)

    def dense_topk(q, w, kv, sc, bt, lengths, K, check_values=True, scorer="f16"):
        assert scorer == "f16"  # the bench's default scorer
        lg = paged_logits(q, w, kv, sc, bt, lengths)
        B, n, L = lg.shape
        return (
            dense.select_rows(lg.reshape(B * n, L), K, None, None).astype(np.int64).reshape(B, n, K)
        )

    class Selector:
        def __init__(self, K, history=2, buffer=None, check_values=False, check_layout=True,
                     scorer="f16"):  # fmt: skip
            assert scorer == "f16"  # the bench's default scorer
            self.K, self.buffer, self.last_overflow = K, buffer, 0

        def step(self, *a, return_stats=False, out=None):
            st = types.SimpleNamespace(compaction=0.01, witnesses=np.zeros(4))
            ids = dense_topk(*a, self.K)
            if out is not None:
                out[...] = ids
            return types.SimpleNamespace(ids=ids if out is None else out, stats=st)

    monkeypatch.setattr(BD, "make_cache", make_cache)
    monkeypatch.setattr(BD, "query_walk", query_walk)
    monkeypatch.setattr(dec, "paged_logits", paged_logits)
    monkeypatch.setattr(dec, "dense_decode_topk", dense_topk)
    monkeypatch.setattr(dec, "DecodeSelectorGPU", Selector)
    monkeypatch.setattr(BD, "capture", lambda cp, fn: fn)  # a "graph" that re-runs fn

    def torch_capture(torch, fn):  # a "graph" whose replay re-runs fn into the same output
        out = np.asarray(fn()).copy().view(_TorchT)
        return (lambda: np.copyto(out, np.asarray(fn()))), out

    monkeypatch.setattr(DP, "torch_capture", torch_capture)


def _decode_row(peers, n=2):
    return BD.bench_shape(32, 2, 300, n, 16, 3, 1, 2, None, 0, lambda s: None, peers=peers)


def test_decode_peers_with_fakes(monkeypatch):
    calls = {"meta": 0, "logits": 0}
    _fake_decode(monkeypatch, torch=_fake_torch(), deep_gemm=_fake_deep_gemm(calls))
    p = DP.discover()
    assert p.notes == [] and p.deep_gemm is not None
    r = _decode_row(p)
    assert r["ids_equal"] and r["peer_errors"] == {} and r["peer_notes"] == []
    # warm-up + 3 steps, alone and + topk; the graph: warm-up, capture, 3 replays; back to
    # back: a graph per step (3 captures), replayed in B2B_ROUNDS rounds; DeepGEMM + the
    # project's selection the same way after a call for its rows' shape and a warm-up step
    b2b = 3 + BD.B2B_ROUNDS * 3
    sel = 1 + 1 + b2b  # the rows' shape, one warm-up step, the graphs
    assert calls == {"meta": 4 + 5 + b2b + sel, "logits": 2 * 4 + 5 + b2b + sel}
    assert r["dg_graph_overlap_min"] == 1.0 and r["dosa_graph_ids_equal"]
    assert r["dg_b2b_overlap_min"] == 1.0 and r["dosa_b2b_ids_equal"]
    # the selection reads each row's range only: DeepGEMM's tail garbage is never selected
    assert r["dg_select_overlap_min"] == 1.0
    assert len(r["dosa_b2b_ms_all"]) == len(r["dg_b2b_ms_all"]) == BD.B2B_ROUNDS
    assert len(r["dg_select_b2b_ms_all"]) == BD.B2B_ROUNDS
    # the garbage past each row's end was masked: DeepGEMM's set == the dense route's
    assert r["dg_overlap_min"] == 1.0 and r["dg_overlap_pooled"] == 1.0
    assert r["own_select_ids_equal"] and r["own_torch_overlap_min"] == 1.0
    for k in ("dg_meta", "dg_logits", "dg_topk", "own_select", "own_torch_topk", "dg_graph",
              "dosa_graph"):  # fmt: skip
        assert r[f"{k}_ms"] >= 0 and len(r[f"{k}_ms_all"]) == 3
    assert r["key_floor_ms"] > 0 and all(v is not None for v in r["x_floor"].values())
    assert r["x_floor"]["dg_topk"] == pytest.approx(r["dg_topk_ms"] / r["key_floor_ms"])
    md = BD.markdown([r])
    assert "| DG meta ms |" in md and "| 1.0000 |" in md and "Peers not timed" not in md
    json.dumps(r)  # the row is JSON


def test_decode_peers_absent_or_failing(monkeypatch):
    _fake_decode(monkeypatch, torch=None)
    p = DP.discover()
    assert p.torch is None and "torch" in p.notes[0]
    r = _decode_row(p, n=1)
    assert all(r[k] is None for k in DP.PEER_KEYS) and r["ids_equal"]
    assert r["x_floor"]["dg_logits"] is None and r["x_floor"]["dense"] is not None
    md = BD.markdown([r])
    assert "| - | - | - |" in md and "Peers not timed: peers need torch" in md

    monkeypatch.setitem(sys.modules, "torch", _fake_torch())  # torch, no deep_gemm
    p = DP.discover()
    assert p.deep_gemm is None and p.notes[0].startswith("deep_gemm not importable")
    r = _decode_row(p)
    assert r["dg_logits_ms"] is None and r["own_select_ms"] is not None
    assert "deep_gemm not importable" in BD.markdown([r])

    calls = {"meta": 0, "logits": 0}
    p.deep_gemm, p.notes = _fake_deep_gemm(calls, fail=True), []
    r = _decode_row(p)
    assert "num_heads" in r["peer_errors"]["deepgemm"] and r["own_select_ids_equal"]
    assert "deepgemm failed" in BD.markdown([r])
    assert DP.discover(False) is None
    r = _decode_row(None)
    assert r["peer_notes"] == [] and r["dg_topk_ms"] is None
    assert "Peers" not in BD.markdown([r]) and "| key floor ms |" in BD.markdown([r])


def test_decode_main_peers_flag(monkeypatch, tmp_path, capsys):
    _fake_decode(monkeypatch, torch=None)
    argv = ["--shapes", "32x2x300", "--K", "16", "--warm", "1", "--out", str(tmp_path)]
    assert BD.main(argv + ["--no-peers"]) == 0
    rows = json.loads((tmp_path / "bench_decode.json").read_text())
    assert rows[0]["peer_notes"] == [] and rows[0]["dg_logits_ms"] is None
    assert "# peers:" not in capsys.readouterr().out
    assert BD.main(argv) == 0  # --peers (default): torch absent → a note, same exit code
    assert "# peers: peers need torch" in capsys.readouterr().out
    md = (tmp_path / "bench_decode.md").read_text()
    assert "| key floor ms |" in md and "Peers not timed: peers need torch" in md


def test_decode_paged_walk_layout():
    """paged_walk: each request's keys read back in logical order through the block table
    (decode_ops.gather_request_keys) are its keys quantized as dosa_ref.fp8 does, every
    other row of the cache is zero, one spare block, the queries quantized, the lengths per
    step as given."""
    from dosa_cupy.decode_ops import gather_request_keys
    from dosa_ref.fp8 import quantize_keys, quantize_queries

    rng = np.random.default_rng(3)
    B, ctx, steps, n, H = 3, 150, 2, 2, 4
    keys = [rng.standard_normal((ctx, 128)).astype(np.float32) for _ in range(B)]
    qs = rng.standard_normal((steps, B, n, H, 128)).astype(np.float32)
    ws = rng.standard_normal((steps, B, n, H)).astype(np.float32)
    lengths = np.array([[146, 147, 148], [148, 149, 150]])
    kv, sc, bt, walk, lens = BD.paged_walk(np, keys, qs, ws, lengths, seed=5)
    mb = 3
    assert kv.shape == (B * mb + 1, 64, 128) and sc.shape == (B * mb + 1, 64)
    assert bt.shape == (B, mb) and len(set(bt.ravel().tolist())) == B * mb
    for b, (p, s_) in enumerate(gather_request_keys(kv, sc, bt, [ctx] * B)):
        want_p, want_s = quantize_keys(keys[b])
        assert np.array_equal(p, want_p) and np.array_equal(s_, want_s)
    used = np.zeros(kv.shape[:2], dtype=bool)
    t = np.arange(ctx)
    for b in range(B):
        used[bt[b, t // 64], t % 64] = True
    assert not kv[~used].any() and not sc[~used].any()
    for i in range(steps):
        qp, wq = quantize_queries(qs[i].reshape(B * n, H, 128), ws[i].reshape(B * n, H))
        assert np.array_equal(walk[i][0], qp.reshape(B, n, H, 128))
        assert np.array_equal(walk[i][1], wq.reshape(B, n, H))
        assert lens[i].dtype == np.int32 and np.array_equal(lens[i], lengths[i])
    with pytest.raises(ValueError, match="keys"):
        BD.paged_walk(np, [keys[0], keys[1][:100]], qs[:, :2], ws[:, :2], lengths[:, :2], 0)


def test_decode_trained_walk_and_its_limits():
    """trained_walk: the trained regime's walk (make_trained_decode) in the paged layout, its
    last step seeing every key of a request; the encoded tokens capped, a context too short
    refused, and ``--regime`` / trained shapes checked before any GPU work."""
    T = pytest.importorskip("dosa_ref.trained")
    pytest.importorskip("tokenizers", reason="the tokenizer: pip install 'dosa[real]'")
    try:
        T.load_indexer(32)
        T.corpus()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"the trained regime's encoder or corpus: {e}")
    B, ctx, n, steps = 2, 96, 1, 3
    kv, sc, bt, walk, lens = BD.trained_walk(np, B, ctx, n, 32, steps, seed=1)
    d = T.make_trained_decode(B, ctx - n * steps, steps, next_n=n, H=32, seed=1)
    assert [int(x) for x in lens[-1]] == [ctx] * B
    assert np.array_equal(np.stack(lens), d["lengths"])
    from dosa_cupy.decode_ops import gather_request_keys
    from dosa_ref.fp8 import quantize_keys

    got = gather_request_keys(kv, sc, bt, [ctx] * B)
    for b in range(B):
        assert np.array_equal(got[b][0], quantize_keys(d["k"][b])[0])
    assert walk[0][0].shape == (B, n, 32, 128)
    with pytest.raises(ValueError, match="shapes"):
        BD.trained_walk(np, 64, 1 << 20, 1, 32, 3, 0)
    with pytest.raises(ValueError, match="shapes"):
        BD.trained_walk(np, 1, 3, 1, 32, 3, 0)
    with pytest.raises(ValueError, match="regime"):
        BD.main(["--regime", "real"])
    with pytest.raises(ValueError, match="shapes"):
        BD.main(["--regime", "trained", "--shapes", "64x64x1048576"])


@pytest.mark.parametrize("wrong", ["eager", "graph"])
def test_decode_ids_checks_can_fail(monkeypatch, tmp_path, wrong):
    """The bench's ids checks see a wrong id: a selector that swaps two ids at one step
    (eager) or only when replayed from the graph (``out=``) makes that check False and the
    command exit 1."""
    import dosa_cupy.decode as dec

    _fake_decode(monkeypatch, torch=None)
    Good = dec.DecodeSelectorGPU

    class Bad(Good):
        def step(self, *a, return_stats=False, out=None):
            r = super().step(*a, return_stats=return_stats, out=out)
            if (out is None) == (wrong == "eager"):
                r.ids[0, 0, [0, 1]] = r.ids[0, 0, [1, 0]]
            return r

    monkeypatch.setattr(dec, "DecodeSelectorGPU", Bad)
    r = _decode_row(None)
    key = "ids_equal" if wrong == "eager" else "dosa_graph_ids_equal"
    other = "dosa_graph_ids_equal" if wrong == "eager" else "ids_equal"
    assert r[key] is False and r[other] is True
    assert r["dosa_b2b_ids_equal"] is (wrong == "eager")  # the back-to-back graphs use out=
    argv = ["--shapes", "32x2x300", "--K", "16", "--warm", "1", "--no-peers"]
    assert BD.main(argv + ["--out", str(tmp_path)]) == 1


# --------------------------------------------------------------------------- serving mode
# `dosa bench --serving` (bench/serving.py) without a GPU: arguments, the hint to install
# CuPy, the ragged batch's sizes, and the report of a synthetic run.


def test_serving_mode_arguments():
    from dosa_cupy.bench import serving as BS

    a = BS.parse_args([])
    assert a.parts == list(BS.PARTS) and a.heads == [32, 64] and a.out == "out/serving"
    a = BS.parse_args(["--parts", "small,decode", "--heads", "64", "--keys", "65536"])
    assert a.parts == ["small", "decode"] and a.heads == [64] and a.keys == 65536
    for argv, name in ((["--parts", "small,prefill"], "parts"), (["--heads", "32,x"], "heads"),
                       (["--heads", "65"], "heads"), (["--reps", "3"], "reps"),
                       (["--warm", "0"], "warm"), (["--rotate", "0"], "rotate"),
                       (["--K", "5000"], "K"), (["--keys", "100"], "keys"),
                       (["--keys", "360"], "keys")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}:"):
            BS.parse_args(argv)
    for total in (131072, 1000, 1 << 20):
        n = BS.ragged_lengths(total)
        assert sum(n) == total and all(x >= q for x, q in zip(n, BS.RAGGED_QN, strict=True))


def test_serving_mode_without_cupy(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` → ImportError
    assert B.main(["--serving", "--parts", "small"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dosa bench --serving: CuPy is not importable")
    assert "pip install 'dosa[gpu]'" in err and "NVIDIA GPU" in err
    with pytest.raises(ValueError, match="^parts:"):  # arguments are checked first
        B.main(["--serving", "--parts", "nope"])


def test_serving_report_of_a_synthetic_run(tmp_path):
    from dosa_cupy.bench import serving as BS

    small = dict(H=32, Qn=16, N=131072, replays=100, dosa_ms=0.5, dosa_nocheck_ms=0.4,
                 dense_ms=0.25, dense_nocheck_ms=0.2, dosa_over_dense=2.0,
                 dosa_over_dense_nocheck=2.0, ids_equal=True)  # fmt: skip
    base = dict(H=64, B=8, queries=360, keys=131072)
    res = {
        "meta": {"date_utc": "2026-12-02 00:00:00Z", "commit": "abc1234"},
        "device": "NVIDIA H200",
        "small": [small],
        "ragged": [dict(base, ragged_ms=3.0, separate_ms=6.0, separate_over_ragged=2.0,
                        ids_equal=True)],
        "paged": [dict(base, paged_ms=3.5, physical_ms=3.6, contiguous_ms=3.0,
                       paged_over_contiguous=3.5 / 3.0, ids_equal=True,
                       physical_ids_equal=False)],
        "decode": [],
    }  # fmt: skip
    md = BS.markdown(res)
    assert "commit abc1234, NVIDIA H200" in md and "| 32 | 16 | 131,072 | 100 | 0.500 |" in md
    assert "| 2.00× | 2.00× | True |" in md and "| 64 | 8 | 360 | 131,072 | 3.000 |" in md
    assert "(d) Decode" not in md  # a part that did not run is left out
    assert not BS.all_equal(res)
    res["paged"][0]["physical_ids_equal"] = True
    assert BS.all_equal(res)
    BS._write(tmp_path / "o", res)
    assert (
        json.loads((tmp_path / "o" / "bench_serving.json").read_text())["device"] == "NVIDIA H200"
    )
    assert (tmp_path / "o" / "bench_serving.md").read_text() == BS.markdown(res)


def test_median_ms_interleaved_times_every_call_in_turn():
    """Replay i runs every call once, starting at call i mod 2, before replay i + 1; the
    k-th call overall reads set k mod 2 (never the set the call before it read); each call
    gets its own events; the medians are per call."""
    import types

    from dosa_cupy.bench.timing import median_ms, median_ms_interleaved

    clock, calls = [0.0], []

    class Event:
        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

    cp = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: b.t - a.t)
    )

    def fn(name, ms):
        def run(s):
            calls.append((name, s))
            clock[0] += ms

        return run

    got = median_ms_interleaved(cp, {"a": fn("a", 2.0), "b": fn("b", 1.0)}, 4, 1, ["x", "y"])
    assert calls[:2] == [("a", "x"), ("b", "y")]  # the warm-up, both calls
    assert calls[2:] == [("a", "x"), ("b", "y"), ("b", "x"), ("a", "y")] * 2
    assert all(p[1] != q[1] for p, q in zip(calls[:-1], calls[1:], strict=True))  # sets alternate
    assert got["a"] == (2.0, [2.0] * 4) and got["b"] == (1.0, [1.0] * 4)
    calls.clear()  # one call alone (median_ms): call i on set i mod 2, the warm-up first
    assert median_ms(cp, fn("c", 3.0), 3, 2, ["x", "y"]) == (3.0, [3.0] * 3)
    assert [s for _, s in calls] == ["x", "y", "x", "y", "x"]


# --------------------------------------------------------------------------- --cp mode
# `dosa bench --cp` (bench/context_parallel.py) without a GPU: arguments, the dry run's plan,
# the collectives' sizes, and the report of a synthetic run.


def test_cp_mode_arguments_and_plan(capsys):
    from dosa_cupy.bench import context_parallel as CP

    a = CP.parse_args([])
    assert (a.ranks, a.H, a.Qn, a.N, a.K, a.scorer) == (2, 64, 4096, 1 << 20, 2048, "f16")
    for argv, name in ((["--ranks", "1"], "ranks"), (["--ranks", "0", "--one-gpu"], "ranks"),
                       (["--shape", "64x4096"], "shape"), (["--shape", "65x8x64"], "shape"),
                       (["--shape", "8x100x64"], "shape"), (["--reps", "3"], "reps"),
                       (["--shape", "64x8x4000"], "shape"),  # a shard shorter than K
                       (["--warm", "0"], "warm"), (["--K", "5000"], "K"),
                       (["--scorer", "bf16"], "scorer")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}:"):
            CP.parse_args(argv)
    assert CP.collective_sizes(4096, 2048) == {
        "flag_allreduce": 4, "seed_allgather": 8 * 4096 * 2048, "records_allgather": 8 * 4096 * 2048
    }  # fmt: skip
    assert B.main(["--cp", "--dry-run", "--ranks", "4", "--shape", "64x4096x2097152"]) == 0
    out = capsys.readouterr().out
    assert "4 shards (4 processes on NCCL)" in out and "[1572864, 2097152)" in out
    assert "sharded_deepgemm" in out and "records_allgather 67,108,864" in out
    assert B.main(["--cp", "--dry-run", "--one-gpu", "--ranks", "3", "--no-peers"]) == 0
    assert "one process, one GPU" in capsys.readouterr().out


def test_cp_mode_without_cupy(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert B.main(["--cp", "--ranks", "2"]) == 2
    assert capsys.readouterr().err.startswith("dosa bench --cp: CuPy is not importable")


def test_cp_report_of_a_synthetic_run():
    from dosa_cupy.bench import context_parallel as CP

    res = {
        "meta": {"date_utc": "2026-12-05 00:00:00Z", "commit": "abc1234"},
        "args": dict(regime="calibrated", H=64, Qn=4096, N=1 << 20, K=2048, ranks=2,
                     one_gpu=False, scorer="fp8"),
        "times_ms": {"one_gpu_dosa": 40.0, "sharded_dosa": 20.0, "sharded_deepgemm": 50.0},
        "collectives": [dict(name="seed_allgather", bytes=16388, ms=0.02)],
        "pruning": [dict(shard=0, keys=524288, screened=1000, survivors_shared=10,
                         survivors_own=40, raised=7)],
        "ids": {"sharded_dosa == dense_topk (whole context)": True},
    }  # fmt: skip
    md = CP.markdown(res)
    assert "commit abc1234" in md and "2 shards, scorer fp8" in md
    assert "| one_gpu_dosa | 40.00 | 2.00× |" in md and "| sharded_deepgemm | 50.00 | 2.50× |" in md
    assert "| seed_allgather | 16,388 | 0.020 |" in md
    assert "| 0 | 524,288 | 1,000 | 0.0100 | 0.0400 | 7 |" in md
    assert "- sharded_dosa == dense_topk (whole context): True" in md


def test_profile_line_split_charges_callees_to_their_own_lines(monkeypatch):
    """``dosa bench --profile-plan``'s line split: a line that calls a traced function is
    charged only with the time outside the callee, whose lines carry the rest (a fake clock
    that the functions advance)."""
    import types

    from dosa_cupy.bench import profile_plan

    clock = [0.0]
    monkeypatch.setattr(profile_plan.time, "perf_counter", lambda: clock[0])
    sync = types.SimpleNamespace(synchronize=lambda: None)
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: sync))

    def inner():
        clock[0] += 2.0

    def outer():
        clock[0] += 1.0
        inner()
        clock[0] += 3.0

    acc = profile_plan._line_split(outer, (), cp, (inner,))
    first = {"outer": outer.__code__.co_firstlineno, "inner": inner.__code__.co_firstlineno}
    got = {(f, ln - first[f]): t for (f, ln), t in acc.items() if t}
    assert got == {("outer", 1): 1.0, ("inner", 1): 2.0, ("outer", 3): 3.0}


def test_profile_finish_is_the_pipelines_tail(monkeypatch):
    """``--profile-plan``'s finish: the exact selection on the seeds' and refinement's
    records, recovery of the queries ``recovery_queries`` or an invalid plan names, int64
    ids — the stages ``dosa_topk`` runs after refinement, in its order (fakes record the
    calls)."""
    from dosa_cupy import select
    from dosa_cupy.bench import profile_plan

    calls = []
    ids = np.zeros((3, 2), np.int32)

    def select_ids(K, d, r):
        calls.append(("select", K, d, r))
        return ids, None

    def recovery_queries(b):
        calls.append(("queries", b))
        return np.array([False, True, False])

    def recover(b, i, bad):
        calls.append(("recover", b, i, bad.tolist()))

    for name, fn in (("select_ids", select_ids), ("recovery_queries", recovery_queries),
                     ("recover", recover)):  # fmt: skip
        monkeypatch.setattr(select, name, fn)
    sd = types.SimpleNamespace(default="seed records")
    valid = np.array([True, True, False])
    out = profile_plan._finish(2, sd, "recs", "batch", valid)
    assert out.dtype == np.int64 and out.shape == (3, 2)
    assert calls == [("select", 2, "seed records", "recs"), ("queries", "batch"),
                     ("recover", "batch", ids, [False, True, True])]  # fmt: skip
