"""The refine stage (docs/method.md §9; dosa_cupy.refine, csrc/refine.cu).

CPU tests (run anywhere):
  * the kernel's loop decomposition (blocks, warps, the id-compaction loop with carried
    ids), emulated step by step: for random survivor masks and visible ranges (partial
    first / last words, causal chunks, arbitrary ranges) every surviving (query, key) pair
    is refined exactly once, and nothing else;
  * refine_stage (the host code and the exact overflow extension) run with numpy standing
    in for CuPy and the kernel replaced by that emulation, after checking every launch
    argument against the kernel's C signature parsed from the .cu files: the records and
    counts are exactly those of the surviving keys with s ≥ τ (also when buffers overflow);
  * constants in Python equal the .cu source's; popcount_rows.
GPU test (marked ``gpu``; skipped with a reason without CuPy / a GPU): refine_stage's
records with τ = −inf equal the dense route's records of exactly the surviving keys
(bit-identical scores, no duplicate, none missing) for MT = 1..4.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import HAVE_GPU, cp, gpu
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_cupy import dense as dense_mod
from dosa_cupy import refine as rs_mod
from dosa_cupy import select as select_mod
from dosa_cupy.emulate import make_records, record_order, record_score, score_code, wide_floor
from dosa_cupy.prepare import Batch

CSRC = Path(rs_mod.__file__).parent / "csrc"
KERNELS_SRC = read_source(CSRC / "kernels.cu")
FP8_SRC = read_source(CSRC / "score_fp8.cu")
REFINE_CU = (CSRC / "refine.cu").read_text()  # as written (its #defines included)
HOT = 4  # consecutive queries that share a "hot" survivor set in the random masks

# ---------------------------------------------------------------------------------------
# Random survivor masks with visible ranges (as the screen writes them: bits only for keys
# in [ks, ke))
# ---------------------------------------------------------------------------------------


def _bits(masks):
    """uint32 [R, NW] → bool [R, 32·NW] (bit i of word j ↔ key 32j + i)."""
    m = np.ascontiguousarray(masks, dtype=np.uint32)
    return np.unpackbits(m.view(np.uint8), axis=1, bitorder="little").astype(bool)


def _pack(bits):
    return np.packbits(bits, axis=1, bitorder="little").view(np.uint32)


def _random_case(rng, Qn, N, density, kind):
    NW = -(-N // 32)
    if kind == "causal":  # a causal chunk: ks = 0, ke = N − Qn + t + 1
        ks = np.zeros(Qn, dtype=np.int32)
        ke = (N - Qn + np.arange(Qn) + 1).clip(0, N).astype(np.int32)
    elif kind == "window":  # sliding visible windows (partial words at both ends)
        ke = np.sort(rng.integers(N // 2, N + 1, Qn)).astype(np.int32)
        ks = np.maximum(0, ke - rng.integers(1, N // 2 + 1, Qn)).astype(np.int32)
    else:  # arbitrary ranges, some empty
        a = rng.integers(0, N + 1, Qn)
        b = rng.integers(0, N + 1, Qn)
        ks, ke = np.minimum(a, b).astype(np.int32), np.maximum(a, b).astype(np.int32)
    key = np.arange(32 * NW)
    vis = (key[None, :] >= ks[:, None]) & (key[None, :] < ke[:, None])
    # correlated survivors: a "hot" set per HOT consecutive queries plus independent noise
    hot = rng.random((-(-Qn // HOT), 32 * NW)) < density
    bits = (np.repeat(hot, HOT, axis=0)[:Qn] & (rng.random((Qn, 32 * NW)) < 0.7)) | (
        rng.random((Qn, 32 * NW)) < density / 3
    )
    bits &= vis
    return _pack(bits), ks, ke


CASES = [
    (1, 40, 0.3, "arbitrary"),
    (3, 100, 0.5, "window"),
    (4, 64, 0.4, "causal"),
    (5, 1000, 0.2, "arbitrary"),
    (7, 2050, 0.1, "window"),
    (13, 333, 0.6, "causal"),
    (16, 4096, 0.05, "causal"),
    (30, 777, 0.3, "window"),
    (9, 31, 0.9, "arbitrary"),
]


def test_popcount_rows():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2**32, (7, 5), dtype=np.uint64).astype(np.uint32)
    want = [sum(bin(int(v)).count("1") for v in row) for row in x]
    assert rs_mod.popcount_rows(x, np).tolist() == want
    assert rs_mod.popcount_rows(np.zeros((3, 0), np.uint32), np).tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------------------
# The kernel's loop decomposition, emulated (refine.cu refine_impl)
# ---------------------------------------------------------------------------------------


def _batch_pos(lane):
    g, c = lane >> 2, lane & 3
    return 8 * (g >> 1) + 2 * c + (g & 1)


def _compact_batches(row, w0, w1, buf_cap):
    """The id-compaction loop of one warp over words [w0, w1) of a mask row: yields, per
    batch, (loaded ids [32 lanes][4 groups], result id [32 lanes]) with −1 = empty."""
    carried = []
    wb = w0
    while wb < w1:
        new = []
        for lane in range(32):  # lane order, then bit order (prefix sum + __ffs)
            wi = wb + lane
            m = int(row[wi]) if wi < w1 else 0
            new += [wi * 32 + b for b in range(32) if (m >> b) & 1]
        buf = carried + new
        assert len(buf) <= buf_cap  # the per-warp buffer never overflows
        total = len(buf)
        last = wb + 32 >= w1
        full = total if last else total & ~31
        for j in range(0, full, 32):
            my = [[buf[j + 8 * u + (ln >> 2)] if j + 8 * u + (ln >> 2) < total else -1
                   for u in range(4)] for ln in range(32)]  # fmt: skip
            ids = [buf[j + _batch_pos(ln)] if j + _batch_pos(ln) < total else -1
                   for ln in range(32)]  # fmt: skip
            yield my, ids
        carried = buf[full:]
        assert len(carried) < 32
        wb += 32
    assert not carried


def _check_batch(my, ids):
    """Lane (g, c) loads key my[u] of group u; after the MMA + reduce8 it holds the key at
    batch_pos: the result ids are exactly the loaded keys, each once."""
    loaded = sorted({my[ln][u] for ln in range(32) for u in range(4)} - {-1})
    res = sorted(i for i in ids if i >= 0)
    assert loaded == res and len(set(res)) == len(res)
    for ln in range(32):  # key n = 2c + v of group u is loaded by lane g' = n of that group
        i = ids[ln]
        if i >= 0:
            p = _batch_pos(ln)
            u, n = p // 8, p % 8
            assert my[4 * n][u] == i  # lanes 4n..4n+3 (g' = n) hold key n of group u


def _bit(mask, t, i):
    return (int(mask[t, i >> 5]) >> (i & 31)) & 1


def emulate_refine(grid, N, ks, ke, qlist, surv, on_pair):
    """refine.cu refine_impl's blocks and warps: on_pair(t, id) for every refined pair."""
    W, RW = 8, rs_mod.RW
    gx, gy = grid
    assert gx == len(qlist)
    for x in range(gx):
        t = int(qlist[x])
        wlo, whi = int(ks[t]) >> 5, (int(ke[t]) + 31) >> 5
        for y in range(gy):
            for warp in range(W):
                w0 = wlo + (y * W + warp) * RW
                if w0 >= whi:
                    continue
                w1 = min(whi, w0 + RW)
                if not np.any(surv[t, w0:w1]):
                    continue
                for my, ids in _compact_batches(surv[t], w0, w1, 1024 + 32):
                    _check_batch(my, ids)
                    for i in ids:
                        if i >= 0:
                            on_pair(t, i)


