"""The record stages on the native FP8 scorer (csrc/score_fp8.cu: refine_fp8_h{H},
seed_score_fp8_h{H}, seed_ids_fp8_h{H}; docs/error_model.md "A native FP8 scorer",
docs/method.md §9 "Compact writeback and selection"): every record a kernel writes carries
the dense FP8 logits' bits of its (query, key) — csrc/dense_fp8.cu with every key visible —
and the records of a query are exactly the expected set: compared as uint64 records
(``code(s) << 32 | ~id``) and as score bits, never with a tolerance.  The counter counts
every qualifying record; with a small capacity the count is still exact and the records
written are that many of the expected ones.  Needs a compute-capability-9.0 GPU (sm_90a)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gpu_support import cp, gpu, needs_sm90a

RWF = 2048  # bitmask words per refine_fp8 block (score_fp8.cu RWF)
RCAP = 2048  # survivor ids per refine_fp8 window (score_fp8.cu RCAP)
# (N, Qn): N not a multiple of 64; 140001: three RWF blocks; both: rows of more than RCAP
# survivors in a block (two windows and more); 65536: the last word whole (N % 32 = 0)
SHAPES = [(3000, 9), (140001, 7), (65536, 6)]
# the refine kernels: name → (words per block, ids per window, threads, dynamic shared memory
# of H)
REFINES = {
    "refine_fp8": (RWF, RCAP, 128, lambda H: 0),
}


def _kernel(name: str, smem: int = 0):
    from dosa_cupy._build import KernelSpec, kernel

    return kernel(name, smem, KernelSpec("score_fp8.cu", (), sm90a=True))


def _ranges(N: int, Qn: int):
    """Visible ranges int32 [Qn]: ranges that start and end inside a bitmask word (and in
    different RWF blocks for a large N), an empty one, the whole key array, a short one."""
    rng = np.random.default_rng(N)
    ks = np.sort(rng.integers(0, N // 2, Qn)).astype(np.int32)
    ke = rng.integers(N // 2, N + 1, Qn).astype(np.int32)
    ks[0], ke[0] = 5, N - 3  # mid-word at both ends
    ks[1], ke[1] = 1024, 1024  # empty (no visible word either)
    ks[2], ke[2] = 0, N  # every key
    ks[3], ke[3] = 37, 101  # inside one tile, mid-word
    return ks, ke


@functools.cache
def _case(H: int, N: int, Qn: int):
    """(workload on the device, its ranges replaced by _ranges, and every key's dense FP8
    logit lg fp32 [Qn, N] on the host: the dense kernel run with every key visible)."""
    from dosa_cupy.bench import fp8_dense
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload("calibrated", Qn, N, H, seed=21 + H)
    ks, ke = _ranges(N, Qn)
    wl["ks"], wl["ke"] = cp.asarray(ks), cp.asarray(ke)
    full = dict(q=wl["q"], w=wl["w"], k_payload=wl["k_payload"], k_scale=wl["k_scale"],
                ks=cp.zeros(Qn, dtype=cp.int32), ke=cp.full(Qn, N, dtype=cp.int32))  # fmt: skip
    lg = cp.asnumpy(fp8_dense.fp8_logits(full, fp8_dense.BEST[H]))
    assert not np.isinf(lg).any()  # every key visible
    return wl, ks, ke, lg


def _records(scores, ids) -> np.ndarray:
    """Sorted uint64 records code(s) << 32 | ~id of fp32 scores and int ids (record.cuh
    make_record)."""
    from dosa_cupy.emulate import score_code

    code = score_code(np.asarray(scores, dtype=np.float32)).astype(np.uint64)
    low = (~np.asarray(ids).astype(np.uint32)).astype(np.uint64)
    return np.sort((code << np.uint64(32)) | low)


def _record_ids(rec) -> np.ndarray:
    return (~(np.asarray(rec, dtype=np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32)).astype(
        np.int64
    )


def _check_row(got, count: int, cap: int, want: np.ndarray, lg_row, label):
    """A query's records: the exact count, and with room for all of them exactly ``want``
    (else that many distinct records of ``want``); every record's score has the bits of the
    logit at its id (``lg_row``: a key id → the logit; −0 is recorded as +0)."""
    assert count == want.size, (label, count, want.size)
    kept = np.sort(got[: min(count, cap)])
    if count <= cap:
        assert np.array_equal(kept, want), label
    else:
        assert np.unique(kept).size == cap and np.isin(kept, want).all(), label
    if kept.size:
        from dosa_cupy.emulate import record_score

        s = record_score(kept)
        exp = lg_row(_record_ids(kept)) + np.float32(0)  # −0 → +0, as score_code folds it
        assert np.array_equal(s.view(np.uint32), exp.view(np.uint32)), label


def _buffer(Qn: int, cap: int):
    from dosa_cupy.select import RecordBuffer

    return RecordBuffer(Qn, cap)


# ---------------------------------------------------------------------------------------
# Refinement
# ---------------------------------------------------------------------------------------


def _bitmasks(N: int, Qn: int, rng) -> np.ndarray:
    """uint32 [Qn, NW] survivor rows: sparse and dense densities, an all-zero row, a full row
    (bits past N set too: the kernel has no key there and must ignore them), bits outside
    the visible words everywhere (ignored: the kernel reads the visible words only)."""
    NW = (N + 31) // 32
    dens = rng.choice([0.01, 0.03, 0.3, 0.7], Qn)
    bits = rng.random((Qn, 32 * NW)) < dens[:, None]
    bits[4] = False  # no survivor at all
    bits[2] = True  # every key (and the bits past N)
    packed = np.packbits(bits, axis=-1, bitorder="little")  # bit b of byte j: key 8j + b
    return np.ascontiguousarray(packed).view("<u4").astype(np.uint32)


def _bit(surv, t: int, ids) -> np.ndarray:
    return ((surv[t, ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def _refine_expected(surv, t, ks, ke, N, lg, tau) -> np.ndarray:
    NW = surv.shape[1]
    wlo, whi = int(ks[t]) >> 5, min(NW, (int(ke[t]) + 31) >> 5)
    ids = np.arange(32 * wlo, min(32 * max(whi, wlo), N))
    ids = ids[_bit(surv, t, ids)]
    ids = ids[lg[t, ids] >= tau[t]]
    return _records(lg[t, ids], ids)


@gpu
@needs_sm90a
@pytest.mark.parametrize("kname", list(REFINES))
@pytest.mark.parametrize("H", [64, 32])
@pytest.mark.parametrize("N,Qn", SHAPES)
def test_refine_fp8_records_equal_the_dense_logits_at_the_survivors(H, N, Qn, kname):
    """refine_fp8_h{H}: for the queries of a scrambled subset list, the records are exactly
    {(logit, i): bit i set in a visible word, i < N, logit ≥ τ} with the dense logits' bits
    (τ: a logit of the row, so s = τ is kept; −inf for one row); count[t] is their number,
    the queries off the list get none; with a small capacity the count stays exact and the
    records written are that many of them."""
    wl, ks, ke, lg = _case(H, N, Qn)
    rng = np.random.default_rng(5 + H)
    surv = _bitmasks(N, Qn, rng)
    tau = np.array([np.quantile(lg[t, ks[t] : max(ke[t], ks[t] + 1)], 0.8, method="lower")
                    for t in range(Qn)], dtype=np.float32)  # fmt: skip
    tau[0] = tau[2] = -np.inf  # every survivor recorded: row 2's span several windows
    qlist = rng.permutation(np.delete(np.arange(Qn), 5)).astype(np.int32)  # query 5 left out
    want = {t: _refine_expected(surv, t, ks, ke, N, lg, tau) for t in range(Qn)}
    NW = surv.shape[1]
    words, window, threads, smem = REFINES[kname]
    f = _kernel(f"{kname}_h{H}", smem(H))
    for cap in (max(w.size for w in want.values()) + 3, 5):
        out = _buffer(Qn, cap)
        args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], cp.asarray(tau), wl["ks"],
                wl["ke"], cp.asarray(qlist), np.int64(N), cp.asarray(surv))  # fmt: skip
        f((qlist.size, -(-NW // words)), (threads,), args + out.args(), shared_mem=smem(H))
        cnt, rec = cp.asnumpy(out.cnt), cp.asnumpy(out.rec)
        for t in range(Qn):
            if t not in qlist:
                assert cnt[t] == 0, t
                continue
            _check_row(rec[t], int(cnt[t]), cap, want[t], lambda i, t=t: lg[t, i], (cap, t))
    assert sum(w.size > 5 for w in want.values()) >= 3  # the small capacity overflows rows
    # query 2 (every key visible and surviving, all recorded) has more survivors in its first
    # block than one window holds — its ids are scored in two windows or more
    assert _bit(surv, 2, np.arange(N)).all()
    assert min(N, 32 * words) > window


# ---------------------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------------------


def _seed_score(H: int, wl, keys, lo, hi, gx: int):
    """seed_score_fp8_h{H} on the key array ``keys`` = (payload, scale, idmap or None) for the
    ranges lo, hi (int32 [Qn]), grid (gx, ⌈Qn / QB⌉) with QB = 128 / H queries per block
    (score_fp8.cu seed_score; seeds.score_seed_tiles): (cap, count, records) on the host."""
    from dosa_cupy.dense import _NULL

    kp, ksc, idmap = keys
    Qn = lo.size
    cap = max(int((np.minimum(hi, kp.shape[0]) - np.maximum(lo, 0)).max()), 1)
    out = _buffer(Qn, cap)
    args = (wl["q"], wl["w"], kp, ksc, np.int64(kp.shape[0]), cp.asarray(lo), cp.asarray(hi),
            _NULL if idmap is None else idmap, np.int32(Qn))  # fmt: skip
    _kernel(f"seed_score_fp8_h{H}")((gx, -(-Qn // (128 // H))), (128,), args + out.args())
    return cap, cp.asnumpy(out.cnt), cp.asnumpy(out.rec)


def _check_seed_rows(lo, hi, pool, cap, cnt, rec, lg):
    """Every query's records are those of the keys pool[i], i ∈ [lo, hi) ∩ [0, pool.size)."""
    for t in range(lo.size):
        ids = pool[max(int(lo[t]), 0) : max(min(int(hi[t]), pool.size), 0)]
        want = _records(lg[t, ids], ids)
        _check_row(rec[t], int(cnt[t]), cap, want, lambda i, t=t: lg[t, i], t)


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
@pytest.mark.parametrize("N,Qn", SHAPES)
@pytest.mark.parametrize("mapped", [False, True], ids=["keys", "idmap"])
@pytest.mark.parametrize("gx", [3, 1])
def test_seed_score_fp8_records_every_key_of_the_ranges(H, N, Qn, mapped, gx):
    """seed_score_fp8_h{H}: the keys i of [lo[t], hi[t]) of a key array — the workload's
    keys, or (idmap) a scrambled subset of them gathered as the anchor pool is, a record's
    id idmap[i] — each recorded once with the dense logit's bits of its key id, no
    threshold; fewer blocks than tiles (the stride loop; gx = 1: every tile of a query
    group through one block's key ring), empty and mid-tile ranges, unrelated ranges in one
    query group (tiles between them skipped)."""
    wl, _, _, lg = _case(H, N, Qn)
    rng = np.random.default_rng(7 + H)
    if mapped:
        pool = rng.permutation(N)[: N // 3].astype(np.int32)
        pi = cp.asarray(pool)
        kp, ksc, idmap = wl["k_payload"][pi], wl["k_scale"][pi], pi
    else:
        pool = np.arange(N, dtype=np.int32)
        kp, ksc, idmap = wl["k_payload"], wl["k_scale"], None
    n = pool.size
    lo = rng.integers(0, n // 2, Qn).astype(np.int32)
    hi = np.minimum(lo + rng.integers(0, 2000, Qn), n).astype(np.int32)
    lo[0], hi[0] = 0, n  # the whole array
    lo[1], hi[1] = 70, 70  # empty
    lo[2], hi[2] = n - 3, n  # the array's last keys
    lo[3], hi[3] = 63, 129  # across a tile border
    cap, cnt, rec = _seed_score(H, wl, (kp, ksc, idmap), lo, hi, gx)
    _check_seed_rows(lo, hi, pool, cap, cnt, rec, lg)


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
@pytest.mark.parametrize("gx", [1, 2, 64])
def test_seed_score_fp8_query_groups_share_key_tiles(H, gx):
    """seed_score_fp8_h{H} on the ranges the seed stage gives consecutive causal queries —
    local windows [e − W, e) whose end grows by one per query (W not a multiple of 64), so
    the QB = 128 / H queries of a block share nearly every key tile — and at the borders of
    a query group: a window clipped at key 0 and one past n (lo < 0, hi > n), an empty range
    first in its group (the group's tiles meet query 0 nowhere), an empty one inside a group,
    a query whose range lies far from its group mates' (the tiles between skipped), a group
    of one query at the end (Qn = 9: the last group is partial at H = 64 and 32), and a
    window that starts exactly at a tile border of its group's span.  Each query gets
    exactly its keys' records with the dense logits' bits (each key scored against each
    query on its own B tile: the bits of one query)."""
    N, Qn = 3000, 9
    wl, _, _, lg = _case(H, N, Qn)
    # groups: H = 32 {0–3} {4–7} {8}; H = 64 {0, 1} {2, 3} {4, 5} {6, 7} {8}
    lo = np.array([0, 151, -40, 152, 2690, 64, 2704, 2384, 1700], dtype=np.int32)
    hi = np.array([0, 451, 452, 152, 2990, 700, 3004, 3005, 1764], dtype=np.int32)
    # 0: empty, first of its group; 1, 2: windows of 300 ending at 451, 452 (2 clipped at 0);
    # 3: empty, inside its group; 4: window [2690, 2990); 5: far from 4 (and 6, 7), its group's
    # span starts with it; 6, 7: past n (clipped at 3000), 6 starts five tiles after 7 (the
    # span's start at H = 64); 8: a last group of one query and one tile
    pool = np.arange(N, dtype=np.int32)
    keys = (wl["k_payload"], wl["k_scale"], None)
    cap, cnt, rec = _seed_score(H, wl, keys, lo, hi, gx)
    _check_seed_rows(lo, hi, pool, cap, cnt, rec, lg)
    assert cnt[0] == 0 and cnt[3] == 0 and cnt[2] == 452 and cnt[7] == 3000 - 2384


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
@pytest.mark.parametrize("N,Qn", SHAPES)
@pytest.mark.parametrize("gx", [2, 1])
def test_seed_ids_fp8_records_the_visible_ids_of_the_table(H, N, Qn, gx):
    """seed_ids_fp8_h{H}: the entries ks[t] ≤ id < ke[t] of a table with −1 padding at the
    row ends, ids out of the range (below ks, at ke, past N) and at its borders (ks, ke − 1),
    a tile of padding inside a row (gx = 1: between two tiles of keys in one block's key
    ring, not scored; gx = 2: a block of padding only) and a row of padding only: each
    visible id recorded once with the dense logit's bits, no threshold, count[t] = their
    number."""
    wl, ks, ke, lg = _case(H, N, Qn)
    rng = np.random.default_rng(9 + H)
    S = 150
    table = np.full((Qn, S), -1, dtype=np.int32)
    for t in range(Qn):
        a, b = int(ks[t]), int(ke[t])
        vis = rng.permutation(np.arange(a, b))[: rng.integers(20, 120)] if b > a else []
        bad = [a - 1, b, N, N + 77, 2**31 - 1]  # out of the range (a − 1 = −1 where a = 0)
        border = [a, b - 1] if b - a >= 2 else []
        row = np.unique(np.concatenate([vis, border]).astype(np.int64))
        row = np.concatenate([row, bad])
        row = row[rng.permutation(row.size)][:S]
        table[t, : row.size] = row
    table[3] = -1  # range [37, 101): keys, then a tile of padding, then keys and others
    table[3, :56] = rng.permutation(np.arange(43, 99))
    table[3, 128:140] = [37, 38, 39, 40, 41, 42, 100, 36, 101, 102, 0, 99]
    table[1] = -1  # a row of padding only (its range is empty too)
    out = _buffer(Qn, S)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], wl["ks"], wl["ke"],
            cp.asarray(table), np.int64(S), out.cnt, out.rec)  # fmt: skip
    _kernel(f"seed_ids_fp8_h{H}")((gx, Qn), (128,), args)
    cnt, rec = cp.asnumpy(out.cnt), cp.asnumpy(out.rec)
    for t in range(Qn):
        ids = table[t][(table[t] >= ks[t]) & (table[t] < ke[t])]
        want = _records(lg[t, ids], ids)
        _check_row(rec[t], int(cnt[t]), S, want, lambda i, t=t: lg[t, i], t)
    assert int(cnt[3]) == 56 + 8 and int(cnt[1]) == 0


