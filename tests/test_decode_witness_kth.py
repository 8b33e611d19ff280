"""CPU: the witnesses' K-th record as decode_witness_kth selects it (select_block.cuh's
radix procedure; its host twin ``dosa_cupy.emulate.block_kth_record``; docs/method.md §10
"The witnesses' K-th in their kernel") equals the k-th largest record by a sort — for any
multiset of records (a property), for crafted edges (one record, k = n, every record with
the same score, records equal in all but the lowest bit, the extremes of the 64 bits), and
with the passes the procedure promises: it stops where one record is left with the known
bits.  The GPU test (tests/test_decode_fp8.py
test_gpu_fp8_witness_kth_equals_the_selection_bitwise) holds the kernel to select_into."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_cupy.emulate import KTH_WIDTHS, block_kth_record, make_records


def _oracle(rec, k):
    return int(np.sort(np.asarray(rec, dtype=np.uint64))[-k])


def test_the_digits_cover_the_record():
    assert sum(KTH_WIDTHS) == 64 and max(KTH_WIDTHS) == 11  # select_block.cuh kKthBins 2048


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=300),
    st.integers(1, 300),
    st.integers(0, 64),
)
def test_kth_record_equals_the_sort(values, k, low):
    """Any records (repeats allowed), any rank; ``low``: the records' bits above ``low``
    cleared in part of the list, so that many share their top digits."""
    rec = np.array(values, dtype=np.uint64)
    rec[::2] &= np.uint64((1 << low) - 1) if low < 64 else np.uint64(2**64 - 1)
    k = min(k, rec.size)
    got, passes = block_kth_record(rec, k)
    assert got == _oracle(rec, k)
    assert 1 <= passes <= len(KTH_WIDTHS)


@pytest.mark.parametrize("n", [1, 2, 64, 4096, 16384])
def test_witness_like_records(n):
    """Records of distinct ids with scores of a few thousand witnesses, every rank at the
    edges and in the middle."""
    rs = np.random.default_rng(n)
    ids = rs.permutation(1 << 20)[:n]
    rec = make_records(rs.standard_normal(n).astype(np.float32) * 10, ids)
    for k in sorted({1, min(2, n), n // 2 or 1, n - 1 or 1, n}):
        assert block_kth_record(rec, k)[0] == _oracle(rec, k), k


def test_equal_scores_decide_by_id():
    """Every witness with the same score: the K-th is decided in the id's digits (the fifth
    and sixth passes or the fetch), and equals the record of the K-th smallest id."""
    ids = np.arange(5000, 5000 + 4096)
    rec = make_records(np.full(ids.size, 1.5, np.float32), ids)
    for k in (1, 100, 2048, 4096):
        got, passes = block_kth_record(rec, k)
        assert got == _oracle(rec, k) and ~np.uint32(got & 0xFFFFFFFF) == ids[k - 1]
        assert passes >= 4  # the score's 32 bits, then the id's


def test_extremes_and_neighbours():
    top, bot = 2**64 - 1, 0
    rec = np.array([top, bot, top - 1, bot + 1, 1 << 63, (1 << 63) - 1], dtype=np.uint64)
    for k in range(1, rec.size + 1):
        assert block_kth_record(rec, k)[0] == _oracle(rec, k)
    same = np.full(10, 12345, dtype=np.uint64)  # a multiset: the record itself at every rank
    assert {block_kth_record(same, k)[0] for k in range(1, 11)} == {12345}


def test_one_left_stops_early():
    """Where the K-th record's first digit is its own, one histogram pass and the fetch."""
    rec = np.array([1 << 60, 3 << 60, 5 << 60, 7 << 60], dtype=np.uint64)
    assert block_kth_record(rec, 2) == (5 << 60, 2)


@pytest.mark.parametrize("k", [0, 5])
def test_rank_is_checked(k):
    with pytest.raises(ValueError, match="^k:"):
        block_kth_record(np.arange(4, dtype=np.uint64), k)
