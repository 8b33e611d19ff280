"""Decode on the native FP8 scorer (``scorer="fp8"``; docs/method.md §10, csrc/score_fp8.cu
decode_scan / decode_witness).

CPU tests (run anywhere):
  * the numpy backend scores with the FP8 kernels' bits (``dosa_ref.mma_model
    .fp8_fresh_scores``) and its ids equal a brute-force Top-K of those scores, every step of
    walks with overflows and histories;
  * the cupy backend's host code, with numpy for CuPy and the three FP8 decode kernels
    emulated on the same scores after checking every launch against its parameter list in
    score_fp8.cu and its grid, gives the numpy backend's ids, and its dense route the same;
  * the option is checked (ValueError naming ``scorer``).
GPU tests (sm_90a): the paged logits equal the prefill FP8 dense logits on the gathered
keys bit for bit; the fused step equals the FP8 dense decode route and the numpy emulation
every step of walks (B, next_n, H, overflow, history 0).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from cuda_signatures import check_args, signatures
from gpu_support import cp, gpu, needs_sm90a, replay_decode_walk
from test_gpu_decode import PagedCache, _FakeKernels, _queries, fake_cupy  # noqa: F401

from dosa_cupy import decode as dec
from dosa_cupy import decode_ops as dops
from dosa_cupy import scorer as scorer_mod
from dosa_cupy.emulate import block_kth_record, score_code
from dosa_cupy.scorer import FP8_SPEC
from dosa_ref.mma_model import fp8_fresh_scores
from dosa_ref.scorer import topk_of


def _padded(qp, wq):
    """q [B, n, H, 128], w [B, n, H] with heads padded to the FP8 scorer's 32 or 64."""
    B, n, H, _ = qp.shape
    Hp = scorer_mod.padded_heads(H, "fp8")
    q = np.zeros((B, n, Hp, 128), np.uint8)
    w = np.zeros((B, n, Hp), np.float32)
    q[:, :, :H], w[:, :, :H] = qp, wq
    return q, w


def _row_scores(q, w, cache, b, ids):
    """The FP8 scorer's scores (float32) of request b's logical keys ``ids`` for the padded
    query q [Hp, 128], w [Hp]."""
    rows = dec.physical_rows(cache.block_table[b : b + 1], np.asarray(ids)[None, :])[0]
    kv = cache.kv.reshape(-1, 128)
    sc = cache.scale.reshape(-1)
    return fp8_fresh_scores(q, w, kv[rows], sc[rows])


def _brute(qp, wq, cache, L, K):
    """int64 [B, n, K]: Top-K of every row's visible keys by the FP8 scores (score desc,
    id asc, −1 padding)."""
    B, n = qp.shape[:2]
    q, w = _padded(qp, wq)
    ke = dec.visible_ends(L, n)
    out = np.full((B, n, K), -1, np.int64)
    for b in range(B):
        for j in range(n):
            ids = np.arange(int(ke[b, j]), dtype=np.int64)
            if ids.size:
                sel, _ = topk_of(_row_scores(q[b, j], w[b, j], cache, b, ids), ids, K)
                out[b, j, : sel.size] = sel
    return out


@pytest.mark.parametrize(
    "B,n,H,K,history,buffer",
    [(1, 1, 32, 8, 2, None), (3, 2, 20, 16, 2, 20), (2, 2, 64, 5, 0, 6), (2, 1, 40, 12, 1, 1)],
)
def test_numpy_fp8_backend_equals_brute_force(B, n, H, K, history, buffer):
    cache = PagedCache(B, 5 * 64, seed=7 * B + n + H)
    rs = cache.rs
    L = rs.integers(1, 90, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=history, buffer=buffer, backend="numpy", scorer="fp8")
    qf = rs.standard_normal((B, n, H, 128))
    overflowed = 0
    for step in range(4):
        qp, wq = _queries(rs, qf, n, H)
        out = sel.step(qp, wq, cache.kv, cache.scale, cache.block_table, L)
        assert np.array_equal(out.ids, _brute(qp, wq, cache, L, K)), step
        overflowed += sel.last_overflow
        L = np.minimum(L + rs.integers(1, 70, B), cache.max_blocks * 64).astype(np.int32)
    if buffer is not None and buffer < 10:
        assert overflowed > 0  # the exact extension was exercised


