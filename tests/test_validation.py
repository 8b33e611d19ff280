"""Bad input raises ValueError naming the argument (docs/design.md, public contract)."""

import numpy as np
import pytest

from dosa_ref import dosa_topk, index_scores, topk_ids

q = np.ones((2, 3, 4))
w = -np.ones((2, 3))
k = np.ones((10, 4))


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(q=np.ones((2, 3))), "q"),
        (dict(w=np.ones((2, 4))), "w"),
        (dict(k=np.ones((10, 5))), "k"),
        (dict(q=np.full((2, 3, 4), np.nan)), "q"),
        (dict(w=np.array([[1, np.inf, 1], [1, 1, 1]])), "w"),
        (dict(k=np.full((10, 4), -np.inf)), "k"),
        (dict(K=0), "K"),
        (dict(K=2.5), "K"),
        (dict(K=3.0), "K"),
        (dict(K=True), "K"),
        (dict(K=np.bool_(True)), "K"),
        (dict(K=np.asarray(3.0)), "K"),
        (dict(K=np.asarray(True)), "K"),
        (dict(K=np.asarray([3])), "K"),
        (dict(ks=np.array([3, 0]), ke=np.array([2, 10])), "ks"),
        (dict(ke=np.array([5, 11])), "ke"),
        (dict(ks=np.array([-1, 0])), "ks"),
        (dict(ks=np.array([0, 0, 0])), "ks"),
        (dict(ks=np.array([0.5, 0.0])), "ks"),
        (dict(q=np.array([["a"]])), "q"),
    ],
)
def test_bad_input_names_argument(kwargs, name):
    args = dict(q=q, w=w, k=k, K=3, ks=None, ke=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        dosa_topk(**args)
    if name != "K":
        args.pop("K")
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            index_scores(**args)


@pytest.mark.parametrize(
    "opt,name",
    [
        (dict(seeds="nope"), "seeds"),
        (dict(seeds="explicit"), "seed_ids"),
        (dict(buffer=0), "buffer"),
        (dict(r=0), "r"),
        (dict(form="x"), "form"),
        (dict(neg_aggregate="x"), "neg_aggregate"),
        (dict(allowance="x"), "allowance"),
        (dict(bogus=1), "bogus"),
        (dict(window=-1), "window"),
        (dict(window=2.0), "window"),
        (dict(cert_seeds=-1), "cert_seeds"),
        (dict(auto_dense=1), "auto_dense"),
        (dict(seed_ids=np.zeros((3, 2), np.int64)), "seed_ids"),
        (dict(seed_ids=np.zeros((2, 2))), "seed_ids"),
        (dict(seed_ids=np.full((2, 2), 10)), "seed_ids"),
    ],
)
def test_bad_options_name_option(opt, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        dosa_topk(q, w, k, 3, **opt)


@pytest.mark.parametrize("K", [np.asarray(3), np.asarray(3, dtype=np.uint8), np.int32(3)])
def test_K_as_numpy_integer_or_0d_array(K):
    """K given as a numpy integer or a 0-d integer array means that integer."""
    ref = topk_ids(index_scores(q, w, k), 3)
    np.testing.assert_array_equal(dosa_topk(q, w, k, K).ids, ref)
    np.testing.assert_array_equal(topk_ids(index_scores(q, w, k), K), ref)


def test_topk_ids_rejects_nan_and_bad_K():
    with pytest.raises(ValueError, match="^scores"):
        topk_ids(np.array([[np.nan, 1.0]]), 1)
    with pytest.raises(ValueError, match="^K"):
        topk_ids(np.zeros((1, 3)), 0)


def test_topk_ids_contract():
    s = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0], [-np.inf] * 5])
    np.testing.assert_array_equal(topk_ids(s, 4), [[1, 2, 4, 0], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(topk_ids(s, 1), [[1], [-1]])


def test_check_seed_ids_does_not_wrap_unsigned_ids():
    """An uint64 id ≥ 2^63 must be refused, not cast to a negative int64 that passes as the
    padding −1 (or into [0, N)); the GPU package validates with the same function."""
    from dosa_ref.options import check_seed_ids

    good = np.array([[0, -1, 9]], dtype=np.int64)
    np.testing.assert_array_equal(check_seed_ids(good, 1, 10), good)
    for bad, n in (
        (np.full((1, 2), 2**64 - 1, np.uint64), 10),  # would wrap to −1 (padding)
        (np.full((1, 2), 2**63 + 3, np.uint64), 10),  # would wrap to a negative id
        (np.full((1, 1), 10, np.uint8), 10),  # = N
        (np.ones((1, 1), np.uint32), 0),  # N = 0: no id is valid
    ):
        with pytest.raises(ValueError, match="seed_ids"):
            check_seed_ids(bad, 1, n)


def test_nan_code_word_predicate():
    """csrc/prepare.cu check_values tests four e4m3 codes at once: a word has a NaN code
    (byte & 0x7F == 0x7F) iff ((x & M) + C) & H != 0 — the three constants read from the
    kernel's source, checked for every byte value in every lane against the per-byte rule
    (``dosa_ref.fp8.nan_codes``)."""
    import re
    from pathlib import Path

    from dosa_ref.fp8 import nan_codes

    src = (Path(__file__).resolve().parents[1] / "dosa_cupy/csrc/prepare.cu").read_text()
    m = re.search(r"has_nan_code\(uint32_t x\) \{\s*return \(\(\(x & (0x\w+)u\) \+ "
                  r"(0x\w+)u\) & (0x\w+)u\) != 0u;", src)  # fmt: skip
    assert m, "has_nan_code's expression not found in csrc/prepare.cu"
    M, C, H = (int(g, 16) for g in m.groups())
    rng = np.random.default_rng(0)
    for lane in range(4):
        for b in range(256):
            other = rng.integers(0, 256, (64, 4), dtype=np.uint64)
            other[:, lane] = b
            x = (other << (8 * np.arange(4, dtype=np.uint64))).sum(axis=1)
            word = (((x & np.uint64(M)) + np.uint64(C)) & np.uint64(H)) != 0
            assert np.array_equal(word, nan_codes(other).any(axis=1))


# ---------------------------------------------------------------------------------------
# The GPU package's options (dosa_cupy/options.py: host logic, no GPU needed)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"bogus": 1}, "bogus"),
        ({"sinks": -1}, "sinks"),
        ({"n_anchors": -1}, "n_anchors"),
        ({"p_sample": -1}, "p_sample"),
        ({"buffer": 0}, "buffer"),
        ({"cert_cap": 0}, "cert_cap"),
        ({"window": -1}, "window"),
        ({"cert_seeds": 4097}, "cert_seeds"),
        ({"r": 0}, "r"),
        ({"r": 31}, "r"),
        ({"mma_bits": 7}, "mma_bits"),
        ({"mma_bits": 25}, "mma_bits"),
        ({"stream": "both"}, "stream"),
        ({"planner": "numpy"}, "planner"),
        ({"seeds": ["local", 3]}, "seeds"),
    ],
)
def test_gpu_options_name_the_bad_one(kw, name):
    from dosa_cupy.options import check_options

    with pytest.raises(ValueError, match=f"^{name}:"):
        check_options(kw)


