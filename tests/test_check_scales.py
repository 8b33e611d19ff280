"""CPU: the scale and envelope checks by one kernel (``prepare.SCALE_CHECK_KERNEL``,
csrc/prepare.cu check_scales) set the flag bits the array path sets (``ValueCheck``'s
``_flag_envelope`` with the switch off): SCALES_INVALID exactly when some α is not in
[0, FLT_MAX], CHECK_ENVELOPE exactly when some query's Σ|w| · 2^25 · max(α_max, 1) > 2^125.
The kernel is emulated operation for operation (its bit tests, its per-query sums in head
order, its two maxima over every block and the last block's test) and launched through the
host code, its arguments checked against the kernel's C signature.  The GPU side:
tests/test_gpu.py ``test_check_scales_kernel_equals_the_array_path``."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import numpy_as_cupy
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_cupy import _build
from dosa_cupy import prepare as prep
from dosa_cupy.prepare import CHECK_ENVELOPE, SCALES_INVALID

PREPARE_CU = _build.CSRC / "prepare.cu"
SIG = param_types(read_source(PREPARE_CU), "check_scales")
SMS = 132


def emulate_check_scales(
    ksc, N, w, Qn, H, dot_bound, envelope_max, acc, flags, env_bit, scale_bit, grid, block
):
    """csrc/prepare.cu check_scales in numpy: each thread's strided α and query loops, the
    maxima and the invalid flag reduced over its warp and block into acc and flags (maxima
    and ORs: any order), then the last block's envelope test."""
    threads = grid * block
    bits = np.asarray(ksc, np.float32).view(np.uint32)[: int(N)]
    valid = bits < 0x7F800000
    bad = ~valid & (bits != 0x80000000)
    for t in range(threads):  # the strided loops, thread by thread
        mine = bits[t::threads]
        ok = mine[mine < 0x7F800000]
        if ok.size:
            acc[0] = max(int(acc[0]), int(ok.max()))
        for q in range(t, int(Qn), threads):
            s = 0.0
            for h in range(int(H)):
                s += abs(float(w[q, h]))
            if s > 0.0:
                acc[1] = max(int(acc[1]), int(np.float64(s).view(np.uint64)))
    if bad.any():
        flags[0] |= scale_bit
    acc[2] = grid  # every block counted itself; the last one tests
    a = float(np.uint32(acc[0]).view(np.float32))
    ws = float(np.uint64(acc[1]).view(np.float64))
    if int(N) > 0 and ws * (float(dot_bound) * max(a, 1.0)) > float(envelope_max):
        flags[0] |= env_bit