def _grid(Qn, N):
    """refine_stage's grid: (queries, word chunks of REFINE_WARPS·RW words)."""
    NW = -(-N // 32)
    return Qn, -(-NW // (rs_mod.REFINE_WARPS * rs_mod.RW))


@pytest.mark.parametrize(
    "Qn,N,density,kind", CASES + [(6, 70000, 0.02, "causal"), (8, 9000, 1.0, "causal")]
)
def test_loop_decomposition_refines_each_pair_once(Qn, N, density, kind):
    rng = np.random.default_rng(Qn * 7 + N)
    surv, ks, ke = _random_case(rng, Qn, N, density, kind)
    pairs = []
    emulate_refine(_grid(Qn, N), N, ks, ke, np.arange(Qn), surv, lambda t, i: pairs.append((t, i)))
    B = _bits(surv)
    assert len(set(pairs)) == len(pairs)  # no pair twice
    assert sorted(pairs) == sorted((t, int(i)) for t in range(Qn) for i in np.flatnonzero(B[t]))


# ---------------------------------------------------------------------------------------
# Constants and C signatures
# ---------------------------------------------------------------------------------------


def _param_types(src, name):
    return param_types(src, rf"\b{name}_mt##MT")


def test_constants_match_source():
    assert re.search(r"#define RW 256\b", REFINE_CU) and rs_mod.RW == 256
    # REFINE_WARPS warps per block: the kernel's launch bound
    assert f"__launch_bounds__({32 * rs_mod.REFINE_WARPS}) refine_mt##MT" in REFINE_CU


def test_signature_parses():
    r = _param_types(KERNELS_SRC, "refine")
    assert len(r) == 13 and r[8] == np.int64


# ---------------------------------------------------------------------------------------
# refine_stage (host code + overflow extension) on the CPU
# ---------------------------------------------------------------------------------------


_record = make_records  # record.cuh make_record


class _FakeRefine:
    """refine_mt* emulated (loop decomposition above) with a fixed score table S[t, i] —
    and the FP8 scorer's refine_fp8_h*, refine_fp8_spill_h* (its blocks of RWF words; the
    records past a row's cap appended to the spill) and extend_from_spill (the extension
    from the spill, select.cu); every launch argument is checked against the C signature."""

    def __init__(self, S):
        self.S = S
        self.sig = _param_types(KERNELS_SRC, "refine")
        self.calls = []

    def get(self, name):
        if name.startswith("refine_fp8") or name == "extend_from_spill":
            return self._fp8(name)
        assert re.fullmatch(r"refine_mt\d", name), name
        mt = int(name[-1])

        def launch(grid, block, args, **kw):
            check_args(name, args, self.sig)
            assert block == (256,) and len(grid) == 2 and not kw
            assert args[0].shape[1] == 16 * mt and args[1].shape[1] == 16 * mt  # q, w: MT
            self.calls.append(name)
            self.refine(grid, *args)

        return launch

    def _fp8(self, name):
        m = re.fullmatch(r"refine_fp8(_spill)?_h(32|64)|extend_from_spill", name)
        assert m, name
        src = KERNELS_SRC if name == "extend_from_spill" else FP8_SRC
        sig = param_types(src, rf"\b{name[:-2]}##H" if m.group(2) else rf"\b{name}\b")

        def launch(grid, block, args, **kw):
            check_args(name, args, sig)
            assert not kw
            self.calls.append(name)
            if name == "extend_from_spill":
                return _emulate_extend_from_spill(*args)
            assert block == (128,) and len(grid) == 2
            assert args[0].shape[1] == int(m.group(2))  # q: the kernel's heads
            q, _, _, _, tau, ks, ke, qlist, N, surv, cnt, rec, cap, *spill = args
            emit = self._emit(q, cnt, rec, int(cap), tau, spill or None)
            NW = surv.shape[1]
            for x in range(grid[0]):  # blocks (x, y): RWF words of query qlist[x] each
                t = int(qlist[x])
                wlo, whi = int(ks[t]) >> 5, min(NW, (int(ke[t]) + 31) >> 5)
                for y in range(grid[1]):
                    for wi in range(wlo + y * rs_mod.RWF, min(whi, wlo + (y + 1) * rs_mod.RWF)):
                        for bit in range(32):
                            if (int(surv[t, wi]) >> bit) & 1 and 32 * wi + bit < int(N):
                                emit(t, 32 * wi + bit)

        return launch

    def _emit(self, q, cnt, rec, cap, tau, spill=None):
        # the score table is indexed by the query's identity, which the test writes into
        # q[t, 0, :4] (_tag_queries): the overflow extension launches on q[rows] sub-arrays
        qid = np.ascontiguousarray(q[:, 0, :4]).view(np.uint32)[:, 0]

        def on_pair(t, i):
            s = self.S[qid[t], i]
            if s >= tau[t]:
                at = int(cnt[t])
                cnt[t] += 1  # counts past the capacity
                if at < cap:
                    rec[t, at] = _record(s, i)
                elif spill is not None:  # refine_fp8_spill: past cap, to the spill
                    count, srec, srow, scap = spill
                    k = int(count[0])
                    count[0] += 1  # counts past the spill's capacity
                    if k < int(scap):
                        srec[k], srow[k] = _record(s, i), t

        return on_pair

    def refine(self, grid, q, w, kp, ksc, tau, ks, ke, qlist, N, surv, cnt, rec, cap):
        emulate_refine(grid, int(N), ks, ke, qlist, surv, self._emit(q, cnt, rec, int(cap), tau))


def _emulate_extend_from_spill(rec, cap, oq, n, slot, srec, srow, ns, floor, cnt2, rec2, cap2):
    """select.cu extend_from_spill: the kept records of the rows oq, then the spilled ones,
    appended to row slot[row] of rec2 where their score ≥ floor of that row."""
    kept = [(j, rec[oq[j], c]) for j in range(int(n)) for c in range(int(cap))]
    spilled = [(slot[srow[k]], srec[k]) for k in range(int(ns))]
    for j, r in kept + spilled:
        if j >= 0 and record_score(np.array([r], np.uint64))[0] >= floor[j]:
            at = int(cnt2[j])
            cnt2[j] += 1
            if at < int(cap2):
                rec2[j, at] = r


def _host_kth(K, recA, cntA, want_ids=True, want_kth=False):
    """select_records' K-th records on the host (the extension's ``captured_floor``): the
    K-th largest of each row's first min(count, cap) records, 0 where there are fewer."""
    assert not want_ids and want_kth and recA.dtype == np.uint64 and cntA.dtype == np.uint32
    kth = np.zeros(recA.shape[0], dtype=np.uint64)
    for r in range(recA.shape[0]):
        kept = np.sort(recA[r, : min(int(cntA[r]), recA.shape[1])])[::-1]
        kth[r] = kept[K - 1] if kept.size >= K else 0
    return None, kth


def _code_score(c):
    """record.cuh code_score on uint32 codes → fp32: ``emulate.record_score`` of the records
    with those codes (NaN for the codes below −inf's; code 0, no record there, −inf)."""
    return record_score(np.asarray(c, dtype=np.uint64) << np.uint64(32))


class _FakeFloor:
    """select.cu floor_wide_hist, select_wide_cut and floor_of_cut emulated (the captured
    floor of ``select.FLOOR_WIDE``), each launch checked against its C signature; the
    histograms count in grid-stride order, which only a count depends on."""

    NAMES = ("floor_wide_hist", "select_wide_cut", "floor_of_cut")

    def __init__(self):
        self.sig = {n: param_types(KERNELS_SRC, rf"void (?:__launch_bounds__\(\w+\) )?{n}\b")
                    for n in self.NAMES}  # fmt: skip
        self.calls = []

    def get(self, name):
        assert name in self.NAMES, name

        def launch(grid, block, args, **kw):
            check_args(name, args, self.sig[name])
            assert not kw
            self.calls.append(name)
            getattr(self, name)(grid, *args)

        return launch

    @staticmethod
    def floor_wide_hist(grid, level, rec, cap, oq, state, hist):
        assert grid[1] == oq.size and grid[0] >= 1
        for j, t in enumerate(oq.tolist()):
            c = (rec[t, : int(cap)] >> np.uint64(32)).astype(np.int64)
            if level == 0:
                hist[j] += np.bincount(c >> 21, minlength=2048).astype(np.uint32)
            elif not state[j, 3]:
                sel = c[(c >> 21) == int(state[j, 0])]
                hist[j] += np.bincount((sel >> 10) & 2047, minlength=2048).astype(np.uint32)

    @staticmethod
    def select_wide_cut(grid, level, K, ks, ke, hist, state, cnt):
        for j in range(grid[0]):
            if level == 0:
                cnt[j] = 0
                if int(ke[j]) - int(ks[j]) <= K:
                    state[j] = (0, 0, 0, 1)
                    continue
            elif state[j, 3]:
                continue
            kk = int(K) - (int(state[j, 1]) if level else 0)
            top = np.cumsum(hist[j][::-1].astype(np.int64))  # counts of bins ≥ 2047 − i
            i = int(np.argmax(top >= kk))
            d = 2047 - i
            above = int(top[i]) - int(hist[j][d])
            if level == 0:
                state[j, 0], state[j, 1], state[j, 3] = d, above, 0
            else:
                state[j, 2] = (int(state[j, 0]) << 21) | (d << 10)

    @staticmethod
    def floor_of_cut(grid, state, n, floor):
        f = _code_score(state[: int(n), 2])
        floor[: int(n)] = np.where((state[: int(n), 3] != 0) | np.isnan(f), -np.inf, f)


def _floor_of_kept(kept, K):
    """``select.captured_floor`` of a full row's kept records uint64 [cap] on the host: the
    K-th largest record's score (−inf where fewer than K were kept), or with ``FLOOR_WIDE``
    ``emulate.wide_floor``."""
    if select_mod.FLOOR_WIDE:
        return wide_floor(kept, K)
    return float(np.sort(record_score(kept))[::-1][K - 1]) if kept.size >= K else -np.inf


@pytest.fixture
def fake_refine(monkeypatch):
    def install(S):
        fk = _FakeRefine(S)
        ff = _FakeFloor()
        monkeypatch.setattr(rs_mod, "cupy_or_raise", lambda: np)
        monkeypatch.setattr(select_mod, "cupy_or_raise", lambda: np)  # the record buffers
        monkeypatch.setattr(select_mod, "select_records", _host_kth)
        monkeypatch.setattr(select_mod, "score_of_records", record_score)
        monkeypatch.setattr(select_mod, "kernel", lambda name, *_: ff.get(name))
        monkeypatch.setattr(dense_mod, "cupy_or_raise", lambda: np)  # dense.wide_cut
        monkeypatch.setattr(dense_mod, "kernel", lambda name, *_: ff.get(name))
        monkeypatch.setattr(dense_mod, "num_sms", lambda: 3)  # dense.wide_blocks
        monkeypatch.setattr(rs_mod, "kernel", lambda name, *_: fk.get(name))
        fk.floor = ff
        return fk

    return install


def _tag_queries(q):
    """Write each query's index into q[t, 0, :4] (read back by _FakeRefine._emit)."""
    q[:, 0, :4] = np.arange(q.shape[0], dtype=np.uint32)[:, None].view(np.uint8)
    return q


@pytest.mark.parametrize("mt", [1, 2, 3, 4])
@pytest.mark.parametrize("Qn,N,density,kind,cap", [
    (13, 333, 0.6, "causal", 4096), (13, 333, 0.6, "causal", 3),
    (30, 777, 0.3, "window", 1), (5, 1000, 0.2, "arbitrary", 50), (9, 31, 0.9, "arbitrary", 2),
])  # fmt: skip
@pytest.mark.parametrize("raised", [True, "wide", False])
def test_refine_stage_records_and_extension(fake_refine, monkeypatch, mt, Qn, N, density, kind,
                                            cap, raised):  # fmt: skip
    """The first pass keeps the records s ≥ τ (counted past the capacity); an overflowed row
    is refined again into its complete list of the records s ≥ max(τ, floor), floor the
    K-th record its first pass kept (``select.captured_floor``; the lower edge of its 22-bit
    code bucket with ``FLOOR_WIDE``, "wide"; τ alone with ``RAISED_EXTENSION`` off), and its
    Top-K over that list is its Top-K over s ≥ τ."""
    monkeypatch.setattr(select_mod, "RAISED_EXTENSION", bool(raised))
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", raised == "wide")
    rng = np.random.default_rng(Qn + N + mt)
    surv, ks, ke = _random_case(rng, Qn, N, density, kind)
    S = rng.standard_normal((Qn, N)).astype(np.float32)
    S[:, ::7] = 0.5  # ties
    tau = np.quantile(S, 0.4, axis=1).astype(np.float32)
    tau[0] = -np.inf
    Hp = 16 * mt
    K = 1 + mt % 3  # 1, 2 or 3: floors from a kept list shorter than K, and ties at the floor
    q = _tag_queries(np.zeros((Qn, Hp, 128), np.uint8))
    w = np.zeros((Qn, Hp), np.float32)
    kp = np.zeros((N, 128), np.uint8)
    ksc = np.ones(N, np.float32)
    fk = fake_refine(S)
    recs = rs_mod.refine_stage(Batch(q, w, kp, ksc, K, ks, ke), tau, surv, cap)
    assert fk.calls and all(c == f"refine_mt{mt}" for c in fk.calls)
    B = _bits(surv)
    want_cnt = np.array([int(np.sum(B[t, :N] & (S[t] >= tau[t]))) for t in range(Qn)])
    assert recs.cnt.tolist() == want_cnt.tolist()
    assert recs.rec.shape == (Qn, cap)
    assert recs.over.tolist() == (want_cnt > cap).tolist()
    floor = tau.copy()  # each row's threshold of its complete list
    if recs.over.any():  # the extension holds exactly the overflowed rows
        rows, rec2, cnt2 = recs.ext
        assert rows.tolist() == np.flatnonzero(want_cnt > cap).tolist()
        assert rec2.shape == (rows.size, want_cnt.max())  # the largest first-pass count
        for t in rows.tolist() if raised else []:
            fl = _floor_of_kept(recs.rec[t], K)
            kept = np.sort(record_score(recs.rec[t]))[::-1]
            assert fl <= (kept[K - 1] if cap >= K else np.inf)  # a floor: ≤ the K-th kept
            floor[t] = max(tau[t], fl)
        if raised == "wide":
            assert fk.floor.calls == ["floor_wide_hist", "select_wide_cut"] * 2 + ["floor_of_cut"]
        want2 = [int(np.sum(B[t, :N] & (S[t] >= floor[t]))) for t in rows.tolist()]
        assert cnt2.tolist() == want2
        assert len(fk.calls) == 2  # the first pass and the overflowed rows' pass
    else:
        assert recs.ext is None and len(fk.calls) == 1
    for t in range(Qn):
        ids = np.flatnonzero(B[t, :N] & (S[t] >= floor[t]))
        row = np.sort(recs.row(t))
        assert np.array_equal(row, np.sort(_record(S[t, ids], ids))), t
        every = np.flatnonzero(B[t, :N] & (S[t] >= tau[t]))  # the row's Top-K is kept
        top = record_order(S[t, every], every, K)
        assert np.isin(top, ids).all(), t


@pytest.mark.parametrize("mt", [2, 4])
@pytest.mark.parametrize("cap,ratio", [(3, 100.0), (3, 0.0), (40, 1.0), (40, 0.05), (4096, 1.0)])
@pytest.mark.parametrize("raised", [True, "wide", False])
@pytest.mark.parametrize("deferred", [True, False])
def test_spill_extension_on_the_cpu(fake_refine, monkeypatch, mt, cap, ratio, raised, deferred):
    """The FP8 refinement with its spill (``refine_stage(..., spill=True)``; the kernels
    emulated, their arguments checked against the C signatures): the spill holds every
    record past a row's cap, with its row; an overflowed row's complete list comes from the
    kept and spilled records (extend_from_spill, no second refinement) where the spill held
    them all, else from a second refinement (refine_fp8_h*), and is the same either way —
    the records s ≥ max(τ, floor) (floor: ``select.captured_floor``, "wide" its
    ``FLOOR_WIDE`` form); eagerly or from the counts read back by the caller
    (``select.overflow_counts``: its fourth count is the spill's)."""
    monkeypatch.setattr(select_mod, "RAISED_EXTENSION", bool(raised))
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", raised == "wide")
    monkeypatch.setattr(rs_mod, "SPILL_RATIO", ratio)
    rng = np.random.default_rng(cap + mt)
    Qn, N = 17, 700
    surv, ks, ke = _random_case(rng, Qn, N, 0.5, "causal")
    S = rng.standard_normal((Qn, N)).astype(np.float32)
    S[:, ::5] = 0.25  # ties
    tau = np.quantile(S, 0.3, axis=1).astype(np.float32)
    tau[1] = -np.inf
    Hp, K = 16 * mt, 2
    q = _tag_queries(np.zeros((Qn, Hp, 128), np.uint8))
    b = Batch(q, np.zeros((Qn, Hp), np.float32), np.zeros((N, 128), np.uint8),
              np.ones(N, np.float32), K, ks, ke, scorer="fp8")  # fmt: skip
    fk = fake_refine(S)
    if deferred:
        recs = rs_mod.refine_stage(b, tau, surv, cap, extend=False, spill=True)
        n, top, _, spilled = (int(x) for x in select_mod.overflow_counts(recs, np.zeros(Qn, bool)))
        if n:
            recs = rs_mod.extend_records(b, tau, surv, recs, (n, top), spilled)
    else:
        recs = rs_mod.refine_stage(b, tau, surv, cap, spill=True)
    B = _bits(surv)
    want_cnt = np.array([int(np.sum(B[t, :N] & (S[t] >= tau[t]))) for t in range(Qn)])
    assert recs.cnt.tolist() == want_cnt.tolist()
    past = np.maximum(want_cnt - cap, 0)
    assert int(recs.spill.count[0]) == past.sum() and recs.spill.cap == int(Qn * cap * ratio)
    fits = past.sum() <= recs.spill.cap
    if fits:
        got = np.bincount(recs.spill.row[: past.sum()], minlength=Qn)
        assert got.tolist() == past.tolist()
    first = f"refine_fp8_spill_h{Hp}"
    again = [] if not past.any() else ["extend_from_spill"] if fits else [f"refine_fp8_h{Hp}"]
    assert fk.calls == [first] + again
    floor = tau.copy()
    if past.any():
        rows, _, cnt2 = recs.ext
        assert rows.tolist() == np.flatnonzero(past).tolist()
        for t in rows.tolist() if raised else []:
            floor[t] = max(tau[t], _floor_of_kept(recs.rec[t], K))
        want2 = [int(np.sum(B[t, :N] & (S[t] >= floor[t]))) for t in rows.tolist()]
        assert cnt2.tolist() == want2
    for t in range(Qn):
        ids = np.flatnonzero(B[t, :N] & (S[t] >= floor[t]))
        assert np.array_equal(np.sort(recs.row(t)), np.sort(_record(S[t, ids], ids))), t


@pytest.mark.parametrize("cap,K", [(64, 5), (64, 64), (200, 1), (9, 30)])
def test_wide_floor_is_the_bucket_edge_of_the_kth_kept_record(fake_refine, monkeypatch, cap, K):
    """``select.captured_floor`` with ``FLOOR_WIDE`` (floor_wide_hist, select_wide_cut,
    floor_of_cut emulated; arguments checked against the C signatures): per overflowed row
    the lower edge of its K-th kept record's 22-bit code bucket as a score — ≤ that record's
    score, within one bucket — on negative, zero (−0 as +0), tied and bucket-edge scores;
    −inf where at most K records were kept."""
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", True)
    rng = np.random.default_rng(cap + K)
    Qn = 7
    scale = np.exp2(rng.integers(-20, 20, (Qn, 1)))
    S = (rng.standard_normal((Qn, cap)) * scale).astype(np.float32)
    S[1] = -np.abs(S[1])  # a row of negative scores
    S[2, ::3] = -0.0
    S[3] = S[3, 0]  # one tied score
    S[4] = _code_score(np.uint32(0xC0000000) + np.arange(cap, dtype=np.uint32) * 0x400)  # edges
    ids = np.arange(cap)
    rec = np.stack([_record(S[t], ids) for t in range(Qn)])
    recs = select_mod.Records(rec, np.full(Qn, cap + 1, np.uint32), np.ones(Qn, bool))
    fk = fake_refine(np.zeros((Qn, cap), np.float32))
    oq = np.array([0, 1, 2, 3, 4, 6], dtype=np.int32)
    floor = select_mod.captured_floor(K, recs, oq)
    assert floor.dtype == np.float32 and floor.shape == (oq.size,)
    assert fk.floor.calls == ["floor_wide_hist", "select_wide_cut"] * 2 + ["floor_of_cut"]
    for j, t in enumerate(oq.tolist()):
        assert floor[j] == wide_floor(rec[t], K), (t, floor[j])
        if cap > K:
            kth = np.sort(S[t])[::-1][K - 1]
            assert floor[j] <= kth and (score_code(kth) >> 10) == (score_code(floor[j]) >> 10)
        else:
            assert floor[j] == -np.inf


def test_refine_stage_without_extension_flags_the_overflowed_rows(fake_refine):
    rng = np.random.default_rng(11)
    Qn, N, cap = 13, 333, 3
    surv, ks, ke = _random_case(rng, Qn, N, 0.6, "causal")
    S = rng.standard_normal((Qn, N)).astype(np.float32)
    tau = np.full(Qn, -np.inf, np.float32)
    q = _tag_queries(np.zeros((Qn, 16, 128), np.uint8))
    fk = fake_refine(S)
    b = Batch(q, np.zeros((Qn, 16), np.float32), np.zeros((N, 128), np.uint8),
              np.ones(N, np.float32), 1, ks, ke)  # fmt: skip
    recs = rs_mod.refine_stage(b, tau, surv, cap, extend=False)
    want_cnt = _bits(surv)[:, :N].sum(axis=1)
    assert recs.cnt.tolist() == want_cnt.tolist() and recs.ext is None
    assert recs.over.tolist() == (want_cnt > cap).tolist() and recs.over.any()
    assert len(fk.calls) == 1  # no second pass


def _extension_case(seed: int, Qn: int, N: int):
    """(batch, survivor mask, scores [Qn, N], τ at each row's 30 % quantile) of a causal
    chunk for the fake refine kernel (``fake_refine``)."""
    rng = np.random.default_rng(seed)
    surv, ks, ke = _random_case(rng, Qn, N, 0.6, "causal")
    S = rng.standard_normal((Qn, N)).astype(np.float32)
    tau = np.quantile(S, 0.3, axis=1).astype(np.float32)
    q = _tag_queries(np.zeros((Qn, 16, 128), np.uint8))
    b = Batch(q, np.zeros((Qn, 16), np.float32), np.zeros((N, 128), np.uint8),
              np.ones(N, np.float32), 1, ks, ke)  # fmt: skip
    return b, surv, S, tau


@pytest.mark.parametrize("cap", [3, 4096])
def test_deferred_extension_equals_the_immediate_one(fake_refine, cap):
    """``refine.DEFERRED_EXTENSION``'s pieces: ``refine_stage(..., extend=False)`` then
    ``extend_records`` give the records, counts, flags and extension of ``refine_stage``
    (the same rows refined again, at the same size); without an overflowed row nothing is
    launched again."""
    b, surv, S, tau = _extension_case(5, 13, 333)
    Qn = b.Qn
    fake_refine(S)
    now = rs_mod.refine_stage(b, tau, surv, cap)
    fk = fake_refine(S)
    later = rs_mod.extend_records(b, tau, surv, rs_mod.refine_stage(b, tau, surv, cap, False))
    assert len(fk.calls) == (2 if now.over.any() else 1)
    assert np.array_equal(now.cnt, later.cnt) and np.array_equal(now.over, later.over)
    assert (now.ext is None) == (later.ext is None) == (not now.over.any())
    if now.ext is not None:  # the same rows at the same size and counts
        (r0, e0, c0), (r1, e1, c1) = now.ext, later.ext
        assert np.array_equal(r0, r1) and e0.shape == e1.shape and np.array_equal(c0, c1)
    for t in range(Qn):  # every query's records (the buffers past the counts are not written)
        assert np.array_equal(np.sort(now.row(t)), np.sort(later.row(t))), t


def test_extension_with_counts_read_back_equals_the_one_that_reads_them(fake_refine):
    """``select.extend_flagged`` given (overflowed rows, their largest count) by the caller
    (``select.overflow_counts``, read back once: ``refine.PREFETCH_COUNTS``) extends the
    same rows at the same size as when it reads them itself; with none flagged it launches
    nothing."""
    b, surv, S, tau = _extension_case(11, 17, 400)
    Qn = b.Qn
    for cap in (3, 4096):
        fake_refine(S)
        own = rs_mod.extend_records(b, tau, surv, rs_mod.refine_stage(b, tau, surv, cap, False))
        fk = fake_refine(S)
        first = rs_mod.refine_stage(b, tau, surv, cap, False)
        bad = np.zeros(Qn, bool)
        bad[[2, 9]] = True
        n, top, nbad, spilled = (int(x) for x in select_mod.overflow_counts(first, bad))
        assert (n, nbad, spilled) == (int(first.over.sum()), 2, 0)  # no spill asked for
        assert top == (int(first.cnt[first.over].max()) if n else 0)
        given = rs_mod.extend_records(b, tau, surv, first, (n, top))
        assert len(fk.calls) == (2 if n else 1)
        assert (own.ext is None) == (given.ext is None) == (n == 0)
        if n:
            (r0, e0, c0), (r1, e1, c1) = own.ext, given.ext
            assert np.array_equal(r0, r1) and e0.shape == e1.shape and np.array_equal(c0, c1)
            assert r1.dtype == np.int32
        for t in range(Qn):
            assert np.array_equal(np.sort(own.row(t)), np.sort(given.row(t))), t


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=70))
def test_flagged_rows_is_flatnonzero(flags):
    """``select.flagged_rows`` (the rows of a mask from their count, without a
    synchronization) equals ``flatnonzero``, in order, for every mask."""
    mask = np.array(flags, dtype=bool)
    got = select_mod.flagged_rows(mask, int(mask.sum()), np)
    assert got.dtype == np.int32 and got.tolist() == np.flatnonzero(mask).tolist()