def test_scorer_option_is_checked():
    with pytest.raises(ValueError, match="^scorer:"):
        dec.DecodeSelectorGPU(4, backend="numpy", scorer="bf16")
    with pytest.raises(ValueError, match="^scorer:"):
        dec.check_decode_inputs(
            np.zeros((1, 1, 8, 128), np.uint8), np.ones((1, 1, 8), np.float32),
            np.zeros((2, 64, 128), np.uint8), np.ones((2, 64), np.float32),
            np.zeros((1, 1), np.int32), np.array([5], np.int32), 4, scorer=None,
        )  # fmt: skip
    if not scorer_mod.fp8_available():  # the device backend refuses "fp8" where it cannot run
        with pytest.raises(ValueError, match="^scorer:"):
            dec.DecodeSelectorGPU(4, scorer="fp8")


# ---- the cupy backend's host code with the FP8 decode kernels emulated -----------------


class _FakeFP8(_FakeKernels):
    """score_fp8.cu's decode kernels emulated with fp8_fresh_scores."""

    def __init__(self):
        self.sig, self.calls = signatures(FP8_SPEC), []

    def get(self, name, smem=0, spec=None):
        assert spec is FP8_SPEC and smem == 0, (name, spec)
        m = re.fullmatch(r"(decode_\w+_fp8)_h(\d+)(_n2)?", name)
        base, H, rows = m.group(1), int(m.group(2)), m.group(3) is not None

        def launch(grid, block, args, **kw):
            check_args(name, args, [p.dtype for p in self.sig[name]])
            assert block == (128,) and len(grid) == 2 and not kw, (name, grid, block, kw)
            assert args[0].shape[1] == H, "the build of the padded heads"
            if base in ("decode_witness_fp8", "decode_witness_kth_fp8"):
                Wc, n = int(args[9]), int(args[7])
                # a block per row, or per request with both rows (decode_witness_fp8_h{H}_n2)
                assert not rows or (n == 2 and base == "decode_witness_fp8"), name
                assert grid[1] == args[6].shape[0] // (n if rows else 1), (name, grid)
                assert 1 <= grid[0] <= max(1, -(-Wc // 64))
            else:  # block (x, b): request b's tiles x, x + gx, … of 64 keys
                B, mb = args[4].shape[0], int(args[5])
                assert grid[1] == B and 1 <= grid[0] <= mb
            self.calls.append(name)
            getattr(self, base)(*args)

        return launch

    @staticmethod
    def _scores(q, w, kv, ksc, bt, r, n, ids):
        """The kernels' arguments: q [R, Hp, 128], kv [rows, 128], ksc [rows] (flattened)."""
        b = r // n
        rows = dec.physical_rows(bt[b : b + 1], np.asarray(ids)[None, :])[0]
        return fp8_fresh_scores(q[r], w[r], kv[rows], ksc[rows])

    # decode.cu's emulations (_FakeKernels) with these scores; the FP8 kernels take no
    # (ld, nreq, per) and the logits arrive filled with −inf by scan_fp8
    def decode_logits_fp8(self, q, w, kv, ksc, bt, mb, ke, n, out):
        assert np.all(out == -np.inf), "scan_fp8 fills the logits with −inf first"
        self.decode_logits(q, w, kv, ksc, bt, mb, ke, n, out.shape[1], None, None, out)

    def decode_fused_fp8(self, q, w, kv, ksc, bt, mb, ke, n, thr, cnt, rec, cap):
        self.decode_fused(q, w, kv, ksc, bt, mb, ke, n, None, None, None, thr, cnt, rec, cap)

    def decode_witness_fp8(self, q, w, kv, ksc, bt, mb, ke, n, wit, Wc, cnt, rec):
        self.decode_witness(q, w, kv, ksc, bt, mb, ke, n, wit, Wc, cnt, rec)

    def decode_witness_kth_fp8(self, q, w, kv, ksc, bt, mb, ke, n, wit, Wc, cnt, rec, K, ticket,
                               thr):  # fmt: skip
        """The witnesses, then each row's K-th record by select_block.cuh's procedure (its
        host twin), 0 below K records; the tickets are 0 before and after."""
        assert not ticket.any(), "decode_witness_kth's tickets are 0 at rest"
        self.decode_witness(q, w, kv, ksc, bt, mb, ke, n, wit, Wc, cnt, rec)
        for r in range(cnt.shape[0]):
            m = min(int(cnt[r]), int(Wc))
            thr[r] = block_kth_record(rec[r, :m], int(K))[0] if m >= K else 0


@pytest.mark.parametrize("kth,rows", [(False, False), (True, False), (False, True)],
                         ids=["select", "witkth", "witrows"])  # fmt: skip
@pytest.mark.parametrize("B,n,H,buffer,K", [(2, 2, 32, None, 8), (3, 1, 64, 1, 16)])
def test_cupy_host_code_with_emulated_fp8_kernels(fake_cupy, monkeypatch, B, n, H, buffer, K,  # noqa: F811
                                                  kth, rows):  # fmt: skip
    """``kth``: the witnesses' K-th by decode_witness_kth (decode_ops.WITNESS_KTH), so a step
    with a history selects once (its scan's records), not twice; ``rows``: at next_n 2 both
    rows of a request's witnesses by one launch of decode_witness_fp8_h{H}_n2, a block per
    request (decode_ops.WITNESS_ROWS)."""
    cache = PagedCache(B, 4 * 64, seed=B + n + H)
    rs = cache.rs
    fk = _FakeFP8()
    monkeypatch.setattr(scorer_mod, "fp8_available", lambda: True)
    monkeypatch.setattr(dops, "kernel", fk.get)
    monkeypatch.setattr(dops, "DECODE_TMA", False)  # the emulation is of decode_scan's kernels
    monkeypatch.setattr(dops, "WITNESS_KTH", kth)
    monkeypatch.setattr(dops, "WITNESS_ROWS", rows)
    selections = []
    select_into = dops.select_into
    monkeypatch.setattr(dops, "select_into", lambda *a: selections.append(1) or select_into(*a))
    L = rs.integers(1, 200, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2, buffer=buffer, scorer="fp8")
    ref = dec.DecodeSelectorGPU(K, history=2, buffer=buffer, backend="numpy", scorer="fp8")
    qf = rs.standard_normal((B, n, H, 128))
    for step in range(4):
        qp, wq = _queries(rs, qf, n, H)
        args = (qp, wq, cache.kv, cache.scale, cache.block_table, L)
        dense = dec.dense_decode_topk(*args, K, scorer="fp8")
        selections.clear()
        out = sel.step(*args)
        assert len(selections) == (1 if kth else 2), step  # a step with a history
        assert np.array_equal(out.ids, dense), step
        got = ref.step(*args)
        assert np.array_equal(out.ids, got.ids), step
        # the threshold record is the selection's K-th either way
        assert np.array_equal(out.stats.tau, got.stats.tau), step
        L = np.minimum(L + rs.integers(1, 40, B), cache.max_blocks * 64).astype(np.int32)
    witness = "decode_witness_kth_fp8" if kth else "decode_witness_fp8"
    assert {c.rsplit("_h", 1)[0] for c in fk.calls} == {
        "decode_logits_fp8", "decode_fused_fp8", witness}  # fmt: skip
    assert any(c.endswith("_n2") for c in fk.calls) == (rows and n == 2)


# ---- GPU (sm_90a) ----------------------------------------------------------------------


# the scan: decode_scan (gathered tiles), decode_scan_tma with the device's SMs, or with one
# SM's worth of blocks (every block takes many pages: its consumers' rings wrap)
TMA = pytest.mark.parametrize("tma", [None, 0, 1], ids=["gather", "tma", "tma_1sm"])


def _use_scan(monkeypatch, tma) -> None:
    """decode_ops set to the scan ``tma`` names (TMA's values)."""
    monkeypatch.setattr(dops, "DECODE_TMA", tma is not None)  # forced either way
    if tma:
        monkeypatch.setattr(dops, "num_sms", lambda: tma)


@TMA
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("H", [32, 64, 20, 48])  # padded heads: 20 → 32, 48 → 64
@needs_sm90a
@gpu
def test_gpu_fp8_paged_logits_equal_prefill_dense(monkeypatch, H, n, tma):
    """Paged FP8 logits of request b == the prefill FP8 dense logits over its gathered keys,
    bitwise (one arithmetic for every route) — by decode_scan and by decode_scan_tma
    (decode_ops.DECODE_TMA), which must agree with a kernel of another family."""
    import dosa_cupy

    _use_scan(monkeypatch, tma)
    B = 2
    cache = PagedCache(B, 20 * 64, seed=H + 1)
    rs = cache.rs
    L = np.array([20 * 64 - 7, 300], dtype=np.int32)
    qp, wq = _queries(rs, rs.standard_normal((B, n, H, 128)), n, H)
    dev = [cp.asarray(x) for x in (qp, wq, cache.kv, cache.scale, cache.block_table, L)]
    lg = dec.paged_logits(*dev, scorer="fp8")
    ke = dec.visible_ends(L, n)
    for b, (p, s) in enumerate(dec.gather_request_keys(cache.kv, cache.scale,
                                                       cache.block_table, L)):  # fmt: skip
        ref = dosa_cupy.dense_logits(cp.asarray(qp[b]), cp.asarray(wq[b]), cp.asarray(p),
                                     cp.asarray(s), ke=cp.asarray(ke[b]), scorer="fp8")  # fmt: skip
        got = lg[b, :, : p.shape[0]]
        assert cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32))
        assert bool(cp.all(lg[b, :, p.shape[0] :] == -cp.inf))


