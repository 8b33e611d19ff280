"""CPU: ``dosa_cupy.bench.host_lag`` — the marked stage functions (entry and exit in call order,
restored after the block, also when it raises; an unknown function named), the medians per
point over calls (repeated points numbered, points missing from a call left out) and its
flags (a bad one: one line, exit 2)."""

from __future__ import annotations

import pytest

from dosa_cupy import pipeline, route
from dosa_cupy.bench.host_lag import POINTS, main, probed, summarize


def test_probed_marks_entry_and_exit_and_restores(monkeypatch):
    marks = []

    def recovery_queries(b):
        marks.append("ran")
        return ("rq", b)

    monkeypatch.setattr(pipeline, "recovery_queries", recovery_queries)
    before = {(m, n): getattr(pipeline if m == "pipeline" else route, n)
              for m in ("pipeline", "route") for n in POINTS[m]}  # fmt: skip
    with probed(marks.append, {"pipeline": ("recovery_queries",)}):
        assert pipeline.recovery_queries is not recovery_queries
        assert pipeline.recovery_queries.__name__ == "recovery_queries"
        assert pipeline.recovery_queries(7) == ("rq", 7)
    assert marks == ["recovery_queries>", "ran", "recovery_queries<"]
    assert pipeline.recovery_queries is recovery_queries
    assert all(getattr(pipeline if m == "pipeline" else route, n) is f
               for (m, n), f in before.items())  # fmt: skip


def test_probed_restores_when_the_block_raises_and_names_unknown_points():
    f = pipeline.select_ids
    with pytest.raises(RuntimeError), probed(lambda n: None, {"pipeline": ("select_ids",)}):
        assert pipeline.select_ids is not f
        raise RuntimeError
    assert pipeline.select_ids is f
    with pytest.raises(ValueError, match="^points: dosa_cupy.route has no function 'nope'"):
        with probed(lambda n: None, {"pipeline": ("select_ids",), "route": ("nope",)}):
            pass
    assert pipeline.select_ids is f  # nothing was replaced before the check


def test_every_point_exists():
    with probed(lambda n: None):
        pass


def test_summarize_medians_numbering_and_missing_points():
    calls = [
        [("call>", 0.0, 0.0), ("plan_stage>", 1.0, 2.0), ("plan_stage>", 3.0, 3.5),
         ("extend_records>", 4.0, 9.0), ("call<", 5.0, 10.0)],
        [("call>", 0.0, 0.0), ("plan_stage>", 2.0, 2.0), ("plan_stage>", 4.0, 4.5),
         ("call<", 6.0, 11.0)],
        [("call>", 0.0, 0.0), ("plan_stage>", 3.0, 5.0), ("plan_stage>", 5.0, 5.5),
         ("call<", 7.0, 12.0)],
    ]  # fmt: skip
    got = summarize(calls)
    assert [k for k, _, _ in got] == ["call>", "plan_stage>", "plan_stage>#2", "call<"]
    assert got[1][1:] == (2.0, 2.0) and got[2][1:] == (4.0, 4.5) and got[3][1:] == (6.0, 11.0)


@pytest.mark.parametrize("argv", [["--scenarios", "fast"], ["--calls", "0"], ["--H", "x"],
                                  ["--scenarios", ","]])  # fmt: skip
def test_bad_flags_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