def test_recover_with_its_count_given_replaces_the_same_rows(monkeypatch):
    """``select.recover`` with the number of bad rows given (read back by the caller) replaces
    the same rows as when it reads the mask itself, and launches nothing for none."""
    from gpu_support import numpy_as_cupy

    monkeypatch.setattr(select_mod, "cupy_or_raise", numpy_as_cupy)
    seen = []

    class B:
        def rows(self, idx):
            seen.append(np.asarray(idx).tolist())
            return idx

    monkeypatch.setattr(select_mod, "dense_ids", lambda rows: -1 - np.asarray(rows)[:, None])
    bad = np.array([False, True, False, False, True])
    a, c = np.zeros((5, 2), np.int32), np.zeros((5, 2), np.int32)
    select_mod.recover(B(), a, bad)
    select_mod.recover(B(), c, bad, 2)
    assert np.array_equal(a, c) and seen == [[1, 4], [1, 4]]
    select_mod.recover(B(), c, np.zeros(5, bool), 0)
    assert seen == [[1, 4], [1, 4]]


# ---------------------------------------------------------------------------------------
# GPU (H200)
# ---------------------------------------------------------------------------------------

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


@pytest.mark.parametrize("H", [16, 32, 48, 64])
@pytest.mark.parametrize("cap,raised", [(1 << 16, True), (5, True), (5, False)])
@gpu
def test_gpu_refine_stage_records_exact(monkeypatch, H, cap, raised):
    """τ = −inf, random survivor masks: the records are exactly the dense route's records
    of the surviving keys (bit-identical scores; no duplicate, none missing), MT = H/16 =
    1..4, with and without the overflow extension; an extended row's are those with
    s ≥ the floor of the records its first pass kept (K = 1; ``select.captured_floor``: the
    best of them, or with ``FLOOR_WIDE`` the lower edge of its code's bucket), or all of them
    without ``select.RAISED_EXTENSION``."""
    from dosa_cupy.prepare import pad_batch

    monkeypatch.setattr(select_mod, "RAISED_EXTENSION", raised)

    Qn, N = 203, 20000
    wl = make_gpu_workload("structured", Qn, N, H, seed=35)
    ks, ke = wl["ks"], wl["ke"]
    batch = pad_batch(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 1, ks, ke)
    lg = cp.asnumpy(
        dosa_cupy.dense_logits(wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], ks, ke)
    )
    rng = np.random.default_rng(H + cap)
    surv, _, _ = _random_case(rng, Qn, N, 0.3, "causal")
    key = np.arange(surv.shape[1] * 32)
    vis = (key[None, :] >= cp.asnumpy(ks)[:, None]) & (key[None, :] < cp.asnumpy(ke)[:, None])
    surv = _pack(_bits(surv) & vis)
    tau = cp.full(Qn, -np.inf, dtype=cp.float32)
    B = _bits(surv)
    recs = rs_mod.refine_stage(batch, tau, cp.asarray(surv), cap)
    assert cp.asnumpy(recs.cnt).tolist() == B[:, :N].sum(axis=1).tolist()
    over, kept = cp.asnumpy(recs.over), cp.asnumpy(recs.rec)
    assert over.any() == (cap == 5)
    for t in range(Qn):
        ids = np.flatnonzero(B[t, :N])
        if raised and over[t]:  # the first pass's best kept record raises the floor
            ids = ids[lg[t, ids] >= _floor_of_kept(kept[t], 1)]
        got = np.sort(cp.asnumpy(recs.row(t)))
        assert np.array_equal(got, np.sort(_record(lg[t, ids], ids))), t


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("buffer", [16, 1 << 16])
@gpu
def test_gpu_deferred_extension_returns_the_dense_ids(buffer, prefetch, monkeypatch):
    """``refine.DEFERRED_EXTENSION`` in a DoSA call: the overflow flags read with the
    recovery's (``refine.PREFETCH_COUNTS``: while the selection runs, or after it), the
    overflowed rows (every row at a buffer of 16 records) extended and selected after the
    selection, then a query that sees an invalid scale recovered by the dense route — the
    dense route's ids, the statistics' overflow counts as without it."""
    monkeypatch.setattr(rs_mod, "PREFETCH_COUNTS", prefetch)
    wl = make_gpu_workload("calibrated", 300, 30000, 64, seed=9)
    ksc = wl["k_scale"].copy()
    ksc[20000] = -1.0  # the queries that see key 20000 are recovered
    a = (wl["q"], wl["w"], wl["k_payload"], ksc, 256, wl["ks"], wl["ke"])
    opts = dict(route="dosa", screen="wgt", r=6, buffer=buffer, return_stats=True)
    _, now = dosa_cupy.dosa_topk(*a, **opts)
    monkeypatch.setattr(rs_mod, "DEFERRED_EXTENSION", True)
    ids, st = dosa_cupy.dosa_topk(*a, **opts)
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*a))
    assert np.array_equal(st.overflows, now.overflows) and st.recovered.any()
    assert st.overflows.any() == (buffer == 16)


