"""Bad input raises ValueError naming the argument (docs/design.md, public contract)."""

import importlib
import math

import numpy as np
import pytest

from dosa_ref import DecodeSelector, dosa_topk, fp8_bounds, fp8_topk, index_scores, topk_ids
from dosa_ref.fp8 import quantize_keys
from dosa_ref.pipeline import topk_check
from dosa_ref.validate import IDS_MAX, K_MAX, check_K, check_scores

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


# ---------------------------------------------------------------------------------------
# Array arguments of every entry point (dosa_ref/validate.py): a value numpy cannot read
# or would convert into another problem raises ValueError naming the argument
# ---------------------------------------------------------------------------------------

PAYLOAD, SCALE = quantize_keys(k)
KS, KE = np.array([0, 1]), np.array([10, 9])
# decode layout: q [B, next_n, H, D], w [B, next_n, H], ranges [B, next_n], lengths [B]
DQ, DW = np.ones((2, 2, 3, 4)), -np.ones((2, 2, 3))
DKS, DKE, DL = np.array([[0, 0], [1, 1]]), np.array([[9, 10], [8, 9]]), np.array([9, 10])


def _decode(K, **kw):
    return DecodeSelector(K).step(**kw)


# Each entry point with valid arguments (by name); the tests replace one of them.
ENTRIES = {
    "index_scores": (index_scores, dict(q=q, w=w, k=k, ks=KS, ke=KE)),
    "dosa_topk": (dosa_topk, dict(q=q, w=w, k=k, K=3, ks=KS, ke=KE)),
    "fp8_topk": (fp8_topk, dict(q=q, w=w, payload=PAYLOAD, scale=SCALE, K=3, ks=KS, ke=KE)),
    "topk_check": (topk_check, dict(q=q, w=w, payload=PAYLOAD, scale=SCALE, K=3, ks=KS, ke=KE)),
    "fp8_bounds": (fp8_bounds, dict(q=q, w=w, payload=PAYLOAD, scale=SCALE, ks=KS, ke=KE)),
    "topk_ids": (topk_ids, dict(scores=index_scores(q, w, k), K=3)),
    "decode": (_decode, dict(K=2, q=DQ, w=DW, k=k, ks=DKS, ke=DKE)),
    "decode_lengths": (_decode, dict(K=2, q=DQ, w=DW, k=k, lengths=DL)),
}
INT_ARGS = ("ks", "ke", "lengths")  # index arguments: integer dtypes only; None = default
REAL_KINDS = ("ragged", "object", "str", "bytes", "complex", "None", "bool")
INT_KINDS = ("ragged", "object", "str", "bytes", "complex", "bool", "whole_float", "float")


def _ragged(good: np.ndarray) -> list:
    """``good`` as nested lists with its last innermost row one entry short (1-d: the last
    entry a list), so numpy cannot build an array of it."""
    lst = good.tolist()
    if good.ndim == 1:
        lst[-1] = [lst[-1]]
        return lst
    row = lst
    while isinstance(row[-1], list):
        row = row[-1]
    row.pop()
    return lst


def _bad_value(good, kind: str):
    g = np.asarray(good)
    return {
        "ragged": lambda: _ragged(g),
        "object": lambda: g.astype(object),  # numbers, but in an object array
        "str": lambda: np.full(g.shape, "1"),  # "1" would convert to 1.0 if allowed
        "bytes": lambda: np.full(g.shape, b"1"),
        "complex": lambda: g.astype(np.complex128),
        "None": lambda: None,
        "bool": lambda: np.ones(g.shape, dtype=bool),
        "whole_float": lambda: g.astype(np.float64),  # 1.0: refused like 1.5 (one rule)
        "float": lambda: g + 0.5,
    }[kind]()


def _array_cases():
    cases = []
    for entry, (_, good) in ENTRIES.items():
        for arg in good:
            if arg == "K":
                continue
            for kind in INT_KINDS if arg in INT_ARGS else REAL_KINDS:
                cases.append(pytest.param(entry, arg, kind))
    return cases


@pytest.mark.parametrize("entry", ENTRIES)
def test_entry_points_accept_the_good_arguments(entry):
    """The baseline of the cases below: with every argument valid, each call succeeds."""
    fn, good = ENTRIES[entry]
    fn(**good)


@pytest.mark.parametrize("entry,arg,kind", _array_cases())
def test_bad_array_names_argument(entry, arg, kind):
    """A ragged list, an object array, strings, bytes, complex numbers, None where an array
    is required, booleans and (for index arguments) floats, whole or not: ValueError whose
    message starts with the argument's name."""
    fn, good = ENTRIES[entry]
    args = dict(good, **{arg: _bad_value(good[arg], kind)})
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        fn(**args)


@pytest.mark.parametrize("entry", [e for e, (_, g) in ENTRIES.items() if "ks" in g])
@pytest.mark.parametrize("value", [np.array([0.0, 1.0]), np.array([1.5, 0.0])])
def test_float_ranges_say_integers_are_required(entry, value):
    """One rule for 1.0 and 1.5 (integer dtypes only, as dosa_cupy takes), and a message
    that says so: not "got dtype float64" alone, which read as if 1.5 were the problem."""
    fn, good = ENTRIES[entry]
    v = value if good["ks"].ndim == 1 else np.stack([value, value], axis=1)
    with pytest.raises(ValueError, match=r"^ks: expected integers .*floats are refused"):
        fn(**dict(good, ks=v))


