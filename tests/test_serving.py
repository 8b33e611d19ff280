"""Ragged batches and paged prefill (dosa_cupy/serving.py; docs/serving.md).

CPU: argument validation (before any CuPy use), and the host logic of both functions with
numpy standing in for CuPy and an exact float64 Top-K (dosa_ref) standing in for
``dosa_topk``.  GPU: a ragged batch of 8 requests in one call equals 8 separate
``dosa_topk`` calls bitwise and ``dense_topk`` per request; paged prefill equals the
contiguous call, and ``physical=True`` equals ``decode.physical_rows`` of its ids."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu, numpy_as_cupy

from dosa_cupy import decode as dec
from dosa_cupy import prepare
from dosa_cupy import serving as S
from dosa_ref import index_scores, topk_ids
from dosa_ref.fp8 import e4m3_values, quantize_keys, quantize_queries

# ---------------------------------------------------------------------------------------
# Host workloads (numpy): B requests of H heads, concatenated
# ---------------------------------------------------------------------------------------


def _ragged_host(qn, nk, H=16, seed=0):
    """(q uint8 [ΣQn, H, 128], w fp32 [ΣQn, H], kp uint8 [ΣN, 128], ksc fp32 [ΣN], cu_q,
    cu_k int32 [B + 1]) with structured keys, so that scores tie and spread."""
    rs = np.random.default_rng(seed)
    kf = rs.standard_normal((sum(nk), 128)).astype(np.float32)
    kf[1::2] = kf[0:-1:2]  # pairs of equal keys: equal scores, ordered by id
    kp, ksc = quantize_keys(kf)
    qf = rs.standard_normal((sum(qn), H, 128))
    q, w = quantize_queries(qf, np.where(rs.random((sum(qn), H)) < 0.75, 1.0, -0.5))
    cu = [np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (qn, nk)]
    return q, w, kp, ksc, cu[0], cu[1]


def _exact_topk(q, w, kp, ksc, K, ks=None, ke=None, **options):
    """A stand-in for ``dosa_topk``: exact float64 Top-K of the dequantized inputs (scores
    per key independent of the other keys, ties by id), recording its options."""
    _exact_topk.seen = options
    k = e4m3_values(np.asarray(kp)) * np.asarray(ksc, np.float64)[:, None]
    s = index_scores(e4m3_values(np.asarray(q)), np.asarray(w, np.float64), k, ks, ke)
    return topk_ids(s, K)


@pytest.fixture
def numpy_gpu(monkeypatch):
    """numpy as CuPy in serving.py / prepare.as_device, and ``_exact_topk`` as dosa_topk."""
    shim = numpy_as_cupy()
    monkeypatch.setattr(S, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(prepare, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(S, "dosa_topk", _exact_topk)


def _per_request(q, w, kp, ksc, K, cu_q, cu_k, causal=True):
    """Each request's own call: ids [Qn_b, K] relative to its first key."""
    out = []
    for b in range(cu_q.size - 1):
        qa, qb, ka, kb = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        n, m = kb - ka, qb - qa
        ke = np.arange(n - m + 1, n + 1) if causal else np.full(m, n)
        out.append(_exact_topk(q[qa:qb], w[qa:qb], kp[ka:kb], ksc[ka:kb], K,
                               np.zeros(m, np.int64), ke))  # fmt: skip
    return out


class Paged:
    """Requests' keys (logical order) written through a shuffled block table; unused
    table entries −1 (never read)."""

    def __init__(self, kp, ksc, cu_k, seed, spare=3, xp=np):
        """kp uint8 [ΣN, 128], ksc fp32 [ΣN], cu_k [B + 1] on the host; arrays of ``xp``."""
        rs = np.random.default_rng(seed)
        L = np.diff(np.asarray(cu_k)).astype(np.int64)
        nblk = (L + dec.PAGE - 1) // dec.PAGE
        mb, nb = max(1, int(nblk.max(initial=0)) + 1), int(nblk.sum()) + spare
        perm = rs.permutation(nb)
        bt = np.full((L.size, mb), -1, np.int32)
        a = 0
        for b, c in enumerate(nblk.tolist()):
            bt[b, :c] = perm[a : a + c]
            a += c
        rows = [np.zeros(0, np.int64)]
        for b, n in enumerate(L.tolist()):
            rows.append(dec.physical_rows(bt[b : b + 1], np.arange(n)[None, :])[0])
        rows = np.concatenate(rows)
        kv = rs.integers(0, 0x7E, (nb * dec.PAGE, 128)).astype(np.uint8)  # other tokens
        sc = np.ones(nb * dec.PAGE, np.float32)
        kv[rows], sc[rows] = kp, ksc
        self.kv = xp.asarray(kv.reshape(nb, dec.PAGE, 128))
        self.scale = xp.asarray(sc.reshape(nb, dec.PAGE))
        self.block_table = xp.asarray(bt)
        self.lengths = xp.asarray(L.astype(np.int32))
        self.num_blocks = nb