@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("cap,raised,ratio", [(5, True, 1000.0), (300, True, 1.0),
                                              (5, False, 1000.0), (5, True, 0.0),
                                              (300, True, 0.01)])  # fmt: skip
@gpu
def test_gpu_spill_extension_equals_refining_again(monkeypatch, H, cap, raised, ratio):
    """The FP8 refinement with its spill (``refine.SPILL``, refine_fp8_spill_h{H}): the
    first pass's records are those without it, the spill holds every record past a row's
    cap (its count = Σ (count − cap) over the overflowed rows), and each overflowed row's
    extension from the spill (``extend_from_spill``; no second refinement) holds exactly
    the records a second refinement writes — the dense FP8 logits' records of its survivors
    at or above max(τ, the captured floor of its kept records).  A spill too small for them
    (ratio 0, 0.01) falls back to the second refinement, with the same records."""
    from dosa_cupy.prepare import pad_batch

    monkeypatch.setattr(select_mod, "RAISED_EXTENSION", raised)
    monkeypatch.setattr(rs_mod, "SPILL_RATIO", ratio)
    again = []
    real_rescore = rs_mod._rescore

    def rescore_spy(b, tau, surv):
        f = real_rescore(b, tau, surv)
        return lambda *a: again.append(a[0].size) or f(*a)

    monkeypatch.setattr(rs_mod, "_rescore", rescore_spy)
    Qn, N = 203, 20000
    wl = make_gpu_workload("calibrated", Qn, N, H, seed=36)
    ks, ke = wl["ks"], wl["ke"]
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"])
    batch = pad_batch(*a, 1, ks, ke, scorer="fp8")
    lg = cp.asnumpy(dosa_cupy.dense_logits(*a, ks, ke, scorer="fp8"))
    rng = np.random.default_rng(H + cap)
    surv, _, _ = _random_case(rng, Qn, N, 0.3, "causal")
    key = np.arange(surv.shape[1] * 32)
    vis = (key[None, :] >= cp.asnumpy(ks)[:, None]) & (key[None, :] < cp.asnumpy(ke)[:, None])
    surv = _pack(_bits(surv) & vis)
    B = _bits(surv)
    # τ: the 40th best visible score of the even rows, the 2,000th of the odd ones (about 12
    # and 600 records of the surviving 30 %: the odd rows overflow either cap)
    srt = np.sort(np.where(vis[:, :N], lg, -np.inf), axis=1)
    tau = np.where(np.arange(Qn) % 2, srt[:, -2000], srt[:, -40]).astype(np.float32)
    tau_d = cp.asarray(tau)
    recs = rs_mod.refine_stage(batch, tau_d, cp.asarray(surv), cap, spill=True)
    plain = rs_mod.refine_stage(batch, tau_d, cp.asarray(surv), cap, extend=False)
    cnt, over = cp.asnumpy(recs.cnt).astype(np.int64), cp.asnumpy(recs.over)
    assert np.array_equal(cnt, cp.asnumpy(plain.cnt)) and over.any()
    kept = cp.asnumpy(recs.rec)
    spilled = int(np.maximum(cnt - cap, 0).sum())
    assert int(recs.spill.count[0]) == spilled
    assert recs.spill.cap == int(Qn * cap * ratio)
    assert (again == []) == (spilled <= recs.spill.cap), (again, spilled, recs.spill.cap)
    if spilled <= recs.spill.cap:  # every record past cap, with its row
        rows = cp.asnumpy(recs.spill.row[:spilled])
        assert np.array_equal(np.bincount(rows, minlength=Qn), np.maximum(cnt - cap, 0))
    for t in range(Qn):
        ids = np.flatnonzero(B[t, :N])
        ids = ids[lg[t, ids] >= tau[t]]
        if raised and over[t]:  # the K-th (K = 1) kept record raises the floor
            ids = ids[lg[t, ids] >= _floor_of_kept(kept[t], 1)]
        got = np.sort(cp.asnumpy(recs.row(t)))
        assert np.array_equal(got, np.sort(_record(lg[t, ids], ids))), t


