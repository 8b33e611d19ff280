"""The device side of DoSA decode (docs/method.md §10): launches of csrc/decode.cu, the
fused step's workspace and its two backends (the kernels, and a numpy emulation).

``Workspace`` holds every device buffer of one step shape — visible ends, the witness ring
and table, witness records, the threshold records, the compact records (room for every
visible key by default), the selected ids and the selection scratch — so that a step on it
issues kernels only: no allocation and, with ``check_layout=False`` and the default buffer,
no host synchronization, which is what a CUDA graph capture needs (docs/method.md §10 "No
per-step host work").

The witness ring: ``ring`` int32 [B, history·next_n·K] holds the last ``history`` steps'
selections; a step writes its ids into slot ``ctr % history`` and moves the counter, both
on the device (``decode_step_finish``, which also writes the caller's int64 ids; with
``STEP_FOLD`` off, ``decode_ring_push`` and ``decode_ring_advance``), so a replayed graph
rotates the slots by itself.  ``decode_witness_dedup`` turns the ring into a table of
distinct witnesses (``witness_table``'s ids per row); ``decode_witness_dedup_zero`` also
zeroes the step's record counters and writes its visible ends.

The paged cache's layout (``physical_rows``, ``page_rows``, ``gather_request_keys``) and the
witness table live here too, below the selector (``dosa_cupy.decode``, which re-exports
them): both backends need them, and the selector imports this module, not the reverse.
"""

from __future__ import annotations

import functools
from collections import deque

import numpy as np

from ._build import KernelSpec, cupy_or_raise, kernel, num_sms
from .dense import SEL_KMAX
from .emulate import record_score
from .plan import build_plans_fused, row_tiles
from .scorer import FP8_SPEC, FP8_TILE, MMA_BITS, padded_heads, plan_scorer

PAGE = 64  # tokens per KV block (csrc/decode.cu DEC_PAGE)
D = 128
WARPS = 8  # warps per block of the decode kernels (256 threads)
WIT_KEYS = 64  # csrc/decode.cu DEC_WIT_KEYS
SCAN_TILE = 512  # csrc/decode.cu DEC_TILE: logical keys per work item of the scan
SCAN_STAGES = 2  # csrc/decode.cu DEC_STAGES


def scan_smem(tile: int, stages: int) -> int:
    """Shared memory of the scan's ring: stages × (tile keys × (128 payload + 4 scale) bytes)
    (csrc/decode.cu DEC_STAGES · DEC_STAGE_BYTES)."""
    return stages * tile * (D + 4)


SCAN_SMEM = scan_smem(SCAN_TILE, SCAN_STAGES)
DEDUP_MAX = 1 << 14  # witnesses per request that decode_witness_dedup hashes in shared memory
KMAX = SEL_KMAX  # the selection kernel's limit
DECODE = KernelSpec("decode.cu")  # decode.cu's own ring shape (SCAN_TILE, SCAN_STAGES)
NONE = 2**31 - 1  # decode_layout: no violation


# ---------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------


def _kernel(name: str, smem: int = 0):
    return kernel(name, smem, DECODE)


