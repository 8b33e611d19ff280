"""The host code of score_fp8.cu's range scorer launches (``seeds.anchor_logits``, the fused
route's ``FusedLaunch`` on the FP8 scorer), on the CPU: numpy stands in for CuPy and each
kernel is replaced by an emulation of ``range_scores``' tile walk (csrc/score_fp8.cu: the
span [L, E) of a block row's ranges in tiles of 64, block x taking tiles x, x + gx, … that
meet some range) that first checks the launch against the kernel's parameter list; a
stand-in score per (query, key) shows where each value lands.  Every visible key of every
row must be written exactly (anchor logits), and the fused records must be exactly
fused.cu's set — visible, past the sinks, before the local window, outside the anchor pool,
s ≥ τ — also across launches of GRID_Y block rows and in the exact extension's rescoring.
The decode scan's launches likewise: each request's rows against its logical keys through
its block-table row, records at or above the threshold record, dense logits with −inf past
a row's visible end.  The scores' bits are the GPU tests' (tests/test_gpu_fp8_gather.py,
test_gpu_scorer_fp8.py, test_decode_fp8.py)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from cuda_signatures import check_launch, signatures

from dosa_cupy import fused as fused_mod
from dosa_cupy import seeds as seeds_mod
from dosa_cupy import select as select_mod
from dosa_cupy.prepare import Batch
from dosa_cupy.scorer import FP8_SPEC
from dosa_cupy.tma import TMAP_DTYPE

NEG = np.float32(-np.inf)


def _score(t: int, i: int) -> np.float32:
    """A stand-in score of query t (w[t, 0] = t) and key i."""
    return np.float32(((t * 7919 + i * 104729) % 1000) / 10.0 - 50.0)


def _walk_rows(t0, nq, bx, gx, ranges, n_keys, put):
    """One block's part of range_scores' walk for queries t0 .. t0 + nq − 1 with raw ranges."""
    lo, hi, L, E = [], [], n_keys, 0
    for a, z in ranges:
        a, z = max(0, a), min(n_keys, z)
        if z <= a:
            a = z = 0
        else:
            L, E = min(L, a), max(E, z)
        lo.append(a)
        hi.append(z)
    if E <= L:
        return
    for j in range(bx, (E - L + 63) >> 6, gx):
        for u in range(nq):
            if L + 64 * j < hi[u] and L + 64 * j + 64 > lo[u]:
                for i in range(L + 64 * j, L + 64 * j + 64):
                    put(t0 + u, lo[u] <= i < hi[u], i)


def _walk(H, grid, Qn, n_keys, rng, put):
    """range_scores' tile walk over a (gx, gy) grid of 128 / H queries per block row:
    put(t, in_range, i) for every key row i of every tile a block scores for query t (the
    tiles that meet its range)."""
    QB, (gx, gy) = 128 // H, grid
    for by, bx in itertools.product(range(gy), range(gx)):
        t0 = by * QB
        if t0 < Qn:
            nq = min(QB, Qn - t0)
            _walk_rows(t0, nq, bx, gx, [rng(t0 + u) for u in range(nq)], n_keys, put)


def _append(cnt, rec, cap, t, value) -> None:
    """A record stage's append: the counter counts every record, the first cap are kept."""
    c = int(cnt[t])
    cnt[t] += 1
    if c < int(cap):
        rec[t, c] = np.uint64(value)


def _record(sc, i: int) -> int:
    """record.cuh make_record: code << 32 | ~id."""
    from dosa_cupy.emulate import score_code

    return (int(score_code(np.array([sc], np.float32))[0]) << 32) | ((~i) & 0xFFFFFFFF)