@pytest.mark.parametrize("spill", [True, False])
@pytest.mark.parametrize("ratio", [0.125, 0.0])
@pytest.mark.parametrize("buffer", [16, 256])
@gpu
def test_gpu_spill_in_a_dosa_call_returns_the_dense_ids(monkeypatch, buffer, ratio, spill):
    """A DoSA call on the FP8 scorer whose rows overflow their buffer: the ids are the dense
    route's with the spill (``refine.SPILL``), with a spill too small (ratio 0: the rows
    scored again) and without one, and the statistics' overflow counts agree."""
    monkeypatch.setattr(rs_mod, "SPILL", spill)
    monkeypatch.setattr(rs_mod, "SPILL_RATIO", ratio)
    wl = make_gpu_workload("calibrated", 300, 30000, 64, seed=9)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
    opts = dict(route="dosa", screen="wgt", r=6, buffer=buffer, scorer="fp8")
    ids, st = dosa_cupy.dosa_topk(*a, return_stats=True, **opts)
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*a, scorer="fp8"))
    assert st.overflows.any()
    monkeypatch.setattr(rs_mod, "SPILL", not spill)
    _, other = dosa_cupy.dosa_topk(*a, return_stats=True, **opts)
    assert np.array_equal(st.overflows, other.overflows)