# ---------------------------------------------------------------------------------------
# CPU: validation (no CuPy needed: it runs before any device work)
# ---------------------------------------------------------------------------------------


def _good(B=3, H=16):
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([2, 0, 3], [5, 4, 70], H)
    return dict(q=q, w=w, k_payload=kp, k_scale=ksc, K=4, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def _bad_ragged():
    g = _good()
    return [
        ("q", dict(q=g["q"][:, :, :64])),
        ("q", dict(q=g["q"][0])),
        ("w", dict(w=g["w"][:, :3])),
        ("k_payload", dict(k_payload=g["k_payload"][:, :8])),
        ("k_scale", dict(k_scale=g["k_scale"][:-1])),
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([1, 2, 2, 5]))),  # not from 0
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([0, 3, 2, 5]))),  # decreasing
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([0, 2, 2, 4]))),  # total ≠ q rows
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([0.0, 2, 2, 5]))),  # not integers
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([[0, 2, 2, 5]]))),
        ("cu_seqlens_q", dict(cu_seqlens_q=None)),
        ("cu_seqlens_k", dict(cu_seqlens_k=np.array([0, 5, 79]))),  # B + 1 ≠ 4
        ("cu_seqlens_k", dict(cu_seqlens_k=np.array([0, 5, 9, 78]))),
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([0, 2, 2, 5]),
                              cu_seqlens_k=np.array([0, 5, 77, 79]))),  # 3 queries, 2 keys
        ("causal", dict(causal=1)),
        ("ids_dtype", dict(ids_dtype="int16")),
        ("ids_dtype", dict(ids_dtype="float64")),
        ("ids_dtype", dict(ids_dtype=object())),
        ("page_table", dict(page_table=np.zeros((2, 2), np.int32))),  # B rows
        ("page_table", dict(page_table=np.zeros((3, 1), np.int32))),  # 70 tokens > 64
        ("page_table", dict(page_table=np.zeros((3, 2), np.float32))),
    ]  # fmt: skip


@pytest.mark.parametrize("name,change", _bad_ragged())
def test_ragged_validation_names_the_argument(name, change):
    args = {**_good(), **change}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        S.ragged_topk(**args)


def _good_paged():
    g = _good()
    pc = Paged(g["k_payload"], g["k_scale"], g["cu_seqlens_k"], seed=1)
    return dict(q=g["q"], w=g["w"], kv_payload=pc.kv, kv_scale=pc.scale,
                block_table=pc.block_table, lengths=pc.lengths, cu_seqlens_q=g["cu_seqlens_q"],
                K=4)  # fmt: skip


def _bad_paged():
    g = _good_paged()
    return [
        ("kv_payload", dict(kv_payload=g["kv_payload"].reshape(-1, 128))),
        ("kv_payload", dict(kv_payload=g["kv_payload"][:, :32])),
        ("kv_scale", dict(kv_scale=g["kv_scale"][:-1])),
        ("lengths", dict(lengths=np.array([5, -1, 70]))),
        ("lengths", dict(lengths=np.array([5.0, 4, 70]))),
        ("block_table", dict(block_table=g["block_table"][:2])),
        ("block_table", dict(block_table=g["block_table"][:, :1])),  # 70 tokens
        ("block_table", dict(block_table=g["block_table"].astype(np.float64))),
        ("cu_seqlens_q", dict(cu_seqlens_q=np.array([0, 2, 5]))),  # B = 3 requests
        ("cu_seqlens_q", dict(lengths=np.array([1, 4, 70]))),  # 2 queries, 1 token
        ("q", dict(q=g["q"][:, :, :100])),
        ("w", dict(w=g["w"][:-1])),
        ("ids_dtype", dict(ids_dtype="uint32")),
        ("physical", dict(physical="yes")),
    ]


@pytest.mark.parametrize("name,change", _bad_paged())
def test_paged_validation_names_the_argument(name, change):
    args = {**_good_paged(), **change}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        S.paged_prefill_topk(**args)