def scan(d, fused: bool, tail: tuple) -> None:
    """Launch the scan of ``d``'s scorer: "f16", the persistent scan (csrc/decode.cu
    dec_scan_impl), one block per SM over the (request, tile) items; "fp8", ``scan_fp8``.
    ``tail`` = the route's last arguments: (out,) for the logits, (thr, cnt, rec, cap) for
    the fused route."""
    if d["scorer"] == "fp8":
        return scan_fp8(d, fused, tail)
    smem, T = SCAN_SMEM, -(-d["L"] // SCAN_TILE)
    total = d["B"] * T
    grid = max(1, min(total, num_sms()))
    per = -(-total // grid)
    name = f"decode_{'fused' if fused else 'logits'}_mt{d['Hp'] // 16}"
    _kernel(name, smem)(
        (grid,), (32 * WARPS,),
        (
            d["q"], d["w"], d["kv"], d["scale"], d["block_table"], np.int32(d["max_blocks"]),
            d["ke"], np.int32(d["n"]), np.int64(d["L"]), np.int32(d["B"]), np.int64(per), *tail,
        ),
        shared_mem=smem,
    )  # fmt: skip


# The FP8 decode kernels (csrc/score_fp8.cu decode_scan, decode_witness; sm_90a, scorer.
# FP8_SPEC): blocks per SM they are built for (DECODE_BLOCKS, SEED_IDS_BLOCKS) and the blocks
# per row of the witness scoring (each streams its tiles of 64 witnesses through the key ring).
FP8_SCAN_BLOCKS = {64: 3, 32: 5}
FP8_WIT_BLOCKS = 4
# The witnesses of a step of few rows spread over up to one block per SM instead of
# FP8_WIT_BLOCKS per row (``witness_blocks``): at B = 1 a row's 4,096 witnesses are 64 tiles,
# 16 for each of four blocks in turn.  The same records, in another order (every reader
# takes them as a set).  With RANK_SELECT, B = 1 steps replayed 1.45–1.68× faster on an H100
# (docs/records/benchmarks.md "Four builds on by default; the decode step's selection by
# rank"); bench build witblocks4 keeps FP8_WIT_BLOCKS per row.
WITNESS_SPREAD = True


def witness_blocks(tiles: int, rows: int, sms: int) -> int:
    """Blocks per row of decode_witness_fp8 for ``tiles`` tiles of 64 witnesses and ``rows``
    query rows: FP8_WIT_BLOCKS, or with ``WITNESS_SPREAD`` up to ``sms`` blocks in all (at
    least FP8_WIT_BLOCKS per row), never more than the tiles."""
    per_row = max(FP8_WIT_BLOCKS, sms // max(1, rows)) if WITNESS_SPREAD else FP8_WIT_BLOCKS
    return max(1, min(tiles, per_row))


FP8_ROWS = 2  # query rows per request the decode scan takes (decode_scan's QB)
# The decode scan fed by the bulk tensor copy engine (score_fp8.cu decode_scan_tma: a producer
# warpgroup copies each page and its α into slots, three consumer warpgroups score them; one
# block per SM) or decode_scan (each block loads its own tiles): the same bits
# (tests/test_decode_fp8.py).  None: ``tma_wanted``'s rule; True / False: that scan always
# (dosa bench --decode --scorer fp8tma forces it).
DECODE_TMA: bool | None = None
# tma_wanted without the read-ahead (TMA_AHEAD False, the build tmadue): the TMA scan from this many
# requests on, or for next_n ≥ 2 with 64 padded heads, the TMA scan's producer then loading each
# block-table entry when its page is due (the H200's decode steps at 1M, docs/records/benchmarks.md
# session 22: graph replays 2.33 / 2.59 ms against 3.23 / 4.10 at B = 64, next_n = 1, H = 32 / 64,
# and faster at next_n = 2 for B = 1, 8, 64; slower at B = 8, next_n = 1: 0.65 / 0.67 ms against
# 0.52 / 0.64).  At 32 heads and next_n 2 below TMA_MIN_B the gathering scan is as fast or faster
# (an H100, session 37, back-to-back replays: B = 8, 1M 0.591 against 0.666 ms; 128K 0.166 / 0.168;
# B = 1 0.107 / 0.112 at 1M, 0.049 / 0.048 at 128K), while at 64 heads TMA stays ahead (B = 8, 1M:
# 0.675 against 0.784).
TMA_MIN_B = 16
# The TMA scan's producer warp reads the block-table entries of the next 32 pages while it
# issues the copies (score_fp8.cu tma_pages' AHEAD, the kernels ending in _ahead; docs/method.md
# §10 "The scan fed by TMA"): a block's pages are gx entries apart (gx = 2 at B = 64, 16 at
# B = 8, 128 at B = 1, 1M keys), so reading each entry when its page is due puts a load from
# L2 in front of most copies.  The same copies, so the same bits.  None: the read-ahead where
# a block's pages are at least TMA_AHEAD_MIN_GX entries apart (``tma_ahead``), and the TMA scan
# for every step (``tma_wanted``); True / False: the read-ahead always / never (bench builds
# tmaahead / tmadue; tmadue is the rule before it: the gathering scan below TMA_MIN_B
# requests except next_n ≥ 2 at 64 heads).  On an H100 (docs/records/benchmarks.md "The
# TMA scan's block table read ahead"), back-to-back replays at 1M: B = 8, next_n 2, H 64
# 0.537 against 0.673 ms; B = 8, next_n 1 0.425 / 0.429 against the gathering scan's 0.532 /
# 0.463 (H 64 / 32); B = 1 0.081 / 0.082 against 0.094 / 0.086; at B = 64 (gx = 2) within
# the runs' spread either way (3.70–3.87 against 3.65–3.72 ms at next_n 2, H 64).
TMA_AHEAD: bool | None = None
TMA_AHEAD_MIN_GX = 8


def tma_ahead(gx: int) -> bool:
    """Whether decode_scan_tma with ``gx`` blocks per request reads the block table ahead
    (``TMA_AHEAD``; None: from TMA_AHEAD_MIN_GX blocks per request on)."""
    return bool(TMA_AHEAD) if TMA_AHEAD is not None else gx >= TMA_AHEAD_MIN_GX


# The FP8 witnesses' K-th record selected by the last block of each row of their own kernel
# (score_fp8.cu decode_witness_kth, select_block.cuh; docs/method.md §10 "The witnesses' K-th
# in their kernel") instead of a selection launch after them: the same threshold record, one
# launch fewer a step.  Off (bench build witkth): on an H100 the last block took 9–12 µs for
# 4,096–8,192 records, about the launch it saves — 3–5 % faster steps at B = 8, next_n 1,
# 128K, 4–14 % slower at B = 1, next_n 1; its batched variants were slower
# (docs/records/benchmarks.md "The TMA scan's block table read ahead").
WITNESS_KTH = False
# At next_n 2 the FP8 witnesses of a request's two rows scored by one block on each gathered
# tile (score_fp8.cu decode_witness_fp8_h{H}_n2: id_scores' QB = 2, one N = H MMA per row, so
# the same records), not by one block per row, which gathers every witness twice.  On an
# H100 (docs/records/benchmarks.md "The TMA scan's block table read ahead") the witnesses of
# a B = 8, 128K step took 0.024 / 0.022 ms against 0.033 (H 64 / 32), the step back to back
# 0.149 / 0.139 against 0.157 / 0.151 ms.  Bench build witperrow: a block per row.
WITNESS_ROWS = True
FP8_TMA_CWG, FP8_TMA_SLOTS = 3, 3  # score_fp8.cu kCwg, kTmaSlots
# A step of at most dense.RANK_ROWS query rows selects its witnesses' K-th and its scan's
# records by select_rank (many blocks rank a row's few thousand records; docs/method.md §9
# "Few rows of few records") instead of select_kernel's one block per row: the same
# selection, B = 1 steps replayed 1.11–1.29× faster on an H100 (docs/records/benchmarks.md
# "Four builds on by default; the decode step's selection by rank"); bench build blockselect
# keeps select_kernel.
RANK_SELECT = True
# A step's bookkeeping folded into the launches around it (docs/method.md §10 "No per-step
# host work"): the dedup also zeroes the witnesses' and the scan's counters
# (decode_witness_dedup_zero), and decode_step_finish writes the ids into ``out`` and the ring
# and moves the ring's counter — four graph nodes fewer than the chain (two memsets, the
# counter's advance, the ids' int64 copy). Bench build stepchain keeps the chain.
STEP_FOLD = True


def fp8_tma_smem(nc: int) -> int:
    """Dynamic shared memory of decode_scan_tma with ``nc`` = next_n · H MMA columns
    (score_fp8.cu decode_tma_smem, checked by the kernel): 1 KB alignment slack, the slots'
    key tiles (64 × 128 bytes) and α (64 floats), the query tile, a full and an empty
    mbarrier per slot."""
    ring = FP8_TMA_CWG * FP8_TMA_SLOTS
    return 1024 + ring * 64 * 128 + nc * 128 + ring * 64 * 4 + 2 * ring * 8


def scan_fp8(d, fused: bool, tail: tuple) -> None:
    """The FP8 scan (csrc/score_fp8.cu decode_scan): grid (gx, B), request b's next_n rows
    against its logical keys in tiles of 64, block x taking tiles x, x + gx, …; gx spreads
    the GPU's resident blocks over the B requests without a second wave (B·gx ≤ the blocks
    that fit at once, rounded down: a partial second wave would double the time of the long
    per-block tile loops).  The logits route's ``out`` is filled
    with −inf first: the kernel writes the tiles it scores, the keys below the request's
    last visible end."""
    H, B, L = d["Hp"], d["B"], d["L"]
    if d["n"] > FP8_ROWS:  # validate_shapes admits 1 or 2
        raise ValueError(f"q: the FP8 decode scan takes next_n <= {FP8_ROWS}, got {d['n']}")
    if not fused:
        tail[0].fill(-np.inf)
    if tma_wanted(B, d["n"], H) and _aligned16(d["kv"], d["scale"]):  # the copies' alignment
        return scan_fp8_tma(d, fused, tail)
    T = -(-L // FP8_TILE)
    gx = max(1, min(T, num_sms() * FP8_SCAN_BLOCKS[H] // B))
    name = f"decode_{'fused' if fused else 'logits'}_fp8_h{H}"
    kernel(name, 0, FP8_SPEC)(
        (gx, B), (128,),
        (d["q"], d["w"], d["kv"], d["scale"], d["block_table"], np.int32(d["max_blocks"]),
         d["ke"], np.int32(d["n"]), *tail),
    )  # fmt: skip


def tma_wanted(B: int, n: int, Hp: int = 64) -> bool:
    """Whether a step of ``B`` requests of ``n`` query rows of ``Hp`` padded heads each takes
    the TMA scan (``DECODE_TMA``; None: always where its producer may read ahead —
    ``TMA_AHEAD`` not False — else from TMA_MIN_B requests on, or for n ≥ 2 at 64 heads)."""
    if DECODE_TMA is not None:
        return bool(DECODE_TMA)
    if TMA_AHEAD is not False:
        return True
    return B >= TMA_MIN_B or (n >= 2 and Hp == 64)


def _aligned16(*arrays) -> bool:
    """Whether every array's data starts at a 16-byte boundary (the bulk copies' sources)."""
    return all(int(a.data.ptr) % 16 == 0 for a in arrays)


TMA_BLOCK_PAGES = 8  # a block's set-up and ring fill, in pages (tma_blocks_per_request)


@functools.cache
def tma_blocks_per_request(B: int, pages: int, sms: int) -> int:
    """Blocks per request of decode_scan_tma (one block per SM): the smallest gx ≥ 1 within
    3 % of the least waves × (pages per block + a block's fixed cost), ⌈B·gx / sms⌉ ·
    (⌈pages / gx⌉ + TMA_BLOCK_PAGES), for the longest request's pages — one wave for a few
    long requests; where one block per request would leave SMs idle (between sms / 2 and
    sms requests), a few waves of smaller blocks."""
    gxs = range(1, max(1, min(pages, 4 * sms)) + 1)
    cost = [-(-B * gx // sms) * (-(-pages // gx) + TMA_BLOCK_PAGES) for gx in gxs]
    best = min(cost)
    # the fewest blocks within 3 % of the best: more waves for less is not worth the model
    return next(gx for gx, c in zip(gxs, cost, strict=True) if c <= 1.03 * best)


def scan_fp8_tma(d, fused: bool, tail: tuple) -> None:
    """The FP8 scan by TMA (csrc/score_fp8.cu decode_scan_tma): grid (gx, B), one block per SM
    (gx: ``tma_blocks_per_request``), block x taking request b's pages x,
    x + gx, … below its rows' last visible end; the key pages through a tensor map over the
    cache's rows (kv [num_blocks·64, 128], boxes of one page) — encoded per launch (a driver
    call of microseconds; a cache would keep the cache array alive).  ``tail`` as ``scan``."""
    from .tma import tensor_map_2d

    H, B, L, n = d["Hp"], d["B"], d["L"], d["n"]
    gx = tma_blocks_per_request(B, -(-L // FP8_TILE), num_sms())
    kvmap = tensor_map_2d(d["kv"], 64, 128)
    ahead = "_ahead" * tma_ahead(gx)
    name = f"decode_{'fused' if fused else 'logits'}_tma_fp8_h{H}_n{n}{ahead}"
    smem = fp8_tma_smem(n * H)
    kernel(name, smem, FP8_SPEC)(
        (gx, B), (128 * (1 + FP8_TMA_CWG),),
        (kvmap, d["q"], d["w"], d["scale"], d["block_table"], np.int32(d["max_blocks"]),
         d["ke"], np.int32(n), *tail),
        shared_mem=smem,
    )  # fmt: skip


# The decode screen (csrc/score_fp8.cu decode_screen_tma and decode_survivors_fp8;
# docs/method.md §10 "The certificate in decode"): None — a step's scan scores every visible
# key — or r, the retained heads of each row's plan: a step on the FP8 scorer then plans its
# rows (``plan.build_plans_fused`` for the FP8 screen's dots, ``screen_step``), screens the
# request's pages fed by TMA with those plans against the rows' thresholds, and scores only
# the survivors, appending the records at or above the threshold as the scan does — the
# same records, so the same ids.  Under trial (bench builds screen14, screen30): not the
# default until a GPU has measured it.
SCREEN_R: int | None = None
SCREEN_SAMPLE = 1024  # the plans' activation-frequency sample: cache rows evenly spaced


def screen_wanted(d) -> bool:
    """Whether a step of ``d`` (check_decode_inputs' dict) screens (``SCREEN_R``): the FP8
    scorer and a cache the bulk copies can read (16-byte aligned)."""
    return SCREEN_R is not None and d["scorer"] == "fp8" and _aligned16(d["kv"], d["scale"])


class ScreenBuffers:
    """The decode screen's buffers of one step shape: the rows' plans (the arrays of
    ``build_plans_fused``, written again every step), the plans' sample of cache rows, and
    the survivors — ids int32 [B, L] (room for every visible key) and counts uint32 [B]."""

    def __init__(self, B: int, L: int, r: int):
        cp = cupy_or_raise()
        self.r, self.mts = int(r), row_tiles(r)
        self.plan = None  # the first step's plan: its arrays are reused (build_plans_fused out)
        self.sample, self.sample_rows = None, -1
        self.sids = cp.empty((B, L), dtype=cp.int32)
        self.scount = cp.zeros(B, dtype=cp.uint32)

    def sample_of(self, rows: int):
        """int32 [min(SCREEN_SAMPLE, rows)]: cache rows evenly spaced over [0, rows) (made
        once per cache size)."""
        if rows != self.sample_rows:
            cp = cupy_or_raise()
            ns = max(1, min(SCREEN_SAMPLE, rows))
            self.sample = (cp.arange(ns, dtype=cp.int64) * (rows - 1) // max(ns - 1, 1)).astype(
                cp.int32
            )
            self.sample_rows = rows
        return self.sample


def screen_step(d, thr, ws) -> None:
    """The screen of a step (after ``DeviceOps.tau``): plans of its R rows with SCREEN_R
    retained heads (``plan.build_plans_fused``, the canonical scorer's and the FP8 screen's
    allowances, activation frequencies from ``ScreenBuffers.sample_of``: any sample gives a
    valid plan), then decode_screen_tma_r{16·mts}_n{next_n} — grid (gx, B) as the TMA scan,
    one block per SM — appending each request's survivors to ``ws.scr``."""
    from .tma import tensor_map_2d

    B, n, L = d["B"], d["n"], d["L"]
    if ws.scr is None or ws.scr.r != SCREEN_R or ws.scr.sids.shape != (B, L):
        ws.scr = ScreenBuffers(B, L, SCREEN_R)
    s = ws.scr
    arith = plan_scorer(d["scorer"])
    s.plan = pl = build_plans_fused(d["q"], d["w"], d["kv"], s.sample_of(int(d["kv"].shape[0])),
                                    s.r, s.mts, MMA_BITS, arith, arith, out=s.plan)  # fmt: skip
    s.scount.fill(0)
    nc = n * 16 * s.mts
    smem = fp8_tma_smem(nc)
    gx = tma_blocks_per_request(B, -(-L // FP8_TILE), num_sms())
    kernel(f"decode_screen_tma_r{16 * s.mts}_n{n}", smem, FP8_SPEC)(
        (gx, B), (128 * (1 + FP8_TMA_CWG),),
        (tensor_map_2d(d["kv"], 64, 128), pl.rows, pl.omega, pl.sigma, pl.C, pl.eps_raw,
         np.float64(pl.eps_out), pl.scratch[0], d["scale"], d["block_table"],
         np.int32(d["max_blocks"]), d["ke"], np.int32(n), thr, s.scount, s.sids, np.int64(L)),
        shared_mem=smem,
    )  # fmt: skip


def score_survivors(d, thr, cnt, rec, cap: int, scr) -> None:
    """decode_survivors_fp8_h{Hp}: every row's records at or above its threshold among its
    request's survivors (``scr``), into rec [R, cap] with counts cnt [R] (zeroed by the
    caller; they count past cap) — grid (gx, R), gx as the witnesses' blocks for a row of L
    ids (a block exits when its tiles hold no survivor)."""
    R = d["B"] * d["n"]
    gx = witness_blocks(-(-d["L"] // FP8_TILE), R, num_sms())
    kernel(f"decode_survivors_fp8_h{d['Hp']}", 0, FP8_SPEC)(
        (gx, R), (128,),
        (d["q"], d["w"], d["kv"], d["scale"], d["block_table"], np.int32(d["max_blocks"]),
         d["ke"], np.int32(d["n"]), scr.scount, scr.sids, np.int64(scr.sids.shape[1]), thr, cnt,
         rec, np.int64(cap)),
    )  # fmt: skip


def layout_device(L, bt, mb: int, nb: int, n: int, check: bool, bufs=None):
    """ke int32 [B·n] by the decode_layout kernel and, when ``check``, its layout verdict
    read back in one transfer (ValueError naming the argument, as the host check).
    ``bufs``: an object with ``ke`` and ``bad`` buffers to use (else new arrays)."""
    cp = cupy_or_raise()
    L, bt = cp.ascontiguousarray(L), cp.ascontiguousarray(bt)
    B = int(L.shape[0])
    ke = bufs.ke if bufs is not None else cp.empty(B * n, dtype=cp.int32)
    bad = bufs.bad if bufs is not None else cp.empty(2, dtype=cp.int32)
    if check:
        bad.fill(NONE)
    _kernel("decode_layout")(
        (max(1, -(-mb // 256)), B), (256,),
        (L, bt, np.int32(mb), np.int32(nb), np.int32(n), np.int32(bool(check)), ke, bad),
    )  # fmt: skip
    if check:
        b0, b1 = (int(x) for x in cp.asnumpy(bad))  # the one host sync of the check
        raise_layout(None if b0 == NONE else b0, None if b1 == NONE else b1, L, bt, mb, nb)
    return ke


def raise_layout(b_len, flat, L, bt, mb: int, nb: int) -> None:
    """The layout check's ValueError (host and device checks): ``b_len`` the first request
    whose length is outside [0, max_blocks·64], ``flat`` = b·max_blocks + i of the first used
    block-table entry outside [0, num_blocks); None where there is none."""
    if b_len is not None:
        raise ValueError(f"lengths: lengths[{b_len}]={int(L[b_len])} outside [0, {mb * PAGE}]")
    if flat is not None:
        b, i = divmod(flat, mb)
        raise ValueError(f"block_table: block_table[{b}, {i}]={int(bt[b, i])} outside [0, {nb})")


def dedup(src, dst, counts=None, n: int = 0, lengths=None, ke=None) -> None:
    """decode_witness_dedup: each row of src int32 [B, Wc] (−1 = empty) into dst (may be
    src) with one copy of every id kept in place and every other copy and empty slot −1.
    ``counts`` (uint32 [2, B·n], optional): also zeroed, request b's ``n`` entries of each
    row by its block (decode_witness_dedup_zero); with it, ``lengths`` int32 [B] and ``ke``
    int32 [B·n] (optional): the visible ends written as ``decode_layout`` without its check."""
    from .dense import _opt

    B, Wc = (int(x) for x in src.shape)
    P2 = 1 << (2 * Wc - 1).bit_length()  # hash slots: a power of two ≥ 2·Wc
    args = (src, dst, np.int32(Wc), np.int32(P2))
    if counts is None:
        _kernel("decode_witness_dedup", 4 * P2)((B,), (1024,), args, shared_mem=4 * P2)
    else:
        _kernel("decode_witness_dedup_zero", 4 * P2)(
            (B,), (1024,), (*args, counts, np.int32(n), _opt(lengths), _opt(ke)),
            shared_mem=4 * P2,
        )  # fmt: skip


def witness_table_device(entries, B: int):
    """``witness_table`` on the device: one concatenation and one dedup kernel — the same
    set of ids per row, kept in place instead of sorted; None when it does not apply (an
    entry of another B, or more than DEDUP_MAX witnesses)."""
    cp = cupy_or_raise()
    if not entries or any(e.ndim != 2 or e.shape[0] != B for e in entries):
        return None
    Wc = sum(int(e.shape[1]) for e in entries)
    if Wc == 0 or Wc > DEDUP_MAX:
        return None
    a = cp.concatenate([e.astype(cp.int32, copy=False) for e in entries], axis=1)
    dedup(a, a)
    return a


def physical_rows(block_table, ids, xp=np):
    """Cache rows (block·64 + offset, into payload.reshape(-1, 128)) of logical ids.

    ``block_table`` [B, max_blocks]; ``ids`` int [B, m] logical positions (< max_blocks·64)
    of each request.  Negative ids map to −1.  Mirrors ``dec_phys`` of csrc/decode.cu.
    """
    return page_rows(block_table, xp.arange(int(xp.asarray(ids).shape[0])), ids, xp)


def page_rows(block_table, req, ids, xp=np):
    """``physical_rows`` with a request per row: cache rows of logical positions ``ids`` int
    [R, m], row r belonging to request ``req[r]`` (int [R]) of ``block_table`` [B,
    max_blocks]; −1 stays −1 (rows of different requests need no [R, max_blocks] copy of
    the table: the serving layouts' page-table transform)."""
    ids = xp.asarray(ids).astype(xp.int64)
    ok = ids >= 0
    safe = xp.where(ok, ids, 0)
    blk = xp.asarray(block_table)[xp.asarray(req)[:, None], safe // PAGE].astype(xp.int64)
    return xp.where(ok, blk * PAGE + safe % PAGE, -1)


def gather_request_keys(kv_payload, kv_scale, block_table, lengths):
    """Host (numpy) view of each request's keys in logical order: a list of B pairs
    (payload uint8 [L_b, 128], scale fp32 [L_b]) — the reference's per-request keys."""
    kp = np.asarray(kv_payload).reshape(-1, D)
    ks = np.asarray(kv_scale).reshape(-1)
    bt = np.asarray(block_table)
    out = []
    for b, L in enumerate(np.asarray(lengths).tolist()):
        rows = physical_rows(bt[b : b + 1], np.arange(int(L))[None, :])[0]
        out.append((kp[rows], ks[rows]))
    return out


def witness_table(entries, B: int, xp=np):
    """Distinct witness ids per request: int32 [B, Wc], −1 in unused slots (or None).

    ``entries`` are past selections, each int [B_t, m_t] (−1 = padding); rows beyond B_t
    are empty.  Blanking repeats gives *distinct* witnesses, which the proof of
    τ_K(W) ≤ τ_K(Ω) needs (a repeated witness would be counted twice).  numpy: each row
    sorted, repeats −1; CuPy (``decode_ops.witness_table_device``): the same ids per row,
    one copy kept in place, when every entry has B rows and there are at most DEDUP_MAX.
    """
    if xp is not np:
        fast = witness_table_device(list(entries), B)
        if fast is not None:
            return fast
    cols = []
    for e in entries:
        e = xp.asarray(e).astype(xp.int32)
        part = xp.full((B, e.shape[1]), -1, dtype=xp.int32)
        m = min(B, e.shape[0])
        part[:m] = e[:m]
        cols.append(part)
    if not cols:
        return None
    a = xp.concatenate(cols, axis=1)
    if a.shape[1] == 0:
        return None
    big = np.iinfo(np.int32).max
    s = xp.sort(xp.where(a < 0, big, a), axis=1)
    dup = xp.zeros(s.shape, dtype=bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    return xp.where(dup | (s == big), -1, s).astype(xp.int32)


def _grid_x(n_keys: int, per_warp: int) -> int:
    return max(1, -(-n_keys // (WARPS * per_warp)))


def record_scores(rec) -> np.ndarray:
    """τ (float64, host) of records (uint64): the score of each, −inf for 0
    (``emulate.record_score``, widened)."""
    k = np.asarray(rec.get() if hasattr(rec, "get") else rec)
    return record_score(k).astype(np.float64)


# ---------------------------------------------------------------------------------------
# The workspace and the device backend
# ---------------------------------------------------------------------------------------


class Workspace:
    """Every device buffer of the fused step for one shape (module docstring).

    ``key`` = (B, next_n, H, K, L, history, cap); ``cap`` = compact records per row.
    Memory: about 8·cap bytes per query row (cap = L by default) plus 20·history·next_n·K
    bytes per request.
    """

    def __init__(self, B: int, n: int, H: int, K: int, L: int, history: int, cap: int,
                 scorer: str = "f16"):  # fmt: skip
        from .dense import scratch

        cp = cupy_or_raise()
        R, Hp, Wc = B * n, padded_heads(H, scorer), history * n * K
        self.key = (B, n, H, K, L, history, cap)
        self.ke = cp.empty(R, dtype=cp.int32)
        self.bad = cp.empty(2, dtype=cp.int32)
        self.q = cp.zeros((R, Hp, D), dtype=cp.uint8) if Hp != H else None
        self.w = cp.zeros((R, Hp), dtype=cp.float32) if Hp != H else None
        self.ring = cp.full((B, Wc), -1, dtype=cp.int32) if Wc else None
        self.ctr = cp.zeros(1, dtype=cp.int32)
        self.done = cp.zeros(1, dtype=cp.uint32)  # decode_step_finish's blocks (0 at rest)
        self.wit = cp.empty((B, Wc), dtype=cp.int32) if Wc else None
        self.wrec = cp.empty((R, Wc), dtype=cp.uint64) if Wc else None
        # the witnesses' and the scan's record counters side by side, so that one launch
        # zeroes both (STEP_FOLD)
        self.counts = cp.zeros((2, R), dtype=cp.uint32)
        self.wcnt, self.cnt = self.counts[0], self.counts[1]
        # decode_witness_kth's finished blocks per row (0 at rest; the last block resets it)
        self.ticket = cp.zeros(R, dtype=cp.uint32) if Wc else None
        self.thr = cp.zeros(R, dtype=cp.uint64)  # stays 0 (every key) without history
        self.rec = cp.empty((R, cap), dtype=cp.uint64)
        self.ids = cp.empty((R, K), dtype=cp.int32)
        self.kth = cp.empty(R, dtype=cp.uint64)
        self.scratch = scratch(R)
        self.scr = None  # the decode screen's buffers (ScreenBuffers), made by its first step

    def witnesses(self, b: int) -> np.ndarray:
        if self.ring is None or not 0 <= b < self.ring.shape[0]:
            return np.zeros(0, dtype=np.int64)
        a = cupy_or_raise().asnumpy(self.ring[b]).astype(np.int64)
        return np.unique(a[a >= 0])

    def reset(self, b: int | None = None) -> None:
        if self.ring is None:
            return
        if b is None:
            self.ring.fill(-1)
        elif 0 <= b < self.ring.shape[0]:
            self.ring[b] = -1


def select_into(K, rec, cnt, ids, kth, scr) -> None:
    """A step's exact selection of its record rows (``dense.select_records_into``'s
    arguments): by select_rank where ``RANK_SELECT`` is on and the rows are at most
    dense.RANK_ROWS, else by select_kernel."""
    from .dense import RANK_ROWS, select_records_into, select_records_rank_into

    if RANK_SELECT and int(rec.shape[0]) <= RANK_ROWS:
        select_records_rank_into(K, rec, cnt, ids, kth, scr)
    else:
        select_records_into(K, rec, cnt, ids, kth, scr)


class DeviceOps:
    """The fused step's device operations on a ``Workspace``: witnesses → threshold record
    (their K-th; 0 when fewer than K), scan with compact writeback at or above it, exact
    selection, and the ring update — every score on the selector's ``scorer``."""

    def __init__(self, scorer: str = "f16"):
        self.cp = cupy_or_raise()
        self.scorer = scorer

    def workspace(self, B, n, H, K, L, history, cap):
        return Workspace(B, n, H, K, L, history, cap, self.scorer)

    def witness_records(self, d, wit, wcnt, wrec, zeroed: bool = False, kth=None) -> None:
        """Records uint64 [R, Wc] (into ``wrec``, compacted, their count per row in ``wcnt``
        uint32 [R]) of the ids of ``wit`` int32 [B, Wc] that row r sees (0 ≤ id < ke[r]):
        ids distinct per request, −1 empty; scored by the scan's device function.
        ``zeroed``: ``wcnt`` is already 0 (else zeroed here).  ``kth`` (FP8 only): (ticket
        uint32 [R], thr uint64 [R]) — the same kernel also writes each row's K-th record to
        thr (0 below K records; decode_witness_kth)."""
        Wc = int(wit.shape[1])
        if not zeroed:
            wcnt.fill(0)
        args = (
            d["q"], d["w"], d["kv"], d["scale"], d["block_table"], np.int32(d["max_blocks"]),
            d["ke"], np.int32(d["n"]), wit, np.int32(Wc), wcnt, wrec,
        )  # fmt: skip
        R = d["B"] * d["n"]
        if d["scorer"] == "fp8":  # csrc/score_fp8.cu decode_witness: tiles of 64 per block
            gx = witness_blocks(-(-Wc // FP8_TILE), R, num_sms())
            if kth is not None:
                kernel(f"decode_witness_kth_fp8_h{d['Hp']}", 0, FP8_SPEC)(
                    (gx, R), (128,), (*args, np.int32(d["K"]), *kth)
                )
                return
            if WITNESS_ROWS and d["n"] == 2:  # a block per request: both rows on each tile
                gx = witness_blocks(-(-Wc // FP8_TILE), d["B"], num_sms())
                kernel(f"decode_witness_fp8_h{d['Hp']}_n2", 0, FP8_SPEC)((gx, d["B"]), (128,), args)
                return
            kernel(f"decode_witness_fp8_h{d['Hp']}", 0, FP8_SPEC)((gx, R), (128,), args)
        else:
            grid = (_grid_x(Wc, WIT_KEYS), R)
            _kernel(f"decode_witness_mt{d['Hp'] // 16}")(grid, (32 * WARPS,), args)

    def tau(self, d, ws):
        if ws.ring is None:
            return ws.thr, ws.wcnt
        Wc = int(ws.ring.shape[1])
        folds = self.dedup_folds(ws)  # the dedup zeroes both counters
        if folds:  # and writes the visible ends that begin left to it
            ends = (d["lengths"], d["ke"]) if d.get("ke_later") else (None, None)
            dedup(ws.ring, ws.wit, ws.counts, d["n"], *ends)
        elif Wc <= DEDUP_MAX:
            dedup(ws.ring, ws.wit)
        else:  # beyond the shared-memory hash set: sort on the device (allocates)
            ws.wit[...] = witness_table([ws.ring], d["B"], self.cp)
        if self.kth_in_witnesses(d):  # the K-th by the witnesses' last blocks
            kth = (ws.ticket, ws.thr)
            self.witness_records(d, ws.wit, ws.wcnt, ws.wrec, zeroed=folds, kth=kth)
            return ws.thr, ws.wcnt
        self.witness_records(d, ws.wit, ws.wcnt, ws.wrec, zeroed=folds)
        select_into(d["K"], ws.wrec, ws.wcnt, None, ws.thr, ws.scratch)
        return ws.thr, ws.wcnt

    @staticmethod
    def kth_in_witnesses(d) -> bool:
        """Whether ``tau`` takes the witnesses' K-th from decode_witness_kth (``WITNESS_KTH``
        on the FP8 scorer) instead of a selection launch."""
        return WITNESS_KTH and d["scorer"] == "fp8"

    @staticmethod
    def dedup_folds(ws) -> bool:
        """Whether ``tau`` on ``ws`` runs decode_witness_dedup_zero (``STEP_FOLD``, a
        history within DEDUP_MAX), which also writes the visible ends (``begin``)."""
        return STEP_FOLD and ws.ring is not None and int(ws.ring.shape[1]) <= DEDUP_MAX

    def witness_top(self, d, ws):
        """After ``tau``: the records of each row's visible witnesses, uint64 [R, Wc] (0 past
        the row's count; [R, 1] of 0 without a history; local ids) — a sharded step's part
        of the union whose K-th record is every shard's threshold (``dosa_cupy.shards``
        relabels them with global ids, so no two shards' records are equal)."""
        R = d["B"] * d["n"]
        if ws.ring is None:
            return self.cp.zeros((R, 1), dtype=self.cp.uint64)
        j = self.cp.arange(ws.wrec.shape[1])[None, :]
        return self.cp.where(j < ws.wcnt.astype(self.cp.int64)[:, None], ws.wrec, np.uint64(0))

    def union_floor(self, parts, K: int):
        """int64 [R]: the score code of the K-th record of the union of the shards'
        ``witness_top`` lists (0 where it holds fewer than K records)."""
        from .select import union_kth

        return self.floor_of(union_kth(parts, K))

    def selected_records(self, d, ids, bufs):
        """The records of a step's selection ``ids`` int32 [R, K] (−1 padding): per row, the
        records (uint64 [R, n·K], count uint32 [R]) of the distinct ids its request's rows
        selected that the row sees — every key the row selected, and no key twice
        (``bufs``: ``wit`` int32 [B, n·K], ``wrec`` uint64 [R, n·K], ``wcnt`` uint32 [R])."""
        dedup(ids.reshape(d["B"], -1), bufs.wit)
        self.witness_records(d, bufs.wit, bufs.wcnt, bufs.wrec)
        return bufs.wrec, bufs.wcnt

    def floor_of(self, thr):
        """int64 [R] (device): the score code of each threshold record — its order is the
        score order, 0 below every key (a row with fewer than K witnesses)."""
        return (thr >> np.uint64(32)).astype(self.cp.int64)

    def thr_of_floor(self, code):
        """The threshold records of score codes int64 [R]: every record of a key whose score
        is at or above the code's (the lowest id part, 0)."""
        return code.astype(self.cp.uint64) << np.uint64(32)

    def scan(self, d, thr, cap, ws, again: bool = False):
        """The step's scan after ``tau``; ``again``: the exact extension's second scan (its
        counters count from 0 again; the first scan's were zeroed by ``tau``'s dedup where
        it folds, ``dedup_folds``)."""
        R = d["B"] * d["n"]
        rec = ws.rec if cap == ws.rec.shape[1] else self.cp.empty((R, cap), dtype=self.cp.uint64)
        if again or not self.dedup_folds(ws):
            ws.cnt.fill(0)
        if screen_wanted(d):  # the screen, then its survivors (the extension: those again)
            if not again:
                screen_step(d, thr, ws)
            score_survivors(d, thr, ws.cnt, rec, cap, ws.scr)
        else:
            scan(d, True, (thr, ws.cnt, rec, np.int64(cap)))
        return rec, ws.cnt

    def scored(self, d, ws):
        """int64 [R] (host): the keys each row scored in full — after a screened step, its
        request's survivors within the row's visible end; None after a scan (every visible
        key)."""
        if not screen_wanted(d):
            return None
        sc = self.cp.asnumpy(ws.scr.scount).astype(np.int64)
        return np.minimum(np.repeat(sc, d["n"]), self.cp.asnumpy(d["ke"]).astype(np.int64))

    def select(self, d, rec, cnt, want_kth, ws):
        select_into(d["K"], rec, cnt, ws.ids, ws.kth if want_kth else None, ws.scratch)
        return ws.ids, (record_scores(ws.kth) if want_kth else None)

    def push(self, d, ws, ids, out=None) -> None:
        """The step's ids int32 [R, K] into the ring (the witnesses of the next steps) and,
        when given, into ``out`` (int64 [B, n, K], C-contiguous)."""
        from .dense import _opt

        B, nK = d["B"], d["n"] * d["K"]
        if STEP_FOLD and (ws.ring is not None or out is not None):
            h = 0 if ws.ring is None else int(ws.ring.shape[1]) // nK
            _kernel("decode_step_finish")(
                (-(-B * nK // 256),), (256,),
                (ids, _opt(out), _opt(ws.ring), ws.ctr, ws.done, np.int32(B), np.int32(nK),
                 np.int32(h)),
            )  # fmt: skip
            return
        if ws.ring is not None:
            _kernel("decode_ring_push")(
                (-(-B * nK // 256),), (256,),
                (ids, ws.ring, ws.ctr, np.int32(B), np.int32(nK),
                 np.int32(int(ws.ring.shape[1]) // nK)),
            )  # fmt: skip
            _kernel("decode_ring_advance")((1,), (32,), (ws.ctr,))
        if out is not None:
            out[...] = ids.reshape(out.shape)

    def max_count(self, cnt):
        return int(cnt.max()) if cnt.size else 0

    def thr_score(self, thr) -> np.ndarray:
        return record_scores(thr)


class NumpyOps:
    """CPU emulation of the device operations with float64 scores of the dequantized cache
    (``dosa_ref.scorer.score_keys``; per key independent of the other keys, as
    ``score_batch``) — with ``scorer="fp8"`` the FP8 kernels' scores bit for bit
    (``dosa_ref.mma_model.fp8_fresh_scores``).  Same bookkeeping as the device: records of
    visible witnesses, the threshold = the K-th of them as (τ, id) (τ = −inf when fewer
    than K), compact every key at or above it in the order (score desc, id asc) with a
    counter that counts past ``cap``, selection by (score desc, id asc).  Inputs without NaN
    codes."""

    def __init__(self, scorer: str = "f16"):
        from dosa_ref.fp8 import e4m3_values
        from dosa_ref.scorer import score_keys, topk_of

        self.e4m3_values, self.score_keys, self.topk_of = e4m3_values, score_keys, topk_of
        self.scorer = scorer
        self._ws = None

    def workspace(self, B, n, H, K, L, history, cap):
        """One persistent history for every shape (the deque of past selections; a slot
        beyond a step's B is empty for that step, as in dosa_ref.decode)."""
        if self._ws is None:
            self._ws = NumpyWorkspace(history)
        return self._ws

    def _scores(self, d, r, ids):
        b = r // d["n"]
        rows = physical_rows(d["block_table"][b : b + 1], np.asarray(ids)[None, :])[0]
        if self.scorer == "fp8":  # the FP8 kernels' bits (heads padded to Hp: exact +0 terms)
            from dosa_ref.mma_model import fp8_fresh_scores

            return fp8_fresh_scores(d["q"][r], d["w"][r], d["kv"][rows], d["scale"][rows])
        k = self.e4m3_values(d["kv"][rows]) * d["scale"][rows].astype(np.float64)[:, None]
        H = d["H"]
        q = self.e4m3_values(d["q"][r, :H])
        return self.score_keys(q, d["w"][r, :H].astype(np.float64), k)

    def _witness_lists(self, d, ws):
        """Per row: (scores float64 [K], ids int64 [K]) of its K first visible witnesses in
        (score desc, id asc), −inf / max-int padding, and the witness counts int64 [R]."""
        R, K = d["B"] * d["n"], d["K"]
        sc = np.full((R, K), -np.inf)
        ids = np.full((R, K), np.iinfo(np.int64).max)
        cnt = np.zeros(R, dtype=np.int64)
        wit = witness_table(list(ws.hist), d["B"], np) if ws.history > 0 else None
        if wit is None:
            return sc, ids, cnt
        for r in range(R):
            row = wit[r // d["n"]]
            W = row[(row >= 0) & (row < d["ke"][r])].astype(np.int64)
            cnt[r] = W.size
            s = self._scores(d, r, W)
            o = np.lexsort((W, -s))[:K]
            sc[r, : o.size], ids[r, : o.size] = s[o], W[o]
        return sc, ids, cnt

    def tau(self, d, ws):
        sc, ids, cnt = self._witness_lists(d, ws)
        return (sc[:, -1], ids[:, -1]), cnt  # the K-th (τ, id); −inf with fewer than K

    def witness_top(self, d, ws):
        """``DeviceOps.witness_top``: float64 [R, K] each row's K largest witness scores."""
        return self._witness_lists(d, ws)[0]

    def union_floor(self, parts, K: int) -> np.ndarray:
        """float64 [R]: the K-th largest of the union of the shards' ``witness_top``."""
        from dosa_ref.shards import union_floor

        return union_floor(parts, K)

    def scan(self, d, thr, cap, ws, again: bool = False):
        tau, kid = thr
        R = d["B"] * d["n"]
        rec, cnt = [], np.zeros(R, dtype=np.int64)
        for r in range(R):
            ids = np.arange(int(d["ke"][r]), dtype=np.int64)
            s = self._scores(d, r, ids)
            keep = (s > tau[r]) | ((s == tau[r]) & (ids <= kid[r]))
            cnt[r] = int(keep.sum())
            rec.append((s[keep][:cap], ids[keep][:cap]))  # the device keeps the first cap
        return rec, cnt

    def select(self, d, rec, cnt, want_kth, ws):
        R, K = d["B"] * d["n"], d["K"]
        ids = np.full((R, K), -1, dtype=np.int64)
        kth = np.full(R, -np.inf)
        for r, (s, i) in enumerate(rec):
            sel, sc = self.topk_of(s, i, K)
            ids[r, : sel.size] = sel
            if sel.size == K:
                kth[r] = sc[-1]
        return ids, kth

    def max_count(self, cnt):
        return int(cnt.max()) if cnt.size else 0

    def scored(self, d, ws):
        """None: the emulation scores every visible key (the screen changes no id)."""
        return None

    def thr_score(self, thr) -> np.ndarray:
        return np.asarray(thr[0], dtype=np.float64)

    def selected_records(self, d, ids, bufs=None):
        """``DeviceOps.selected_records``: per row, (scores, ids) of the distinct ids its
        request's rows selected that the row sees, and their count int64 [R]."""
        n = d["n"]
        req = np.asarray(ids).reshape(d["B"], -1)
        out, cnt = [], np.zeros(d["B"] * n, dtype=np.int64)
        for r in range(d["B"] * n):
            u = np.unique(req[r // n]).astype(np.int64)
            W = u[(u >= 0) & (u < d["ke"][r])]
            out.append((self._scores(d, r, W), W))
            cnt[r] = W.size
        return out, cnt

    def floor_of(self, thr) -> np.ndarray:
        """float64 [R]: τ of each threshold (−inf: a row with fewer than K witnesses)."""
        return np.asarray(thr[0], dtype=np.float64)

    def thr_of_floor(self, tau):
        """The threshold of every key whose score is at or above τ float64 [R]."""
        tau = np.asarray(tau, dtype=np.float64)
        return tau, np.full(tau.shape, np.iinfo(np.int64).max)

    @staticmethod
    def dedup_folds(ws) -> bool:
        return False

    def push(self, d, ws, ids, out=None) -> None:
        if ws.history > 0:
            ws.hist.append(np.asarray(ids).reshape(d["B"], -1).astype(np.int32))
        if out is not None:
            out[...] = np.asarray(ids).reshape(out.shape)


class NumpyWorkspace:
    """The numpy backend's state: the last ``history`` selections (int32 [B_t, n·K])."""

    def __init__(self, history: int):
        self.history = history
        self.hist: deque = deque(maxlen=max(history, 1))

    def witnesses(self, b: int) -> np.ndarray:
        rows = [e[b] for e in self.hist if 0 <= b < e.shape[0]]
        if not rows:
            return np.zeros(0, dtype=np.int64)
        a = np.concatenate(rows).astype(np.int64)
        return np.unique(a[a >= 0])

    def reset(self, b: int | None = None) -> None:
        if b is None:
            self.hist.clear()
            return
        for e in self.hist:
            if 0 <= b < e.shape[0]:
                e[b] = -1