@pytest.mark.parametrize("cap,K", [(65536, 2048), (4096, 2048), (3000, 100), (100, 100)])
@gpu
def test_gpu_wide_floor_is_the_bucket_edge(monkeypatch, cap, K):
    """``select.captured_floor`` with ``FLOOR_WIDE`` on the GPU (floor_wide_hist,
    select_wide_cut, floor_of_cut) equals the host's bucket edge of the K-th kept record
    (``emulate.wide_floor``) on every overflowed row — full rows of random, negative, tied and
    bucket-edge scores — and is ≤ the exact floor of ``FLOOR_WIDE`` off."""
    rng = np.random.default_rng(cap + K)
    Qn = 41
    scale = np.exp2(rng.integers(-30, 30, (Qn, 1)))
    S = (rng.standard_normal((Qn, cap)) * scale).astype(np.float32)
    S[1] = -np.abs(S[1])
    S[2, ::3] = -0.0
    S[3] = S[3, 0]
    S[4] = _code_score(np.uint32(0xC0000000) + (np.arange(cap, dtype=np.uint32) % 4096) * 0x400)
    ids = np.arange(cap)
    rec = np.stack([_record(S[t], rng.permutation(ids)) for t in range(Qn)])
    over = np.ones(Qn, bool)
    over[5::7] = False
    recs = select_mod.Records(cp.asarray(rec), cp.full(Qn, cap + 1, dtype=cp.uint32),
                              cp.asarray(over))  # fmt: skip
    oq = cp.asarray(np.flatnonzero(over).astype(np.int32))
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", True)
    wide = cp.asnumpy(select_mod.captured_floor(K, recs, oq))
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", False)
    exact = cp.asnumpy(select_mod.captured_floor(K, recs, oq))
    for j, t in enumerate(np.flatnonzero(over).tolist()):
        assert wide[j] == wide_floor(rec[t], K), (t, wide[j])
        assert wide[j] <= exact[j], t


@pytest.mark.parametrize("spill", [True, False])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_gpu_wide_floor_in_a_dosa_call_returns_the_dense_ids(monkeypatch, spill, H):
    """A DoSA call on the FP8 scorer whose rows overflow, with the wide captured floor
    (``select.FLOOR_WIDE``) and with the spill or the second refinement: the dense route's
    ids, and the overflowed rows are the same as with the exact floor."""
    monkeypatch.setattr(rs_mod, "SPILL", spill)
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", True)
    wl = make_gpu_workload("calibrated", 300, 30000, H, seed=19)
    a = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 256, wl["ks"], wl["ke"])
    opts = dict(route="dosa", screen="wgt", r=6, buffer=16, scorer="fp8")
    ids, st = dosa_cupy.dosa_topk(*a, return_stats=True, **opts)
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*a, scorer="fp8"))
    assert st.overflows.any()
    monkeypatch.setattr(select_mod, "FLOOR_WIDE", False)
    _, other = dosa_cupy.dosa_topk(*a, return_stats=True, **opts)
    assert np.array_equal(st.overflows, other.overflows)
