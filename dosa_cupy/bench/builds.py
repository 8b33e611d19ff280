"""Kernel builds a bench row can switch to (``--variant NAME:...,builds=staged+f16screen``;
``dosa bench --decode --scorer fp8tma``): module switches of the library that select another
build of a stage's kernel with the same ids — the builds the defaults are measured against.
Not options of the library: a build under trial is one of these until it wins.

    staged      screen.WGT_RING = False  the transposed screen staging each query group in
                                         the block (not the ring of group images)
    f16screen   screen.WGT_FP8 = False   its f16 builds where the FP8 build would screen
    decode_tma  decode_ops.DECODE_TMA = True   every decode step on the TMA-fed scan
    decode_gather decode_ops.DECODE_TMA = False  every decode step on the gathering scan
    tmaahead    decode_ops.TMA_AHEAD = True  the TMA scan's producer reads the block table
                                         32 pages ahead of its copies at every B (not only
                                         from 8 blocks per request)
    tmadue      decode_ops.TMA_AHEAD = False  the TMA scan's producer reads each entry when
                                         its page is due, and the gathering scan below 16
                                         requests except next_n ≥ 2 at 64 heads (the rule
                                         before the read-ahead)
    witkth      decode_ops.WITNESS_KTH = True  the FP8 decode witnesses' K-th record
                                         selected by their kernel's last block per row
                                         (not a selection launch; under trial)
    witperrow   decode_ops.WITNESS_ROWS = False  at next_n 2 the FP8 decode witnesses
                                         scored by a block per row (not one block for a
                                         request's two rows, which gathers each tile once)
    screen14, screen30 decode_ops.SCREEN_R = 14, 30  a decode step on the FP8 scorer screened
                                         with plans of 14 or 30 retained heads, only the
                                         survivors scored (not the scan of every key)
    blockselect decode_ops.RANK_SELECT = False  a decode step of at most 4 query rows
                                         selects by select_kernel (not select_rank)
    rank4       dense.RANK_ROWS = 4    a decode step of five to eight query rows (B = 8 at
                                         next_n 1) selects by select_kernel_buf (not
                                         select_rank)
    witblocks4  decode_ops.WITNESS_SPREAD = False  a decode step's witnesses scored by four
                                         blocks per row (not up to one block per SM)
    stepchain   decode_ops.STEP_FOLD = False  a decode step's counters zeroed by two memsets,
                                         its ring pushed and advanced by two launches and its
                                         ids copied by a third (not folded into the dedup
                                         and decode_step_finish)
    scalearrays prepare.SCALE_CHECK_KERNEL = False  the scale and envelope checks by ~15
                                         array operations (not their one kernel)
    routearrays route.COUNT_KERNELS = False  the route stage's counts by ~25 array
                                         operations (not its two kernels)
    chunkplans  route.CHUNK_PLANS = True  the first candidate's plan of the whole chunk
                                         built during the sampled decision (under trial)
    nogate      route.SAMPLE_GATE = False  the sampled decision's timed samples without the
                                         gate that waits for the host's launches
    sample384   cost.WGT_SAMPLE = 384  the transposed screen's sample a whole block row (not
                                         a third of one)
    tworeadbacks route.ONE_READBACK = False  the sampled decision with the positive-head
                                         histogram read back after the seeds (two read-backs)
    eagerext    refine.DEFERRED_EXTENSION = False  the overflow check read back right after
                                         the refinement
    noilp       dense.SELECT_ILP = False  the selection's passes with one load of each
                                         thread in flight (select_kernel)
    collectrow  dense.SELECT_BUF = False  the selection's last pass over the row
                                         (select_kernel_ilp, not select_kernel_buf's pass
                                         over the scratch)
    rhofloat    prepare.RHO_INT = False  ρ by one warp per key and float64 squares
                                         (key_rho_kernel)
    samplearrays plan.POOL_SAMPLE_KERNEL = False  the plan's activation sample ids by six
                                         array operations (not csrc/seeds.cu pool_sample)
    kernellookup _build.KERNEL_CACHE = False  every launch looks its kernel up in the
                                         module again (CuPy makes a new RawKernel each time;
                                         not one Kernel per name and build)
    rescore     refine.SPILL = False  the overflowed rows' survivors refined again (no spill
                                         of the FP8 refinement's records past cap)
    kthfloor    select.FLOOR_WIDE = False  the overflowed rows' captured floor by one block
                                         per row, the K-th kept record itself (not the lower
                                         edge of its 22-bit code bucket by many blocks)
    plainext    select.RAISED_EXTENSION = False  the overflowed rows refined again against τ
                                         alone (not also the K-th record they kept)
    latecounts  refine.PREFETCH_COUNTS = False  the extension's and the recovery's counts
                                         read back after the selection
    syncchecks  prepare.DEFER_CHECKS = False  a DoSA call's value checks read back by a
                                         synchronization before its seeds are queued (not
                                         by an event after)
    sizedpool   seeds.POOL_CAPACITY = False  the eager call's anchor pool sized to P (read back)
    tiefirst    screen.SPECULATIVE_TIE = False  a chunk whose rule the route did not decide
                                         waits for its tie flag before it is planned
    guard64     screen.WGT_GUARD32 = False  the FP8 screen's guard in fp64 (not the fp32
                                         one rounded up)
    nopipe      screen.WGT_PIPE = False  the FP8 screen's fp32-guard kernels without the
                                         pipelined halves
    qg768, qg1536 screen.WGT_QG = 768, 1536  the transposed screen's queries per block row
                                         (the decision's sample stays 128 rows: cost.py
                                         reads WGT_QG once, at import)
    floor6      cost.H200_FP8 with dosa_floor_ms = 6.0  the early decision's floor at the
                                         smallest DoSA call the H100 measured (6.5 ms, 128K
                                         H 32), so such chunks are sampled
    floor6h100  cost.H100_FP8 with dosa_floor_ms = 6.0  the same on an H100 (whose model
                                         ``cost.model_for`` picks there): floor6+floor6h100
                                         on either GPU
    onestream   seeds.SIDE_STREAM = False  the eager call's sinks and local window scored on
                                         the caller's stream after the anchor pool (no side
                                         stream)
    planf32     plan.ACTIVATION_I8 = False  the plan's activation frequencies from fp32
                                         dots in one order (plan_mt*, not the activation
                                         images' integer dots on the s8 tensor cores)
    rowarrays   plan.ROW_CONSTANTS_KERNEL = False  the FP8 screen's per-row constants by
                                         ~25 array operations (not its one kernel)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib

from dosa_cupy import cost

# name → (module of dosa_cupy, its switch, the value the build sets)
BUILDS = {
    "staged": ("screen", "WGT_RING", False),
    "f16screen": ("screen", "WGT_FP8", False),
    "decode_tma": ("decode_ops", "DECODE_TMA", True),
    "decode_gather": ("decode_ops", "DECODE_TMA", False),
    "tmaahead": ("decode_ops", "TMA_AHEAD", True),
    "tmadue": ("decode_ops", "TMA_AHEAD", False),
    "witkth": ("decode_ops", "WITNESS_KTH", True),
    "witperrow": ("decode_ops", "WITNESS_ROWS", False),
    "screen14": ("decode_ops", "SCREEN_R", 14),
    "screen30": ("decode_ops", "SCREEN_R", 30),
    "blockselect": ("decode_ops", "RANK_SELECT", False),
    "rank4": ("dense", "RANK_ROWS", 4),
    "witblocks4": ("decode_ops", "WITNESS_SPREAD", False),
    "stepchain": ("decode_ops", "STEP_FOLD", False),
    "rowarrays": ("plan", "ROW_CONSTANTS_KERNEL", False),
    "planf32": ("plan", "ACTIVATION_I8", False),
    "scalearrays": ("prepare", "SCALE_CHECK_KERNEL", False),
    "routearrays": ("route", "COUNT_KERNELS", False),
    "chunkplans": ("route", "CHUNK_PLANS", True),
    "nogate": ("route", "SAMPLE_GATE", False),
    "sample384": ("cost", "WGT_SAMPLE", 384),
    "tworeadbacks": ("route", "ONE_READBACK", False),
    "eagerext": ("refine", "DEFERRED_EXTENSION", False),
    "latecounts": ("refine", "PREFETCH_COUNTS", False),
    "plainext": ("select", "RAISED_EXTENSION", False),
    "kthfloor": ("select", "FLOOR_WIDE", False),
    "rescore": ("refine", "SPILL", False),
    "kernellookup": ("_build", "KERNEL_CACHE", False),
    "samplearrays": ("plan", "POOL_SAMPLE_KERNEL", False),
    "noilp": ("dense", "SELECT_ILP", False),
    "collectrow": ("dense", "SELECT_BUF", False),
    "rhofloat": ("prepare", "RHO_INT", False),
    "syncchecks": ("prepare", "DEFER_CHECKS", False),
    "sizedpool": ("seeds", "POOL_CAPACITY", False),
    "tiefirst": ("screen", "SPECULATIVE_TIE", False),
    "guard64": ("screen", "WGT_GUARD32", False),
    "nopipe": ("screen", "WGT_PIPE", False),
    "qg768": ("screen", "WGT_QG", 768),
    "qg1536": ("screen", "WGT_QG", 1536),
    "onestream": ("seeds", "SIDE_STREAM", False),
    "floor6": ("cost", "H200_FP8", dataclasses.replace(cost.H200_FP8, dosa_floor_ms=6.0)),
    "floor6h100": ("cost", "H100_FP8", dataclasses.replace(cost.H100_FP8, dosa_floor_ms=6.0)),
}


def parse_builds(spec) -> tuple[str, ...]:
    """``a+b`` → ("a", "b"); ValueError naming ``builds`` for an unknown name."""
    names = tuple(x for x in str(spec or "").split("+") if x)
    unknown = sorted(set(names) - set(BUILDS))
    if unknown:
        raise ValueError(f"builds: unknown {unknown}; known: {sorted(BUILDS)}")
    return names


@contextlib.contextmanager
def builds_on(names):
    """The switches of ``names`` (``BUILDS``) set for the block, then restored."""
    mods = [(importlib.import_module(f"dosa_cupy.{BUILDS[n][0]}"), BUILDS[n][1]) for n in names]
    was = [getattr(m, a) for m, a in mods]
    try:
        for (m, a), n in zip(mods, names, strict=True):
            setattr(m, a, BUILDS[n][2])
        yield
    finally:
        for (m, a), v in zip(mods, was, strict=True):
            setattr(m, a, v)