def test_block_table_entries_are_checked(numpy_gpu):
    g = _good_paged()
    bt = np.array(g["block_table"])
    bt[2, 1] = g["kv_payload"].shape[0]  # a used block outside the cache
    with pytest.raises(ValueError, match=r"^block_table: block_table\[2, 1\]"):
        S.paged_prefill_topk(**{**g, "block_table": bt})
    bt[2, 1], bt[0, 0] = 0, -3
    with pytest.raises(ValueError, match=r"^block_table: block_table\[0, 0\]"):
        S.paged_prefill_topk(**{**g, "block_table": bt})
    r = _good()
    pt = np.array(g["block_table"])
    pt[2, 1] = -1
    with pytest.raises(ValueError, match=r"^page_table: page_table\[2, 1\]=-1 negative"):
        S.ragged_topk(**r, page_table=pt)
    S.ragged_topk(**r, page_table=pt, check=False)  # the caller's promise: not read
    with pytest.raises(ValueError, match="^seed_ids:"):
        S.ragged_topk(**r, seed_ids=np.full((5, 2), 5))  # request 0 has 5 keys


# ---------------------------------------------------------------------------------------
# CPU: the host logic, numpy for CuPy, an exact float64 Top-K for dosa_topk
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ids_dtype", ["int64", "int32", np.int32])
def test_ragged_equals_per_request_calls(numpy_gpu, causal, ids_dtype):
    qn, nk = [3, 0, 7, 1, 5], [40, 9, 130, 1, 5]
    q, w, kp, ksc, cu_q, cu_k = _ragged_host(qn, nk, seed=3)
    K = 16
    got = S.ragged_topk(q, w, kp, ksc, K, cu_q, cu_k, causal=causal, ids_dtype=ids_dtype,
                        route="dense")  # fmt: skip
    assert got.dtype == np.dtype(ids_dtype) and got.shape == (sum(qn), K)
    assert _exact_topk.seen == {"route": "dense"}  # options reach dosa_topk
    want = np.concatenate(_per_request(q, w, kp, ksc, K, cu_q, cu_k, causal))
    assert np.array_equal(got, want)
    # the page-table transform: physical rows of each request's logical ids
    pc = Paged(kp, ksc, cu_k, seed=4)
    phys = S.ragged_topk(q, w, kp, ksc, K, cu_q, cu_k, causal=causal, page_table=pc.block_table)
    for b in range(len(qn)):
        rows = slice(cu_q[b], cu_q[b + 1])
        ref = dec.physical_rows(pc.block_table[b : b + 1], want[rows].reshape(1, -1))
        assert np.array_equal(phys[rows], ref.reshape(-1, K)), b


def test_ragged_seed_ids_are_request_relative(numpy_gpu):
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([2, 3], [10, 20], seed=5)
    seeds = np.array([[0, -1], [9, 1], [0, 19], [-1, -1], [3, 4]])
    S.ragged_topk(q, w, kp, ksc, 4, cu_q, cu_k, seed_ids=seeds)
    want = np.array([[0, -1], [9, 1], [10, 29], [-1, -1], [13, 14]])
    assert np.array_equal(_exact_topk.seen["seed_ids"], want)


def test_ragged_keeps_position_zero_and_pads(numpy_gpu):
    """K above a request's visible keys: every position is selected — position 0 of the
    first request (global id 0) included — and the rest is −1."""
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([2, 3], [5, 20], seed=10)
    got = S.ragged_topk(q, w, kp, ksc, 8, cu_q, cu_k)
    assert np.array_equal(got, np.concatenate(_per_request(q, w, kp, ksc, 8, cu_q, cu_k)))
    assert sorted(got[0][got[0] >= 0].tolist()) == [0, 1, 2, 3] and (got[0][4:] == -1).all()
    assert sorted(got[1][got[1] >= 0].tolist()) == [0, 1, 2, 3, 4]


def test_ragged_seed_ids_outside_their_request_raise(numpy_gpu):
    """A relative seed id at or above its own request's N_b names another request's key:
    ValueError naming seed_ids (also for the second request, whose keys start at 10)."""
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([2, 3], [10, 20], seed=5)
    for row, val in ((0, 10), (2, 20), (4, -2)):
        seeds = np.full((5, 2), -1)
        seeds[row, 1] = val
        with pytest.raises(ValueError, match="seed_ids"):
            S.ragged_topk(q, w, kp, ksc, 4, cu_q, cu_k, seed_ids=seeds)
    seeds = np.full((5, 2), -1)
    seeds[2, 1] = 19  # the last key of request 1: legal
    S.ragged_topk(q, w, kp, ksc, 4, cu_q, cu_k, seed_ids=seeds)
    assert _exact_topk.seen["seed_ids"][2, 1] == 29