@pytest.mark.parametrize("entry", [e for e, (_, g) in ENTRIES.items() if "ks" in g])
@pytest.mark.parametrize("cast", [lambda a: a.tolist(), lambda a: a.astype(np.int32),
                                  lambda a: a.astype(np.uint8)])  # fmt: skip
def test_integer_ranges_of_any_integer_dtype_are_accepted(entry, cast):
    """Python ints (lists) and every numpy integer dtype mean the same ranges."""
    fn, good = ENTRIES[entry]
    want = fn(**good)
    got = fn(**dict(good, ks=cast(good["ks"]), ke=cast(good["ke"])))
    for name in ("ids", "U") if not isinstance(want, np.ndarray) else ():
        if hasattr(want, name):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    if isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want)


def test_uint64_ranges_above_int64_are_refused_not_wrapped():
    """2**64 - 1 would wrap to -1 in int64; the message must not report a negative entry."""
    with pytest.raises(ValueError, match=r"^ke: entries too large for int64"):
        index_scores(q, w, k, ke=np.array([10, 2**64 - 1], dtype=np.uint64))


def test_check_scores_names_the_argument():
    """``check_scores``, the validation of ``topk_ids``: -inf allowed,
    everything ``as_float_array`` refuses refused, NaN and +inf refused."""
    s = index_scores(q, w, k, ks=KS, ke=KE)
    np.testing.assert_array_equal(check_scores(s), s)
    assert check_scores(s.astype(np.float32)).dtype == np.float64
    for kind in REAL_KINDS:
        with pytest.raises(ValueError, match=r"^scores\b"):
            check_scores(_bad_value(s, kind))
    for v in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"^scores: contains nan or \+inf"):
            check_scores(np.where(np.isfinite(s), s, v))
    with pytest.raises(ValueError, match=r"^scores: expected 2 dimensions"):
        check_scores(s[0])


# ---------------------------------------------------------------------------------------
# K: 1 <= K <= K_MAX = 2**31 - 1, and the ids array holds at most IDS_MAX = 2**31 - 1 ids
# ---------------------------------------------------------------------------------------

_K_ENTRIES = [e for e, (_, g) in ENTRIES.items() if "K" in g]


def test_check_K_bounds():
    """K_MAX and IDS_MAX are the stated limits; nothing is allocated to check them."""
    assert K_MAX == IDS_MAX == 2**31 - 1
    assert check_K(K_MAX) == K_MAX and check_K(np.int64(K_MAX)) == K_MAX
    assert check_K(K_MAX, rows=1) == K_MAX and check_K(K_MAX, rows=0) == K_MAX
    assert check_K(2**30, rows=1) == 2**30
    for K in (K_MAX + 1, 10**12, np.uint64(2**64 - 1), np.asarray(10**12)):
        with pytest.raises(ValueError, match=r"^K: at most 2147483647 \(2\*\*31 - 1"):
            check_K(K)
    # 2 rows of 2**30 ids: 2**31 ids, 2**34 bytes (16 GiB): the message gives the bytes
    with pytest.raises(ValueError, match=r"^K: .* 2 rows x K=1073741824 .*17179869184 bytes"):
        check_K(2**30, rows=2)
    with pytest.raises(ValueError, match=r"^K: .*at most 2147483647 ids"):
        check_K(K_MAX, rows=2)
    # a caller's own, smaller limit (the GPU selection kernel's)
    with pytest.raises(ValueError, match=r"^K: at most 4096 \(the kernel\), got 4097"):
        check_K(4097, max_K=4096, why="the kernel")


@pytest.mark.parametrize("entry", _K_ENTRIES)
@pytest.mark.parametrize("K", [10**12, 2**31])
def test_huge_K_raises_before_allocating(entry, K):
    """K = 10**12 asked for a 21.8 TiB int64 [Qn, K] array (MemoryError); now ValueError."""
    fn, good = ENTRIES[entry]
    with pytest.raises(ValueError, match=r"^K: at most 2147483647"):
        fn(**dict(good, K=K))


@pytest.mark.parametrize("entry", _K_ENTRIES)
def test_K_above_the_key_count_pads(entry):
    """K > N is part of the contract (-1 padding), far below the limits."""
    fn, good = ENTRIES[entry]
    K = k.shape[0] + 5
    out = fn(**dict(good, K=K))
    ids = out if isinstance(out, np.ndarray) else out.ids
    assert ids.shape[-1] == K and (ids[..., k.shape[0] :] == -1).all()