@TMA
@pytest.mark.parametrize("H", [32, 64, 48])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("B", [1, 3])
@needs_sm90a
@gpu
def test_gpu_fp8_decode_walk(monkeypatch, B, n, H, tma):
    """The fused FP8 step == the FP8 dense decode route, bitwise, every step; on the first
    steps also == the numpy emulation of the FP8 kernels (brute force of their bits) — with
    the gathered scan and with decode_scan_tma (both routes then run it: the brute force is
    the independent check)."""
    _use_scan(monkeypatch, tma)
    K, steps = 128, 6
    cache = PagedCache(B, 24 * 64, seed=20 * B + n + H)
    rs = cache.rs
    L = rs.integers(K // 2, 6 * 64, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2, scorer="fp8")
    small = dec.DecodeSelectorGPU(K, history=2, buffer=3, scorer="fp8")  # overflow path
    qf = rs.standard_normal((B, n, H, 128))
    dev = [cp.asarray(x) for x in (cache.kv, cache.scale, cache.block_table)]
    for step in range(steps):
        qp, wq = _queries(rs, qf, n, H)
        args = (cp.asarray(qp), cp.asarray(wq), *dev, cp.asarray(L))
        dense = dec.dense_decode_topk(*args, K, scorer="fp8")
        assert cp.array_equal(sel.step(*args).ids, dense), step
        assert cp.array_equal(small.step(*args).ids, dense), step
        if step < 2:
            assert np.array_equal(cp.asnumpy(dense), _brute(qp, wq, cache, L, K)), step
        L = np.minimum(L + rs.integers(1, 300, B), cache.max_blocks * 64).astype(np.int32)


def _walk_steps(cache, L, H: int, n: int, K: int, steps: int, grow: int):
    """The steps of a drifting FP8 decode walk on ``cache`` from lengths L (int32 [B], grown by
    up to ``grow`` keys a step within the cache; queries drawn after L from ``cache.rs``):
    yields (step, args, dense, L) — the step's device arguments, the FP8 dense decode route's
    ids on them and its host lengths."""
    rs, B = cache.rs, cache.B
    qf = rs.standard_normal((B, n, H, 128))
    dev = [cp.asarray(x) for x in (cache.kv, cache.scale, cache.block_table)]
    for step in range(steps):
        qp, wq = _queries(rs, qf, n, H)
        args = (cp.asarray(qp), cp.asarray(wq), *dev, cp.asarray(L))
        yield step, args, dec.dense_decode_topk(*args, K, scorer="fp8"), L
        L = np.minimum(L + rs.integers(1, grow, B), cache.max_blocks * 64).astype(np.int32)


@pytest.mark.parametrize("small", [True, False], ids=["rank_spread", "block_four"])
@pytest.mark.parametrize("B,n,H", [(1, 1, 64), (1, 2, 32), (2, 2, 64), (3, 2, 32)])
@needs_sm90a
@gpu
def test_gpu_fp8_small_step_by_rank_with_spread_witnesses(monkeypatch, B, n, H, small):
    """decode_ops.RANK_SELECT and WITNESS_SPREAD on (steps of at most dense.RANK_ROWS rows
    select by select_rank; the witnesses of few rows spread over many blocks) and both off
    (select_kernel, four witness blocks per row): the FP8 step == the FP8 dense decode route
    bitwise at every step, eager (with the overflow path too) and replayed from a CUDA
    graph; B · n = 6 rows takes select_kernel either way."""
    monkeypatch.setattr(dops, "RANK_SELECT", small)
    monkeypatch.setattr(dops, "WITNESS_SPREAD", small)
    K, steps = 512, 6
    cache = PagedCache(B, 48 * 64, seed=30 * B + n + H)
    rs = cache.rs
    L = rs.integers(K, 24 * 64, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2, scorer="fp8")
    small = dec.DecodeSelectorGPU(K, history=2, buffer=3, scorer="fp8")  # overflow path
    walk = []
    for step, args, dense, _ in _walk_steps(cache, L, H, n, K, steps, 300):
        walk.append((args[0], args[1], args[-1]))
        assert cp.array_equal(sel.step(*args).ids, dense), step
        assert cp.array_equal(small.step(*args).ids, dense), step
    replay_decode_walk(walk, list(args[2:5]), K, f"fp8 rank B={B} n={n} H={H}", scorer="fp8")


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(
    "B,n,H,K,history",
    [(1, 1, 64, 2048, 2), (1, 2, 32, 2048, 4), (3, 2, 64, 512, 2), (8, 1, 32, 300, 2)],
)
@needs_sm90a
@gpu
def test_gpu_fp8_witness_kth_equals_the_selection_bitwise(monkeypatch, B, n, H, K, history, ties):
    """decode_witness_kth (decode_ops.WITNESS_KTH): after every step of a walk, each row's
    threshold record equals the K-th that select_into finds in the same witness records, and
    the host's sort of them (0 below K records) — up to 16,384 witnesses a row (history 4,
    next_n 2) and, with ``ties``, every page the same 64 keys, so that thousands of witnesses
    share each score and the K-th is decided in the id's digits; the step's ids equal the
    FP8 dense decode route's, eager and replayed from a CUDA graph."""
    monkeypatch.setattr(dops, "WITNESS_KTH", True)
    cache = PagedCache(B, 400 * 64, seed=40 * B + n + H + K)
    if ties:
        cache.kv[...] = cache.kv[:1]
        cache.scale[...] = cache.scale[:1]
    L = cache.rs.integers(K // 2, 200 * 64, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=history, scorer="fp8")
    walk = []
    for step, args, dense, _ in _walk_steps(cache, L, H, n, K, 5, 3000):
        walk.append((args[0], args[1], args[-1]))
        assert cp.array_equal(sel.step(*args).ids, dense), step
        ws = sel._ws
        kth = cp.zeros_like(ws.thr)
        dops.select_into(K, ws.wrec, ws.wcnt, None, kth, ws.scratch)
        assert cp.array_equal(ws.thr, kth), step
        cnt, wrec = cp.asnumpy(ws.wcnt), cp.asnumpy(ws.wrec)
        for r in range(B * n):
            c = np.sort(wrec[r, : cnt[r]])
            assert int(ws.thr[r]) == (int(c[-K]) if c.size >= K else 0), (step, r)
        assert not ws.ticket.any(), step  # the last blocks reset the tickets
    replay_decode_walk(walk, list(args[2:5]), K, f"fp8 witkth B={B} n={n} H={H}", scorer="fp8")


@pytest.mark.parametrize("H,B,K", [(64, 3, 512), (32, 8, 300), (48, 1, 2048)])
@needs_sm90a
@gpu
def test_gpu_fp8_witness_rows_equal_a_block_per_row(monkeypatch, H, B, K):
    """decode_witness_fp8_h{H}_n2 (decode_ops.WITNESS_ROWS, next_n 2): after every step of a
    walk, each row's witness records equal, as a set, those of decode_witness_fp8 (a block
    per row) on the same witness table, and so do the threshold records; the step's ids equal
    the FP8 dense decode route's, eager and replayed from a CUDA graph."""
    n = 2
    cache = PagedCache(B, 300 * 64, seed=50 * B + H + K)
    L = cache.rs.integers(K // 2, 150 * 64, B).astype(np.int32)
    monkeypatch.setattr(dops, "WITNESS_ROWS", True)
    sel = dec.DecodeSelectorGPU(K, history=2, scorer="fp8")
    walk = []
    for step, args, dense, _ in _walk_steps(cache, L, H, n, K, 5, 2000):
        walk.append((args[0], args[1], args[-1]))
        assert cp.array_equal(sel.step(*args).ids, dense), step
        ws = sel._ws
        d, _ = sel.begin(*args)  # the step's inputs again (the ring untouched)
        got = [np.sort(cp.asnumpy(ws.wrec[r, : int(ws.wcnt[r])])) for r in range(B * n)]
        cnt, rec = cp.zeros_like(ws.wcnt), cp.zeros_like(ws.wrec)
        with monkeypatch.context() as m:
            m.setattr(dops, "WITNESS_ROWS", False)
            sel._ops.witness_records(d, ws.wit, cnt, rec)
        for r in range(B * n):
            want = np.sort(cp.asnumpy(rec[r, : int(cnt[r])]))
            assert np.array_equal(got[r], want), (step, r)
    replay_decode_walk(walk, list(args[2:5]), K, f"fp8 witrows B={B} H={H}", scorer="fp8")


@TMA
@pytest.mark.parametrize("H", [32, 64])
@needs_sm90a
@gpu
def test_gpu_fp8_step_captured_in_a_cupy_graph(monkeypatch, H, tma):
    """The FP8 step replayed from a CUDA graph equals the eager FP8 step and the FP8 dense
    decode route at every step (gpu_support.replay_decode_walk), both scans."""
    _use_scan(monkeypatch, tma)
    B, n, K, steps = 2, 2, 64, 5
    cache = PagedCache(B, 12 * 64, seed=H + 3)
    rs = cache.rs
    L = rs.integers(K, 6 * 64, B).astype(np.int32)
    qf = rs.standard_normal((B, n, H, 128))
    walk = []
    for _ in range(steps):
        qp, wq = _queries(rs, qf, n, H)
        walk.append((cp.asarray(qp), cp.asarray(wq), cp.asarray(L)))
        L = np.minimum(L + rs.integers(1, 64, B), cache.max_blocks * 64).astype(np.int32)
    dev = [cp.asarray(x) for x in (cache.kv, cache.scale, cache.block_table)]
    replay_decode_walk(walk, dev, K, f"fp8 H={H}", scorer="fp8")


@pytest.mark.parametrize("ahead", [False, True], ids=["due", "ahead"])
@pytest.mark.parametrize("sms", [1, 3, 132])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("H", [32, 64])
@needs_sm90a
@gpu
def test_gpu_fp8_tma_scan_equals_gathered_scan_bitwise(monkeypatch, H, n, sms, ahead):
    """decode_scan_tma against decode_scan on the same step, launched directly: the logits
    bit for bit, the fused scan's counts equal and its records the same set (their order is
    the atomics'), at a threshold that keeps about a fifth of the keys — with blocks of many
    pages (sms = 1, 3: every consumer's ring wraps, the deferred record writes cross pages;
    at sms = 1 a block's 40 pages cross the producer's 32-page chunk of block-table entries
    read ahead) and the device's grid; lengths that end inside a page and one request longer
    than the others; the producer reading each entry when its page is due or ahead
    (dops.TMA_AHEAD)."""
    monkeypatch.setattr(dops, "TMA_AHEAD", ahead)
    B, pages = 3, 40
    cache = PagedCache(B, pages * 64, seed=7 * H + n)
    rs = cache.rs
    L = np.array([pages * 64 - 5, 130, 64 * 17], dtype=np.int32)
    qp, wq = _queries(rs, rs.standard_normal((B, n, H, 128)), n, H)
    q, w = _padded(qp, wq)
    Hp = q.shape[2]
    ke = dec.visible_ends(L, n).reshape(-1).astype(np.int32)
    d = dict(q=cp.asarray(q.reshape(B * n, Hp, 128)), w=cp.asarray(w.reshape(B * n, Hp)),
             kv=cp.asarray(cache.kv.reshape(-1, 128)), scale=cp.asarray(cache.scale.reshape(-1)),
             block_table=cp.asarray(cache.block_table.astype(np.int32)),
             max_blocks=cache.max_blocks, ke=cp.asarray(ke), n=n, B=B, Hp=Hp,
             L=cache.max_blocks * 64, scorer="fp8")  # fmt: skip
    R, Lk = B * n, cache.max_blocks * 64
    out = {}
    for tma in (False, True):
        monkeypatch.setattr(dops, "DECODE_TMA", tma)
        monkeypatch.setattr(dops, "num_sms", lambda: sms)
        lg = cp.empty((R, Lk), dtype=cp.float32)
        dops.scan_fp8(d, False, (lg,))
        out[tma] = [lg]
    assert cp.array_equal(out[False][0].view(cp.uint32), out[True][0].view(cp.uint32))
    # a threshold record per row near its 80th percentile of scores (fused keeps ≥ it)
    lg = cp.asnumpy(out[False][0])
    thr = np.zeros(R, np.uint64)
    for r in range(R):
        vis = lg[r, : ke[r]]
        if vis.size:
            cut = np.float32(np.quantile(vis, 0.8))
            thr[r] = np.uint64(int(score_code(np.array([cut], np.float32))[0]) << 32)
    cap = Lk
    for tma in (False, True):
        monkeypatch.setattr(dops, "DECODE_TMA", tma)
        cnt = cp.zeros(R, dtype=cp.uint32)
        rec = cp.zeros((R, cap), dtype=cp.uint64)
        dops.scan_fp8(d, True, (cp.asarray(thr), cnt, rec, np.int64(cap)))
        out[tma] += [cp.asnumpy(cnt), cp.asnumpy(rec)]
    (_, c0, r0), (_, c1, r1) = out[False], out[True]
    assert np.array_equal(c0, c1) and c0.sum() > 0
    for r in range(R):
        assert np.array_equal(np.sort(r0[r, : c0[r]]), np.sort(r1[r, : c1[r]])), r


# ---- the decode screen (decode_ops.SCREEN_R; score_fp8.cu decode_screen_tma) --------------


def _screen_survivors_match_emulation(sel, cache, L, label) -> None:
    """After a screened step of ``sel``: each request's survivor list (its ids distinct, in
    [0, max ke)) equals ``emulate.decode_screen_keep`` of the step's own device plans and
    thresholds, bit for bit."""
    from dosa_cupy.emulate import decode_screen_keep

    ws = sel._ws
    s, pl = ws.scr, ws.scr.plan
    n = ws.key[1]
    get = cp.asnumpy
    rows, om, sig, C, er = (get(x) for x in (pl.rows, pl.omega, pl.sigma, pl.C, pl.eps_raw))
    valid, thr, ke = get(pl.valid), get(ws.thr), get(ws.ke)
    cnt, sids = get(s.scount), get(s.sids)
    for b, (kp, ksc) in enumerate(dec.gather_request_keys(cache.kv, cache.scale,
                                                          cache.block_table, L)):  # fmt: skip
        r = slice(b * n, b * n + n)
        want = decode_screen_keep(rows[r], om[r], sig[r], C[r], er[r], pl.eps_out, valid[r],
                                  thr[r], kp, ksc, ke[r])  # fmt: skip
        got = sids[b, : int(cnt[b])]
        assert np.unique(got).size == got.size, f"{label} request {b}: an id appended twice"
        assert np.array_equal(np.sort(got), np.flatnonzero(want)), f"{label} request {b}"


@pytest.mark.parametrize("sms", [None, 1], ids=["grid", "1sm"])
@pytest.mark.parametrize("r", [14, 30])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("H", [64, 32])
@needs_sm90a
@gpu
def test_gpu_decode_screen_equals_dense_and_its_emulation(monkeypatch, H, n, r, sms):
    """A screened FP8 step == the FP8 dense decode route bitwise at every step (also with a
    bounded buffer: the extension scores the survivors again), its survivors == the kernel's
    numpy model on the step's own plans and thresholds (whose pruning
    tests/test_decode_certificate.py shows), with the stats' scored counts between the
    compacted and the visible ones; then the walk replayed from a CUDA graph. With one SM's
    worth of blocks every consumer's ring wraps."""
    monkeypatch.setattr(dops, "SCREEN_R", r)
    if sms:
        monkeypatch.setattr(dops, "num_sms", lambda: sms)
    B, K, steps = 2, 64, 5
    cache = PagedCache(B, 20 * 64, seed=11 * H + 3 * n + r)
    rs = cache.rs
    L = rs.integers(8 * 64, 12 * 64, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2, scorer="fp8")
    small = dec.DecodeSelectorGPU(K, history=2, buffer=5, scorer="fp8")  # overflow path
    walk = []
    for step, args, dense, Lh in _walk_steps(cache, L, H, n, K, steps, 200):
        walk.append((args[0], args[1], args[-1]))
        out = sel.step(*args)
        assert cp.array_equal(out.ids, dense), step
        st = out.stats
        assert np.all(st.scored <= st.visible) and np.all(st.compacted <= st.scored), step
        _screen_survivors_match_emulation(sel, cache, Lh, f"step {step}")
        assert cp.array_equal(small.step(*args).ids, dense), step
    replay_decode_walk(walk, list(args[2:5]), K, f"screen r={r} n={n} H={H}", scorer="fp8")