def test_host_offsets_edge_cases(numpy_gpu):
    """Offsets: None is missing, a CuPy-like array (``.get()``) is read back, a uint64 entry
    beyond int64 is refused; a page table needs ceil(N_b / 64) blocks per request (64
    tokens fit one), and block ids of any size are accepted when num_blocks is not known."""
    g = _good()
    with pytest.raises(ValueError, match="cu_seqlens_q: missing"):
        S.ragged_topk(**dict(g, cu_seqlens_q=None))

    class Dev:  # the host read-back of a device array
        def __init__(self, a):
            self.a, self.shape, self.dtype = a, a.shape, a.dtype

        def get(self):
            return self.a

    want = S.ragged_topk(**g)
    assert np.array_equal(S.ragged_topk(**dict(g, cu_seqlens_k=Dev(g["cu_seqlens_k"]))), want)
    huge = np.array([0, 2, 2, 2**64 - 1], np.uint64)
    with pytest.raises(ValueError, match="cu_seqlens_q: entries too large for int64"):
        S.ragged_topk(**dict(g, cu_seqlens_q=huge))
    # the requests hold 5, 4 and 70 tokens (_good): 1, 1 and 2 blocks of 64
    table = np.array([[500, -1], [7, -1], [900, 901]], np.int32)
    S.ragged_topk(**g, page_table=table)  # block ids of any size (no num_blocks here)
    with pytest.raises(ValueError, match="page_table"):
        S.ragged_topk(**g, page_table=table[:, :1])  # request 2's 70 tokens need two blocks
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([1], [64], seed=11)  # 64 tokens in one block
    S.ragged_topk(q, w, kp, ksc, 4, cu_q, cu_k, page_table=np.array([[3]], np.int32))


def test_too_many_keys_for_int32_ids():
    """Σ N_b at the int32 id limit is refused before any device work (shapes only)."""

    class Shaped:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)

    g = _good()
    big = prepare.MAX_KEYS  # the first key count int32 ids cannot hold
    with pytest.raises(ValueError, match="k_payload: .* too many"):
        S.ragged_topk(**dict(g, k_payload=Shaped((big, 128), np.uint8),
                             k_scale=Shaped((big,), np.float32)))  # fmt: skip


def test_paged_prefill_equals_contiguous(numpy_gpu):
    qn, nk = [4, 1, 0, 9], [100, 64, 3, 200]
    q, w, kp, ksc, cu_q, cu_k = _ragged_host(qn, nk, seed=6)
    pc = Paged(kp, ksc, cu_k, seed=7)
    K = 8
    args = (q, w, pc.kv, pc.scale, pc.block_table, pc.lengths, cu_q, K)
    got = S.paged_prefill_topk(*args, ids_dtype="int32")
    want = S.ragged_topk(q, w, kp, ksc, K, cu_q, cu_k)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    phys = S.paged_prefill_topk(*args, physical=True)
    ref = _rows_oracle(pc.block_table, np.repeat(np.arange(len(qn)), qn), want)
    assert phys.dtype == np.int64 and np.array_equal(phys, ref)
    # the physical rows hold the keys the logical ids name
    flat = np.asarray(pc.kv).reshape(-1, 128)
    sel = (want >= 0).nonzero()
    start = np.repeat(cu_k[:-1], qn)[sel[0]]
    assert np.array_equal(flat[phys[sel]], kp[want[sel] + start])


