"""Certificate-guided seeds on the GPU (``dosa_cupy.dosa_topk(cert_seeds=m)``; docs/method.md
§2, dosa_ref.select's "certificate" strategy): the screen also records (U, id) of its
survivors (``screen_cert_mt*``), the m survivors of largest U are scored exactly and raise
τ, and ``cert_clear_below_tau`` drops the survivors whose bound is below the new τ.

CPU tests: the kernels' C signatures against the host code's launch arguments, and the
clear kernel's host wrapper with a numpy emulation of the kernel against the reference
stage ``dosa_ref.stages.cert_clear_below_tau``.  GPU tests (marked ``gpu``, skipped
without a GPU; run records: docs/records/gpu_tests.md): ids equal
the dense route's bitwise, τ never above the true K-th score, survivors never more than
without certificate seeds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import HAVE_GPU, cp, gpu, guard_violations

import dosa_cupy.seeds as sd
import dosa_cupy.select as sel
from dosa_cupy.emulate import make_records
from dosa_cupy.options import check_options
from dosa_ref.stages import cert_clear_below_tau

SRC = read_source(Path(sd.__file__).parent / "csrc" / "kernels.cu").replace("\\\n", " ")


def _sig(pattern: str) -> list:
    return param_types(SRC, pattern)


def test_screen_cert_signature_extends_screen():
    """screen_cert_mt* takes the screen's arguments plus (ucnt, urec, ucap), and the
    host's record buffer (select.RecordBuffer.args()) has exactly those types."""
    base = _sig(r"void __launch_bounds__\(256\) screen_mt##MTS")
    cert = _sig(r"void __launch_bounds__\(256\) screen_cert_mt##MTS")
    assert cert[: len(base)] == base
    tail = cert[len(base) :]
    assert tail == [np.uint32, np.uint64, np.int64]
    old = sel.cupy_or_raise
    try:
        sel.cupy_or_raise = lambda: np
        args = sel.RecordBuffer(5, 7).args()
    finally:
        sel.cupy_or_raise = old
    assert [np.asarray(a).dtype.type for a in args] == tail
    assert re.findall(r"SCREEN_INST\((\d)\)", SRC) == ["1", "2"]


_record = make_records  # (U, id) records, record.cuh make_record


def _code_score(c):
    c = c.astype(np.uint32)
    b = np.where(c & np.uint32(0x80000000), c & np.uint32(0x7FFFFFFF), ~c)
    return b.astype(np.uint32).view(np.float32)


class _FakeClear:
    """numpy emulation of ``cert_clear_below_tau`` with its argument types checked."""

    def __init__(self):
        self.types = _sig(r"void cert_clear_below_tau")
        self.calls = 0

    def __call__(self, name, *_):
        assert name == "cert_clear_below_tau"

        def launch(grid, block, args):
            check_args(name, args, self.types)
            urec, ucnt, ucap, tau, Qn, NW, surv = args
            assert grid[1] == min(surv.shape[0], 65535) and surv.shape == (Qn, NW)
            for t in range(surv.shape[0]):
                n = min(int(ucnt[t]), int(ucap))
                r = urec[t, :n]
                u = _code_score(r >> np.uint64(32))
                ids = (~(r & np.uint64(0xFFFFFFFF)).astype(np.uint32)).astype(np.int64)
                for i in ids[u < tau[t]]:
                    surv[t, i >> 5] &= ~np.uint32(1 << (i & 31))
            self.calls += 1

        return launch


@pytest.mark.parametrize("cap", [3, 40, 1000])
def test_cert_clear_matches_reference(cap):
    """The host wrapper + emulated kernel clear exactly the reference's dropped survivors
    (among the recorded ones); unrecorded survivors (count > cap) keep their bit."""
    rng = np.random.default_rng(cap)
    Qn, N = 4, 300
    NW = (N + 31) // 32
    alive = rng.random((Qn, N)) < 0.3
    U = rng.normal(size=(Qn, N)).astype(np.float32)
    U[0, :5] = np.nan
    tau = rng.normal(size=Qn).astype(np.float32) * 0.5
    words = np.zeros((Qn, NW), dtype=np.uint32)
    for t in range(Qn):
        for i in np.flatnonzero(alive[t]):
            words[t, i >> 5] |= np.uint32(1 << (i & 31))
    old_cp, old_kernel = sel.cupy_or_raise, sd.kernel
    fake = _FakeClear()
    try:
        sel.cupy_or_raise = lambda: np
        sd.kernel = fake
        cert = sel.RecordBuffer(Qn, cap)
        for t in range(Qn):
            ids = rng.permutation(np.flatnonzero(alive[t]))  # record order is arbitrary
            cert.cnt[t] = ids.size
            m = min(cap, ids.size)
            cert.rec[t, :m] = _record(U[t, ids[:m]], ids[:m])
        sd.cert_clear(cert, tau, words)
    finally:
        sel.cupy_or_raise, sd.kernel = old_cp, old_kernel
    assert fake.calls == 1
    for t in range(Qn):
        got = np.flatnonzero(np.unpackbits(words[t].view(np.uint8), bitorder="little")[:N])
        surv = np.flatnonzero(alive[t])
        n = min(cap, surv.size)
        recorded = np.zeros(N, dtype=bool)
        rec = cert.rec[t, :n]
        recorded[(~(rec & np.uint64(0xFFFFFFFF)).astype(np.uint32)).astype(np.int64)] = True
        want = np.union1d(
            cert_clear_below_tau(surv[recorded[surv]], U[t, surv[recorded[surv]]], tau[t]),
            surv[~recorded[surv]],
        )
        np.testing.assert_array_equal(got, want)


