"""DoSA decode on the paged FP8 cache (dosa_cupy.decode, docs/method.md §10; issue 6).

GPU tests (marked ``gpu``; skipped with a reason without CuPy / a GPU):
  * over random walks (B ∈ {1, 3}, next_n ∈ {1, 2}, H ∈ {32, 64}, growing contexts,
    shuffled block tables) the fused DoSA decode ids == the dense decode route's ids
    bitwise, every step;
  * both agree with ``dosa_ref.decode`` on the dequantized inputs, tie-agnostically within
    the scorer error bound of ``dosa_ref.numeric.ErrorModel`` (docs/design.md: count, no
    duplicates, visible ids, min(selected) ≥ max(unselected) − 2β);
  * the paged logits equal the prefill ``dense_logits`` on the gathered keys bit for bit
    (one arithmetic for every route);
  * the overflow path (tiny buffer) and history = 0 stay exact.
CPU tests (run anywhere): paging index arithmetic (block table → cache rows, visible
ranges) against ``dosa_ref.decode``; witness tables; the numpy emulation of the selector's
step equals ``dosa_ref.decode.DecodeSelector`` (ids and stats) over random walks with
overflows; validation errors name the argument; kernel names / constants match decode.cu.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, param_types
from gpu_support import cp, gpu, numpy_as_cupy, replay_decode_walk

from dosa_cupy import decode as dec
from dosa_cupy import decode_ops as dops
from dosa_cupy.emulate import make_records
from dosa_ref.decode import DecodeSelector
from dosa_ref.fp8 import e4m3_values, quantize_keys, quantize_queries

# ---------------------------------------------------------------------------------------
# Paged workloads (host, numpy): keys written through a shuffled block table
# ---------------------------------------------------------------------------------------


class PagedCache:
    """Requests' keys (logical order) scattered into a shuffled paged cache."""

    def __init__(self, B, max_tokens, seed, spare=3, topics=True):
        rs = np.random.default_rng(seed)
        mb = -(-max_tokens // dec.PAGE)
        nb = B * mb + spare
        self.rs, self.B, self.max_blocks, self.num_blocks = rs, B, mb, nb
        kf = rs.standard_normal((nb * dec.PAGE, 128)).astype(np.float32)
        if topics:  # structured keys: a few shared directions with heavy-tailed loadings
            t = rs.standard_normal((4, 128)).astype(np.float32)
            load = rs.exponential(1.0, (nb * dec.PAGE, 4)).astype(np.float32) ** 2
            kf += 1.5 * (load * (rs.random((nb * dec.PAGE, 4)) < 0.3)) @ t
        kp, ksc = quantize_keys(kf)
        self.kv = kp.reshape(nb, dec.PAGE, 128)
        self.scale = ksc.reshape(nb, dec.PAGE)
        self.block_table = rs.permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32)

    def keys(self, lengths):
        """Per-request dequantized keys [L_b, 128] in logical order (float64)."""
        out = []
        for p, s in dec.gather_request_keys(self.kv, self.scale, self.block_table, lengths):
            out.append(e4m3_values(p) * s.astype(np.float64)[:, None])
        return out