def _rows_oracle(bt, req, ids):
    """Cache row of each logical id, element by element: block_table[request, id // 64]·64
    + id % 64, −1 for −1."""
    out = np.full(ids.shape, -1, np.int64)
    for r, i in np.ndindex(*ids.shape):
        if ids[r, i] >= 0:
            out[r, i] = int(bt[req[r], ids[r, i] // 64]) * 64 + int(ids[r, i]) % 64
    return out


def test_page_rows_equals_physical_rows():
    """page_rows and physical_rows (which calls it) against the formula written out."""
    rs = np.random.default_rng(8)
    bt = rs.permutation(40)[:24].reshape(3, 8).astype(np.int32)
    ids = rs.integers(-1, 8 * 64, (3, 50))
    want = dec.physical_rows(bt, ids)
    assert np.array_equal(want, _rows_oracle(bt, np.arange(3), ids))
    req = np.array([2, 0, 1, 2])
    got = S.page_rows(bt, req, ids[req])
    assert np.array_equal(got, _rows_oracle(bt, req, ids[req]))


def test_empty_batch(numpy_gpu):
    q, w, kp, ksc, cu_q, cu_k = _ragged_host([], [], seed=9)
    got = S.ragged_topk(q, w, kp, ksc, 4, np.zeros(1, np.int32), np.zeros(1, np.int32))
    assert got.shape == (0, 4) and got.dtype == np.int64


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------


def _ragged_gpu(regime, qn, nk, H, seed):
    """8 requests from make_gpu_workload, concatenated (each request its own keys and
    queries, causal: the queries are the request's last tokens)."""
    from dosa_cupy.workload import make_gpu_workload

    parts = [make_gpu_workload(regime, m, n, H, seed=seed + b)
             for b, (m, n) in enumerate(zip(qn, nk, strict=True))]  # fmt: skip
    cat = {k: cp.concatenate([p[k] for p in parts]) for k in ("q", "w", "k_payload", "k_scale")}
    cu_q = cp.asarray(np.concatenate([[0], np.cumsum(qn)]).astype(np.int32))
    cu_k = cp.asarray(np.concatenate([[0], np.cumsum(nk)]).astype(np.int32))
    return parts, cat, cu_q, cu_k


def _gpu_ranges(m, n, causal):
    ke = np.arange(n - m + 1, n + 1) if causal else np.full(m, n)
    return cp.zeros(m, dtype=cp.int32), cp.asarray(ke.astype(np.int32))


QN = [1, 300, 17, 64, 128, 5, 250, 33]
NK = [3000, 20000, 4096, 9000, 15000, 3001, 12345, 7777]


@pytest.mark.parametrize(
    "regime,H,K,causal",
    [("calibrated", 32, 256, True), ("ties", 64, 256, True), ("calibrated", 64, 2048, True),
     ("ties", 32, 2048, False)],
)  # fmt: skip
@gpu
def test_gpu_ragged_batch_equals_separate_calls(regime, H, K, causal):
    import dosa_cupy

    parts, cat, cu_q, cu_k = _ragged_gpu(regime, QN, NK, H, seed=H + K)
    args = (cat["q"], cat["w"], cat["k_payload"], cat["k_scale"], K, cu_q, cu_k)
    got = S.ragged_topk(*args, causal=causal)
    got32 = S.ragged_topk(*args, causal=causal, ids_dtype="int32")
    assert got.dtype == cp.int64 and got32.dtype == cp.int32
    assert cp.array_equal(got32.astype(cp.int64), got)
    a = 0
    for b, p in enumerate(parts):
        m, n = QN[b], NK[b]
        ks, ke = _gpu_ranges(m, n, causal)
        one = (p["q"], p["w"], p["k_payload"], p["k_scale"], K, ks, ke)
        sep = dosa_cupy.dosa_topk(*one)
        assert cp.array_equal(got[a : a + m], sep), b
        assert cp.array_equal(sep, dosa_cupy.dense_topk(*one)), b
        a += m


@pytest.mark.parametrize("H,K", [(32, 256), (64, 2048)])
@gpu
def test_gpu_paged_prefill_equals_contiguous(H, K):
    parts, cat, cu_q, cu_k = _ragged_gpu("calibrated", QN, NK, H, seed=5)
    host = (cp.asnumpy(cat["k_payload"]), cp.asnumpy(cat["k_scale"]), cp.asnumpy(cu_k))
    pc = Paged(*host, seed=6, xp=cp)
    args = (cat["q"], cat["w"], pc.kv, pc.scale, pc.block_table, pc.lengths, cu_q, K)
    got = S.paged_prefill_topk(*args)
    want = S.ragged_topk(cat["q"], cat["w"], cat["k_payload"], cat["k_scale"], K, cu_q, cu_k)
    assert cp.array_equal(got, want)
    phys = S.paged_prefill_topk(*args, physical=True, ids_dtype="int32")
    assert phys.dtype == cp.int32
    a = 0
    for b, m in enumerate(QN):
        ref = dec.physical_rows(pc.block_table[b : b + 1], want[a : a + m].reshape(1, -1), cp)
        assert cp.array_equal(phys[a : a + m].astype(cp.int64), ref.reshape(m, K)), b
        a += m
    # the same through the page-table option of ragged_topk
    viaopt = S.ragged_topk(cat["q"], cat["w"], cat["k_payload"], cat["k_scale"], K, cu_q, cu_k,
                           page_table=pc.block_table)  # fmt: skip
    assert cp.array_equal(viaopt, phys.astype(cp.int64))