def test_cert_options_validated():
    with pytest.raises(ValueError, match="cert_seeds"):
        check_options({"cert_seeds": 5000})
    with pytest.raises(ValueError, match="cert_seeds"):
        check_options({"cert_seeds": -1})
    with pytest.raises(ValueError, match="cert_cap"):
        check_options({"cert_cap": 0})


if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


def _logits(wl):
    return dosa_cupy.dense_logits(
        wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], wl["ks"], wl["ke"]
    )


def _base_and_option(regime, H, seed, K, base, option):
    """64 × 16,384 causal workload: DoSA with options ``base`` and with ``base`` +
    ``option``, both asserted equal to the dense route's ids; (wl, args, stats, stats)."""
    if regime == "calibrated":
        pytest.importorskip("dosa_ref.workloads")
    wl = make_gpu_workload(regime, 64, 16384, H, seed=seed)
    a = _args(wl, K)
    dense = dosa_cupy.dense_topk(*a)
    base = {"screen": "fp64", **base}  # the mma.sync screen at r, whatever "auto" picks
    ids0, st0 = dosa_cupy.dosa_topk(*a, return_stats=True, **base)
    ids, st = dosa_cupy.dosa_topk(*a, return_stats=True, **{**base, **option})
    assert cp.array_equal(ids, dense) and cp.array_equal(ids0, dense)
    return wl, a, st0, st


def _args(wl, K):
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


@pytest.mark.parametrize(
    "regime,H,kw",
    [
        ("structured", 32, {}),
        ("structured", 64, {"r": 30}),
        ("calibrated", 32, {}),
        ("calibrated", 64, {}),
        ("structured", 32, {"buffer": 16}),  # compact-record overflow → exact extension
        ("calibrated", 32, {"cert_cap": 64}),  # (U, id) records dropped past the cap
        ("structured", 48, {"window": 0, "sinks": 0, "n_anchors": 0}),  # τ0 = −inf
    ],
)
@gpu
def test_cert_seeds_equal_dense(regime, H, kw):
    """ids == dense ids bitwise; τ ≤ the true K-th score; τ ≥ τ without certificate seeds;
    survivors never more than without them."""
    K = 512
    wl, a, st0, st = _base_and_option(regime, H, 13, K, kw, {"cert_seeds": K})
    lg = _logits(wl)
    kth = cp.asnumpy(cp.sort(lg, axis=1)[:, -K])
    assert np.all(st.tau <= kth) and np.all(st.tau >= st0.tau)
    assert np.all(st.survivors <= st0.survivors)
    print(
        f"\n[cert] {regime} H={H} {kw}: survivors {st0.survivors.sum()} → {st.survivors.sum()}"
        f", cert seeds/query {st.cert_seeds.mean():.0f}"
    )


@gpu
def test_cert_seeds_with_explicit_seeds_and_bounds():
    """Explicit seeds that are also survivors are counted once; the guard still holds."""
    K = 256
    wl = make_gpu_workload("structured", 32, 8192, 32, seed=5)
    a = _args(wl, K)
    dense = dosa_cupy.dense_topk(*a)
    seeds = cp.asarray(np.random.default_rng(1).integers(-1, 8192, (32, 600)), dtype=cp.int32)
    ids, st = dosa_cupy.dosa_topk(*a, seed_ids=seeds, cert_seeds=K, return_stats=True,
                                  debug_bounds=True)  # fmt: skip
    assert cp.array_equal(ids, dense)
    lg = _logits(wl)
    kth = cp.asnumpy(cp.sort(lg, axis=1)[:, -K])
    assert np.all(st.tau <= kth)
    assert guard_violations(lg, st.bounds)[0] == 0


# --------------------------------------------------------------------------- screen option


def test_screen_option_validated():
    assert check_options({"screen": "fp64"})["screen"] == "fp64"
    with pytest.raises(ValueError, match="screen"):
        check_options({"screen": "fp32"})
