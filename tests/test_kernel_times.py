"""CPU: the per-kernel GPU-time summary of ``dosa_cupy.bench.kernel_times`` (ncu's CSV read
and added up per kernel name; units converted; a bad unit or flag rejected)."""

from __future__ import annotations

import pytest

from dosa_cupy.bench.kernel_times import main, parse_ncu_csv, summarize

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')  # fmt: skip


def _row(i, name, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","1","python3","127.0.0.1","{name}","1","7","(256, 1, 1)","(8, 1, 1)","0",'
            f'"9.0","Command line profiler metrics","{metric}","{unit}","{value}"')  # fmt: skip


def test_launches_in_order_and_units_to_ms():
    text = "\n".join([
        "==PROF== Connected to process 1",
        HEAD,
        _row(0, "screen_wgt_fp8_ring_rows8_g32", "ns", "23,295,040"),
        _row(1, "select_kernel(int, float *)", "us", "445.5"),
        _row(2, "select_kernel(int, float *)", "ms", "1.5"),
        _row(3, "cupy_take", "ns", "4,000", metric="sm__cycles_elapsed.avg"),
    ])  # fmt: skip
    got = parse_ncu_csv(text)
    names = [n for n, _ in got]
    assert names == ["screen_wgt_fp8_ring_rows8_g32", "select_kernel", "select_kernel"]
    assert got[0][1] == pytest.approx(23.29504) and got[1][1] == pytest.approx(0.4455)
    s = summarize(got)
    assert s[0] == ("screen_wgt_fp8_ring_rows8_g32", 1, pytest.approx(23.29504))
    assert s[1] == ("select_kernel", 2, pytest.approx(1.9455))


def test_unknown_unit_names_the_argument():
    with pytest.raises(ValueError, match="^text: unknown unit"):
        parse_ncu_csv("\n".join([HEAD, _row(0, "k", "cycle", "5")]))


def test_summary_prints_the_totals(tmp_path, capsys):
    p = tmp_path / "k.csv"
    p.write_text("\n".join([HEAD, _row(0, "a", "us", "1000"), _row(1, "b", "us", "3000")]))
    main(["summary", str(p)])
    out = capsys.readouterr().out
    assert "2 launches, 4.000 ms" in out and out.index(" b") < out.index(" a")


@pytest.mark.parametrize("argv", [["run", "--route", "fused"], ["summary"], ["nope"]])
def test_bad_flags_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("graph", [False, True])
def test_run_profiles_one_call_after_the_warm_ones(monkeypatch, graph):
    """``run``: the warm calls (two; with --graph three — eager, capture, first replay — on
    one ``StepGraphs``), then exactly one call between profiler start and stop."""
    import sys
    import types

    from dosa_cupy import pipeline, workload
    from dosa_cupy.capture import StepGraphs

    log = []
    dev = types.SimpleNamespace(synchronize=lambda: None)
    prof = types.SimpleNamespace(start=lambda: log.append("start"), stop=lambda: log.append("stop"))
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: dev, profiler=prof))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    fields = ("q", "w", "k_payload", "k_scale", "ks", "ke")
    monkeypatch.setattr(workload, "make_gpu_workload", lambda *a, **k: dict.fromkeys(fields))
    monkeypatch.setattr(pipeline, "dosa_topk", lambda *a, **o: log.append(o.get("graph")))
    main(["run", "--route", "auto", "--Qn", "8", "--N", "64"] + (["--graph"] if graph else []))
    calls = [x for x in log if x not in ("start", "stop")]
    assert len(calls) == (4 if graph else 3) and log[-3:-1] == ["start", calls[-1]]
    assert log[-1] == "stop"
    if graph:
        assert isinstance(calls[0], StepGraphs) and all(c is calls[0] for c in calls)
    else:
        assert calls == [None] * 3
