"""``dosa mutate`` itself (dosa_ref/mutate/, docs/mutation.md): mutants are valid
single-point edits, the sample is a deterministic function of the seed, the module table
points at existing files and every equivalent-mutant entry still matches a mutant (an
entry left behind by a refactor is reported, not silently ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dosa_ref import mutate

ROOT = Path(__file__).resolve().parents[1]


SMALL = ("dosa_ref/seeds.py", "dosa_ref/scorer.py", "dosa_ref/fp8.py", "dosa_ref/certificate.py")


@pytest.fixture(scope="module")
def pools():
    """Mutants of the smaller modules (generating all of them compiles ~1,700 files)."""
    return {t.path: mutate.generate(ROOT, t) for t in mutate.TARGETS if t.path in SMALL}


def test_targets_exist_and_have_tests():
    for t in mutate.TARGETS:
        assert (ROOT / t.path).is_file(), t.path
        assert mutate.tests_for(ROOT, t), t.path
    t = mutate.Target("dosa_ref/seeds.py", ("tests/test_select.py", "tests/nosuch.py"))
    assert mutate.tests_for(ROOT, t) == ["tests/test_select.py"]
    by_name = mutate.select_targets("cupy_plan,seeds,dosa_ref/fp8.py,dosa_ref.numeric")
    assert [x.path for x in by_name] == [
        "dosa_cupy/plan.py",
        "dosa_ref/seeds.py",
        "dosa_ref/fp8.py",
        "dosa_ref/numeric.py",
    ]
    assert mutate.select_targets(None) == list(mutate.TARGETS)


def test_mutants_are_valid_single_point_edits(pools):
    for path, ms in pools.items():
        src = (ROOT / path).read_bytes()
        assert len(ms) >= 20, path
        assert len({m.id for m in ms}) == len(ms)
        for m in ms:
            new = m.apply(src)
            assert new != src and m.start < m.end <= len(src)
            compile(new, path, "exec")
            assert new[: m.start] == src[: m.start] and new.endswith(src[m.end :])
            d = m.diff(src)
            assert d.count("\n-") >= 1 and d.count("\n+") >= 1


def test_sample_is_deterministic_and_covers_every_module(pools):
    a = mutate.sample(pools, 60, seed=3)
    b = mutate.sample(pools, 60, seed=3)
    c = mutate.sample(pools, 60, seed=4)
    assert [m.id for m in a] == [m.id for m in b] and len(a) == 60
    assert [m.id for m in a] != [m.id for m in c]
    for path in pools:
        assert sum(m.path == path for m in a) >= 3, path


def test_equivalent_entries_match_the_source():
    """Each entry's original line is still in its module (else the entry is stale)."""
    for e in mutate.EQUIVALENT:
        assert e.kind in ("identical", "contract") and e.why
        lines = {x.strip() for x in (ROOT / e.path).read_text().splitlines()}
        assert e.before in lines, f"stale EQUIVALENT entry for {e.path}: {e.before!r}"
        assert e.after != e.before


def test_main_lists_and_validates(capsys):
    assert mutate.main(["--list", "--modules", "seeds,fp8", "--max-mutants", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("8 of ") and len(out) == 9
    assert all(line.split(":")[0] in ("seeds", "fp8") for line in out[1:])
    with pytest.raises(ValueError, match="modules"):
        mutate.main(["--list", "--modules", "nosuch"])
    with pytest.raises(ValueError, match="ids"):
        mutate.main(["--list", "--modules", "seeds", "--ids", "seeds:0:none:0"])