def test_gpu_options_accept_their_bounds():
    from dosa_cupy.options import check_options

    for kw in ({"r": 1}, {"r": 30}, {"mma_bits": 8}, {"mma_bits": 24}, {"buffer": 1},
               {"cert_cap": 1}, {"sinks": 0}, {"n_anchors": 0}, {"p_sample": 0}, {"window": 0},
               {"cert_seeds": 4096}, {"stream": "shared"}, {"planner": "cupy"}):  # fmt: skip
        assert check_options(kw)[next(iter(kw))] == next(iter(kw.values()))


def test_gpu_options_resolve_certificate_seeds_and_leave_their_input():
    """cert_seeds = 0 turns the certificate strategy off even when named; m > 0 turns it on
    (with a default-free count); resolving returns a new dict."""
    from dosa_cupy.options import check_options, resolve_options

    o = check_options({"seeds": "local+certificate", "cert_seeds": 0})
    r = resolve_options(o, 64)
    assert r["cert_seeds"] == 0 and "strategies" not in o and r is not o
    assert resolve_options(check_options({"cert_seeds": 1}), 64)["cert_seeds"] == 1
    with pytest.raises(ValueError, match="^screen:"):  # 1 certificate seed is "on"
        check_options({"cert_seeds": 1, "screen": "wg"})
    for screen in ("wg", "pair"):  # 0 is "off": the screens that take none accept it
        check_options({"cert_seeds": 0, "screen": screen, "r": 6})


def test_gpu_stats_overflowed_marks_every_extension():
    from dosa_cupy.options import DosaGpuStats

    st = DosaGpuStats(3, stage_ms={})
    st.overflows = np.array([0, 1, 2])
    assert st.overflowed.tolist() == [False, True, True]