def _queries(rs, qf, n, H):
    """Drifting queries of one step: e4m3 payload [B, n, H, 128] + folded weights."""
    B = qf.shape[0]
    qf[:] = 0.9 * qf + 0.35 * rs.standard_normal(qf.shape)
    w = rs.standard_normal((B, n, H)).astype(np.float32)
    w[..., : max(1, H // 4)] = np.abs(w[..., : max(1, H // 4)])
    qp, wq = quantize_queries(qf.reshape(B * n, H, 128).astype(np.float32), w.reshape(B * n, H))
    return qp.reshape(B, n, H, 128), wq.reshape(B, n, H)


# ---------------------------------------------------------------------------------------
# CPU: paging index arithmetic
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
def test_visible_ends_match_reference(n):
    B = 5
    L = np.array([0, 1, 2, 63, 200], dtype=np.int32)
    ke = dec.visible_ends(L, n)
    assert ke.dtype == np.int32 and ke.shape == (B, n)
    # dosa_ref.decode's rule, through its public stats: |Ω| of each row with ks = 0
    sel = DecodeSelector(1, history=0)
    keys = [np.ones((int(x), 3)) for x in L]
    st = sel.step(np.ones((B, n, 1, 3)), np.ones((B, n, 1)), keys, lengths=L).stats
    assert np.array_equal(ke, st.visible)
    for b in range(B):
        for j in range(n):
            assert ke[b, j] == max(0, int(L[b]) - n + j + 1)


def test_physical_rows_and_gather_roundtrip():
    rs = np.random.default_rng(7)
    B, mb = 3, 5
    nb = B * mb + 2
    bt = rs.permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32)
    L = np.array([1, 64, 5 * 64], dtype=np.int32)
    # token t of request b is written at cache row bt[b, t // 64]·64 + t % 64
    logical = [rs.integers(0, 255, (int(x), 128), dtype=np.uint8) for x in L]
    kv = np.zeros((nb * 64, 128), dtype=np.uint8)
    sc = np.zeros(nb * 64, dtype=np.float32)
    for b in range(B):
        for t in range(int(L[b])):
            kv[bt[b, t // 64] * 64 + t % 64] = logical[b][t]
            sc[bt[b, t // 64] * 64 + t % 64] = b * 1000 + t
    got = dec.gather_request_keys(kv.reshape(nb, 64, 128), sc.reshape(nb, 64), bt, L)
    for b in range(B):
        assert np.array_equal(got[b][0], logical[b])
        assert np.array_equal(got[b][1], b * 1000 + np.arange(int(L[b]), dtype=np.float32))
    ids = np.array([[0, 63, 64, -1], [1, 2, 319, -5], [65, 128, 200, 0]])
    rows = dec.physical_rows(bt, ids)
    for b in range(B):
        for c, i in enumerate(ids[b]):
            want = -1 if i < 0 else bt[b, i // 64] * 64 + i % 64
            assert rows[b, c] == want


def test_witness_table_distinct_union():
    e1 = np.array([[5, 3, -1, 3], [7, 7, 7, 1]], dtype=np.int32)
    e2 = np.array([[3, 9, 2, -1]], dtype=np.int32)  # a step with B = 1
    t = dec.witness_table([e1, e2], 3)
    assert t.shape == (3, 8) and t.dtype == np.int32
    for b, want in enumerate([[2, 3, 5, 9], [1, 7], []]):
        row = t[b][t[b] >= 0]
        assert np.array_equal(row, want)  # sorted and distinct
    assert dec.witness_table([], 2) is None
    assert dec.witness_table([np.zeros((2, 0), np.int32)], 2) is None


def test_record_scores_inverse():
    from dosa_cupy.emulate import score_code

    x = np.array([-np.inf, -3.5, -0.0, 0.0, 1e-30, 2.0, 3e38, np.inf], dtype=np.float32)
    rec = (score_code(x).astype(np.uint64) << np.uint64(32)) | np.uint64(0xFFFFFFFF)
    back = dops.record_scores(rec)
    assert np.array_equal(back, np.where(x == 0, 0.0, x).astype(np.float64))
    assert dops.record_scores(np.zeros(2, np.uint64)).tolist() == [-np.inf, -np.inf]


def test_witness_blocks():
    """decode_witness_fp8's blocks per row: FP8_WIT_BLOCKS, or with WITNESS_SPREAD up to one
    block per SM in all (at least FP8_WIT_BLOCKS per row), never more than the tiles."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dops, "WITNESS_SPREAD", False)
        assert dops.witness_blocks(64, 1, 132) == dops.FP8_WIT_BLOCKS
        assert dops.witness_blocks(2, 1, 132) == 2 and dops.witness_blocks(0, 1, 132) == 1
    assert dops.WITNESS_SPREAD  # the default
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dops, "WITNESS_SPREAD", True)
        assert dops.witness_blocks(64, 1, 132) == 64 and dops.witness_blocks(0, 1, 132) == 1
        assert dops.witness_blocks(64, 2, 132) == 64 and dops.witness_blocks(64, 4, 132) == 33
        assert dops.witness_blocks(64, 128, 132) == dops.FP8_WIT_BLOCKS
        assert dops.witness_blocks(3, 128, 132) == 3


def test_kernel_names_and_constants_match_source():
    src = (Path(dec.__file__).parent / "csrc" / "decode.cu").read_text()
    for pre in ("decode_logits_mt", "decode_fused_mt", "decode_witness_mt"):
        assert re.search(rf"{pre}##MT", src), pre
    assert re.findall(r"DEC_INST\((\d)\)", src) == ["1", "2", "3", "4"]
    for name, val in (("DEC_PAGE", dec.PAGE), ("DEC_TILE", dops.SCAN_TILE),
                      ("DEC_WIT_KEYS", dops.WIT_KEYS)):  # fmt: skip
        assert re.search(rf"#define {name} {val}\b", src), name
    stages = int(re.search(r"#define DEC_STAGES (\d+)", src).group(1))
    assert dops.SCAN_SMEM == stages * (dops.SCAN_TILE * 128 + dops.SCAN_TILE * 4)
    assert '#include "common.cuh"' in src and "Scorer::score<MT>" in src  # the canonical scorer


# ---------------------------------------------------------------------------------------
# CPU: the selector's step (numpy emulation) equals dosa_ref.decode
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "B,n,H,K,history,buffer",
    [(1, 1, 16, 8, 2, 8), (3, 2, 20, 16, 2, 20), (3, 1, 7, 5, 1, 1000), (2, 2, 33, 4, 0, 6)],
)
def test_numpy_emulation_equals_reference(B, n, H, K, history, buffer):
    cache = PagedCache(B, 6 * 64, seed=B * 100 + n * 10 + H)
    rs = cache.rs
    L = rs.integers(0, 100, B).astype(np.int32)
    L[0] = 1  # a request shorter than K (−1 padding)
    sel = dec.DecodeSelectorGPU(K, history=history, buffer=buffer, backend="numpy")
    ref = DecodeSelector(K, history=history)
    qf = rs.standard_normal((B, n, H, 128))
    overflowed = 0
    for step in range(6):
        qp, wq = _queries(rs, qf, n, H)
        out = sel.step(qp, wq, cache.kv, cache.scale, cache.block_table, L)
        r = ref.step(e4m3_values(qp), wq.astype(np.float64), cache.keys(L), lengths=L)
        assert np.array_equal(out.ids, r.ids), step
        for f in ("witnesses", "tau", "compacted", "visible", "tau_final"):
            assert np.array_equal(getattr(out.stats, f), getattr(r.stats, f)), (step, f)
        for b in range(B):
            assert np.array_equal(sel.witnesses(b), ref.witnesses(b))
        overflowed += sel.last_overflow
        L = np.minimum(L + rs.integers(1, 60, B), cache.max_blocks * 64).astype(np.int32)
    if buffer < 10:
        assert overflowed > 0  # the exact extension was exercised


def _witness_reset_walk(sel):
    cache = PagedCache(3, 128, seed=3)
    rs = cache.rs
    qp, wq = _queries(rs, rs.standard_normal((3, 1, 16, 128)), 1, 16)
    L = np.array([100, 128, 3], dtype=np.int32)  # request 2: every key a witness, id 0 too
    ids = np.asarray(sel.step(qp, wq, cache.kv, cache.scale, cache.block_table, L).ids)
    for b in range(3):  # exactly the step's ids: nothing else in a fresh history
        assert np.array_equal(sel.witnesses(b), np.unique(ids[b, 0][ids[b, 0] >= 0]))
    assert sel.witnesses(3).size == 0 and sel.witnesses(-1).size == 0  # no such slot
    sel.reset(0)
    assert sel.witnesses(0).size == 0 and sel.witnesses(1).size == 4
    assert sel.witnesses(2).tolist() == [0, 1, 2]
    sel.reset(2)
    assert sel.witnesses(2).size == 0 and sel.witnesses(1).size == 4
    sel.reset(7)  # no such slot: nothing happens
    assert sel.witnesses(1).size == 4
    sel.reset()
    assert all(sel.witnesses(b).size == 0 for b in range(3))


def test_numpy_emulation_reset():
    _witness_reset_walk(dec.DecodeSelectorGPU(4, backend="numpy"))


def test_release_forgets_the_witnesses():
    """After ``release`` a selector starts with an empty history (its docstring), also on
    the numpy backend, whose one workspace serves every step shape."""
    cache = PagedCache(3, 128, seed=5)
    rs = cache.rs
    L = np.array([100, 128, 60], dtype=np.int32)
    sel = dec.DecodeSelectorGPU(4, backend="numpy")
    for step in range(2):
        qp, wq = _queries(rs, rs.standard_normal((3, 1, 16, 128)), 1, 16)
        if step == 1:
            assert any(sel.witnesses(b).size for b in range(3))
            sel.release()
        ids = np.asarray(sel.step(qp, wq, cache.kv, cache.scale, cache.block_table, L).ids)
    for b in range(3):  # only the step after the release
        assert np.array_equal(sel.witnesses(b), np.unique(ids[b, 0][ids[b, 0] >= 0]))


def test_cupy_host_code_reset(fake_cupy):
    _witness_reset_walk(dec.DecodeSelectorGPU(4))


# ---------------------------------------------------------------------------------------
# CPU: validation
# ---------------------------------------------------------------------------------------


def _good(B=2, n=1, H=16, nb=5, mb=2):
    return dict(
        q=np.zeros((B, n, H, 128), np.uint8),
        w=np.ones((B, n, H), np.float32),
        kv_payload=np.zeros((nb, 64, 128), np.uint8),
        kv_scale=np.ones((nb, 64), np.float32),
        block_table=np.arange(B * mb, dtype=np.int32).reshape(B, mb) % nb,
        lengths=np.full(B, 70, np.int32),
    )


def _bad_cases():
    g = _good()
    cases = [
        ("q", dict(q=g["q"][0])),
        ("q", dict(q=g["q"].astype(np.int16))),
        ("q", dict(q=np.zeros((2, 3, 16, 128), np.uint8))),  # next_n = 3
        ("q", dict(q=np.zeros((2, 1, 65, 128), np.uint8))),
        ("q", dict(q=np.zeros((2, 1, 16, 64), np.uint8))),
        ("w", dict(w=g["w"].astype(np.float64))),
        ("w", dict(w=np.ones((2, 1, 15), np.float32))),
        ("kv_payload", dict(kv_payload=np.zeros((5, 32, 128), np.uint8))),
        ("kv_payload", dict(kv_payload=np.zeros((5, 64, 128), np.float32))),
        ("kv_scale", dict(kv_scale=np.ones((5, 32), np.float32))),
        ("kv_scale", dict(kv_scale=np.ones((5, 64), np.float64))),
        ("block_table", dict(block_table=np.zeros((3, 2), np.int32))),
        ("block_table", dict(block_table=np.zeros((2, 2), np.float32))),
        ("block_table", dict(block_table=np.array([[0, 9], [1, 2]], np.int32))),
        ("block_table", dict(block_table=np.array([[0, 1], [-1, 2]], np.int32))),
        ("lengths", dict(lengths=np.array([70, 129], np.int32))),
        # the last used block of a length 64k + 1 (blocks 0 and 1 of request 1 are used)
        (
            "block_table",
            dict(
                lengths=np.array([70, 65], np.int32),
                block_table=np.array([[0, 1], [2, 9]], np.int32),
            ),
        ),
        ("lengths", dict(lengths=np.array([70, -1], np.int32))),
        ("lengths", dict(lengths=np.array([70], np.int32))),
        ("lengths", dict(lengths=np.array([70.0, 1.0]))),
    ]
    return cases


def _bad_values():
    g = _good()
    q = g["q"].copy()
    q[1, 0, 3, 5] = 0x7F
    w = g["w"].copy()
    w[0, 0, 0] = np.nan
    kv = g["kv_payload"].copy()
    kv[g["block_table"][1, 1], 5, 0] = 0xFF
    return [("q", dict(q=q)), ("w", dict(w=w)), ("kv_payload", dict(kv_payload=kv))]


@pytest.mark.parametrize("name,change", _bad_cases())
def test_validation_names_the_argument(name, change):
    args = {**_good(), **change}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        dec.check_decode_inputs(K=4, xp=np, **args)
    sel = dec.DecodeSelectorGPU(4, backend="numpy")
    with pytest.raises(ValueError, match=rf"^{name}:"):
        sel.step(**args)


def test_validation_messages_name_the_entry():
    args = {**_good(), "lengths": np.array([70, 129], np.int32)}
    with pytest.raises(ValueError, match=r"^lengths: lengths\[1\]=129 outside"):
        dec.check_decode_inputs(K=4, xp=np, **args)
    with pytest.raises(ValueError, match=r"^q: missing"):
        dec.check_decode_inputs(K=4, xp=np, **{**_good(), "q": None})


def test_validation_accepts_the_edge_layouts():
    """A trailing unit axis on the scales (DeepGEMM's [blocks, 64, 1]), a block table of one
    column, and an int64 block table give the same arrays as the plain layout."""
    g = _good(mb=1)
    g["lengths"] = np.full(2, 64, np.int32)
    base = dec.check_decode_inputs(K=4, xp=np, **g)
    g2 = {**g, "kv_scale": g["kv_scale"][..., None]}
    g2["block_table"] = g["block_table"].astype(np.int64)
    alt = dec.check_decode_inputs(K=4, xp=np, **g2)
    for k in ("scale", "block_table", "ke", "kv"):
        assert np.array_equal(base[k], alt[k]) and base[k].dtype == alt[k].dtype, k


def test_validation_rejects_a_cache_too_large_for_int32_rows():
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (2**25, 64, 128), (0, 0, 0))
    sc = np.lib.stride_tricks.as_strided(np.ones(1, np.float32), (2**25, 64), (0, 0))
    with pytest.raises(ValueError, match="^kv_payload: num_blocks"):
        dec.check_decode_inputs(K=4, xp=np, **{**_good(), "kv_payload": big, "kv_scale": sc})


def test_numpy_backend_refuses_device_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="^q: the numpy backend takes host arrays"):
        dec.DecodeSelectorGPU(4, backend="numpy").step(
            **{**_good(), "q": torch.zeros(2, 1, 16, 128)}
        )


def test_value_scan_ignores_unused_blocks():
    """A NaN code in a block no request uses (length 64: one block each) is not an error."""
    g = {**_good(), "lengths": np.full(2, 64, np.int32)}
    g["kv_payload"] = g["kv_payload"].copy()
    g["kv_payload"][g["block_table"][1, 1], 5, 0] = 0x7F
    dec.check_decode_inputs(K=4, xp=np, check_values=True, **g)


@pytest.mark.parametrize("backend", ["numpy", "cupy"])
def test_fresh_selector_state(backend, request):
    if backend == "cupy":
        request.getfixturevalue("fake_cupy")
    sel = dec.DecodeSelectorGPU(4, backend=backend)
    assert sel.last_overflow is False and sel.witnesses(0).size == 0
    sel.reset()


def test_cupy_host_code_unchecked_layout_ends_by_the_dedup(fake_cupy, step_fold):
    """Without the layout check, a step whose dedup folds (STEP_FOLD) leaves the visible ends
    to it — no decode_layout launch — and selects the dense route's ids with the stats'
    visible ends; the chain launches decode_layout.  A first step of a shape (empty ring)
    and history 0 (no dedup) are covered too."""
    B, n, H, K = 2, 2, 32, 8
    cache = PagedCache(B, 4 * 64, seed=31)
    rs = cache.rs
    qf = rs.standard_normal((B, n, H, 128))
    L = np.array([200, 77], dtype=np.int32)
    for history in (2, 0):
        sel = dec.DecodeSelectorGPU(K, history=history, check_layout=False)
        for _ in range(3):
            qp, wq = _queries(rs, qf, n, H)
            args = (qp, wq, cache.kv, cache.scale, cache.block_table, L)
            dense = dec.dense_decode_topk(*args, K)
            before = len(fake_cupy.calls)
            st = sel.step(*args)
            mine = fake_cupy.calls[before:]
            assert np.array_equal(st.ids, dense)
            assert np.array_equal(st.stats.visible, dec.visible_ends(L, n))
            assert ("decode_layout" in mine) == (not step_fold or history == 0)
            if step_fold and history:  # the step's decode.cu launches, nothing else
                base = [re.sub(r"_mt\d$", "", c) for c in mine]
                assert base == ["decode_witness_dedup_zero", "decode_witness", "decode_fused",
                                "decode_step_finish"], base  # fmt: skip
            L = L + 1


def test_cupy_host_code_out_and_layouts(fake_cupy):
    """out= receives the ids (and is what the step returns); a non-contiguous q and an int64
    block table give the same ids as contiguous int32 inputs."""
    B, n, H, K = 2, 2, 32, 8
    cache = PagedCache(B, 4 * 64, seed=12)
    qp, wq = _queries(cache.rs, cache.rs.standard_normal((B, n, H, 128)), n, H)
    L = np.array([200, 77], dtype=np.int32)
    args = (qp, wq, cache.kv, cache.scale, cache.block_table, L)
    want = dec.DecodeSelectorGPU(K).step(*args).ids
    out = np.full((B, n, K), -7, np.int64)
    got = dec.DecodeSelectorGPU(K).step(*args, out=out)
    assert got.ids is out and np.array_equal(out, want)
    qnc = np.ascontiguousarray(qp[:, :, ::-1])[:, :, ::-1]  # the same values, negative strides
    assert not qnc.flags.c_contiguous
    alt = (qnc, wq, cache.kv, cache.scale, cache.block_table.astype(np.int64), L)
    assert np.array_equal(dec.DecodeSelectorGPU(K).step(*alt).ids, want)
    with pytest.raises(ValueError, match="^out:"):
        dec.DecodeSelectorGPU(K).step(*args, out=np.zeros((B, n, K), np.int32))


@pytest.mark.parametrize("name,change", _bad_values())
def test_value_scan_is_opt_in_and_names_the_argument(name, change):
    args = {**_good(), **change}
    dec.check_decode_inputs(K=4, xp=np, **args)  # default: no value scan
    with pytest.raises(ValueError, match=rf"^{name}:"):
        dec.check_decode_inputs(K=4, xp=np, check_values=True, **args)
    sel = dec.DecodeSelectorGPU(4, backend="numpy", check_values=True)
    with pytest.raises(ValueError, match=rf"^{name}:"):
        sel.step(**args)


def test_layout_check_can_be_skipped_but_is_on_by_default():
    args = {**_good(), "lengths": np.array([70, 129], np.int32)}
    with pytest.raises(ValueError, match="^lengths:"):
        dec.check_decode_inputs(K=4, xp=np, **args)
    d = dec.check_decode_inputs(K=4, xp=np, check_layout=False, **args)
    assert d["lengths"].tolist() == [70, 129]


def test_validation_accepts_good_and_unused_blocks():
    g = _good()
    # an invalid entry in a block the request does not use (length 70 uses 2 blocks; with
    # length 10 only 1) is accepted, as in the serving stacks
    g["block_table"] = np.array([[0, 1], [2, 99]], np.int32)
    g["lengths"] = np.array([70, 10], np.int32)
    d = dec.check_decode_inputs(K=4, xp=np, **g)
    assert d["q"].shape == (2, 16, 128) and d["ke"].tolist() == [70, 10]
    g2 = _good(H=20)
    d2 = dec.check_decode_inputs(K=4, xp=np, **g2)
    assert d2["Hp"] == 32 and d2["q"].shape == (2, 32, 128) and np.all(d2["w"][:, 20:] == 0)
    # the 4-D DeepGEMM payload [num_blocks, 64, 1, 128] is accepted
    g3 = _good()
    g3["kv_payload"] = g3["kv_payload"][:, :, None, :]
    dec.check_decode_inputs(K=4, xp=np, **g3)


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(K=0), "K"),
        (dict(K=5000), "K"),
        (dict(K=True), "K"),
        (dict(K=4, history=-1), "history"),
        (dict(K=4, history=1.5), "history"),
        (dict(K=4, within_step=True), "within_step"),
        (dict(K=4, buffer=0), "buffer"),
        (dict(K=4, backend="torch"), "backend"),
    ],
)
def test_selector_arguments(kw, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        dec.DecodeSelectorGPU(**({"backend": "numpy"} | kw))


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------


def _bound(qv, w, k_payload, k_scale, Hp):
    """β per visible key: |s_ref − s_gpu| ≤ β (ErrorModel.scorer_coefficients, m16n8k16
    steps, W = 17 kept bits; the head sum counted over the padded Hp heads)."""
    from dosa_ref.numeric import ErrorModel

    eps, dabs, eabs = ErrorModel.hopper_fp8(17, k_step=16).scorer_coefficients(128, Hp)
    kb = np.abs(e4m3_values(k_payload))
    X = np.abs(qv) @ kb.T  # [H, m]
    aw = np.abs(w)
    a = k_scale.astype(np.float64)
    return a * (eps * (aw @ X) + dabs * aw.sum()) + eabs * (aw.sum() + 2 * Hp + 1)


def _check_against_reference(ids, qp, wq, cache, L, K):
    """Tie-agnostic comparison of GPU ids [B, n, K] with float64 scores of the dequantized
    inputs (docs/design.md), within 2β of the error model."""
    B, n = ids.shape[:2]
    H = qp.shape[2]
    Hp = -(-H // 16) * 16
    ke = dec.visible_ends(L, n)
    gathered = dec.gather_request_keys(cache.kv, cache.scale, cache.block_table, L)
    keys = cache.keys(L)
    ref = DecodeSelector(K, history=0).step(e4m3_values(qp), wq.astype(np.float64), keys,
                                            lengths=L).ids  # fmt: skip
    worst = 0.0
    for b in range(B):
        for j in range(n):
            e = int(ke[b, j])
            qv, w = e4m3_values(qp[b, j]), wq[b, j].astype(np.float64)
            s = (np.maximum(qv @ keys[b][:e].T, 0) * w[:, None]).sum(0)
            beta = _bound(qv, w, gathered[b][0][:e], gathered[b][1][:e], Hp)
            g = ids[b, j][ids[b, j] >= 0]
            assert g.size == min(K, e) and np.unique(g).size == g.size
            assert np.all(g < e)
            r = ref[b, j][ref[b, j] >= 0]
            assert r.size == g.size
            uns = np.setdiff1d(np.arange(e), g)
            if uns.size and g.size:
                slack = s[g].min() - s[uns].max()
                tol = 2 * max(beta[g].max(), beta[uns].max())
                assert slack >= -tol, (b, j, slack, tol)
                worst = max(worst, -slack / tol if tol else 0.0)
    return worst


@pytest.fixture(params=[False, True], ids=["select_kernel", "select_rank"])
def rank_select(request, monkeypatch):
    """The decode step's selections by select_kernel, then by select_rank where the step has
    at most dense.RANK_ROWS query rows (decode_ops.RANK_SELECT)."""
    monkeypatch.setattr(dops, "RANK_SELECT", request.param)


@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("B", [1, 3])
@gpu
def test_gpu_decode_walk(rank_select, B, n, H):
    K, steps = 256, 8
    cache = PagedCache(B, 40 * 64, seed=10 * B + n + H)
    rs = cache.rs
    L = rs.integers(K // 2, 8 * 64, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2)
    qf = rs.standard_normal((B, n, H, 128))
    dev = {k: cp.asarray(getattr(cache, k)) for k in ("kv", "scale", "block_table")}
    worst, comp = 0.0, []
    for step in range(steps):
        qp, wq = _queries(rs, qf, n, H)
        args = (cp.asarray(qp), cp.asarray(wq), dev["kv"], dev["scale"], dev["block_table"],
                cp.asarray(L))  # fmt: skip
        dense = dec.dense_decode_topk(*args, K)
        out = sel.step(*args)
        assert out.ids.dtype == cp.int64 and out.ids.shape == (B, n, K)
        assert cp.array_equal(out.ids, dense), f"step {step}: DoSA decode != dense decode"
        st = out.stats
        assert np.all(st.compacted >= np.minimum(K, st.visible))
        assert np.all(st.tau <= st.tau_final)
        comp.append(st.compaction)
        worst = max(worst, _check_against_reference(cp.asnumpy(dense), qp, wq, cache, L, K))
        L = np.minimum(L + rs.integers(1, 300, B), cache.max_blocks * 64).astype(np.int32)
    print(f"\n[decode-walk] B={B} n={n} H={H}: compaction per step "
          f"{[round(c, 3) for c in comp]}, worst −slack/tol {worst:.3e}")  # fmt: skip


@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_gpu_paged_logits_equal_prefill_dense(H):
    """Paged logits of request b == prefill dense_logits over its gathered keys, bitwise."""
    import dosa_cupy

    B, n = 2, 2
    cache = PagedCache(B, 20 * 64, seed=H)
    rs = cache.rs
    L = np.array([20 * 64 - 7, 300], dtype=np.int32)
    qp, wq = _queries(rs, rs.standard_normal((B, n, H, 128)), n, H)
    lg = dec.paged_logits(cp.asarray(qp), cp.asarray(wq), cp.asarray(cache.kv),
                          cp.asarray(cache.scale), cp.asarray(cache.block_table),
                          cp.asarray(L))  # fmt: skip
    ke = dec.visible_ends(L, n)
    for b, (p, s) in enumerate(dec.gather_request_keys(cache.kv, cache.scale,
                                                       cache.block_table, L)):  # fmt: skip
        ref = dosa_cupy.dense_logits(cp.asarray(qp[b]), cp.asarray(wq[b]), cp.asarray(p),
                                     cp.asarray(s), ke=cp.asarray(ke[b]))  # fmt: skip
        got = lg[b, :, : p.shape[0]]
        assert cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32))
        assert bool(cp.all(lg[b, :, p.shape[0] :] == -cp.inf))


@pytest.mark.parametrize("history,buffer", [(0, None), (2, 1), (1, 64)])
@gpu
def test_gpu_overflow_and_history(history, buffer):
    B, n, H, K = 3, 2, 32, 128
    cache = PagedCache(B, 16 * 64, seed=5)
    rs = cache.rs
    L = np.array([50, 16 * 64, 500], dtype=np.int32)  # request 0 shorter than K
    sel = dec.DecodeSelectorGPU(K, history=history, buffer=buffer)
    qf = rs.standard_normal((B, n, H, 128))
    dev = [cp.asarray(cache.kv), cp.asarray(cache.scale), cp.asarray(cache.block_table)]
    over = 0
    for _ in range(4):
        qp, wq = _queries(rs, qf, n, H)
        args = (cp.asarray(qp), cp.asarray(wq), *dev, cp.asarray(L))
        out = sel.step(*args)
        assert cp.array_equal(out.ids, dec.dense_decode_topk(*args, K))
        assert bool(cp.all(out.ids[0, :, 50:] == -1))
        over += sel.last_overflow
    if buffer == 1:
        assert over == 4


@pytest.mark.parametrize("H,n", [(64, 2), (32, 1)])
@gpu
def test_gpu_long_context_scan_and_wide_select(H, n):
    """Contexts of 40K–70K keys: the persistent scan runs several (request, tile) items per
    block through its cp.async ring, crossing requests inside a block, and the dense route's
    selection takes the wide (many blocks per row) path.  Paged logits == prefill logits
    bitwise; fused ids == dense ids every step; the dense ids == a host sort of the logits."""
    import dosa_cupy

    B, K = 3, 2048
    cache = PagedCache(B, 72 * 1024 + 512, seed=H + n, topics=True)  # 145 tiles per request
    rs = cache.rs
    L = np.array([72 * 1024 - 16, 40_000, 65_537], dtype=np.int32)
    T = -(-cache.max_blocks * 64 // dops.SCAN_TILE)
    grid = min(B * T, dops.num_sms())
    per = -(-B * T // grid)
    assert per >= 2 and T % per != 0  # several items per block, and a block spans 2 requests
    dev = [cp.asarray(cache.kv), cp.asarray(cache.scale), cp.asarray(cache.block_table)]
    sel = dec.DecodeSelectorGPU(K)
    qf = rs.standard_normal((B, n, H, 128))
    for step in range(3):
        qp, wq = _queries(rs, qf, n, H)
        args = (cp.asarray(qp), cp.asarray(wq), *dev, cp.asarray(L))
        dense = dec.dense_decode_topk(*args, K)
        assert cp.array_equal(sel.step(*args, return_stats=False).ids, dense), f"step {step}"
        lg = dec.paged_logits(*args)
        ke = dec.visible_ends(L, n)
        rows = cp.asnumpy(lg.reshape(B * n, -1))
        want = np.stack([_host_topk(x, int(e), K) for x, e in zip(rows, ke.ravel(), strict=True)])
        assert np.array_equal(cp.asnumpy(dense).reshape(B * n, K), want)
        L = L + n
    b = 2  # one request's logits against the prefill dense route on its gathered keys
    p, s_ = dec.gather_request_keys(cache.kv, cache.scale, cache.block_table, L)[b]
    keb = cp.asarray(dec.visible_ends(L, n)[b])
    ref = dosa_cupy.dense_logits(cp.asarray(qp[b]), cp.asarray(wq[b]), cp.asarray(p),
                                 cp.asarray(s_), ke=keb)  # fmt: skip
    got = dec.paged_logits(cp.asarray(qp), cp.asarray(wq), *dev, cp.asarray(L))[b, :, : p.shape[0]]
    assert cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32))


def _host_topk(row, e, K):
    """(score desc, id asc) Top-K ids of row[:e] by records, −1 padded (the selection's
    contract, NaN lowest)."""
    rec = _FakeKernels._record(row[:e].astype(np.float32), np.arange(e))
    top = np.sort(rec)[::-1][:K]
    ids = np.full(K, -1, dtype=np.int64)
    ids[: top.size] = (~(top & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
    return ids


@pytest.mark.parametrize("kind", ["normal", "ties", "equal", "nan", "short"])
@gpu
def test_gpu_wide_select_equals_host_sort(kind):
    """select_rows on few long rows (the wide path, and the one-block path forced) equals a
    host sort by records: plain values, heavy ties at the K-th, one value everywhere (the
    compacted records overflow: the row is selected from its logits), NaN scattered, and a
    row shorter than K."""
    from dosa_cupy import dense as dm

    rs = np.random.default_rng(7)
    R, N, K = 5, 1 << 16, 2048
    x = rs.standard_normal((R, N)).astype(np.float32)
    if kind == "ties":
        x = np.round(x * 4) / 4
    elif kind == "equal":
        x[:] = 1.5
    elif kind == "nan":
        x[rs.random((R, N)) < 0.3] = np.nan
    ks = np.array([0, 3, 100, 0, 7], dtype=np.int32)
    ke = np.array([N, N - 1, 40_000, 1000 if kind == "short" else N, N - 5], dtype=np.int32)
    assert R <= dm.WIDE_ROWS and N >= dm.WIDE_MIN_N
    got = cp.asnumpy(dm.select_rows(cp.asarray(x), K, cp.asarray(ks), cp.asarray(ke)))
    for r in range(R):
        rec = _FakeKernels._record(x[r, ks[r] : ke[r]], np.arange(ks[r], ke[r]))
        top = np.sort(rec)[::-1][:K]
        want = np.full(K, -1, dtype=np.int64)
        want[: top.size] = (~(top & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
        assert np.array_equal(got[r], want), f"row {r}"
    old = dm.WIDE_ROWS
    try:
        dm.WIDE_ROWS = 0  # the one-block-per-row path on the same rows
        one = cp.asnumpy(dm.select_rows(cp.asarray(x), K, cp.asarray(ks), cp.asarray(ke)))
    finally:
        dm.WIDE_ROWS = old
    assert np.array_equal(one, got)
    # with its buffers given (dense.rows_work), twice on the same buffers (the histograms
    # zeroed again): the same ids
    work = dm.rows_work(R, N, K)
    for _ in range(2):
        again = dm.select_rows(cp.asarray(x), K, cp.asarray(ks), cp.asarray(ke), work=work)
        assert again is work.ids and np.array_equal(cp.asnumpy(again), got)


@gpu
def test_gpu_nan_codes_unchecked_fused_equals_dense():
    """Without the (opt-in) value scan: NaN codes in the cache and in q (the scorer's ReLU,
    fmaxf, maps a NaN logit to 0, so such keys tie at finite scores) and NaN key scales and
    weights (NaN scores, record code 0 on every route); the fused route compares records,
    not scores, so it still equals the dense route bitwise."""
    B, n, H, K = 2, 2, 64, 64
    cache = PagedCache(B, 8 * 64, seed=3)
    rs = cache.rs
    kv = cache.kv.copy()
    kv.reshape(-1, 128)[rs.random(kv.shape[0] * 64) < 0.5, 3] = 0x7F  # half the keys
    scale = cache.scale.copy()
    scale.reshape(-1)[rs.random(scale.size) < 0.3] = np.nan  # NaN scores
    L = np.array([8 * 64, 100], dtype=np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2)
    qf = rs.standard_normal((B, n, H, 128))
    for step in range(4):
        qp, wq = _queries(rs, qf, n, H)
        if step == 2:
            qp[1, 0, 5, 9] = 0xFF
        if step == 3:
            wq[0, 1, 0] = np.nan  # every score of that row is NaN
        args = (cp.asarray(qp), cp.asarray(wq), cp.asarray(kv), cp.asarray(scale),
                cp.asarray(cache.block_table), cp.asarray(L))  # fmt: skip
        dense = dec.dense_decode_topk(*args, K)
        assert cp.array_equal(sel.step(*args, return_stats=False).ids, dense), f"step {step}"


@pytest.mark.parametrize(
    "widths,B", [([8], 1), ([5, 7], 3), ([4096, 4096], 2), ([300, 1, 9000], 4), ([16384], 2)]
)
@gpu
def test_gpu_witness_dedup_equals_host(widths, B):
    """decode_witness_dedup keeps one copy of every id of a row in place and blanks the
    other copies and the empty slots: per row the ids of witness_table's numpy table, each
    once (repeats within and across entries, −1 padding)."""
    rs = np.random.default_rng(sum(widths) + B)
    entries = [rs.integers(-1, 3 * max(widths), (B, m)).astype(np.int32) for m in widths]
    want = dec.witness_table(entries, B, np)
    got = cp.asnumpy(dec.witness_table([cp.asarray(e) for e in entries], B, cp))
    cat = np.concatenate(entries, axis=1)
    for b in range(B):
        kept = got[b][got[b] >= 0]
        assert kept.size == np.unique(kept).size  # each id once
        assert np.array_equal(np.sort(kept), want[b][want[b] >= 0])  # the same ids
        assert np.all((got[b] == cat[b]) | (got[b] == -1))  # in place


@pytest.mark.parametrize("B,n,Wc", [(1, 1, 4096), (3, 2, 8192), (64, 2, 8192)])
@gpu
def test_gpu_dedup_zero_and_step_finish_equal_the_chain(B, n, Wc):
    """decode_witness_dedup_zero keeps the same entries as decode_witness_dedup, zeroes
    both counter rows and writes the visible ends; decode_step_finish writes the ids into
    out and into the ring slot that decode_ring_push fills, and moves the counter as
    decode_ring_advance — over
    several launches of many blocks (B·n·K / 256 of them: the last one re-arms ``done``)."""
    rs = np.random.default_rng(B * 100 + n)
    K = Wc // (2 * n)
    ring = cp.asarray(rs.integers(-1, Wc, (B, Wc)).astype(np.int32))
    want, got = cp.empty_like(ring), cp.empty_like(ring)
    dops.dedup(ring, want)
    counts = cp.full((2, B * n), 7, dtype=cp.uint32)
    L = rs.integers(0, 3 * n, B).astype(np.int32)  # ends clamped at 0 among them
    ke = cp.full(B * n, -5, dtype=cp.int32)
    dops.dedup(ring, got, counts, n, cp.asarray(L), ke)
    assert np.array_equal(cp.asnumpy(ke), dec.visible_ends(L, n).reshape(-1))
    # which copy of an id is kept may differ between launches; the kept set may not
    for b in range(B):
        a, g = cp.asnumpy(want[b]), cp.asnumpy(got[b])
        assert np.array_equal(np.sort(a[a >= 0]), np.sort(g[g >= 0]))
    assert int(counts.max()) == 0
    d = {"B": B, "n": n, "K": K}
    chain, fold = (
        types.SimpleNamespace(
            ring=ring.copy(), ctr=cp.zeros(1, cp.int32), done=cp.zeros(1, cp.uint32)
        )
        for _ in range(2)
    )
    ops = dops.DeviceOps("f16")
    for t in range(3):
        ids = cp.asarray(rs.integers(-1, 1 << 20, (B * n, K)).astype(np.int32))
        out = cp.full((B, n, K), -7, dtype=cp.int64)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dops, "STEP_FOLD", False)
            ops.push(d, chain, ids)
        ops.push(d, fold, ids, out)
        assert cp.array_equal(out.reshape(B * n, K), ids.astype(cp.int64)), t
        assert cp.array_equal(fold.ring, chain.ring)
        assert int(fold.ctr[0]) == t + 1 == int(chain.ctr[0])
        assert int(fold.done[0]) == 0


def _graph_walk_inputs(B, n, H, seed, steps):
    cache = PagedCache(B, 12 * 64, seed=seed)
    rs = cache.rs
    qf = rs.standard_normal((B, n, H, 128))
    L0 = rs.integers(300, 10 * 64, B)
    walk = []
    for t in range(steps):
        qp, wq = _queries(rs, qf, n, H)
        walk.append((cp.asarray(qp), cp.asarray(wq), cp.asarray((L0 + t).astype(np.int32))))
    dev = [cp.asarray(cache.kv), cp.asarray(cache.scale), cp.asarray(cache.block_table)]
    return walk, dev


@pytest.mark.parametrize("B,n,H", [(2, 1, 64), (3, 2, 32), (1, 2, 20)])
@gpu
def test_gpu_step_captured_in_a_cupy_graph(rank_select, B, n, H):
    """The step with check_layout=False, the default buffer, return_stats=False and out=
    allocates nothing and never synchronizes: captured once in a CuPy stream graph and
    replayed on new inputs copied into the same buffers, its ids equal an eager selector's
    and the dense route's at every step (the ring advances on the device;
    ``gpu_support.replay_decode_walk``)."""
    walk, dev = _graph_walk_inputs(B, n, H, seed=B + n + H, steps=6)
    replay_decode_walk(walk, dev, 128, f"B={B} n={n} H={H}")


@gpu
def test_gpu_step_captured_in_a_torch_graph():
    """The same capture through torch.cuda.CUDAGraph (CuPy launching on torch's capture
    stream), as a torch serving stack would record it."""
    torch = pytest.importorskip("torch")
    B, n, H, K, steps = 2, 2, 64, 256, 5
    walk, dev = _graph_walk_inputs(B, n, H, seed=9, steps=steps)
    static = [x.copy() for x in walk[0]]
    out = cp.empty((B, n, K), dtype=cp.int64)
    sel = dec.DecodeSelectorGPU(K, check_layout=False)
    sel.step(*static[:2], *dev, static[2], return_stats=False, out=out)  # eager step 0
    cp.cuda.Device().synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            sel.step(*static[:2], *dev, static[2], return_stats=False, out=out)
    for t in range(1, steps):
        for dst, src in zip(static, walk[t], strict=True):
            dst[...] = src
        cp.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        dense = dec.dense_decode_topk(*walk[t][:2], *dev, walk[t][2], K)
        assert cp.array_equal(out, dense), f"step {t}"


@gpu
def test_gpu_validation_on_device_arrays():
    g = {k: cp.asarray(v) for k, v in _good().items()}
    g["block_table"] = cp.asarray(np.array([[0, 9], [1, 2]], np.int32))
    with pytest.raises(ValueError, match="^block_table:"):
        dec.dense_decode_topk(**g, K=4)
    with pytest.raises(ValueError, match="^block_table:"):
        dec.DecodeSelectorGPU(4).step(**g)


# ---------------------------------------------------------------------------------------
# CPU: benchmark host logic
# ---------------------------------------------------------------------------------------


def test_bench_shapes_and_arguments():
    from dosa_cupy.bench import decode as bd

    shapes = bd.parse_shapes(bd.DEFAULT_SHAPES)
    assert len(shapes) == 24
    assert {s[0] for s in shapes} == {32, 64} and {s[1] for s in shapes} == {1, 8, 64}
    assert {s[2] for s in shapes} == {131072, 262144, 524288, 1048576}
    assert bd.parse_shapes(bd.DEFAULT_SHAPES, "64x64x1048576") == [(64, 64, 1048576)]
    # comma-separated alternatives, as the prefill bench's --filter
    two = bd.parse_shapes(bd.DEFAULT_SHAPES, "x131072, x1048576")
    assert len(two) == 12 and {s[2] for s in two} == {131072, 1048576}
    with pytest.raises(ValueError, match="^filter:"):
        bd.main(["--filter", "x999"])
    for bad in ("32x1", "axbxc", "65x1x1024", "32x0x1024"):
        with pytest.raises(ValueError, match="^shapes:"):
            bd.parse_shapes(bad)
    with pytest.raises(ValueError, match="^reps:"):
        bd.main(["--reps", "3"])
    with pytest.raises(ValueError, match="^next-n:"):
        bd.main(["--next-n", "3"])
    with pytest.raises(ValueError, match="^scorer:"):
        bd.main(["--scorer", "fp8,fp9:blockselect"])
    with pytest.raises(ValueError, match="^builds:"):  # a scorer's builds are checked by name
        bd.main(["--scorer", "fp8:blockselect+nope"])
    row = dict(H=32, B=1, ctx=131072, next_n=1, dense_ms=2.0, dosa_ms=1.0, speedup=2.0)
    row.update(step_ratio_median=2.0, compaction=0.01, overflow_steps=0, ids_equal=True)
    md = bd.markdown([row])
    assert "| 32 | 1 | 131,072 | 1 | f16 | 2.000 | 1.000 | 2.00× |" in md


@pytest.mark.parametrize("shape", ["32x1x131072", "64x8x131072"])
@gpu
def test_gpu_bench_decode_small(shape, tmp_path):
    from dosa_cupy.bench import decode as bd

    assert bd.main(["--shapes", shape, "--K", "512", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_decode.json").read_text())
    assert rows and all(r["ids_equal"] for r in rows)


# ---------------------------------------------------------------------------------------
# CPU: the kernels' work decomposition (loops of csrc/decode.cu emulated in Python)
# ---------------------------------------------------------------------------------------


def _batch_pos(lane):
    g, c = lane >> 2, lane & 3
    return 8 * (g >> 1) + 2 * c + (g & 1)


def _emulate_scan(L, ke, n, fused, sms):
    """(written (row, id), scored (row, id)) of dec_scan_impl's loops: the persistent grid
    over (request, tile) items, the copies of an item (ids < the request's last row's end)
    and each warp's row and batches.  ``ke`` int [B·n] row ends (non-decreasing in j)."""
    B = len(ke) // n
    T = -(-L // dops.SCAN_TILE)
    total = B * T
    grid = max(1, min(total, sms))
    per = -(-total // grid)
    writes, scored = [], []
    for bx in range(grid):
        for it in range(bx * per, min(bx * per + per, total)):
            b, t = divmod(it, T)
            base = t * dops.SCAN_TILE
            kmax = ke[b * n + n - 1]
            loaded = {base + k for k in range(dops.SCAN_TILE) if base + k < kmax}
            nbw = dops.SCAN_TILE // 256 * n  # batches per warp (DEC_WARP_BATCHES · n)
            for warp in range(dops.WARPS):
                r = b * n + warp % n
                hi = ke[r]
                for x in range(nbw):
                    i0 = base + ((warp // n) * nbw + x) * 32
                    if i0 >= L:
                        continue
                    for lane in range(32):
                        i = i0 + _batch_pos(lane)
                        if i0 >= hi:
                            writes += [] if fused else [(r, i)]
                            continue
                        for u in range(4):  # a key a visible result depends on was loaded
                            k = i0 + 8 * u + (lane >> 2)
                            assert k >= hi or k in loaded
                        if i < hi:
                            scored.append((r, i))
                        writes += [] if fused else [(r, i)]
    return writes, scored


@pytest.mark.parametrize(
    "L,ke,n,sms",
    [(64, [0], 1, 3), (64, [1], 1, 3), (320, [200], 1, 1), (4096, [4096], 1, 5),
     (4160, [3000], 1, 4), (4160, [2999, 3000, 10, 11, 0, 1], 2, 4), (1024, [5, 1024], 1, 132),
     (768, [700, 701, 767, 768], 2, 3), (2048, [1500, 2048, 0, 513], 1, 3)],
)  # fmt: skip
def test_scan_decomposition_covers_each_key_once(L, ke, n, sms):
    R = len(ke)
    writes, scored = _emulate_scan(L, ke, n, fused=False, sms=sms)
    # every logits column of every row written exactly once
    assert sorted(writes) == [(r, i) for r in range(R) for i in range(L)]
    want = [(r, i) for r in range(R) for i in range(ke[r])]
    assert sorted(scored) == want  # every visible key of every row scored exactly once
    _, scored_f = _emulate_scan(L, ke, n, fused=True, sms=sms)
    assert sorted(scored_f) == want
    # batch_pos is a permutation of the 32 batch positions (one result per key)
    assert sorted(_batch_pos(x) for x in range(32)) == list(range(32))


def test_witness_decomposition_emits_each_visible_witness_once():
    rs = np.random.default_rng(2)
    Wc, ke = 1000, 700
    row = rs.permutation(2000)[:Wc].astype(np.int32)
    row[rs.random(Wc) < 0.3] = -1
    emitted = []
    for bx in range(dops._grid_x(Wc, dops.WIT_KEYS)):
        for warp in range(dops.WARPS):
            j0 = (bx * dops.WARPS + warp) * dops.WIT_KEYS
            j1 = min(j0 + dops.WIT_KEYS, Wc)
            for x0 in range(j0, j1, 32):
                for lane in range(32):
                    xp_ = x0 + _batch_pos(lane)
                    i = int(row[xp_]) if xp_ < j1 else -1
                    if 0 <= i < ke:
                        emitted.append(i)
    want = row[(row >= 0) & (row < ke)]
    assert sorted(emitted) == sorted(want.tolist())


# ---------------------------------------------------------------------------------------
# CPU: the cupy backend's host code, run with numpy standing in for CuPy and the kernels
# replaced by numpy emulations that first check every argument against the kernel's
# signature in decode.cu / select.cu (count, pointer dtypes, int vs long long).
# ---------------------------------------------------------------------------------------


def _signatures():
    src = (Path(dec.__file__).parent / "csrc" / "decode.cu").read_text().replace("\\\n", " ")
    out = {n: param_types(src, rf"\b{n}_mt##MT") for n in
           re.findall(r"(decode_\w+)_mt##MT\(", src)}  # fmt: skip
    for name in ("decode_layout", "decode_witness_dedup", "decode_ring_push",
                 "decode_ring_advance", "decode_witness_dedup_zero",
                 "decode_step_finish"):  # fmt: skip
        out[name] = param_types(src, rf"\b{name}")
    return out


def _check_geometry(base, grid, args, kw):
    """The launch geometry each decode.cu kernel assumes (its loops' coverage): the fakes
    compute every result whatever the grid, so without this a grid that leaves work undone
    would pass on the CPU."""
    assert all(isinstance(g, int) for g in grid), grid
    if base in ("decode_logits", "decode_fused"):
        ld, nreq, per = int(args[8]), int(args[9]), int(args[10])
        total = nreq * -(-ld // dops.SCAN_TILE)  # (request, tile) items
        assert len(grid) == 1 and 1 <= grid[0] <= max(1, total)
        assert grid[0] * per >= total  # every item has a block
        assert grid[0] == min(total, dops.num_sms())  # persistent: one block per SM
        assert kw.get("shared_mem") == dops.SCAN_SMEM  # the ring: stages · (tile · 132)
    elif base == "decode_witness":
        R, Wc = int(args[6].shape[0]), int(args[9])
        assert grid[1] == R and grid[0] * dops.WARPS * dops.WIT_KEYS >= Wc
        assert (grid[0] - 1) * dops.WARPS * dops.WIT_KEYS < Wc
    elif base == "decode_layout":
        B, mb = int(args[0].shape[0]), int(args[2])
        assert grid[1] == B and grid[0] * 256 >= mb and (grid[0] - 1) * 256 < max(mb, 1)
    elif base in ("decode_witness_dedup", "decode_witness_dedup_zero"):
        Wc, P2 = int(args[2]), int(args[3])
        assert grid == (args[0].shape[0],) and kw.get("shared_mem") == 4 * P2
        assert P2 >= 2 * Wc > P2 // 2 and P2 & (P2 - 1) == 0  # load ≤ ½, no larger than needed
        if base == "decode_witness_dedup_zero":  # counts uint32 [2, B·n], ke int32 [B·n]
            B, n = args[0].shape[0], int(args[5])
            assert args[4].shape == (2, B * n)
            assert (type(args[6]) is np.uint64) == (type(args[7]) is np.uint64)
            assert type(args[7]) is np.uint64 or (args[6].shape, args[7].shape) == ((B,), (B * n,))
    elif base == "decode_ring_advance":
        assert grid == (1,)
    elif base == "decode_ring_push":
        B, nK, h = int(args[3]), int(args[4]), int(args[5])
        assert grid[0] * 256 >= B * nK > (grid[0] - 1) * 256
        assert args[1].shape == (B, h * nK)
    elif base == "decode_step_finish":
        B, nK, h = int(args[5]), int(args[6]), int(args[7])
        assert grid[0] * 256 >= B * nK > (grid[0] - 1) * 256
        assert type(args[2]) is np.uint64 or args[2].shape == (B, h * nK)
        assert type(args[1]) is np.uint64 or args[1].size == B * nK


class _FakeKernels:
    """decode.cu emulated in numpy on float32-rounded float64 scores."""

    def __init__(self):
        self.sig = _signatures()
        self.calls = []

    def get(self, name, *_):
        base = re.sub(r"_mt\d$", "", name)
        types = self.sig[base]

        def launch(grid, block, args, **kw):
            check_args(name, args, types)
            # a kernel reads its arrays as dense row-major buffers
            assert all(a.flags.c_contiguous for a in args if isinstance(a, np.ndarray)), name
            want = {"decode_witness_dedup": (1024,), "decode_witness_dedup_zero": (1024,),
                    "decode_ring_advance": (32,)}.get(base, (256,))  # fmt: skip
            assert len(grid) in (1, 2) and block == want
            _check_geometry(base, grid, args, kw)
            self.calls.append(name)
            # an optional buffer's null pointer (dense._NULL) reaches the emulation as None
            getattr(self, base)(*(None if type(a) is np.uint64 else a for a in args))

        return launch

    @staticmethod
    def _scores(q, w, kv, ksc, bt, r, n, ids):
        rows = dec.physical_rows(bt[r // n : r // n + 1], np.asarray(ids)[None, :])[0]
        k = e4m3_values(kv[rows])
        s = (np.maximum(e4m3_values(q[r]) @ k.T, 0) * w[r].astype(np.float64)[:, None]).sum(0)
        return (s.astype(np.float32) * ksc[rows]).astype(np.float32)

    _record = staticmethod(make_records)  # record.cuh make_record

    def decode_logits(self, q, w, kv, ksc, bt, mb, ke, n, ld, nreq, per, out):
        for r in range(out.shape[0]):
            e = int(ke[r])
            out[r] = -np.inf
            out[r, :e] = self._scores(q, w, kv, ksc, bt, r, int(n), np.arange(e))

    # The scan and the witness scoring count their records from the counter's value, as the
    # kernels' atomicAdd does: a counter the step did not zero misplaces them.
    def decode_fused(self, q, w, kv, ksc, bt, mb, ke, n, ld, nreq, per, thr, cnt, rec, cap):
        for r in range(cnt.shape[0]):
            ids = np.arange(int(ke[r]))
            s = self._scores(q, w, kv, ksc, bt, r, int(n), ids)
            keep = self._record(s, ids) >= thr[r]
            a = int(cnt[r])
            cnt[r] = a + keep.sum()
            m = max(0, min(int(cap), int(cnt[r])) - a)
            rec[r, a : a + m] = self._record(s[keep], ids[keep])[:m]

    def decode_witness(self, q, w, kv, ksc, bt, mb, ke, n, wit, Wc, cnt, rec):
        for r in range(cnt.shape[0]):
            row = wit[r // int(n)]
            ids = row[(row >= 0) & (row < ke[r])].astype(np.int64)
            a = int(cnt[r])
            cnt[r] = a + ids.size
            got = self._record(self._scores(q, w, kv, ksc, bt, r, int(n), ids), ids)
            rec[r, a : a + ids.size] = got[: max(0, rec.shape[1] - a)]

    def decode_layout(self, L, bt, mb, nb, n, check, ke, bad):
        ke[:] = dec.visible_ends(L, int(n)).reshape(-1)
        if check:
            Lh = L.astype(np.int64)
            badl = np.flatnonzero((Lh < 0) | (Lh > int(mb) * dec.PAGE))
            used = np.arange(int(mb))[None, :] < ((np.clip(Lh, 0, None) + 63) // 64)[:, None]
            badb = np.flatnonzero((used & ((bt < 0) | (bt >= int(nb)))).ravel())
            bad[0] = min(bad[0], badl[0]) if badl.size else bad[0]
            bad[1] = min(bad[1], badb[0]) if badb.size else bad[1]

    def decode_witness_dedup(self, src, dst, Wc, P2):
        assert int(P2) >= 2 * int(Wc) and int(Wc) == src.shape[1] and int(P2) & (int(P2) - 1) == 0
        a = src.copy()
        for row in a:  # one copy of each id kept in place (here: the last), others −1
            seen = set()
            for i in range(row.size - 1, -1, -1):
                v = int(row[i])
                row[i] = v if v >= 0 and v not in seen else -1
                seen.add(v)
        dst[:] = a

    def decode_witness_dedup_zero(self, src, dst, Wc, P2, counts, n, lengths, ke):
        self.decode_witness_dedup(src, dst, Wc, P2)
        counts[...] = 0  # every block zeroes its request's rows: all of them
        if ke is not None:
            ke[:] = dec.visible_ends(lengths, int(n)).reshape(-1)

    def decode_step_finish(self, ids, out, ring, ctr, done, B, nK, h):
        assert int(done[0]) == 0  # re-armed by the previous launch's last block
        if out is not None:
            out.reshape(-1)[:] = ids.reshape(-1)
        if ring is not None:
            self.decode_ring_push(ids, ring, ctr, B, nK, h)
            self.decode_ring_advance(ctr)

    def decode_ring_push(self, ids, ring, ctr, B, nK, h):
        slot = int(ctr[0]) % int(h)
        ring.reshape(int(B), int(h), int(nK))[:, slot] = ids.reshape(int(B), int(nK))

    def decode_ring_advance(self, ctr):
        ctr[0] += 1


def _fake_select_records(K, recA, cntA, recB=None, cntB=None, want_ids=True, want_kth=False):
    assert recB is None and recA.dtype == np.uint64 and cntA.dtype == np.uint32
    rows = recA.shape[0]
    ids = np.full((rows, K), -1, dtype=np.int32) if want_ids else None
    kth = np.zeros(rows, dtype=np.uint64) if want_kth else None
    for r in range(rows):
        m = min(int(cntA[r]), recA.shape[1])
        top = np.sort(recA[r, :m])[::-1][:K]
        if want_ids:
            ids[r, : top.size] = (~(top & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
        if want_kth and top.size == K:
            kth[r] = top[-1]
    return ids, kth


def _fake_select_records_into(K, recA, cntA, ids, kth, scr, recB=None, cntB=None):
    i, k = _fake_select_records(K, recA, cntA, recB, cntB, ids is not None, kth is not None)
    if ids is not None:
        ids[...] = i
    if kth is not None:
        kth[...] = k


def _fake_select_rank_into(K, rec, cnt, ids, kth, scr):
    """select_rank emulated: each record's rank = the row's records greater than it (distinct
    records: a permutation), its id at that place below K, rank K − 1 the K-th record."""
    import dosa_cupy.dense as dense_mod

    assert rec.shape[0] <= dense_mod.RANK_ROWS and rec.dtype == np.uint64
    for r in range(rec.shape[0]):
        x = rec[r, : min(int(cnt[r]), rec.shape[1])]
        rank = (x[None, :] > x[:, None]).sum(axis=1)
        assert np.unique(rank).size == rank.size  # distinct records
        sel = rank < K
        if ids is not None:
            ids[r] = -1
            ids[r, rank[sel]] = (~(x[sel] & np.uint64(0xFFFFFFFF))).astype(np.uint32).view(np.int32)
        if kth is not None:
            kth[r] = x[rank == K - 1][0] if x.size >= K else 0


def _fake_select_rows(logits, K, ks, ke):
    rows = logits.shape[0]
    rec = np.zeros((rows, logits.shape[1]), dtype=np.uint64)
    cnt = np.zeros(rows, dtype=np.uint32)
    for r in range(rows):
        a, e = int(ks[r]), int(ke[r])
        rec[r, : e - a] = _FakeKernels._record(logits[r, a:e], np.arange(a, e))
        cnt[r] = e - a
    return _fake_select_records(K, rec, cnt)[0]


@pytest.fixture
def fake_cupy(monkeypatch):

    import dosa_cupy.dense as dense_mod
    import dosa_cupy.prepare as prep

    shim = numpy_as_cupy()
    # device memory is not zeroed: "empty" buffers hold 3 (a valid id, a tiny record), so a
    # buffer read before the step writes it is seen
    shim.empty = lambda shape, dtype=np.float64: np.full(shape, 3, dtype=dtype)
    fk = _FakeKernels()
    monkeypatch.setattr(dec, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(dops, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(prep, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(dops, "_kernel", fk.get)
    monkeypatch.setattr(dops, "num_sms", lambda: 3)
    monkeypatch.setattr(dense_mod, "select_records_into", _fake_select_records_into)
    monkeypatch.setattr(dense_mod, "select_records_rank_into", _fake_select_rank_into)
    monkeypatch.setattr(dense_mod, "scratch", lambda rows: (rows, None))
    monkeypatch.setattr(dense_mod, "select_records", _fake_select_records)
    monkeypatch.setattr(dense_mod, "_select_rows", _fake_select_rows)
    return fk


@pytest.fixture(params=[True, False], ids=["fold", "chain"])
def step_fold(request, monkeypatch):
    """The decode step's bookkeeping folded into the dedup and decode_step_finish, then as
    the chain of memsets, push, advance and copy (decode_ops.STEP_FOLD)."""
    monkeypatch.setattr(dops, "STEP_FOLD", request.param)
    return request.param


@pytest.mark.parametrize(
    "B,n,H,buffer,K",
    [(1, 1, 32, None, 16), (3, 2, 20, 40, 16), (2, 2, 64, 1, 16), (2, 1, 33, None, 257)],
)
def test_cupy_host_code_with_emulated_kernels(fake_cupy, step_fold, B, n, H, buffer, K):
    cache = PagedCache(B, 8 * 64, seed=B + n + H)
    rs = cache.rs
    L = rs.integers(1, 200, B).astype(np.int32)
    sel = dec.DecodeSelectorGPU(K, history=2, buffer=buffer)
    assert sel.backend == "cupy"
    qf = rs.standard_normal((B, n, H, 128))
    for _ in range(5):
        qp, wq = _queries(rs, qf, n, H)
        args = (qp, wq, cache.kv, cache.scale, cache.block_table, L)
        dense = dec.dense_decode_topk(*args, K)
        assert dense.dtype == np.int64 and dense.shape == (B, n, K)
        out = sel.step(*args)
        assert np.array_equal(out.ids, dense)
        st = out.stats
        # τ is the score of a visible key (the K-th witness) or −inf: the same float
        lg = dec.paged_logits(*args)
        for b in range(B):
            for j in range(n):
                t = st.tau[b, j]
                assert t == -np.inf or np.any(lg[b, j].astype(np.float64) == t), (b, j, t)
        assert np.all(st.compacted >= np.minimum(K, st.visible))
        assert np.all(st.tau <= st.tau_final)
        lg = dec.paged_logits(*args)
        assert lg.shape == (B, n, cache.max_blocks * 64)
        L = np.minimum(L + rs.integers(1, 80, B), cache.max_blocks * 64).astype(np.int32)
    names = {re.sub(r"\d$", "", c) for c in fake_cupy.calls}
    assert {"decode_logits_mt", "decode_fused_mt", "decode_witness_mt"} <= names
    assert f"decode_fused_mt{-(-H // 16)}" in fake_cupy.calls
    folded = {"decode_witness_dedup_zero", "decode_step_finish"}
    chain = {"decode_witness_dedup", "decode_ring_push", "decode_ring_advance"}
    on, off = (folded, chain) if step_fold else (chain, folded)
    assert names >= on and not names & off


def test_cupy_host_code_nan_codes_without_value_scan(fake_cupy):
    """The host code of the fused step with NaN codes in the cache (no value scan): the
    threshold and the compaction compare records, so NaN scores (lowest) are handled as
    the dense route handles them."""
    B, n, H, K = 2, 1, 32, 16
    cache = PagedCache(B, 4 * 64, seed=4)
    kv = cache.kv.copy()
    kv.reshape(-1, 128)[cache.rs.random(kv.shape[0] * 64) < 0.7, 0] = 0x7F
    L = np.array([4 * 64, 30], dtype=np.int32)
    sel = dec.DecodeSelectorGPU(K, history=1)
    qf = cache.rs.standard_normal((B, n, H, 128))
    for _ in range(3):
        qp, wq = _queries(cache.rs, qf, n, H)
        args = (qp, wq, kv, cache.scale, cache.block_table, L)
        assert np.array_equal(sel.step(*args).ids, dec.dense_decode_topk(*args, K))


@pytest.mark.parametrize(
    "field,value,name", [("block_table", [[0, 9], [1, 2]], "block_table"),
                         ("lengths", [70, 129], "lengths"), ("lengths", [-1, 5], "lengths")],
)  # fmt: skip
def test_cupy_host_code_layout_check_names_the_argument(fake_cupy, field, value, name):
    args = {**_good(), field: np.array(value, np.int32)}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        dec.check_decode_inputs(K=4, xp=fake_cupy_shim(), **args)
    with pytest.raises(ValueError, match=rf"^{name}:"):
        dec.DecodeSelectorGPU(4).step(**args)
    dec.check_decode_inputs(K=4, xp=fake_cupy_shim(), check_layout=False, **args)


def test_cupy_host_code_layout_check_far_entries(fake_cupy):
    """A bad block-table entry far into the table (flat index ≥ 61, and a table of 513
    blocks: more than two launch rows of 256) is still found and named."""
    B, mb, nb = 2, 513, 2 * 513 + 1
    g = _good(B=B, nb=nb, mb=mb)
    g["kv_payload"] = np.zeros((nb, 64, 128), np.uint8)
    g["kv_scale"] = np.ones((nb, 64), np.float32)
    g["block_table"] = np.arange(B * mb, dtype=np.int32).reshape(B, mb)
    g["lengths"] = np.full(B, mb * 64, np.int32)
    dec.check_decode_inputs(K=4, xp=fake_cupy_shim(), **g)
    g["block_table"][1, 600 - mb] = nb  # flat index 600
    with pytest.raises(ValueError, match=r"^block_table: block_table\[1, 87\]"):
        dec.check_decode_inputs(K=4, xp=fake_cupy_shim(), **g)


@pytest.mark.parametrize("K", [4097, 0])
def test_k_limits(K):
    with pytest.raises(ValueError, match="^K:"):
        dec.DecodeSelectorGPU(K)
    with pytest.raises(ValueError, match="^K:"):
        dec.check_decode_inputs(K=K, xp=np, **_good())


@pytest.mark.parametrize("widths,Bs", [([7, 5], [3, 3]), ([4, 4], [3, 2]), ([16384], [2]),
                                       ([16384, 1], [2, 2]), ([], [])])  # fmt: skip
def test_cupy_host_code_witness_table(fake_cupy, widths, Bs):
    """witness_table on the (emulated) device: each row's distinct ids, each once, the same
    set as the numpy table — through the dedup kernel when every entry has B rows and there
    are at most DEDUP_MAX witnesses, else through the sort."""
    rs = np.random.default_rng(len(widths) + sum(widths))
    B = 3 if not Bs else max(Bs)
    entries = [rs.integers(-1, 2 * max(widths), (b, m)).astype(np.int32)
               for m, b in zip(widths, Bs, strict=True)]  # fmt: skip
    want = dec.witness_table(entries, B, np)
    got = dec.witness_table(entries, B, fake_cupy_shim())
    if want is None:
        assert got is None
        return
    fast = all(b == B for b in Bs) and sum(widths) <= dops.DEDUP_MAX
    assert ("decode_witness_dedup" in fake_cupy.calls) == fast
    for b in range(B):
        kept = got[b][got[b] >= 0]
        assert kept.size == np.unique(kept).size
        assert np.array_equal(np.sort(kept), want[b][want[b] >= 0])


def fake_cupy_shim():
    return dec.cupy_or_raise()


def test_smem_limit_only_grows(monkeypatch):
    """One dynamic shared-memory limit per loaded function: a smaller request after a larger
    one must not lower it (the dedup kernel's size follows history·next_n·K)."""
    import types

    from dosa_cupy import _build

    dev = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setattr(_build, "cupy_or_raise", lambda: types.SimpleNamespace(cuda=dev))
    monkeypatch.setattr(_build, "_opted", {})
    f = types.SimpleNamespace(max_dynamic_shared_size_bytes=0)
    for smem in (131072, 65536, 131072, 98304):
        _build.raise_smem_limit(f, smem, "decode", "decode_witness_dedup")
        assert f.max_dynamic_shared_size_bytes >= smem
    assert f.max_dynamic_shared_size_bytes == 131072


def test_cupy_host_code_large_witness_table_and_shape_changes(fake_cupy):
    """history·next_n·K above DEDUP_MAX falls back to the sorted table; steps of another B
    keep each shape's workspace (a graph captured at a shape keeps its buffers) and history."""
    B, n, H, K = 2, 2, 32, 4096
    assert 3 * n * K > dops.DEDUP_MAX
    cache = PagedCache(B, 80 * 64, seed=8)
    rs = cache.rs
    sel = dec.DecodeSelectorGPU(K, history=3)
    qf = rs.standard_normal((B, n, H, 128))
    for t in range(4):
        b = 1 if t == 2 else B  # one step of one request between steps of two
        qp, wq = _queries(rs, qf, n, H)
        L = (np.array([80 * 64 - 3, 4500]) - t).astype(np.int32)[:b]
        args = (qp[:b], wq[:b], cache.kv, cache.scale, cache.block_table[:b], L)
        assert np.array_equal(sel.step(*args).ids, dec.dense_decode_topk(*args, K))
    assert len(sel._wss) == 2
    L2 = cache.max_blocks * 64
    assert int(sel._wss[(B, n, H, K, L2, 3, L2)].ctr[0]) == 3  # its three steps, one ring
    sel.release()
    assert sel._wss == {} and sel.witnesses(0).size == 0


def test_reference_comparison_helper_on_cpu(fake_cupy):
    """The GPU tests' tolerance check accepts the emulated float32 route's ids (so it runs
    on the CPU too: ErrorModel coefficients, gathered keys, tie-agnostic conditions)."""
    B, n, H, K = 3, 2, 32, 64
    cache = PagedCache(B, 8 * 64, seed=11)
    rs = cache.rs
    L = np.array([40, 300, 8 * 64], dtype=np.int32)
    qp, wq = _queries(rs, rs.standard_normal((B, n, H, 128)), n, H)
    ids = dec.dense_decode_topk(qp, wq, cache.kv, cache.scale, cache.block_table, L, K)
    worst = _check_against_reference(ids, qp, wq, cache, L, K)
    assert 0.0 <= worst < 1.0
    bad = ids.copy()
    bad[1, 0, 0] = np.setdiff1d(np.arange(299), ids[1, 0])[-1]  # visible, unselected
    with pytest.raises(AssertionError):
        _check_against_reference(bad, qp, wq, cache, L, K)
