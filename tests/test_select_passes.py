"""CPU: the radix selection's control flow (csrc/select.cu select_row), modelled in numpy
digit by digit — the histogram of the records in the K-th's bin, the cut, the compaction
into the block's scratch once the bin fits, the early exit when the bin holds exactly the
remaining kk — with and without ``ABOVE`` (select_kernel_buf, dense.SELECT_BUF: the
compaction also keeps the K − kk records above the bin, and the last pass reads the
scratch).  Both return the K largest records (score desc, id asc) and the K-th; ``ABOVE``
reads the row one pass fewer wherever the records above the bin fit beside it, and never
more often.  The kernels themselves are
checked against the host's order on the GPU (tests/test_gpu.py ``either_select``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def model_select_row(rec, K: int, scap: int, above: bool):
    """(the min(K, n) largest records desc, the K-th or 0, passes over the row) of
    select_row on the distinct uint64 records ``rec``."""
    n, T, passes = rec.size, 0, 0
    buf, from_buf = None, False
    if n > K:
        prefix = mask = 0
        kk, in_buf = K, False
        for d in range(6):
            shf, bm = (53 - 11 * d, 2047) if d < 5 else (0, 511)
            data = buf if in_buf else rec
            passes += not in_buf
            inbin = data[(data & np.uint64(mask)) == np.uint64(prefix)]
            hist = np.bincount(((inbin >> np.uint64(shf)) & np.uint64(bm)).astype(np.int64),
                               minlength=2048)  # fmt: skip
            acc = 0
            for b in range(2047, -1, -1):  # the K-th from the top is in bin b
                if acc + hist[b] >= kk:
                    break
                acc += int(hist[b])
            kk -= acc
            prefix |= b << shf
            mask |= bm << shf
            cnt = int(hist[b])
            if cnt == kk:
                T = prefix
                break
            if not in_buf and cnt <= scap:
                passes += 1
                from_buf = above and cnt + (K - kk) <= scap  # the records above fit too
                keep = rec >= np.uint64(prefix) if from_buf else (rec & np.uint64(mask)) == prefix
                buf, in_buf = rec[keep], True
                assert buf.size <= scap  # the kernel's scratch never overflows
    data = buf if from_buf else rec
    passes += not from_buf
    got = np.sort(data[data >= np.uint64(T)])[::-1]
    assert got.size == min(K, n)
    return got, (got[K - 1] if got.size >= K else np.uint64(0)), passes


def _records(rng, n, spread):
    """n distinct records (code << 32 | ~id) with ``spread`` distinct score codes near one
    exponent (one radix bin holds most of them)."""
    code = np.uint64(0xC0000000) + rng.integers(0, spread, n).astype(np.uint64)
    ids = rng.permutation(1 << 22)[:n].astype(np.uint64)
    return (code << np.uint64(32)) | (~ids & np.uint64(0xFFFFFFFF))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), K=st.sampled_from([1, 7, 64, 300, 2048]),
       scap=st.sampled_from([8, 100, 700, 4096]), spread=st.sampled_from([1, 3, 50, 1 << 20]),
       seed=st.integers(0, 2**31 - 1))  # fmt: skip
def test_above_selects_the_same_records_with_one_pass_fewer(n, K, scap, spread, seed):
    rng = np.random.default_rng(seed)
    rec = _records(rng, n, spread)
    plain, kth0, p0 = model_select_row(rec, K, scap, above=False)
    buf, kth1, p1 = model_select_row(rec, K, scap, above=True)
    want = np.sort(rec)[::-1][:K]
    assert np.array_equal(plain, want) and np.array_equal(buf, want)
    assert kth0 == kth1 == (want[K - 1] if want.size >= K else 0)
    assert p1 <= p0


ROWS = [(70000, 2048, 65536, 1), (30000, 2048, 65536, 1), (5000, 300, 4096, 1),
        (5000, 2048, 2100, 0)]  # fmt: skip


@pytest.mark.parametrize("n,K,scap,saved", ROWS)
def test_above_saves_a_pass_where_the_scratch_fills(n, K, scap, saved):
    """A long row and a DoSA row (70K / 30K records; the selection's 65,536-record scratch)
    and a short one: the last pass reads the scratch, one pass over the row fewer; where the
    records above the bin do not fit beside it (a scratch barely larger than K), the same
    passes."""
    rec = _records(np.random.default_rng(n + K), n, 1 << 12)
    plain, _, p0 = model_select_row(rec, K, scap, above=False)
    buf, _, p1 = model_select_row(rec, K, scap, above=True)
    assert np.array_equal(plain, buf)
    assert p1 == p0 - saved