class _Fake:
    def __init__(self):
        self.calls = []

    def kernel(self, name, *a):
        assert name == "check_scales", name

        def launch(grid, block, args, shared_mem=0):
            check_args(name, args, SIG)
            n = max(int(args[1]), int(args[3]), 1)
            assert grid == (min(-(-n // 256), 4 * SMS),) and block == (256,)
            assert (args[5], args[6]) == (prep._DOT_BOUND, prep.ENVELOPE_MAX)
            assert np.all(args[7] == 0)  # acc zeroed
            self.calls.append(name)
            emulate_check_scales(*args, grid[0], block[0])

        return launch


def _flags(w, ksc, monkeypatch, kernel: bool) -> int:
    """The flag word ``_flag_envelope`` leaves (numpy standing in for CuPy)."""
    shim = numpy_as_cupy()
    fake = _Fake()
    monkeypatch.setattr(prep, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(prep, "kernel", fake.kernel)
    monkeypatch.setattr(prep, "num_sms", lambda: SMS)
    monkeypatch.setattr(prep, "SCALE_CHECK_KERNEL", kernel)
    vc = object.__new__(prep.ValueCheck)
    vc._flags = np.zeros(1, dtype=np.uint32)
    vc._flag_envelope(np.ascontiguousarray(w, np.float32), np.ascontiguousarray(ksc, np.float32))
    assert fake.calls == (["check_scales"] if kernel else [])
    return int(vc._flags[0])


NEG_SUB = np.array([0x80000001], np.uint32).view(np.float32)[0]  # −2^-149
POS_SUB = np.array([0x00000001], np.uint32).view(np.float32)[0]
F32_MAX = np.finfo(np.float32).max
SPECIAL = [0.0, -0.0, 1.0, 0.5, 3.0, F32_MAX, POS_SUB, NEG_SUB, -1.0, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("bad", [None, -1.0, NEG_SUB, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("edge", [-0.0, 0.0, POS_SUB, F32_MAX])
def test_scale_flag_on_special_values(monkeypatch, bad, edge):
    ksc = np.full(1000, 0.25, np.float32)
    ksc[17] = edge
    if bad is not None:
        ksc[999] = bad
    w = np.ones((5, 32), np.float32)
    got = _flags(w, ksc, monkeypatch, True)
    assert got == _flags(w, ksc, monkeypatch, False)
    assert bool(got & SCALES_INVALID) == (bad is not None)


@pytest.mark.parametrize("amax", [0.0, 0.5, 1.0, 2.0, 2.0**60, F32_MAX])
def test_envelope_flag_at_its_boundary(monkeypatch, amax):
    """Weights put the largest query's Σ|w| on 2^125 / (2^25 · max(α_max, 1)) and one ulp
    either side: both paths flag the same side (an invalid scale above α_max does not count)."""
    ksc = np.array([0.125, amax, np.inf, 1e38], np.float32)
    ksc[3] = -1e38  # invalid: not in α_max
    a = max(float(np.float32(amax)), 1.0)
    edge = 2.0**125 / (2.0**25 * a)
    for target in (np.nextafter(edge, 0), edge, np.nextafter(edge, np.inf), edge * 4, edge / 4):
        w = np.zeros((3, 16), np.float32)
        w[1, 0] = np.float32(target)  # one head carries the sum (an fp32 value)
        w[1, 1] = -np.float32(target) * np.float32(2.0**-30)
        got = _flags(w, ksc, monkeypatch, True)
        assert got == _flags(w, ksc, monkeypatch, False), target
        if target in (edge * 4, edge / 4):  # far from the boundary: the side is known
            assert bool(got & CHECK_ENVELOPE) == (target > edge), target
        assert got & SCALES_INVALID  # the inf and the negative scale


def test_no_key_flags_no_envelope(monkeypatch):
    w = np.full((4, 64), 1e30, np.float32)
    assert _flags(w, np.zeros(0, np.float32), monkeypatch, True) == 0
    assert _flags(w, np.zeros(0, np.float32), monkeypatch, False) == 0


def test_valid_scales_decides_on_the_bits():
    """+0 … FLT_MAX and −0 are valid, a negative subnormal is not: the definition by bits that
    the kernel uses, so a device that flushes subnormal operands (CuPy's -ftz=true) agrees
    with numpy (tests/test_gpu.py compares the two flag words on the GPU)."""
    from dosa_cupy.scorer import valid_scales

    k = np.array(SPECIAL, np.float32)
    want = [True, True, True, True, True, True, True, False, False, False, False, False]
    assert valid_scales(k).tolist() == want
    assert valid_scales(k[::2]).tolist() == want[::2]  # a strided view


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(SPECIAL) | st.floats(0, 2.0**20, width=32), min_size=0, max_size=40),
    st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=24),
    st.integers(1, 3),
)
def test_kernel_flags_equal_the_array_path(ksc, wv, Qn):
    """Any scales (specials included) and weights up to 2^100 (the envelope's both sides)."""
    with pytest.MonkeyPatch.context() as mp:
        H = len(wv)
        w = np.tile(np.asarray(wv, np.float32), (Qn, 1)) * np.arange(1, Qn + 1)[:, None]
        w = w.astype(np.float32)
        k = np.asarray(ksc, np.float32)
        assert _flags(w, k, mp, True) == _flags(w, k, mp, False), (ksc, wv, Qn, H)


def test_prefetched_flags_are_read_from_their_copy(monkeypatch):
    """``ValueCheck.prefetch`` (``prepare.DEFER_CHECKS``) copies the flag word by an event;
    ``flags`` then waits for that event and reads the copy — no stream synchronization — and
    reads it once; ``forget`` drops both, so the next read synchronizes again."""
    events, copies = [], []

    class Event:
        def synchronize(self):
            events.append("wait")

    def read_back_async(x):
        copies.append(int(x[0]))
        return np.array(x, copy=True), Event()

    def no_sync():
        raise AssertionError("flags synchronized the stream despite its prefetched copy")

    monkeypatch.setattr(prep, "read_back_async", read_back_async)
    monkeypatch.setattr(prep, "cupy_or_raise", no_sync)
    vc = object.__new__(prep.ValueCheck)
    vc._flags, vc._bad = np.array([prep.CHECK_ORDER], dtype=np.uint32), None
    assert vc._copy is None and not vc.read
    vc.prefetch()
    vc.prefetch()  # one copy
    vc._flags[0] = 0  # written after the copy: the copy is what the checks left
    assert vc.flags == prep.CHECK_ORDER and vc.read
    assert vc.flags == prep.CHECK_ORDER and events == ["wait"] and copies == [prep.CHECK_ORDER]
    vc.prefetch()  # already read: nothing copied
    assert copies == [prep.CHECK_ORDER]
    vc.forget()
    monkeypatch.setattr(prep, "cupy_or_raise", numpy_as_cupy)
    assert vc.flags == 0 and events == ["wait"]