# ---------------------------------------------------------------------------------------
# The anchors' logits
# ---------------------------------------------------------------------------------------


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
@pytest.mark.parametrize("N,Qn", SHAPES)
@pytest.mark.parametrize("grid_y", [65535, 1])  # 1: one block row of queries per launch
def test_seed_logits_fp8_equal_the_dense_logits(H, N, Qn, grid_y, monkeypatch):
    """seed_logits_fp8_h{H} (seeds.anchor_logits, the anchors' Top-K): the dense FP8 logits'
    bits on every visible key, −inf elsewhere (empty, mid-tile, whole and short ranges), and
    the anchors' ids equal the dense route's — also over launches of one block row each."""
    import dosa_cupy
    from dosa_cupy import seeds
    from dosa_cupy.prepare import pad_batch

    monkeypatch.setattr(seeds, "GRID_Y", grid_y)

    wl, ks, ke, lg = _case(H, N, Qn)
    b = pad_batch(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64, wl["ks"], wl["ke"],
                  scorer="fp8")  # fmt: skip
    got = cp.asnumpy(seeds.anchor_logits(b))
    vis = (np.arange(N)[None, :] >= ks[:, None]) & (np.arange(N)[None, :] < ke[:, None])
    want = np.where(vis, lg, -np.inf).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    dense = dosa_cupy.dense_topk(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 64,
                                 wl["ks"], wl["ke"], scorer="fp8")  # fmt: skip
    assert cp.array_equal(seeds.anchor_ids(b).astype(cp.int64), dense)