class _GuardedNumpy:
    """numpy, except that ``full`` refuses more than IDS_MAX entries with MemoryError: an
    entry point that allocates its ids array before checking its size would otherwise ask
    for 16 GiB here, and the test must not depend on the machine's memory."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def full(shape, *args, **kwargs):
        if math.prod(shape if isinstance(shape, tuple) else (shape,)) > IDS_MAX:
            raise MemoryError(f"test guard: np.full of shape {shape}")
        return np.full(shape, *args, **kwargs)


@pytest.mark.parametrize("entry", _K_ENTRIES)
def test_ids_larger_than_the_limit_raise_before_allocating(entry, monkeypatch):
    """K ≤ K_MAX but Qn·K > IDS_MAX (here 2 or 4 rows of 2**30 ids, ≥ 16 GiB): ValueError
    naming K and the size in bytes, raised before the ids array is allocated."""
    for mod in ("dosa_ref.scorer", "dosa_ref.pipeline", "dosa_ref.decode"):
        monkeypatch.setattr(importlib.import_module(mod), "np", _GuardedNumpy())
    fn, good = ENTRIES[entry]
    with pytest.raises(ValueError, match=r"^K: the ids array .* bytes"):
        fn(**dict(good, K=2**30))


# ---------------------------------------------------------------------------------------
# The same rules in the GPU package's host-side validation (no GPU needed)
# ---------------------------------------------------------------------------------------


def test_gpu_K_limit_is_the_selection_kernels():
    """dosa_cupy's K limit (4096) is the one its messages give, also for K > K_MAX."""
    from dosa_cupy.decode import check_decode_inputs
    from dosa_cupy.prepare import check_selection_K

    assert check_selection_K(np.asarray(4096)) == 4096
    for K in (4097, 10**12):
        with pytest.raises(ValueError, match=r"^K: at most 4096"):
            check_selection_K(K)
        with pytest.raises(ValueError, match=r"^K: at most 4096"):
            check_decode_inputs(K=K, xp=np, **_gpu_decode_good())


def _gpu_decode_good() -> dict:
    return dict(
        q=np.zeros((2, 1, 16, 128), np.uint8),
        w=np.ones((2, 1, 16), np.float32),
        kv_payload=np.zeros((5, 64, 128), np.uint8),
        kv_scale=np.ones((5, 64), np.float32),
        block_table=np.arange(4, dtype=np.int32).reshape(2, 2),
        lengths=np.full(2, 70, np.int32),
    )


@pytest.mark.parametrize("arg", ["block_table", "lengths", "q", "w", "kv_payload", "kv_scale"])
@pytest.mark.parametrize("kind", ["ragged", "object", "str", "None", "bool", "whole_float"])
def test_gpu_decode_inputs_name_the_argument(arg, kind):
    from dosa_cupy.decode import check_decode_inputs

    good = _gpu_decode_good()
    if kind == "whole_float" and arg not in ("block_table", "lengths"):
        pytest.skip("a float dtype is right for the others (or refused by their dtype)")
    args = dict(good, **{arg: _bad_value(good[arg], kind)})
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        check_decode_inputs(K=4, xp=np, **args)


@pytest.mark.parametrize("arg", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("kind", ["ragged", "object", "str", "None", "bool", "whole_float"])
def test_gpu_ragged_offsets_name_the_argument(arg, kind):
    """The host checks of ``ragged_topk`` run before any device work (no GPU needed)."""
    from dosa_cupy.serving import ragged_topk

    good = dict(
        q=np.zeros((5, 16, 128), np.uint8),
        w=np.ones((5, 16), np.float32),
        k_payload=np.zeros((79, 128), np.uint8),
        k_scale=np.ones(79, np.float32),
        K=4,
        cu_seqlens_q=np.array([0, 2, 2, 5]),
        cu_seqlens_k=np.array([0, 5, 9, 79]),
    )
    args = dict(good, **{arg: _bad_value(good[arg], kind)})
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        ragged_topk(**args)


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
        ({"mma_bits": 24}, "mma_bits"),  # the scorer's error model, not an option
        ({"seeds": ["local", 3]}, "seeds"),
    ],
)
def test_gpu_options_name_the_bad_one(kw, name):
    from dosa_cupy.options import check_options

    with pytest.raises(ValueError, match=f"^{name}:"):
        check_options(kw)


def test_gpu_options_accept_their_bounds():
    from dosa_cupy.options import check_options

    for kw in ({"r": 1}, {"r": 30}, {"buffer": 1},
               {"cert_cap": 1}, {"sinks": 0}, {"n_anchors": 0}, {"p_sample": 0}, {"window": 0},
               {"cert_seeds": 4096}):  # fmt: skip
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


def test_resolved_gpu_options_are_read_only():
    """Options are resolved once into a read-only mapping; a decision of the call (the
    route's screen) reaches the later stages as a new mapping, never by a change."""
    from dosa_cupy.options import check_options, resolve_options, resolved

    o = resolve_options(check_options({"screen": "auto"}), 2048)
    with pytest.raises(TypeError):
        o["screen"] = "fp64"
    o2 = resolved(o, screen="wg")
    assert o2["screen"] == "wg" and o["screen"] == "auto"
    with pytest.raises(TypeError):
        o2["r"] = 30
    assert dict(o2, screen="pair")["screen"] == "pair"  # the sample's copies still work
