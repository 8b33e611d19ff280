"""CPU: the three host launches of select_kernel and select_kernel_ilp (dense.py: logits
rows, record lists, the wide selection's per-row choice; one parameter list,
DOSA_SELECT_PARAMS) pass the kernel the arguments its signature in select.cu names, in
order — one helper builds them (`dense._select_kernel`)."""

import numpy as np
import pytest
from cuda_signatures import params, read_source
from gpu_support import numpy_as_cupy

from dosa_cupy import dense
from dosa_cupy._build import CSRC

SIG = [n for _, n in params(read_source(CSRC / "select.cu"), r"select_kernel")]


@pytest.fixture(params=["select_kernel_buf", "select_kernel_ilp", "select_kernel"])
def launches(monkeypatch, request):
    calls = []
    shim = numpy_as_cupy()
    monkeypatch.setattr(dense, "SELECT_ILP", request.param != "select_kernel")
    monkeypatch.setattr(dense, "SELECT_BUF", request.param == "select_kernel_buf")
    rows = request.param

    def kernel(name, *_):
        assert name in {rows, "select_wide_hist", "select_wide_cut", "select_wide_compact"}

        def launch(grid, block, args, **kw):
            named = dict(zip(SIG, args, strict=True)) if name == rows else args
            calls.append((name, grid, named))

        return launch

    monkeypatch.setattr(dense, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(dense, "kernel", kernel)
    monkeypatch.setattr(dense, "scratch", lambda rows: (5, np.zeros(8, np.uint64)))
    monkeypatch.setattr(dense, "num_sms", lambda: 4)
    return calls


def _sel(calls):
    (a,) = [c[2] for c in calls if c[0].startswith("select_kernel")]
    return a


def test_logits_rows(launches):
    lg = np.zeros((3, 100), np.float32)
    ks, ke = np.zeros(3, np.int32), np.full(3, 100, np.int32)
    ids = dense.select_rows(lg, 7, ks, ke)
    a = _sel(launches)
    assert a["mode"] == 0 and a["rows"] == 3 and a["K"] == 7 and a["ld"] == 100
    assert a["logits"] is lg and a["ks_"] is ks and a["ke_"] is ke and a["ids_out"] is ids
    assert a["capA"] == 0 and a["capB"] == 0 and a["recA"] == 0 and a["kth_out"] == 0
    assert a["scap"] == dense.SCRATCH and launches[0][1] == (5,)


def test_record_lists(launches):
    ra, ca = np.zeros((2, 9), np.uint64), np.zeros(2, np.uint32)
    rb, cb = np.zeros((2, 4), np.uint64), np.zeros(2, np.uint32)
    ids, kth = dense.select_records(6, ra, ca, rb, cb, want_kth=True)
    a = _sel(launches)
    assert a["mode"] == 1 and a["rows"] == 2 and a["logits"] == 0 and a["ld"] == 0
    assert a["recA"] is ra and a["cntA"] is ca and a["capA"] == 9
    assert a["recB"] is rb and a["cntB"] is cb and a["capB"] == 4
    assert a["ids_out"] is ids and a["kth_out"] is kth
    launches.clear()
    dense.select_records(6, ra, ca, want_ids=False, want_kth=True)
    a = _sel(launches)
    assert a["recB"] == 0 and a["capB"] == 0 and a["ids_out"] == 0


def test_wide_rows(launches):
    lg = np.zeros((2, dense.WIDE_MIN_N), np.float32)
    ks, ke = np.zeros(2, np.int32), np.full(2, dense.WIDE_MIN_N, np.int32)
    ids = dense.select_rows(lg, 5, ks, ke)
    a = _sel(launches)
    assert a["mode"] == 2 and a["logits"] is lg and a["ld"] == dense.WIDE_MIN_N
    assert a["capA"] == 5 + dense.WIDE_EXTRA and a["recA"].shape == (2, a["capA"])
    assert a["capB"] == 0 and a["ids_out"] is ids


def _bad_rows_inputs():
    lg = np.zeros((3, 100), np.float32)
    ks, ke = np.zeros(3, np.int32), np.full(3, 100, np.int32)
    good = dict(logits=lg, K=7, ks=ks, ke=ke)
    return [
        ("K", dict(good, K=0)), ("K", dict(good, K=dense.SEL_KMAX + 1)), ("K", dict(good, K=7.0)),
        ("logits", dict(good, logits=lg.astype(np.float64))),
        ("logits", dict(good, logits=lg[0])), ("logits", dict(good, logits=lg.tolist())),
        ("logits", dict(good, logits=np.zeros((100, 3), np.float32).T)),
        ("ks", dict(good, ks=ks.astype(np.int64))), ("ks", dict(good, ks=ks[:2])),
        ("ke", dict(good, ke=ke.reshape(3, 1))),
        ("ks, ke", dict(good, ke=np.array([100, 101, 5], np.int32))),  # past N
        ("ks, ke", dict(good, ks=np.array([0, 6, 0], np.int32), ke=np.array([9, 5, 9], np.int32))),
        ("ks, ke", dict(good, ks=np.array([-1, 0, 0], np.int32))),
    ]  # fmt: skip


@pytest.mark.parametrize("name,kw", _bad_rows_inputs())
def test_select_rows_refuses_bad_input(launches, name, kw):
    """The public selection of logits rows names the bad argument and launches nothing: a K
    past the kernel's limit, logits that are not a float32 C-contiguous matrix, ranges of
    another dtype or shape, or outside 0 <= ks <= ke <= N (a row read past its end would
    select another row's keys)."""
    with pytest.raises(ValueError, match=f"^{name}:"):
        dense.select_rows(**kw)
    assert launches == []


def test_select_rows_default_ranges(launches):
    """ks, ke None: every row whole, [0, N)."""
    lg = np.zeros((3, 100), np.float32)
    dense.select_rows(lg, 7)
    a = _sel(launches)
    assert a["ks_"].tolist() == [0, 0, 0] and a["ke_"].tolist() == [100, 100, 100]