class _Kernels:
    """score_fp8.cu's range-scorer kernels emulated by their tile walk after the launch check:
    seed_logits_fp8 and fused_fp8 (stand-in score of query t and key i: _score(t, i)), the
    decode scan's decode_{logits,fused}_fp8 (two rows per request, ranges [0, ke[r]), keys
    through the block table: _score(r, cache row of i), so a wrong page shows)."""

    def __init__(self):
        self.sig, self.launches, self.names = signatures(FP8_SPEC), 0, []

    def get(self, name, smem=0, spec=None):
        from dosa_cupy import decode_ops as dops

        assert spec is FP8_SPEC
        self.names.append(name)
        tma = re.fullmatch(r"decode_(fused|logits)_tma_fp8_h(\d+)_n(\d)(_ahead)?", name)
        if tma:  # decode_scan_tma: its shared memory, four warpgroups, the map first
            H, n = int(tma.group(2)), int(tma.group(3))
            assert smem == dops.fp8_tma_smem(n * H)

            def launch_tma(grid, block, args, shared_mem=0):
                check_launch(name, self.sig[name], args, (np.ndarray,))
                # the read-ahead build by its switch and rule (tma_ahead of the grid)
                assert (tma.group(4) is not None) == dops.tma_ahead(grid[0]), (name, grid)
                assert block == (128 * (1 + dops.FP8_TMA_CWG),) and shared_mem == smem
                assert args[0].dtype == TMAP_DTYPE and int(args[7]) == n and len(grid) == 2
                self.launches += 1
                self._decode_tma(name, H, grid, args)

            return launch_tma
        assert smem == 0
        H = int(name.rsplit("_h", 1)[1])

        def launch(grid, block, args, **kw):
            check_launch(name, self.sig[name], args, (np.ndarray,))
            assert block == (128,) and not kw and len(grid) == 2
            self.launches += 1
            if name.startswith("decode_"):
                self._decode(name, H, grid, args)
            elif name.startswith("seed_logits_fp8"):
                q, w, kp, al, nk, lo_, hi_, Qn, out = args
                assert grid[1] == -(-int(Qn) // (128 // H)) and out.shape == (int(Qn), int(nk))

                def put(t, inr, i):
                    if i < nk:
                        out[t, i] = _score(int(w[t, 0]), i) if inr else NEG

                _walk(H, grid, int(Qn), int(nk), lambda t: (int(lo_[t]), int(hi_[t])), put)
            else:
                assert name.startswith("fused_fp8")
                q, w, kp, al, N, tau, ks_, ke_, sinks, window, pm, Qn, cnt, rec, cap = args

                def rng(t):
                    ks, ke = int(ks_[t]), int(ke_[t])
                    s_hi = ks + min(int(sinks), ke - ks)
                    return s_hi, max(s_hi, ke - int(window))

                def put(t, inr, i):
                    sc = _score(int(w[t, 0]), i)
                    if inr and not (int(pm[i >> 5]) >> (i & 31)) & 1 and sc >= tau[t]:
                        _append(cnt, rec, cap, t, i)

                _walk(H, grid, int(Qn), int(N), rng, put)

        return launch

    @staticmethod
    def _decode(name, H, grid, args):
        q, w, kv, ksc, bt, mb, ke, n = args[:8]
        B, n = bt.shape[0], int(n)
        assert grid[1] == B and q.shape == (B * n, H, 128)

        def put(r, inr, i):
            sc = _score(r, int(bt[r // n, i >> 6]) * 64 + (i & 63))
            if name.startswith("decode_logits"):
                out = args[8]
                if i < out.shape[1]:
                    out[r, i] = sc if inr else NEG
            else:
                thr, cnt, rec, cap = args[8:]
                if inr and _record(sc, i) >= int(thr[r]):
                    _append(cnt, rec, cap, r, _record(sc, i))

        for b, bx in itertools.product(range(B), range(grid[0])):
            ranges = [(0, int(ke[b * n + u])) for u in range(n)]
            _walk_rows(b * n, n, bx, grid[0], ranges, int(mb) * 64, put)

    @staticmethod
    def _decode_tma(name, H, grid, args):
        """decode_scan_tma's walk: block (x, b) takes request b's pages x, x + gx, … below
        ⌈max_u ke / 64⌉ and scores every key of each page for each of the request's rows."""
        _, q, w, ksc, bt, mb, ke, n = args[:8]
        B, n = bt.shape[0], int(n)
        assert grid[1] == B and q.shape == (B * n, H, 128)
        L = int(mb) * 64

        def put(r, inr, i):
            sc = _score(r, int(bt[r // n, i >> 6]) * 64 + (i & 63))
            if "logits" in name:
                args[8][r, i] = sc if inr else NEG
            else:
                thr, cnt, rec, cap = args[8:]
                if inr and _record(sc, i) >= int(thr[r]):
                    _append(cnt, rec, cap, r, _record(sc, i))

        for b, bx in itertools.product(range(B), range(grid[0])):
            pages = -(-max(int(ke[b * n + u]) for u in range(n)) // 64)
            for p in range(bx, pages, grid[0]):
                for i in range(64 * p, 64 * p + 64):
                    assert i < L
                    for u in range(n):
                        put(b * n + u, i < int(ke[b * n + u]), i)


@pytest.fixture
def kernels(monkeypatch):
    fk = _Kernels()
    for mod in (seeds_mod, fused_mod):
        monkeypatch.setattr(mod, "kernel", fk.get)
    monkeypatch.setattr(seeds_mod, "cupy_or_raise", lambda: np)
    monkeypatch.setattr(select_mod, "cupy_or_raise", lambda: np)
    return fk


def _batch(H, Qn, N, rs):
    q, w = np.zeros((Qn, H, 128), np.uint8), np.zeros((Qn, H), np.float32)
    w[:, 0] = np.arange(Qn)  # the stand-in score's query
    ks = rs.integers(-5, max(N // 3, 1), Qn).astype(np.int32)
    ke = np.clip(ks + rs.integers(-3, N + 1, Qn), 0, N + 7).astype(np.int32)  # ke > N, ks > ke
    return Batch(q, w, np.zeros((N, 128), np.uint8), np.ones(N, np.float32), 4, ks, ke, H,
                 scorer="fp8")  # fmt: skip


class _Seeds:
    def __init__(self, sinks, window, pm):
        self.args = (np.int32(sinks), np.int32(window), pm)

    def default_args(self):
        return self.args


CASES = list(itertools.product((32, 64), (1, 7, 13), (63, 65, 700), (1, 65535)))


@pytest.mark.parametrize("H,Qn,N,grid_y", CASES)
def test_range_launches_cover_exactly_the_ranges(kernels, monkeypatch, H, Qn, N, grid_y):
    monkeypatch.setattr(seeds_mod, "GRID_Y", grid_y)  # 1: one block row per launch
    rs = np.random.default_rng(H * 1000 + Qn * 10 + N + grid_y)
    b = _batch(H, Qn, N, rs)
    got = seeds_mod.anchor_logits(b)
    for t in range(Qn):
        i = np.arange(N)
        vis = (i >= max(0, int(b.ks[t]))) & (i < min(N, int(b.ke[t])))
        want = np.where(vis, [_score(t, x) for x in i], NEG).astype(np.float32)
        assert np.array_equal(got[t].view(np.uint32), want.view(np.uint32)), t
    NW = (N + 31) // 32
    pm = (rs.integers(0, 2**32, NW) & rs.integers(0, 2**32, NW)).astype(np.uint32)
    sinks, window = int(rs.integers(0, 5)), int(rs.integers(0, 40))
    tau, cap = rs.uniform(-60, 40, Qn).astype(np.float32), int(rs.integers(1, 50))

    def want_set(t):
        ks, ke = int(b.ks[t]), int(b.ke[t])
        s_hi = ks + min(sinks, ke - ks)
        loc = max(s_hi, ke - window)
        return {x for x in range(max(ks, 0), min(ke, N))
                if s_hi <= x < loc and not (int(pm[x >> 5]) >> (x & 31)) & 1
                and _score(t, x) >= tau[t]}  # fmt: skip

    out = select_mod.RecordBuffer(Qn, cap)
    fused_mod.FusedLaunch(b, tau, _Seeds(sinks, window, pm))(out)
    for t in range(Qn):
        want, c = want_set(t), int(out.cnt[t])
        assert c == len(want), t
        kept = {int(x) for x in out.rec[t, : min(c, cap)]}
        assert kept <= want and (c > cap or kept == want), t
    oq = np.array([t for t in range(Qn) if int(out.cnt[t]) > cap] or [Qn - 1])
    ext = select_mod.RecordBuffer(len(oq), 10**4)  # the exact extension's rescoring
    fused_mod.FusedLaunch(b.rows(oq), tau[oq], _Seeds(sinks, window, pm))(ext)
    for j, t in enumerate(oq):
        assert {int(x) for x in ext.rec[j, : int(ext.cnt[j])]} == want_set(t)
    assert kernels.launches >= 3


# ---- the decode scan (score_fp8.cu decode_scan: the range scorer over a request's pages) ---


@pytest.mark.parametrize(
    "tma,ahead",
    [(False, False), (True, False), (True, True), (None, None)],
    ids=["ring", "tma", "tma_ahead", "rule"],
)
@pytest.mark.parametrize("H,B,n,sms", [(64, 3, 2, 2), (32, 1, 1, 132), (64, 5, 1, 1)])
def test_decode_scan_launches_cover_each_request_through_its_pages(monkeypatch, H, B, n, sms,
                                                                   tma, ahead):  # fmt: skip
    """decode_scan (gathered tiles) and decode_scan_tma (dops.DECODE_TMA: pages by the copy
    engine; dops.TMA_AHEAD: its build that reads the block table ahead; both None: their
    rules, which take the TMA scan, reading ahead from TMA_AHEAD_MIN_GX blocks per request):
    every row's logits exactly where visible (−inf elsewhere, the host's fill) and exactly its
    records at or above the threshold, through the request's block table."""
    from dosa_cupy import decode_ops as dops
    from dosa_cupy import tma as tma_mod

    monkeypatch.setattr(dops, "DECODE_TMA", tma)
    monkeypatch.setattr(dops, "TMA_AHEAD", ahead)
    monkeypatch.setattr(dops, "_aligned16", lambda *a: True)  # numpy has no device pointer
    monkeypatch.setattr(tma_mod, "tensor_map_2d", lambda *a, **k: np.zeros(1, TMAP_DTYPE)[0])
    fk = _Kernels()
    monkeypatch.setattr(dops, "kernel", fk.get)
    monkeypatch.setattr(dops, "num_sms", lambda: sms)
    rs = np.random.default_rng(H + B + n)
    mb, nb = 5, 5 * B + 2
    bt = rs.permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32)
    lengths = rs.integers(0, mb * 64 + 1, B)
    ke = np.maximum(0, lengths[:, None] - n + 1 + np.arange(n)[None, :]).reshape(-1)
    d = dict(q=np.zeros((B * n, H, 128), np.uint8), w=np.zeros((B * n, H), np.float32),
             kv=np.zeros((nb * 64, 128), np.uint8), scale=np.ones(nb * 64, np.float32),
             block_table=bt, max_blocks=mb, ke=ke.astype(np.int32), n=n, B=B, Hp=H,
             L=mb * 64, scorer="fp8")  # fmt: skip
    out = np.full((B * n, mb * 64), 7.0, np.float32)
    dops.scan_fp8(d, False, (out,))
    for r in range(B * n):
        for i in range(mb * 64):
            phys = int(bt[r // n, i >> 6]) * 64 + (i & 63)
            want = _score(r, phys) if i < ke[r] else NEG
            assert out[r, i].view(np.uint32) == np.float32(want).view(np.uint32), (r, i)
    thr = rs.integers(0, 2**63, B * n, dtype=np.uint64)
    thr[0] = 0  # every key
    cap = 40
    cnt, rec = np.zeros(B * n, np.uint32), np.zeros((B * n, cap), np.uint64)
    dops.scan_fp8(d, True, (thr, cnt, rec, np.int64(cap)))
    for r in range(B * n):
        want = set()
        for i in range(int(ke[r])):
            phys = int(bt[r // n, i >> 6]) * 64 + (i & 63)
            record = _record(_score(r, phys), i)
            if record >= int(thr[r]):
                want.add(record)
        assert int(cnt[r]) == len(want), r
        got = {int(x) for x in rec[r, : min(int(cnt[r]), cap)]}
        assert got <= want and (len(want) > cap or got == want), r
    tma = tma is not False  # the rule takes the TMA scan
    # the rule's read-ahead: none on these requests of 5 pages (at most 5 blocks each, below
    # TMA_AHEAD_MIN_GX; test_tma_scan_and_read_ahead_rules has the grids that read ahead)
    assert ahead is not None or dops.tma_blocks_per_request(B, mb, sms) < dops.TMA_AHEAD_MIN_GX
    sfx = f"_n{n}{'_ahead' * bool(ahead)}" if tma else ""
    assert fk.names == [f"decode_{k}{'_tma' if tma else ''}_fp8_h{H}{sfx}"
                        for k in ("logits", "fused")]  # fmt: skip


def test_tma_scan_and_read_ahead_rules(monkeypatch):
    """decode_ops.tma_wanted / tma_ahead: by default every step takes the TMA scan, whose
    producer reads ahead from TMA_AHEAD_MIN_GX blocks per request (B = 1 and 8 at 1M keys on
    132 SMs, not B = 64); TMA_AHEAD False restores the rule before it (the gathering scan
    below TMA_MIN_B requests except next_n ≥ 2 at 64 heads) and never reads ahead; True
    always reads ahead; DECODE_TMA forces the scan either way."""
    from dosa_cupy import decode_ops as dops

    pages = (1 << 20) // 64
    gx = {B: dops.tma_blocks_per_request(B, pages, 132) for B in (1, 8, 64)}
    assert dops.TMA_AHEAD is None and dops.DECODE_TMA is None
    assert [dops.tma_ahead(gx[B]) for B in (1, 8, 64)] == [True, True, False], gx
    assert all(dops.tma_wanted(B, n, H) for B in (1, 8, 64) for n in (1, 2) for H in (32, 64))
    monkeypatch.setattr(dops, "TMA_AHEAD", False)
    assert not any(dops.tma_ahead(g) for g in gx.values())
    assert not dops.tma_wanted(8, 1, 64) and not dops.tma_wanted(1, 2, 32)
    assert dops.tma_wanted(dops.TMA_MIN_B, 1, 32) and dops.tma_wanted(1, 2, 64)
    monkeypatch.setattr(dops, "TMA_AHEAD", True)
    assert all(dops.tma_ahead(g) for g in gx.values())
    monkeypatch.setattr(dops, "DECODE_TMA", False)
    assert not dops.tma_wanted(64, 2, 64)


@pytest.mark.parametrize("sms", [1, 7, 132])
def test_tma_grid_is_the_fewest_blocks_near_the_least_cost(sms):
    """decode_ops.tma_blocks_per_request: at least one block per request, within 3 % of the
    least modelled cost over every gx, the smallest such gx; at 132 SMs and few requests of
    many pages, one wave."""
    from dosa_cupy import decode_ops as dops

    def cost(B, P, gx):
        return -(-B * gx // sms) * (-(-P // gx) + dops.TMA_BLOCK_PAGES)

    for B in (1, 2, 3, 8, 64, 67, 131, 132, 200, 500):
        for P in (1, 5, 64, 2048, 16384):
            gx = dops.tma_blocks_per_request(B, P, sms)
            best = min(cost(B, P, g) for g in range(1, max(1, min(P, 4 * sms)) + 1))
            assert 1 <= gx <= max(1, P) and cost(B, P, gx) <= 1.03 * best, (B, P, gx)
            assert all(cost(B, P, g) > 1.03 * best for g in range(1, gx)), (B, P, gx)
            if sms == 132 and B in (1, 2, 8, 64) and P >= 2048:
                assert B * gx <= sms, (B, P, gx)
