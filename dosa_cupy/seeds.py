"""The seed stage (docs/method.md §2): default seeds (sinks, local window, anchor pool) and
explicit seeds scored by the canonical scorer, τ = the K-th seed record, and the
certificate-guided seeds that raise τ after screening.

Default seeds (the "local" and "anchor" strategies, dosa_ref.options) are excluded from
screening and are part of the final selection.  Explicit seeds (``seed_ids=`` [Qn, S] key
ids, e.g. the previous chunk's selections) only raise τ:
they are scored by the ``seed_ids`` kernel and τ is the K-th record of default ∪ explicit
seeds (distinct keys only); they are screened and refined like any other key, so the final
candidate set is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dosa_ref.options import check_seed_ids as check_ref_seed_ids

from ._build import cupy_or_raise, device_const, kernel, tile
from .dense import _NULL, _select_rows, dense_ids, select_records
from .prepare import Batch, as_device
from .scorer import FP8_SPEC, FP8_TILE, QG, ROWB
from .select import NO_KTH_ID, RecordBuffer, tau_of_seeds

__all__ = [
    "Seeds",
    "anchor_pool",
    "anchor_stage",
    "anchor_queries",
    "apply_tau_floor",
    "cert_clear",
    "certificate_seeds",
    "check_seed_ids",
    "device_seed_ids",
    "device_tau_floor",
    "explicit_seed_table",
    "launch_fp8_ranges",
    "pool_capacity",
    "query_rows",
    "score_seed_ids",
    "seed_stage",
]

# The eager call's anchor pool at its capacity min(anchors · K, N), P on the device, as a
# captured step builds it: no synchronization in the seed stage (its pool is sized without
# reading P back): the pool's padding is gathered and its records' buffer is wider; the
# plans' sample keys are spaced over the first P ids by the device formula (plan_stage's
# pcount), the same keys up to the rounding of linspace (the H100's timings:
# docs/records/benchmarks.md "The synchronization builds switched on"); bench builds=sizedpool sizes
# the pool by reading P back.
POOL_CAPACITY = True

# The eager call's sinks and local window scored on a side stream while the anchor pool is
# built on the caller's stream (the anchors' logits, their selection and the pool are a chain
# of small launches that leave most SMs idle: docs/records/benchmarks.md "The synchronization
# builds switched on"), joined by an event before τ.  The records are appended by atomic
# counts, so their order within a query's list is the kernels' schedule either way, and every
# reader takes them as a set (the K-th record, the selection).  A captured step (anchors
# given) keeps one stream.  −0.2 to −0.4 ms per call on an H100 in two runs
# (docs/records/benchmarks.md "The fp32 guard and the seeds' side stream switched on"); bench
# builds=onestream scores them on the caller's stream.
SIDE_STREAM = True

SEED_WARPS = 8  # warps per block of seed_ids
SEEDW = 256  # seed slots per warp (seed_ids.cu SEEDW)


@dataclass
class Seeds:
    """The seed stage's output.

    anchors: int64 [n_anchors] (the anchor queries) or None, pool int32 [P] (sorted
    anchor-pool ids), poolmask uint32 [NW] (bit i = key i in the
    pool), default: the default seed records (``RecordBuffer`` [Qn, sinks + window + P]),
    xcnt uint32 [Qn] (explicit seed records), tau fp32 [Qn] (K-th record of default ∪
    explicit seeds), xtable int32 [Qn, S'] (the explicit seeds that were scored, or None),
    sinks, window: the default seeds' geometry; kth_id int32 [Qn]: the id j of the K-th
    record (τ, j) (``select.kth_ids``; the tie-aware screen, docs/method.md §7).
    """

    anchors: object
    pool: object
    poolmask: object
    default: RecordBuffer
    xcnt: object
    tau: object
    xtable: object
    sinks: int
    window: int
    kth_id: object = None
    # int64 0-d device array: P, the pool's ids, where the pool has its capacity (the rest is
    # padding); None where the pool's size is P — plan_stage's pcount either way
    pcount: object = None

    def default_args(self) -> tuple:
        """(sinks, window, poolmask): how the screen and the fused kernel recognize a default
        seed (the predicate of seed_score and ``explicit_seed_table``)."""
        return (np.int32(self.sinks), np.int32(self.window), self.poolmask)


def anchor_queries(Qn: int, n_anchors: int):
    """The anchor queries: int64 [≤ n_anchors] device array of evenly spaced query rows
    (distinct, sorted), or None when there are none (docs/method.md §2).  One array per
    (Qn, count, device), kept (``_build.device_const``): a call of a shape seen before copies
    nothing to the device (callers only read it)."""
    na = min(n_anchors, Qn)
    if na <= 0:
        return None
    return device_const(
        cupy_or_raise(), f"anchor_rows_{Qn}_{na}",
        lambda: np.unique(np.linspace(0, Qn - 1, na).round().astype(np.int64)),
    )  # fmt: skip


def anchor_stage(b: Batch, o: dict, anchors, cap: int | None) -> tuple:
    """``anchor_pool`` (pool, poolmask, offs) of the anchor rows ``anchors`` of ``b``
    (``anchor_queries``' array or None) at capacity ``cap`` (None: sized to its P ids)."""
    if anchors is not None:
        aid = anchor_ids(b.rows(anchors), o["anchor_segments"])
    else:
        aid = cupy_or_raise().zeros(0, dtype=np.int32)
    if cap is not None and min(int(aid.size), b.N) != cap:
        raise RuntimeError(f"anchor pool: capacity {cap} planned, {aid.size} anchor ids")
    return anchor_pool(aid, b.NW, cap)


def pool_capacity(b: Batch, o: dict, anchors) -> int:
    """The anchor pool's capacity min(anchors · S·K, N) for the anchor rows ``anchors``
    (``anchor_queries``' array or None): ``anchor_ids`` gives S·K ids per anchor row."""
    ids = 0 if anchors is None else int(anchors.size) * o["anchor_segments"] * b.K
    return min(ids, b.N)


def seed_stage(b: Batch, o: dict, anchors="rows", pooled: tuple | None = None) -> Seeds:
    """Seeds (docs/method.md §2) scored by the canonical scorer and τ = K-th seed record.

    Options ``o`` (resolved, ``options.resolve_options``): n_anchors (the anchor pool is the
    union of the exact Top-K of n_anchors evenly spaced queries, within each of
    anchor_segments segments of the keys), sinks, window, seed_ids
    (validated device ids or None, ``device_seed_ids``).  ``anchors``: "rows" (default:
    ``anchor_queries``) or the anchor rows given (``anchor_queries``'s array or None, as a
    captured step passes them: capture.py).  The pool has its capacity min(anchors · K, N)
    and P stays on the device (``Seeds.pcount``), so the stage issues kernels only — with
    the anchor rows given, or with ``POOL_CAPACITY`` (the default); otherwise the pool is
    sized to its P ids, read back (one synchronization).  ``pooled``: the anchor pool already
    built for these anchors at its capacity (``anchor_stage`` of the chunk whose rows ``b``
    holds — a captured step seeds its sampled rows first, the chunk after its route choice:
    capture.py), not built again.
    """
    cp = cupy_or_raise()
    Qn = b.Qn
    fixed = not isinstance(anchors, str)
    if not fixed:
        anchors = anchor_queries(Qn, o["n_anchors"])
    # the pool at its capacity min(anchors · S·K, N) — anchor_ids gives S·K ids per anchor
    # row, so it is known before the pool exists —, or None: sized to its P ids
    cap = None
    if fixed or POOL_CAPACITY:
        cap = pool_capacity(b, o, anchors)
    keys, width = (b.kp, b.ksc, None), o["sinks"] + o["window"]
    side = None
    if SIDE_STREAM and cap is not None and not fixed and anchors is not None:
        default = RecordBuffer(Qn, width + max(cap, 1))  # the pool's size at its capacity
        side = _local_seeds_aside(b, keys, o["sinks"], o["window"], default)
    if pooled is None:
        pooled = anchor_stage(b, o, anchors, cap)
    pool, poolmask, offs = pooled
    rg = seed_ranges(poolmask, offs, b.ks, b.ke, o["sinks"], o["window"])
    if side is None:
        default = RecordBuffer(Qn, max(width + int(pool.size), 1))
        # three tiled launches, one per kind of default seed: sinks, local window, anchor
        # pool (seeds.cu seed_score)
        score_seed_tiles(b, keys, (rg[0], rg[1]), o["sinks"], default)
        score_seed_tiles(b, keys, (rg[2], rg[3]), o["window"], default)
    # the pool's keys are gathered once for every query (with a capacity, its padding ids
    # are key 0: gathered, never in a query's range [rg4, rg5))
    if pool.size:
        score_seed_tiles(b, (b.kp[pool], b.ksc[pool], pool), (rg[4], rg[5]), pool.size, default)
    # Explicit seeds (docs/method.md §2): distinct visible ids that are not default seeds, so
    # the union below has no key twice (a repeated key could lift τ above τ_K(Ω)).
    xcnt = cp.zeros(Qn, dtype=cp.uint32)
    xrec = xtable = None
    if o["seed_ids"] is not None:
        table = explicit_seed_table(
            o["seed_ids"], b.ks, b.ke, o["sinks"], o["window"], poolmask, cp
        )
        xrec, xcnt = score_seed_ids(b, table)
        if xrec is not None:
            xtable = table  # the certificate seeds are deduplicated against these
    if side is not None:
        cp.cuda.get_current_stream().wait_event(side)  # the sinks' and window's records
    tau, kid = tau_of_seeds(b.K, default, xrec, xcnt, want_id=True)
    return Seeds(anchors, pool, poolmask, default, xcnt, tau, xtable, o["sinks"], o["window"],
                 kid, None if cap is None else offs[-1])  # fmt: skip


_SIDE: dict = {}  # device id → the seed stage's side stream


def _side_stream(cp):
    """The current device's side stream of the seed stage (non-blocking, kept)."""
    dev = cp.cuda.Device().id
    if dev not in _SIDE:
        _SIDE[dev] = cp.cuda.Stream(non_blocking=True)
    return _SIDE[dev]


def _local_seeds_aside(b: Batch, keys: tuple, sinks: int, window: int, out: RecordBuffer):
    """``SIDE_STREAM``: the sinks and the local window of every query of ``b`` scored into
    ``out`` on the side stream after the work queued so far on the current stream (``out``
    zeroed there); returns the event the caller's stream waits on before reading ``out``."""
    cp = cupy_or_raise()
    fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
    fork.record()
    side = _side_stream(cp)
    side.wait_event(fork)
    with side:
        rg = cp.empty((4, b.Qn), dtype=cp.int32)
        if b.Qn:
            args = (b.ks, b.ke, np.int32(sinks), np.int32(window), np.int32(b.Qn), rg)
            kernel("local_ranges")((-(-b.Qn // 256),), (256,), args)
        score_seed_tiles(b, keys, (rg[0], rg[1]), sinks, out)
        score_seed_tiles(b, keys, (rg[2], rg[3]), window, out)
        join.record(side)
    return join


def anchor_pool(aid, NW: int, cap: int | None = None):
    """The anchor pool of the anchors' Top-K ids ``aid`` int32 (any shape, −1 padding) over
    keys [0, 32·NW): (pool int32 [P], the sorted distinct ids; poolmask uint32 [NW], bit i
    = key i in the pool; offs int64 [NW + 1], offs[w] = pool ids below key 32·w).  Kernels
    pool_mark, pool_count, pool_ids (csrc/seeds.cu: a bitmask and prefix counts instead of
    a sort); reference ``dosa_ref.stages.pool_ids``.  Reads P back (one synchronization)
    unless ``cap`` ≥ P is given (e.g. aid.size, or N): then pool is int32 [max(cap, 1)],
    its P ids first, zeros after, and P = offs[-1] stays on the device."""
    cp = cupy_or_raise()
    poolmask = cp.zeros(NW, dtype=cp.uint32)
    n = int(aid.size)
    if n:
        args = (aid, np.int64(n), np.int64(NW), poolmask)
        kernel("pool_mark")((min(-(-n // 256), 1024),), (256,), args)
    cnt = cp.zeros(NW + 1, dtype=cp.int64)
    g = (max(1, -(-NW // 256)),)
    kernel("pool_count")(g, (256,), (poolmask, np.int64(NW), cnt))
    offs = cp.cumsum(cnt)
    if cap is None:
        pool = cp.empty(int(offs[-1]), dtype=cp.int32)
    else:  # P ≤ cap: distinct ids of aid, and ids < 32·NW
        pool = cp.zeros(max(int(cap), 1), dtype=cp.int32)
    if pool.size:
        kernel("pool_ids")(g, (256,), (poolmask, offs, np.int64(NW), pool))
    return pool, poolmask, offs


def seed_ranges(poolmask, offs, ks, ke, sinks: int, window: int):
    """The default seeds of each query as three index ranges, int32 [6, Qn]: the sinks
    [rg0, rg1) and the local window [rg2, rg3) of the key array, and [rg4, rg5) of the
    anchor pool's indices — its ids that are visible and neither sinks nor local seeds
    (kernel seed_ranges; reference ``dosa_ref.stages.seed_ranges``).  ``poolmask``,
    ``offs``: ``anchor_pool``'s; ks, ke int32 [Qn]."""
    cp = cupy_or_raise()
    Qn = int(ks.shape[0])
    rg = cp.empty((6, Qn), dtype=cp.int32)
    if Qn:
        NW = np.int64(poolmask.shape[0])
        args = (poolmask, offs, NW, ks, ke, np.int32(sinks), np.int32(window), np.int32(Qn), rg)
        kernel("seed_ranges")((-(-Qn // 256),), (256,), args)
    return rg


ANCHOR_LOGITS = 1 << 27  # the largest anchors × keys whose logits anchor_ids holds (512 MiB)


def anchor_ids(ab: Batch, segments: int = 1):
    """The Top-K ids int32 [n, S·K] of the anchor rows ``ab`` within each of the S =
    ``segments`` segments of the keys (``dosa_ref.seeds.anchor_segments_of``; the anchor
    pool's source, docs/method.md §2): the dense route's — for the FP8 scorer its logits by
    ``anchor_logits`` (64-key tiles of every anchor on the whole GPU) instead of the dense
    kernel, which runs one block per 8–16 queries, so a handful of anchors would scan the
    keys on one SM (~23 ms at 1M keys); then the dense route's selection (``select_rows``,
    which takes the wide selection, many blocks per row, for a few long rows), over the
    segments as rows (``segment_select``).  The same logits' bits and the same selection:
    the dense route's ids.  Any real keys are valid seeds; these are the exact Top-K all the
    same."""
    small = ab.Qn * ab.N <= ANCHOR_LOGITS
    if segments == 1 and (ab.scorer != "fp8" or not small):
        return dense_ids(ab)
    if ab.scorer == "fp8" and small:
        lg = anchor_logits(ab)
    else:
        from .scorer import dense_logits_raw

        lg = dense_logits_raw(ab.q, ab.w, ab.kp, ab.ksc, ab.ks, ab.ke, ab.scorer)
    if segments == 1:
        return _select_rows(lg, ab.K, ab.ks, ab.ke)
    return segment_select(lg, ab.K, ab.ks, ab.ke, segments, _select_rows, cupy_or_raise())


def segment_select(lg, K: int, ks, ke, segments: int, select, xp):
    """Per row of the logits fp32 [n, N] (−inf where not visible), the Top-K ids within
    each of the ``segments`` segments of the keys (``anchor_segments_of``: ⌈N / S⌉ keys
    each): the rows' logits padded to S·⌈N / S⌉ columns (−inf) and viewed as [n·S, ⌈N/S⌉]
    rows, each with its part of the row's range [ks, ke), selected by ``select(rows, K, ks,
    ke)`` (int32 ids [n·S, K], −1 padding) → int32 [n, S·K] key ids, −1 padding.  xp: numpy
    or CuPy."""
    n, N = (int(x) for x in lg.shape)
    S = int(segments)
    L = -(-N // S)
    if S * L == N:  # the segments tile the rows: a view, no copy
        pad = xp.ascontiguousarray(lg)
    else:
        pad = xp.full((n, S * L), -np.inf, dtype=xp.float32)
        pad[:, :N] = lg
    base = (xp.arange(S, dtype=xp.int64) * L)[None, :]
    lo = xp.clip(xp.asarray(ks, dtype=xp.int64)[:, None] - base, 0, L)
    hi = xp.maximum(xp.clip(xp.asarray(ke, dtype=xp.int64)[:, None] - base, 0, L), lo)
    ids = select(pad.reshape(n * S, L), K, lo.reshape(-1).astype(xp.int32),
                 hi.reshape(-1).astype(xp.int32))  # fmt: skip
    ids = xp.asarray(ids).reshape(n, S, K).astype(xp.int64)
    out = xp.where(ids >= 0, ids + base[:, :, None], -1)
    return out.reshape(n, S * K).astype(xp.int32)


def anchor_logits(ab: Batch):
    """fp32 [n, N]: the FP8 dense logits of the rows ``ab`` (−inf where a key is not
    visible) by score_fp8.cu seed_logits (launch_fp8_ranges: the grid and launches)."""
    cp = cupy_or_raise()
    n, N = ab.Qn, ab.N
    out = cp.full((n, N), -np.inf, dtype=cp.float32)
    if n == 0 or N == 0:
        return out
    launch_fp8_ranges(
        kernel(f"seed_logits_fp8_h{16 * ab.mth}", 0, FP8_SPEC), n, 16 * ab.mth, N,
        lambda a, z: (ab.q[a:z], ab.w[a:z], ab.kp, ab.ksc, np.int64(N), ab.ks[a:z], ab.ke[a:z],
                      np.int32(z - a), out[a:z]),
    )  # fmt: skip
    return out


FP8_TILES = 64  # seed_ids_fp8's blocks per query (each loops over its FP8_TILE-id tiles)
GRID_Y = 65535  # the largest grid y (CUDA): the FP8 seed kernels' query groups per launch


def query_rows(Qn: int, per_row: int = 1):
    """(first, end) query rows of the launches of a kernel with ``per_row`` queries per grid
    row (at most GRID_Y rows a launch)."""
    step = GRID_Y * per_row
    return [(a, min(Qn, a + step)) for a in range(0, Qn, step)]


FP8_LAUNCH_BLOCKS = 8192  # about the blocks of one launch of score_fp8.cu's range kernels


def launch_fp8_ranges(f, Qn: int, H: int, keys: int, args) -> None:
    """Launch ``f``, one of score_fp8.cu's range kernels (seed_logits, seed_score, fused), for
    ``Qn`` queries of ``H`` (padded) heads whose query groups each span at most ``keys``
    keys: grid (gx, ⌈Qn / qb⌉), qb = 128 / H queries per block row sharing each FP8_TILE-key
    tile, gx blocks per query group over the tiles of its span, sized so that a launch has
    about FP8_LAUNCH_BLOCKS blocks (each block then streams several tiles through its key
    ring), at most one block per tile; at most GRID_Y block rows a launch.  ``args(a, z)``:
    the kernel's arguments for the query rows [a, z)."""
    qb = 128 // H
    tiles = -(-keys // FP8_TILE)
    gx = max(1, min(tiles, -(-FP8_LAUNCH_BLOCKS // -(-Qn // qb))))
    for a, z in query_rows(Qn, qb):
        f((gx, -(-(z - a) // qb)), (128,), args(a, z))


def score_seed_tiles(b: Batch, keys: tuple, rg: tuple, width: int, out: RecordBuffer) -> None:
    """Append to ``out`` the records of keys [lo[t], hi[t]) (``rg`` = (lo, hi) int32 [Qn])
    of the key array ``keys`` = (payload uint8 [n, 128], scale fp32 [n], idmap int32 [n] or
    None) for every query t of ``b``; a record's id is idmap[i], or i without an idmap
    (kernel seed_score_mt*: key tiles shared by QG queries; the canonical scorer's scores).
    ``width`` ≥ every range's length sizes the grid: QG consecutive causal queries span
    at most width + QG − 1 keys; wider spans are still covered (the kernel loops)."""
    kp, ksc, idmap = keys
    lo, hi = rg
    n = int(kp.shape[0])
    if n == 0 or b.Qn == 0:
        return
    if b.scorer == "fp8":  # score_fp8.cu: a query group of qb = 128 / H spans at most
        # width + qb − 1 keys
        H = 16 * b.mth
        launch_fp8_ranges(
            kernel(f"seed_score_fp8_h{H}", 0, FP8_SPEC), b.Qn, H, min(n, int(width) + 128 // H - 1),
            lambda a, z: (b.q[a:z], b.w[a:z], kp, ksc, np.int64(n), lo[a:z], hi[a:z],
                          _NULL if idmap is None else idmap, np.int32(z - a), out.cnt[a:z],
                          out.rec[a:z], np.int64(out.cap)),
        )  # fmt: skip
        return
    T = tile()
    gx = max(1, -(-min(n, int(width) + QG) // T))
    smem = T * ROWB + T * 4
    kernel(f"seed_score_mt{b.mth}", smem)(
        (gx, -(-b.Qn // QG)),
        (256,),
        (b.q, b.w, kp, ksc, np.int64(n), lo, hi, _NULL if idmap is None else idmap,
         np.int32(b.Qn), np.int32(QG)) + out.args(),
        shared_mem=smem,
    )  # fmt: skip


def score_seed_ids(b: Batch, table):
    """Records of explicit / certificate seeds ``table`` int32 [Qn, S] (distinct, not default
    seeds, −1 padding) by the canonical scorer (``seed_ids`` kernel): (rec uint64 [Qn, S] or
    None when S = 0, count uint32 [Qn])."""
    cp = cupy_or_raise()
    S = int(table.shape[1])
    if S == 0:
        return None, cp.zeros(b.Qn, dtype=cp.uint32)
    table = cp.ascontiguousarray(table)
    out = RecordBuffer(b.Qn, S)
    if b.scorer == "fp8":  # score_fp8.cu: one query per block row, 64-id tiles
        gx = max(1, min(-(-S // FP8_TILE), FP8_TILES))
        f = kernel(f"seed_ids_fp8_h{16 * b.mth}", 0, FP8_SPEC)
        for a, z in query_rows(b.Qn):
            f((gx, z - a), (128,),
              (b.q[a:z], b.w[a:z], b.kp, b.ksc, b.ks[a:z], b.ke[a:z], table[a:z], np.int64(S),
               out.cnt[a:z], out.rec[a:z]))  # fmt: skip
        return out.rec, out.cnt
    gx = (S + SEED_WARPS * SEEDW - 1) // (SEED_WARPS * SEEDW)
    kernel(f"seed_ids_mt{b.mth}")(
        (gx, b.Qn),
        (32 * SEED_WARPS,),
        (b.q, b.w, b.kp, b.ksc, b.ks, b.ke, table, np.int64(S), out.cnt, out.rec),
    )
    return out.rec, out.cnt


def cert_clear(cert: RecordBuffer, tau, surv) -> None:
    """Clear the bitmask bit of every recorded survivor with U < τ (kernel
    ``cert_clear_below_tau``; reference ``dosa_ref.stages.cert_clear_below_tau``).
    cert: the (U, id) records of ``screen_cert_mt*``; tau fp32 [Qn]; surv uint32 [Qn, NW]."""
    Qn, NW = surv.shape
    gx = max(1, min(64, (cert.cap + 255) // 256))
    kernel("cert_clear_below_tau")(
        (gx, min(Qn, 65535)),
        (256,),
        (cert.rec, cert.cnt, np.int64(cert.cap), tau, np.int32(Qn), np.int64(NW), surv),
    )


def certificate_seeds(b: Batch, seeds: Seeds, cert: RecordBuffer, m: int, surv):
    """Certificate-guided seeds on the GPU (docs/method.md §2; dosa_ref.select's "certificate"
    strategy): score the ``m`` survivors of largest U exactly (their (U, id) records
    ``cert``, written by ``screen_cert_mt*``), τ' = K-th record of default ∪ explicit ∪
    these seeds (≥ τ: a superset), then clear the survivor bit of every recorded key with
    U < τ' (``cert_clear``, in place on surv uint32 [Qn, NW]).  Returns (τ' fp32 [Qn],
    the keys scored uint32 [Qn]: explicit ∪ certificate seeds, distinct).

    Exactness: the certificate seeds are survivors, hence visible, not default seeds, and
    distinct (one bitmask bit each); together with explicit seeds they are deduplicated by
    ``explicit_seed_table``, so no key is counted twice in τ'.  A cleared key has
    s ≤ U < τ' ≤ τ_K(Ω).  The seeds are not added to the final candidate set: like explicit
    seeds they only raise τ; a seed with s ≥ τ' has U ≥ τ', keeps its bit, and refinement
    re-scores it into the compact records.  Survivors whose record did not fit
    (count > cap) keep their bit.
    """
    cp = cupy_or_raise()
    cid, _ = select_records(m, cert.rec, cert.cnt)  # largest (U, id) first, −1 padding
    table = cid
    if seeds.xtable is not None:
        both = cp.concatenate([seeds.xtable, cid], axis=1)
        table = explicit_seed_table(both, b.ks, b.ke, seeds.sinks, seeds.window, seeds.poolmask,
                                    cp)  # fmt: skip
    xrec, xcnt = score_seed_ids(b, table)
    tau1 = tau_of_seeds(b.K, seeds.default, xrec, xcnt)
    cert_clear(cert, tau1, surv)
    return tau1, xcnt


def check_seed_ids(seeds, Qn: int, N: int, xp=np):
    """Explicit seed ids validated as the reference validates them
    (``dosa_ref.options.check_seed_ids``) → int32 [Qn, S] (xp array), −1 = padding.
    ``seeds``: an integer xp array [Qn, S] (``dosa_topk`` first converts CuPy, DLPack or
    numpy input with ``as_device``); ids outside a query's visible range are legal (they are
    ignored later)."""
    return check_ref_seed_ids(seeds, Qn, N, xp).astype(xp.int32)


def explicit_seed_table(seeds, ks, ke, sinks: int, window: int, poolmask, xp=np):
    """Explicit seeds that can add to τ: int32 [Qn, S'] (xp array), each row sorted,
    distinct, −1 padded at the end; S' = the largest row count (0 columns when none).

    Keeps id i of row t iff ks[t] ≤ i < ke[t] (visible) and i is not a default seed of
    query t — a sink (i < ks + min(sinks, ke − ks)), in the local window (i ≥ max(that,
    ke − window)), or in the anchor pool (bit i of ``poolmask`` uint32 [ceil(N/32)]) — the
    same predicate as the screen's and seed_score's; repeats are dropped.  Every key then
    appears at most once in default ∪ explicit seeds, as τ_K(S) ≤ τ_K(Ω) requires
    (docs/method.md §2).  seeds: validated ids [Qn, S] (``check_seed_ids``); ks, ke: int [Qn].
    """
    Qn = seeds.shape[0]
    a = seeds.astype(xp.int64)
    lo = ks.astype(xp.int64)[:, None]
    hi = ke.astype(xp.int64)[:, None]
    s_hi = lo + xp.minimum(int(sinks), hi - lo)
    loc_lo = xp.maximum(s_hi, hi - int(window))
    safe = xp.where((a >= 0) & (a < 32 * poolmask.shape[0]), a, 0)
    inpool = ((poolmask[safe >> 5].astype(xp.int64) >> (safe & 31)) & 1) != 0
    visible = (a >= lo) & (a < hi)
    default = (a < s_hi) | (a >= loc_lo) | inpool
    keep = visible & ~default
    big = np.iinfo(np.int64).max
    s = xp.sort(xp.where(keep, a, big), axis=1)
    dup = xp.zeros(s.shape, dtype=bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s = xp.sort(xp.where(dup, big, s), axis=1)  # distinct ids first, then padding
    width = int((s != big).sum(axis=1).max()) if Qn and s.shape[1] else 0
    s = s[:, :width]
    return xp.where(s == big, -1, s).astype(xp.int32)


def device_tau_floor(tau_floor, Qn: int):
    """``tau_floor`` option (float [Qn]: a lower bound per query on the K-th score of a
    context that holds these keys — another shard's τ, docs/method.md §12 "Sharded
    contexts") → CuPy fp32 [Qn] rounded down (a float64 floor is rounded to the fp32 at or
    below it, so it stays a lower bound), or None.  ValueError naming ``tau_floor`` for
    another shape, a non-float dtype, NaN or +inf (one synchronization)."""
    if tau_floor is None:
        return None
    cp = cupy_or_raise()
    x = as_device(tau_floor, "tau_floor")
    if x.shape != (Qn,) or x.dtype.kind != "f":
        raise ValueError(f"tau_floor: expected a float array [Qn={Qn}], got {x.dtype} {x.shape}")
    if Qn and bool(cp.any(cp.isnan(x) | (x == cp.inf))):
        raise ValueError("tau_floor: expected no NaN and no +inf")
    f = x.astype(cp.float32)
    if x.dtype != cp.float32:  # round down: the fp32 at or below each value
        f = cp.where(f.astype(x.dtype) > x, cp.nextafter(f, cp.float32(-cp.inf)), f)
    return cp.ascontiguousarray(f)


def apply_tau_floor(seeds: Seeds, floor) -> Seeds:
    """``seeds`` with τ raised to ``floor`` (fp32 [Qn] or None) where the floor is above it:
    there the K-th seed record (τ, j) no longer bounds the context's K-th score from below
    with its id, so the tie-aware rule falls back to the plain one (kth_id = NO_KTH_ID: only
    U < τ rejects; the plateau bound compares min(U, 0) with the floor, a lower bound on the
    K-th score all the same) — dosa_ref's "the plain rule U < floor" (docs/method.md §12)."""
    if floor is None:
        return seeds
    cp = cupy_or_raise()
    above = floor > seeds.tau
    kth = seeds.kth_id
    if kth is not None:
        kth = cp.where(above, cp.int32(NO_KTH_ID), kth).astype(cp.int32)
    return replace(seeds, tau=cp.maximum(seeds.tau, floor), kth_id=kth)


def device_seed_ids(seed_ids, Qn: int, N: int):
    """``seed_ids`` option → validated CuPy int32 [Qn, S] (or None)."""
    if seed_ids is None:
        return None
    cp = cupy_or_raise()
    return check_seed_ids(as_device(seed_ids, "seed_ids"), Qn, N, cp)
