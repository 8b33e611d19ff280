"""CPU: the route stage's counts by two kernels (``route.COUNT_KERNELS``, csrc/route.cu
route_head and route_sample) equal the array path's (``route._head_counts`` and
``route._sample_counts`` with the switch off) element for element: visible and screened
keys, the tie-aware build's flag (±0 τ only, with tie_reject), the positive-head histogram
(positive weights on their bits: subnormals, ±0, ±inf, NaN), the sample's survivor bits,
visible keys and plan r.  The kernels are emulated in numpy and launched through the host
code, their arguments checked against their C signatures.  The GPU side:
tests/test_gpu_route.py ``test_route_count_kernels_equal_the_array_path``."""

from __future__ import annotations

import types

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import numpy_as_cupy, positive_f32
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_cupy import _build
from dosa_cupy import route as route_mod
from dosa_cupy import screen as screen_mod
from dosa_cupy.prepare import Batch

ROUTE_CU = read_source(_build.CSRC / "route.cu")
SIGS = {n: param_types(ROUTE_CU, n) for n in ("route_head", "route_sample")}


def emulate_route_head(ks, ke, cnt, tau, w, Qn, Hp, tie_reject, hist, out):
    if isinstance(ks, np.ndarray):  # a null ks: the histogram alone (route.head_prefetch)
        v = ke.astype(np.int64) - ks.astype(np.int64)
        out[0] += v.sum()
        out[1] += (v - cnt.astype(np.int64)).sum()
        zero = (np.asarray(tau, np.float32).view(np.uint32) & 0x7FFFFFFF) == 0
        out[2] = max(int(out[2]), int(bool(tie_reject) and zero.any()))
    if hist:
        n = positive_f32(w.reshape(int(Qn), int(Hp))).sum(axis=1)
        np.add.at(out, 3 + n, 1)


def emulate_route_sample(surv, n, NW, ks, ke, cnt, idx, r, out):
    out[0] += int(sum(bin(int(x)).count("1") for x in surv.ravel()))
    v = ke.astype(np.int64) - ks.astype(np.int64)
    out[1] += (v - cnt[idx].astype(np.int64)).sum()
    out[2 : 2 + int(n)] = v
    out[2 + int(n) :] = r


EMULATE = {"route_head": emulate_route_head, "route_sample": emulate_route_sample}


def _install(mp) -> list:
    """numpy for CuPy and the emulated kernels in route.py (their arguments checked against
    the C signatures): the names launched, in order."""
    xp = numpy_as_cupy()
    calls = []

    def kernel(name, *a):
        def launch(grid, block, args, shared_mem=0):
            check_args(name, args, SIGS[name])
            assert block == (256,) and 1 <= grid[0] <= 1024
            assert np.all(args[-1] == 0)  # out zeroed
            calls.append(name)
            EMULATE[name](*args)

        return launch

    mp.setattr(route_mod, "cupy_or_raise", lambda: xp)
    mp.setattr(route_mod, "kernel", kernel)
    return calls


@pytest.fixture
def shim(monkeypatch):
    return _install(monkeypatch)


SPECIAL_W = [0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, np.inf, -np.inf, np.nan]


def _chunk(rs, Qn, Hp, N=5000, special=True):
    ks = rs.randint(0, N, Qn).astype(np.int32)
    ke = np.minimum(N, ks + rs.randint(0, N, Qn)).astype(np.int32)
    w = rs.standard_normal((Qn, Hp)).astype(np.float32)
    if special:
        w.ravel()[rs.randint(0, w.size, 12)] = rs.choice(SPECIAL_W, 12)
    q = np.zeros((Qn, Hp, 128), np.uint8)
    b = Batch(q, w, np.zeros((N, 128), np.uint8), np.ones(N, np.float32), 8, ks, ke, Hp)
    tau = rs.standard_normal(Qn).astype(np.float32)
    cnt = rs.randint(0, 50, Qn).astype(np.uint32)
    cnt = np.minimum(cnt, (ke - ks).astype(np.uint32))
    seeds = types.SimpleNamespace(default=types.SimpleNamespace(cnt=cnt), tau=tau)
    return b, seeds


def _both(monkeypatch, f, *args):
    monkeypatch.setattr(route_mod, "COUNT_KERNELS", True)
    got = np.asarray(f(*args))
    monkeypatch.setattr(route_mod, "COUNT_KERNELS", False)
    want = np.asarray(f(*args))
    return got, want


@pytest.mark.parametrize("tau0", [None, 0.0, -0.0, 1e-45])
@pytest.mark.parametrize("tie_reject", [True, False])
@pytest.mark.parametrize("auto", [True, False])
def test_head_counts(shim, monkeypatch, tau0, tie_reject, auto):
    rs = np.random.RandomState(7)
    b, seeds = _chunk(rs, 300, 64)
    if tau0 is not None:
        seeds.tau[123] = tau0
    o = {"tie_reject": tie_reject}
    got, want = _both(monkeypatch, route_mod._head_counts, b, seeds, o, auto)
    assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
    assert shim == ["route_head"]
    assert got[2] == int(tie_reject and tau0 is not None and tau0 == 0.0)  # ±0 only
    if auto:
        assert got[3:].sum() == b.Qn


