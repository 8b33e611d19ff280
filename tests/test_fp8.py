"""FP8 e4m3 quantization: bit patterns of CUDA's saturating RNE conversion, scales, exact
dequantization, RMS summaries, and input validation (dosa_ref.fp8)."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_ref.fp8 import (
    AMAX_MIN,
    dequantize,
    e4m3_bits,
    e4m3_values,
    key_rms,
    nan_codes,
    quantize_keys,
    quantize_queries,
    scales_from_amax,
)

# All finite e4m3 values with their codes (0x00..0x7E positive, 0x80..0xFE negative).
CODES = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
VALUES = e4m3_values(CODES)


def reference_bits(x: float) -> int:
    """Independent reference: saturate, then the nearest finite e4m3 value, ties to the
    even code (even mantissa); the sign of zero follows the input."""
    x = float(np.float32(x))
    if x != x:
        raise ValueError
    ax = min(abs(x), 448.0)
    pos = CODES[(CODES < 0x80)]
    vals = e4m3_values(pos)
    d = np.abs(vals - ax)
    best = np.flatnonzero(d == d.min())
    if best.size > 1:
        best = best[pos[best] % 2 == 0]
    code = int(pos[best[0]])
    if np.signbit(x):
        code |= 0x80
    return code


@pytest.mark.parametrize(
    "x, bits",
    [
        (448.0, 0x7E),
        (464.0, 0x7E),  # midpoint to the (NaN) next code: saturates
        (465.0, 0x7E),  # ml_dtypes alone would give NaN
        (-465.0, 0xFE),
        (1e30, 0x7E),
        (0.0, 0x00),
        (-0.0, 0x80),
        (2.0**-10, 0x00),  # half the smallest subnormal: tie to even (zero)
        (-(2.0**-10), 0x80),
        (2.0**-10 * (1 + 2.0**-20), 0x01),
        (2.0**-9, 0x01),  # smallest subnormal
        (3 * 2.0**-10, 0x02),  # tie between codes 1 and 2: even
        (0.53125, 0x30),  # tie between 0.5 (0x30) and 0.5625 (0x31): even
        (0.59375, 0x32),  # tie between 0x31 and 0x32: even
        (240.0, 0x77),
        (432.0, 0x7E),  # tie between 416 (0x7D) and 448 (0x7E): even
    ],
)
def test_e4m3_bits_corner_values(x, bits):
    assert int(e4m3_bits(np.float32(x))) == bits
    assert reference_bits(x) == bits


def test_e4m3_bits_match_reference_at_every_midpoint():
    pos = np.sort(VALUES[VALUES > 0])
    mids = (pos[:-1] + pos[1:]) / 2
    xs = np.concatenate([mids, np.nextafter(mids.astype(np.float32), 0), pos, [449.0, 500.0]])
    xs = np.concatenate([xs, -xs]).astype(np.float32)
    got = e4m3_bits(xs)
    want = np.array([reference_bits(x) for x in xs], dtype=np.uint8)
    np.testing.assert_array_equal(got, want)


@settings(deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False, width=32))
def test_e4m3_bits_match_reference(x):
    assert int(e4m3_bits(np.float32(x))) == reference_bits(x)


def test_nan_codes():
    assert nan_codes(np.array([0x7F, 0xFF, 0x7E, 0x00], dtype=np.uint8)).tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert np.isnan(e4m3_values(np.array([0x7F], dtype=np.uint8))[0])


def test_quantize_keys_scale_one_rows():
    row = np.array([[448.0, 464.0 / 2, -3 * 2.0**-10, 2.0**-10, -0.0, 0.53125, 1.0, -448.0]])
    for fmt in ("amax", "ue8m0"):
        p, s = quantize_keys(row, fmt)
        assert s.dtype == np.float32 and s[0] == 1.0
        np.testing.assert_array_equal(p[0], e4m3_bits(row[0].astype(np.float32)))
        assert p[0, 4] == 0x80  # -0 keeps its sign


def test_quantize_keys_scales():
    k = np.array([[0.0] * 4, [1e-6, -2e-6, 0, 0], [1.0, -2.0, 3.0, 0.5], [1e30, 1, 2, 3]])
    p, s = quantize_keys(k, "amax")
    assert s[0] == np.float32(AMAX_MIN) / np.float32(448) and s[1] == s[0]  # amax clamp
    assert s[2] == np.float32(3.0) / np.float32(448)
    assert np.all(p[0] == 0) and np.max(np.abs(e4m3_values(p[2]))) == 448.0
    p2, s2 = quantize_keys(k, "ue8m0")
    m, e = np.frexp(s2)
    assert np.all(m == 0.5)  # powers of two
    amax = np.maximum(np.max(np.abs(k.astype(np.float32)), axis=1), AMAX_MIN)
    ratio = amax.astype(np.float64) / s2
    assert np.all((ratio > 224) & (ratio <= 448))
    # ue8m0 of an exact power of two: 448·2^-3 → scale 2^-3 exactly.
    assert scales_from_amax(np.float32([56.0]), "ue8m0")[0] == np.float32(0.125)


@settings(deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["amax", "ue8m0"]),
    st.sampled_from([1e-30, 1e-6, 1.0, 1e4, 1e30]),
)
def test_quantize_dequantize_exact_and_close(seed, fmt, mag):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((5, 16)) * mag
    k[0] = 0.0
    k[1, 3] *= 1e4  # one dominant coordinate: the others become e4m3 subnormals
    p, s = quantize_keys(k, fmt)
    vals = e4m3_values(p)
    deq = dequantize(p, s)
    # exact: value times scale, no rounding
    for i in range(k.shape[0]):
        for d in (0, 3, 7):
            assert Fraction(float(deq[i, d])) == Fraction(float(vals[i, d])) * Fraction(float(s[i]))
    # saturating RNE of k/scale: error ≤ half an e4m3 step (relative 2^-4) or half the
    # smallest subnormal (2^-10), in payload units
    y = (k.astype(np.float32) / s[:, None]).astype(np.float64)
    err = np.abs(vals - np.clip(y, -448, 448))
    assert np.all(err <= np.maximum(np.abs(y) * 2.0**-4, 2.0**-10) * (1 + 1e-12))


def test_quantize_rejects_non_finite():
    for bad in (np.nan, np.inf, -np.inf):
        k = np.ones((2, 4))
        k[1, 2] = bad
        with pytest.raises(ValueError, match="k"):
            quantize_keys(k)
        q = np.ones((1, 2, 4))
        q[0, 1, 0] = bad
        with pytest.raises(ValueError, match="q"):
            quantize_queries(q, np.ones((1, 2)))
        with pytest.raises(ValueError, match="w"):
            quantize_queries(np.ones((1, 2, 4)), np.array([[1.0, bad]]))
    with pytest.raises(ValueError, match="k"):
        quantize_keys(np.full((1, 2), 1e300))  # overflows float32
    with pytest.raises(ValueError, match="scale_fmt"):
        quantize_keys(np.ones((1, 2)), "e5m2")


def test_quantize_queries_folds_scale():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 3, 8))
    w = rng.standard_normal((2, 3))
    qp, wf = quantize_queries(q, w, "amax")
    amax = np.max(np.abs(q.astype(np.float32)), axis=2)
    sc = (amax / np.float32(448)).astype(np.float32)
    np.testing.assert_array_equal(wf, (w.astype(np.float32) * sc).astype(np.float32))
    assert qp.shape == q.shape and qp.dtype == np.uint8
    # the folded product approximates the original head score
    x = e4m3_values(qp) @ np.ones(8)
    np.testing.assert_allclose(wf * x, w * (q @ np.ones(8)), rtol=0.1, atol=0.2)


@settings(deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300))
def test_key_rms_dominates_norm_exactly(seed, D):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(4, D)).astype(np.uint8)
    codes[nan_codes(codes)] = 0x7E
    codes[0] = 0x7E  # saturated row
    codes[1] = rng.integers(0, 8, size=D)  # subnormals only
    rho = key_rms(codes)
    assert rho.dtype == np.float32
    vals = e4m3_values(codes)
    for i in range(codes.shape[0]):
        n2 = sum(Fraction(float(v)) ** 2 for v in vals[i])
        assert Fraction(float(rho[i])) ** 2 * D >= n2
    bad = codes.copy()
    bad[2, 0] = 0x7F
    assert np.isnan(key_rms(bad)[2])
