"""The shared refinement stream (docs/method.md §9; dosa_cupy.refine, csrc/refine_shared.cu).

CPU tests (run anywhere):
  * the split: for random survivor masks and visible ranges (partial first / last words,
    empty common ranges, Qn not a multiple of 4), every (query, key) with its survivor
    bit set is covered exactly once by (shared set ∧ surv[t]) ∪ residual[t], and nothing
    else; the shared set is exactly "in the common range and alive for ≥ 2 queries";
  * the kernels' loop decomposition (blocks, warps, the id-compaction loop with carried
    ids), emulated step by step: every shared key is gathered and scored once per group,
    its record candidate goes only to queries whose bit is set; with the per-query stream
    on the residual masks every surviving pair is refined exactly once;
  * refine_stage (the host code of both streams and the exact overflow extension) run
    with numpy standing in for CuPy and the kernels replaced by those emulations, after
    checking every launch argument against the kernel's C signature parsed from the .cu
    files: both streams give the same records and counts (also when buffers overflow);
  * constants / shared-memory size in Python equal the .cu source's.
GPU tests (marked ``gpu``; skipped with a reason without CuPy / a GPU): ids of
dosa_topk(stream="shared") == dense_topk on structured / calibrated regimes for H = 32, 64
(causal chunks, Qn not a multiple of 4, a tiny buffer forcing the extension, explicit
seeds), kept records equal to stream="per_query"; refine_stage's records with τ = −inf
equal the dense route's records of exactly the surviving keys (bit-identical scores, no
duplicate, none missing) for MT = 1..4.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import HAVE_GPU, cp, gpu

from dosa_cupy import refine as rs_mod
from dosa_cupy import select as select_mod
from dosa_cupy.emulate import score_code
from dosa_cupy.prepare import Batch
from dosa_cupy.refine import GROUP, split_shared

CSRC = Path(rs_mod.__file__).parent / "csrc"
SHARED_SRC = (CSRC / "refine_shared.cu").read_text()
KERNELS_SRC = read_source(CSRC / "kernels.cu")

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
    else:  # arbitrary ranges, some empty, some disjoint within a group
        a = rng.integers(0, N + 1, Qn)
        b = rng.integers(0, N + 1, Qn)
        ks, ke = np.minimum(a, b).astype(np.int32), np.maximum(a, b).astype(np.int32)
    key = np.arange(32 * NW)
    vis = (key[None, :] >= ks[:, None]) & (key[None, :] < ke[:, None])
    # correlated survivors: a per-group "hot" set plus independent noise
    hot = rng.random((-(-Qn // GROUP), 32 * NW)) < density
    bits = (np.repeat(hot, GROUP, axis=0)[:Qn] & (rng.random((Qn, 32 * NW)) < 0.7)) | (
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


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("Qn,N,density,kind", CASES)
def test_split_partitions_survivors(Qn, N, density, kind, seed):
    rng = np.random.default_rng(seed * 1000 + Qn)
    surv, ks, ke = _random_case(rng, Qn, N, density, kind)
    shared, resid = split_shared(surv, ks, ke, np)
    NG = -(-Qn // GROUP)
    assert shared.shape == (NG, surv.shape[1]) and resid.shape == surv.shape
    assert shared.dtype == np.uint32 and resid.dtype == np.uint32
    S, R, B = _bits(shared), _bits(resid), _bits(surv)
    key = np.arange(B.shape[1])
    for g in range(NG):
        rows = np.arange(GROUP * g, min(GROUP * g + GROUP, Qn))
        lo, hi = ks[rows].max(), ke[rows].min()
        in_range = (key >= lo) & (key < hi)
        alive2 = B[rows].sum(axis=0) >= 2
        assert np.array_equal(S[g], in_range & alive2), g  # the definition, bit by bit
    for t in range(Qn):
        sh_t = S[t // GROUP] & B[t]
        assert not np.any(sh_t & R[t])  # never in both streams
        assert np.array_equal(sh_t | R[t], B[t])  # every survivor in one of them
        assert np.array_equal(R[t], B[t] & ~S[t // GROUP])  # only the shared bits cleared
        # shared keys lie in every query's visible range of the group
        assert not np.any(S[t // GROUP] & ~((key >= ks[t]) & (key < ke[t])))


@pytest.mark.parametrize("N", [1, 31, 32, 33, 95, 96, 200])
def test_common_range_masks_partial_words(N):
    rng = np.random.default_rng(N)
    NW = -(-N // 32)
    Qn = 11
    for _ in range(20):
        a = rng.integers(0, N + 1, Qn)
        b = rng.integers(0, N + 1, Qn)
        ks, ke = np.minimum(a, b).astype(np.int32), np.maximum(a, b).astype(np.int32)
        if rng.random() < 0.5:  # overlapping ranges: non-empty common ranges
            ks[:] = rng.integers(0, max(1, N // 3))
            ke = np.maximum(ks, rng.integers(N // 2, N + 1, Qn)).astype(np.int32)
        m = rs_mod.common_range_masks(ks, ke, NW, np)
        lo, hi = rs_mod.group_ranges(ks, ke, np)
        key = np.arange(32 * NW)
        want = (key[None, :] >= lo[:, None]) & (key[None, :] < hi[:, None])
        assert np.array_equal(_bits(m), want)


def test_group_majority_is_at_least_two():
    rng = np.random.default_rng(5)
    for Qn in (1, 2, 3, 4, 5, 6, 7, 8, 9):
        surv = rng.integers(0, 2**32, (Qn, 3), dtype=np.uint64).astype(np.uint32)
        got = _bits(rs_mod.group_majority(surv, np))
        B = _bits(surv)
        for g in range(-(-Qn // GROUP)):
            assert np.array_equal(got[g], B[GROUP * g : GROUP * g + GROUP].sum(axis=0) >= 2)


def test_popcount_rows():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2**32, (7, 5), dtype=np.uint64).astype(np.uint32)
    want = [sum(bin(int(v)).count("1") for v in row) for row in x]
    assert rs_mod.popcount_rows(x, np).tolist() == want
    assert rs_mod.popcount_rows(np.zeros((3, 0), np.uint32), np).tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------------------
# The kernels' loop decomposition, emulated (refine_shared.cu, refine.cu refine_impl)
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


def emulate_refine_shared(grid, Qn, N, ks, ke, glist, shared, surv, on_pair):
    """refine_shared_impl's blocks and warps; on_pair(t, id) for every (query, key) whose
    record is decided (key in the batch, survivor bit of t set).  Returns the scored
    (group, key) list (each key of a batch is scored for the group's queries)."""
    NW = -(-N // 32)
    W, RSW = rs_mod.RS_WARPS, rs_mod.RS_W
    scored = []
    gx, gy = grid
    assert gx == len(glist)
    for x in range(gx):
        grp = int(glist[x])
        t0 = grp * GROUP
        nq = min(GROUP, Qn - t0)
        lo = max([0] + [int(ks[t0 + i]) for i in range(nq)])
        hi = min([N] + [int(ke[t0 + i]) for i in range(nq)])
        for y in range(gy):
            if nq < 2 or lo >= hi:
                continue
            wlo, whi = lo >> 5, (hi + 31) >> 5
            b0 = wlo + y * W * RSW
            if b0 >= whi:
                continue
            b1 = min(whi, b0 + W * RSW)
            if not np.any(shared[grp, b0:b1]):
                continue
            for warp in range(W):
                w0 = b0 + warp * RSW
                if w0 >= b1:
                    continue
                w1 = min(b1, w0 + RSW)
                if not np.any(shared[grp, w0:w1]):
                    continue
                for my, ids in _compact_batches(shared[grp], w0, w1, rs_mod.RS_BUF):
                    _check_batch(my, ids)
                    scored += [(grp, i) for i in ids if i >= 0]
                    for qi in range(nq):
                        t = t0 + qi
                        sv = [i >= 0 and _bit(surv, t, i) for i in ids]
                        if not any(sv):
                            continue
                        for i, s in zip(ids, sv, strict=True):
                            if s:
                                on_pair(t, i)
    assert NW == shared.shape[1]
    return scored


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


def _grids(Qn, N):
    NW = -(-N // 32)
    NG = -(-Qn // GROUP)
    gy_s = -(-NW // (rs_mod.RS_WARPS * rs_mod.RS_W))
    gy_q = -(-NW // (8 * rs_mod.RW))
    return (NG, gy_s), (Qn, gy_q)


@pytest.mark.parametrize(
    "Qn,N,density,kind", CASES + [(6, 70000, 0.02, "causal"), (8, 9000, 1.0, "causal")]
)
def test_loop_decomposition_refines_each_pair_once(Qn, N, density, kind):
    rng = np.random.default_rng(Qn * 7 + N)
    surv, ks, ke = _random_case(rng, Qn, N, density, kind)
    shared, resid = split_shared(surv, ks, ke, np)
    gs, gq = _grids(Qn, N)
    pairs_s, pairs_q = [], []
    scored = emulate_refine_shared(gs, Qn, N, ks, ke, np.arange(gs[0]), shared, surv,
                                   lambda t, i: pairs_s.append((t, i)))  # fmt: skip
    emulate_refine(gq, N, ks, ke, np.arange(Qn), resid, lambda t, i: pairs_q.append((t, i)))
    S, B = _bits(shared), _bits(surv)
    # every shared key is gathered and scored once per group
    want_scored = sorted((g, int(i)) for g in range(S.shape[0]) for i in np.flatnonzero(S[g]))
    assert sorted(scored) == want_scored
    # the shared stream decides (t, key) iff key ∈ shared[t // 4] and surv[t] has it
    want_s = sorted((t, int(i)) for t in range(Qn) for i in np.flatnonzero(S[t // GROUP] & B[t]))
    assert sorted(pairs_s) == want_s and len(set(pairs_s)) == len(pairs_s)
    # together with the residual per-query stream: every surviving pair exactly once
    allp = pairs_s + pairs_q
    assert len(set(allp)) == len(allp)
    assert sorted(allp) == sorted((t, int(i)) for t in range(Qn) for i in np.flatnonzero(B[t]))
    # the plain per-query stream on surv gives the same pairs
    pq = []
    emulate_refine(gq, N, ks, ke, np.arange(Qn), surv, lambda t, i: pq.append((t, i)))
    assert sorted(pq) == sorted(allp)
    print(f"\n[split] Qn={Qn} N={N} {kind}: shared pairs {len(pairs_s)} / {len(allp)}")


# ---------------------------------------------------------------------------------------
# Constants and C signatures
# ---------------------------------------------------------------------------------------


def _param_types(src, name):
    return param_types(src, rf"\b{name}_mt##MT")


def test_constants_match_source():
    for name, val in (("RS_G", "4"), ("RS_WARPS", "8"), ("RS_W", "256"),
                      ("RS_BUF", r"\(1024 \+ 32\)")):  # fmt: skip
        assert re.search(rf"#define {name} {val}\b|#define {name} {val}", SHARED_SRC), name
    assert GROUP == 4 and rs_mod.RS_WARPS == 8 and rs_mod.RS_W == 256 and rs_mod.RS_BUF == 1056
    assert re.search(r"#define RW 256\b", KERNELS_SRC) and rs_mod.RW == 256
    expr = re.search(r"#define RS_SMEM\(MT\) (.*)", SHARED_SRC).group(1)
    for mt in (1, 2, 3, 4):
        e = expr.replace("RS_G", "4").replace("RS_WARPS", "8").replace("RS_BUF", "(1024 + 32)")
        assert eval(e.replace("MT", str(mt))) == rs_mod.shared_smem_bytes(mt)  # noqa: S307
    assert re.findall(r"REFINE_SHARED_INST\((\d)\)", SHARED_SRC) == ["1", "2", "3", "4"]
    assert (
        '#include "common.cuh"' in SHARED_SRC
        and "score_batch<MT, KeysReg, QFragSmem<MT>>" in SHARED_SRC
    )
    assert "gather_keys(kp, my, lane, B)" in SHARED_SRC
    # no std headers (NVRTC)
    assert not re.search(r"#include\s*<", SHARED_SRC)


def test_signatures_parse():
    t = _param_types(SHARED_SRC, "refine_shared")
    assert len(t) == 15 and t[7] == np.int32 and t[9] == np.int64 and t[14] == np.int64
    r = _param_types(KERNELS_SRC, "refine")
    assert len(r) == 13 and r[8] == np.int64


# ---------------------------------------------------------------------------------------
# refine_stage (host code of both streams + overflow extension) on the CPU
# ---------------------------------------------------------------------------------------


def _record(s, ids):
    low = (~np.asarray(ids, dtype=np.int64)) & 0xFFFFFFFF
    return (score_code(np.asarray(s, np.float32)).astype(np.uint64) << np.uint64(32)) | low.astype(
        np.uint64
    )


class _FakeRefine:
    """refine_mt* / refine_shared_mt* emulated (loop decomposition above) with a fixed
    score table S[t, i]; every launch argument is checked against the C signature."""

    def __init__(self, S):
        self.S = S
        self.sig = {
            "refine": _param_types(KERNELS_SRC, "refine"),
            "refine_shared": _param_types(SHARED_SRC, "refine_shared"),
        }
        self.calls = []

    def get(self, name, smem=0):
        base = re.sub(r"_mt\d$", "", name)
        types = self.sig[base]
        mt = int(name[-1])

        def launch(grid, block, args, **kw):
            check_args(name, args, types)
            assert block == (256,) and len(grid) == 2
            assert args[0].shape[1] == 16 * mt and args[1].shape[1] == 16 * mt  # q, w: MT
            if base == "refine_shared":
                assert kw.get("shared_mem") == rs_mod.shared_smem_bytes(mt) == smem
            else:
                assert not kw
            self.calls.append(name)
            getattr(self, base)(grid, *args)

        return launch

    def _emit(self, q, cnt, rec, cap, tau):
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

        return on_pair

    def refine(self, grid, q, w, kp, ksc, tau, ks, ke, qlist, N, surv, cnt, rec, cap):
        emulate_refine(grid, int(N), ks, ke, qlist, surv, self._emit(q, cnt, rec, int(cap), tau))

    def refine_shared(self, grid, q, w, kp, ksc, tau, ks, ke, Qn, glist, N, shared, surv, cnt,
                      rec, cap):  # fmt: skip
        assert int(Qn) == q.shape[0]
        emulate_refine_shared(grid, int(Qn), int(N), ks, ke, glist, shared, surv,
                              self._emit(q, cnt, rec, int(cap), tau))  # fmt: skip


@pytest.fixture
def fake_refine(monkeypatch):
    holder = {}

    def install(S):
        fk = _FakeRefine(S)
        monkeypatch.setattr(rs_mod, "cupy_or_raise", lambda: np)
        monkeypatch.setattr(select_mod, "cupy_or_raise", lambda: np)  # the record buffers
        monkeypatch.setattr(rs_mod, "kernel", lambda name, smem=0: fk.get(name))
        monkeypatch.setattr(rs_mod, "_shared_kernel", fk.get)
        holder["fk"] = fk
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
def test_refine_stage_streams_agree(fake_refine, mt, Qn, N, density, kind, cap):
    rng = np.random.default_rng(Qn + N + mt)
    surv, ks, ke = _random_case(rng, Qn, N, density, kind)
    S = rng.standard_normal((Qn, N)).astype(np.float32)
    S[:, ::7] = 0.5  # ties
    tau = np.quantile(S, 0.4, axis=1).astype(np.float32)
    tau[0] = -np.inf
    Hp = 16 * mt
    q = _tag_queries(np.zeros((Qn, Hp, 128), np.uint8))
    w = np.zeros((Qn, Hp), np.float32)
    kp = np.zeros((N, 128), np.uint8)
    ksc = np.ones(N, np.float32)
    out = {}
    for stream in ("per_query", "shared"):
        fk = fake_refine(S)
        b = Batch(q, w, kp, ksc, 1, ks, ke)
        recs, shared = rs_mod.refine_stage(b, tau, surv, cap, stream)
        assert (shared is None) == (stream == "per_query")
        names = {re.sub(r"_mt\d$", "", c) for c in fk.calls}
        assert names == ({"refine", "refine_shared"} if stream == "shared" else {"refine"})
        assert all(c.endswith(f"_mt{mt}") for c in fk.calls)
        out[stream] = recs
    B = _bits(surv)
    want_cnt = np.array([int(np.sum(B[t, :N] & (S[t] >= tau[t]))) for t in range(Qn)])
    for stream, recs in out.items():
        assert recs.cnt.tolist() == want_cnt.tolist(), stream
        assert recs.rec.shape == (Qn, cap)
        assert recs.over.tolist() == (want_cnt > cap).tolist()
        if recs.over.any():  # the extension holds exactly the overflowed rows, at exact size
            rows, rec2, cnt2 = recs.ext
            assert rows.tolist() == np.flatnonzero(want_cnt > cap).tolist()
            assert rec2.shape == (rows.size, want_cnt.max())
            assert cnt2.tolist() == want_cnt[rows].tolist()  # both passes, the same count
        else:
            assert recs.ext is None
        for t in range(Qn):
            ids = np.flatnonzero(B[t, :N] & (S[t] >= tau[t]))
            row = np.sort(recs.row(t))
            assert np.array_equal(row, np.sort(_record(S[t, ids], ids))), (stream, t)


def test_refine_stage_rejects_bad_stream(fake_refine):
    fake_refine(np.zeros((1, 1), np.float32))
    z = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="stream"):
        rs_mod.refine_stage(Batch(None, None, None, None, 1, z, z), None, None, 1, "both")


def test_pipeline_option_validation():
    from dosa_cupy.options import OPTIONS, check_options

    assert OPTIONS["stream"] == "per_query"
    assert check_options({"stream": "shared"})["stream"] == "shared"
    with pytest.raises(ValueError, match="stream"):
        check_options({"stream": "groups"})


# ---------------------------------------------------------------------------------------
# GPU (H200)
# ---------------------------------------------------------------------------------------

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


def _need_regime(regime):
    if regime in ("calibrated", "h64"):
        pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")


def _args(wl, K):
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


GPU_CASES = [
    # regime, Qn, N, H, K, options  (Qn not a multiple of 4 in most; causal chunks)
    ("structured", 130, 32768, 32, 1024, {}),
    ("structured", 129, 32768, 64, 1024, {"r": 30}),
    ("structured", 127, 16384, 48, 512, {"window": 512}),
    ("structured", 66, 16384, 32, 512, {"buffer": 16}),
    ("structured", 67, 16384, 64, 512, {"buffer": 16, "r": 30}),
    ("ties", 62, 16384, 32, 512, {}),
    ("calibrated", 131, 32768, 32, 2048, {}),
    ("h64", 126, 32768, 64, 2048, {"r": 30}),
    ("calibrated", 1025, 131072, 32, 2048, {}),
]


@pytest.mark.parametrize(
    "case", GPU_CASES, ids=[f"{c[0]}-Q{c[1]}-H{c[3]}-{c[5]}" for c in GPU_CASES]
)
@gpu
def test_gpu_shared_stream_equals_dense(case):
    regime, Qn, N, H, K, opt = case
    _need_regime(regime)
    wl = make_gpu_workload(regime, Qn, N, H, seed=31)
    dense = cp.asnumpy(dosa_cupy.dense_topk(*_args(wl, K)))
    ids_s, st_s = dosa_cupy.dosa_topk(*_args(wl, K), stream="shared", return_stats=True, **opt)
    ids_q, st_q = dosa_cupy.dosa_topk(*_args(wl, K), return_stats=True, **opt)
    print(
        f"\n[shared] {regime} Qn={Qn} N={N} H={H} {opt}: survivors/query="
        f"{st_s.survivors.mean():.0f} shared keys/query={st_s.shared_keys.mean():.0f} "
        f"shared survivors/query={st_s.shared_survivors.mean():.0f} "
        f"overflows={int(st_s.overflows.sum())}"
    )
    assert np.array_equal(cp.asnumpy(ids_s), dense)
    assert np.array_equal(cp.asnumpy(ids_q), dense)
    # both streams write exactly the surviving keys with s ≥ τ: same kept counts
    assert np.array_equal(st_s.kept, st_q.kept)
    assert np.array_equal(st_s.survivors, st_q.survivors)
    assert np.all(st_s.shared_survivors <= st_s.survivors)
    if opt.get("buffer") == 16:
        assert st_s.overflows.any()


@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_gpu_shared_stream_with_explicit_seeds(H):
    Qn, N, K = 97, 16384, 512
    wl = make_gpu_workload("structured", Qn, N, H, seed=33)
    dense = dosa_cupy.dense_topk(*_args(wl, K))
    rng = np.random.default_rng(H)
    seeds = np.concatenate([cp.asnumpy(dense)[:, : K // 2], rng.integers(-1, N, (Qn, 64))], 1)
    for opt in ({}, {"buffer": 16}):
        opt = dict(opt, seed_ids=seeds, return_stats=True, r=14 if H == 32 else 30)
        ids, st = dosa_cupy.dosa_topk(*_args(wl, K), stream="shared", **opt)
        _, stq = dosa_cupy.dosa_topk(*_args(wl, K), **opt)
        assert cp.array_equal(ids, dense)
        assert np.array_equal(st.kept, stq.kept)


@pytest.mark.parametrize("H", [16, 32, 48, 64])
@pytest.mark.parametrize("cap", [1 << 16, 5])
@gpu
def test_gpu_refine_stage_records_exact(H, cap):
    """τ = −inf, random survivor masks: each stream's records are exactly the dense
    route's records of the surviving keys (bit-identical scores; no duplicate, none
    missing), MT = H/16 = 1..4, with and without the overflow extension."""
    from dosa_cupy.prepare import pad_batch

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
    res = {}
    for stream in ("per_query", "shared"):
        recs, _ = rs_mod.refine_stage(batch, tau, cp.asarray(surv), cap, stream)
        cnt = cp.asnumpy(recs.cnt)
        for t in range(Qn):
            ids = np.flatnonzero(B[t, :N])
            got = np.sort(cp.asnumpy(recs.row(t)))
            assert np.array_equal(got, np.sort(_record(lg[t, ids], ids))), (stream, t)
        res[stream] = cnt
    assert np.array_equal(res["per_query"], res["shared"])
