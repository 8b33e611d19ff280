"""CPU: the kernel builds that bench rows switch to (dosa_cupy/bench/builds.py): names parsed
and checked, switches set inside the block and restored after it, also when the block
raises."""

from __future__ import annotations

import pytest

from dosa_cupy import (
    _build,
    cost,
    decode_ops,
    dense,
    plan,
    prepare,
    refine,
    route,
    screen,
    seeds,
    select,
)
from dosa_cupy.bench.builds import BUILDS, builds_on, parse_builds


def test_parse_builds_names_and_rejects_unknown():
    assert parse_builds("") == () and parse_builds(None) == ()
    assert parse_builds("staged+f16screen") == ("staged", "f16screen")
    with pytest.raises(ValueError, match="builds"):
        parse_builds("staged+nope")


def test_builds_on_sets_and_restores_every_switch():
    mods = {"staged": screen, "f16screen": screen, "decode_tma": decode_ops,
            "decode_gather": decode_ops, "tmaahead": decode_ops, "tmadue": decode_ops,
            "blockselect": decode_ops, "witkth": decode_ops, "witperrow": decode_ops,
            "witblocks4": decode_ops, "stepchain": decode_ops, "screen14": decode_ops,
            "screen30": decode_ops, "rank4": dense,
            "rowarrays": plan,
            "scalearrays": prepare, "routearrays": route, "chunkplans": route,
            "tworeadbacks": route, "eagerext": refine,
            "sizedpool": seeds, "tiefirst": screen, "guard64": screen, "qg768": screen,
            "qg1536": screen, "onestream": seeds, "floor6": cost, "floor6h100": cost,
            "latecounts": refine, "nogate": route, "sample384": cost,
            "syncchecks": prepare, "nopipe": screen, "plainext": select,
            "noilp": dense, "rhofloat": prepare, "rescore": refine, "planf32": plan,
            "kthfloor": select, "collectrow": dense, "kernellookup": _build,
            "samplearrays": plan}  # fmt: skip
    assert set(mods) == set(BUILDS)
    before = {n: getattr(mods[n], BUILDS[n][1]) for n in BUILDS}
    # the defaults: the ring and FP8 screen builds, the decode scan by its rule, the row
    # constants' kernel
    assert screen.WGT_RING and screen.WGT_FP8 and decode_ops.DECODE_TMA is None
    assert decode_ops.SCREEN_R is None  # the decode screen under trial: off by default
    assert decode_ops.TMA_AHEAD is None  # the block table read ahead by its rule
    assert not decode_ops.WITNESS_KTH  # the witnesses' K-th in their kernel: off
    assert decode_ops.WITNESS_ROWS  # a request's two witness rows in one block
    assert plan.ROW_CONSTANTS_KERNEL  # the per-row constants by one kernel
    # the synchronizations session 25 removed, and the decision's plans still under trial
    assert route.ONE_READBACK and refine.DEFERRED_EXTENSION and seeds.POOL_CAPACITY
    assert refine.PREFETCH_COUNTS  # the finish's counts read back while the selection runs
    assert select.RAISED_EXTENSION  # overflowed rows refined again against their kept K-th
    assert refine.SPILL  # the FP8 refinement's records past cap kept for the extension
    assert _build.KERNEL_CACHE  # one Kernel per name and build, not a lookup per launch
    assert plan.POOL_SAMPLE_KERNEL  # the plan's sample ids by one kernel
    assert plan.ACTIVATION_I8  # the plan's activation pass on the s8 tensor cores
    assert select.FLOOR_WIDE and dense.SELECT_BUF  # the floor by many blocks per row; the
    # selection's last pass over its scratch
    with builds_on(("plainext", "noilp", "rhofloat", "rescore", "planf32", "kthfloor",
                    "collectrow")):  # fmt: skip
        assert not select.RAISED_EXTENSION and not dense.SELECT_ILP and not prepare.RHO_INT
        assert not (refine.SPILL or plan.ACTIVATION_I8 or select.FLOOR_WIDE or dense.SELECT_BUF)
    assert select.RAISED_EXTENSION and dense.SELECT_ILP  # four loads of each thread in flight
    assert prepare.RHO_INT  # ρ from integer squares
    assert route.SAMPLE_GATE and cost.WGT_SAMPLE == 128  # the samples behind a gate, 128 rows
    assert prepare.DEFER_CHECKS and screen.WGT_PIPE  # the checks by an event; the halves
    with builds_on(("syncchecks", "nopipe")):
        assert not prepare.DEFER_CHECKS and not screen.WGT_PIPE
    with builds_on(("latecounts", "nogate", "sample384")):
        assert not refine.PREFETCH_COUNTS and refine.DEFERRED_EXTENSION
        assert not route.SAMPLE_GATE and cost.sample_size("wgt") == 384
    assert screen.SPECULATIVE_TIE and not route.CHUNK_PLANS and seeds.SIDE_STREAM
    assert screen.WGT_QG == 384 and cost.sample_size("wgt") == 128 and screen.WGT_GUARD32
    with builds_on(("qg1536",)):  # whole groups of every build; the sample unchanged
        assert screen.WGT_QG == 1536 and screen.WGT_QG % 16 == 0
        assert cost.sample_size("wgt") == 128
    with builds_on(("tworeadbacks", "eagerext", "sizedpool", "tiefirst")):
        assert not (route.ONE_READBACK or refine.DEFERRED_EXTENSION or seeds.POOL_CAPACITY)
        assert not screen.SPECULATIVE_TIE
    floor = cost.H200_FP8.dosa_floor_ms
    with builds_on(("rowarrays", "onestream", "guard64", "floor6")):
        assert not (plan.ROW_CONSTANTS_KERNEL or seeds.SIDE_STREAM or screen.WGT_GUARD32)
        assert cost.model_for("fp8").dosa_floor_ms == 6.0
    assert cost.model_for("fp8").dosa_floor_ms == floor
    # the decode step's selection by rank and its witnesses spread over the SMs
    assert decode_ops.RANK_SELECT and decode_ops.WITNESS_SPREAD
    with builds_on(("blockselect", "witblocks4")):
        assert not decode_ops.RANK_SELECT and not decode_ops.WITNESS_SPREAD
    with builds_on(("staged", "decode_tma")):
        assert not screen.WGT_RING and decode_ops.DECODE_TMA is True and screen.WGT_FP8
    with builds_on(("f16screen", "decode_gather")):
        assert screen.WGT_RING and not screen.WGT_FP8 and decode_ops.DECODE_TMA is False
    with pytest.raises(RuntimeError), builds_on(("staged", "f16screen", "decode_tma")):
        assert not screen.WGT_RING and not screen.WGT_FP8
        raise RuntimeError("a failing variant")
    assert {n: getattr(mods[n], BUILDS[n][1]) for n in BUILDS} == before
