"""CPU: the kernel builds under trial that bench rows switch on (dosa_cupy/bench/builds.py):
names parsed and checked, switches on inside the block and restored after it, also when the
block raises."""

from __future__ import annotations

import pytest

from dosa_cupy import decode_ops, refine, screen
from dosa_cupy.bench.builds import BUILDS, builds_on, parse_builds


def test_parse_builds_names_and_rejects_unknown():
    assert parse_builds("") == () and parse_builds(None) == ()
    assert parse_builds("ring+refine_ws") == ("ring", "refine_ws")
    with pytest.raises(ValueError, match="builds"):
        parse_builds("ring+nope")


def test_builds_on_sets_and_restores_every_switch():
    mods = {"ring": screen, "fp8screen": screen, "refine_ws": refine, "decode_tma": decode_ops}
    assert set(mods) == set(BUILDS)
    before = {n: getattr(mods[n], BUILDS[n][1]) for n in BUILDS}
    assert not any(before.values()), "every build under trial is off by default"
    with builds_on(("ring", "decode_tma")):
        assert screen.WGT_RING and decode_ops.DECODE_TMA and not refine.REFINE_WS
    with pytest.raises(RuntimeError), builds_on(tuple(BUILDS)):
        assert all(getattr(mods[n], BUILDS[n][1]) for n in BUILDS)
        raise RuntimeError("a failing variant")
    assert {n: getattr(mods[n], BUILDS[n][1]) for n in BUILDS} == before