@pytest.mark.parametrize("Hp", [16, 32, 64])
def test_head_prefetch_histogram(shim, monkeypatch, Hp):
    """``route.head_prefetch``: the positive-head histogram read back before the seeds, by
    route_head with a null ks (no ranges, seed counts or τ read), equals the array path's."""
    rs = np.random.RandomState(11)
    b, _ = _chunk(rs, 257, Hp)
    monkeypatch.setattr(route_mod, "read_back_async", lambda x: (np.array(x), None))
    o = dict(route="auto", screen="auto", cert_seeds=0)
    got, want = _both(monkeypatch, lambda: route_mod.head_prefetch(b, o)[0])
    assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
    assert got.shape == (Hp + 1,) and got.sum() == b.Qn
    assert shim == ["route_head"]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70), st.sampled_from([16, 32, 64]), st.integers(0, 2**31 - 1))
def test_sample_counts(n, Hp, seed):
    with pytest.MonkeyPatch.context() as mp:
        calls = _install(mp)
        rs = np.random.RandomState(seed % 2**32)
        b, seeds = _chunk(rs, 100, Hp, special=False)
        idx = np.unique(rs.randint(0, 100, n)).astype(np.int64)
        bs = b.rows(idx)
        surv = rs.randint(0, 2**32, (idx.size, bs.NW), dtype=np.uint64).astype(np.uint32)
        surv[:, rs.randint(bs.NW)] = 0
        plan = types.SimpleNamespace(r=np.asarray(rs.randint(0, 31, (idx.size, 3)), np.int32)[:, 0])
        got, want = _both(mp, route_mod._sample_counts, surv, bs, seeds, idx, plan)
        assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
        assert calls == ["route_sample"]


def test_positive_on_bits_is_positive_heads_hist():
    """The kernel's positive weight on the bits (common.cuh dosa::positive_f32, emulated by
    ``gpu_support.positive_f32``) counts what screen.positive_heads_hist counts with w > 0:
    ±0, −subnormal, −1, −inf and NaN are not positive; +subnormal, 1 and +inf are."""
    w = np.array([SPECIAL_W + [2.0] * 7], np.float32)
    n = int(positive_f32(w).sum())
    assert screen_mod.positive_heads_hist(w, np)[n] == 1


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_sample_gate_waits_for_the_timed_launch(monkeypatch, gate, fails):
    """``route.SAMPLE_GATE``: ``route._sample`` queues csrc/route.cu route_gate (its
    arguments checked against the build's signature: the page-locked word's address, the
    next ticket, the time limit) after priming the launch and before the start event, and
    opens it (writes the ticket) only after the end event is queued — also when the launch
    raises; without the switch nothing is queued and the word is untouched."""
    from cuda_signatures import built_params

    from dosa_cupy import _signature
    from dosa_cupy.seeds import Seeds

    log, word = [], np.zeros(1, np.uint32)
    monkeypatch.setattr(route_mod, "SAMPLE_GATE", gate)
    monkeypatch.setattr(route_mod, "_GATES", {0: [word, 7]})

    class Event:
        def record(self):
            log.append(("event", int(word[0])))

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0), Event=Event),
        empty=np.empty, zeros=np.zeros, uint32=np.uint32,
    )  # fmt: skip
    monkeypatch.setattr(route_mod, "cupy_or_raise", lambda: fake)
    params = built_params("route_gate")

    def kernel(name, *a):
        def launch(grid, block, args, shared_mem=0):
            _signature.check_launch(name, params, args, (np.ndarray,))
            assert (name, grid, block) == ("route_gate", (1,), (1,))
            assert int(args[0]) == word.ctypes.data and int(args[2]) == route_mod.GATE_MAX_NS
            log.append(("gate", int(args[1]), int(word[0])))

        return launch

    class Launch:
        def prime(self, surv, tcnt):
            log.append("prime")

        def __call__(self, surv, bounds, cert, tcnt):
            log.append(("screen", int(word[0])))
            if fails:
                raise RuntimeError("launch")

    monkeypatch.setattr(route_mod, "kernel", kernel)
    monkeypatch.setattr(route_mod, "ScreenLaunch", types.SimpleNamespace(of=lambda *a: Launch()))
    monkeypatch.setattr(route_mod, "_sample_counts", lambda *a: "counts")
    seeds = Seeds(None, None, None, None, None, np.zeros(9, np.float32), None, 0, 0)
    bs = types.SimpleNamespace(Qn=3, NW=2)
    idx = np.array([0, 4, 8])
    try:
        got = route_mod._sample(bs, None, seeds, idx, None, {"screen": "wgt"}, False)
    except RuntimeError:
        assert fails
    else:
        assert not fails and got[2] == "counts"
    timed = [("event", 0), ("screen", 0)] + ([] if fails else [("event", 0)])
    assert log == ["prime"] + ([("gate", 8, 0)] if gate else []) + timed
    assert int(word[0]) == (8 if gate else 0)
