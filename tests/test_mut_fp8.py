"""FP8 key/query quantization against an independent exact specification (docs/mutation.md,
cluster 4).

The specification, in exact rationals (``fractions.Fraction``), of dosa_ref.fp8's module
docstring and the serving quantizers it reproduces:

    amax  = max(max_d |fp32(k_d)|, fp32(1e-4))
    s     = RN_fp32(amax / 448)                           (fp32 division)
    α     = s                                             scale_fmt = "amax"
          = smallest power of two ≥ s                     scale_fmt = "ue8m0"
    k̄_d  = RNE_e4m3(clip(RN_fp32(fp32(k_d) / α), ±448))

(the ue8m0 exponent is taken on the fp32 quotient, as DeepSeek's quantizer does with its
bit-level ceil(log2)).  Amaxes are drawn where the formats disagree: exact powers of two,
448·2^e and its fp32 neighbours, mantissas where ceil and round differ, the 1e-4 clamp,
fp32 subnormals.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dosa_ref.fp8 import (
    AMAX_MIN,
    dequantize,
    e4m3_values,
    key_rms,
    quantize_keys,
    quantize_queries,
    scales_from_amax,
)


def _round_half_even(x: F) -> int:
    n = x.numerator // x.denominator
    rem = x - n
    if rem > F(1, 2) or (rem == F(1, 2) and n % 2 == 1):
        n += 1
    return n


def _round_to(x: F, mant_bits: int, min_exp: int) -> F:
    """Round x to nearest-even on a binary grid with ``mant_bits`` bits after the leading
    one and exponents ≥ ``min_exp`` (below it: the fixed subnormal quantum)."""
    if x == 0:
        return F(0)
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if F(2) ** e > a:
        e -= 1
    e = max(e, min_exp)
    quantum = F(2) ** (e - mant_bits)
    return sign * _round_half_even(a / quantum) * quantum


def f32(x: F) -> F:
    return _round_to(x, 23, -126)


def e4m3(x: F) -> F:
    return _round_to(x, 3, -6)


def spec_scale(amax32: F, fmt: str) -> F:
    s = f32(max(amax32, F(float(AMAX_MIN))) / 448)
    if fmt == "amax":
        return s
    p = F(1)
    while p < s:
        p *= 2
    while p / 2 >= s:
        p /= 2
    return p


def spec_payload(x32: F, alpha: F) -> F:
    y = f32(x32 / alpha)
    return e4m3(max(min(y, F(448)), F(-448)))


def _f32_from(mant: int, exp: int) -> np.float32:
    return np.float32(np.ldexp(float(mant), exp))


SPECIAL = [
    (1 << 23, 0),  # powers of two
    ((1 << 23) + 1, 0),
    ((1 << 24) - 1, 0),
    (7 << 20, 0),  # 448·2^k
    ((7 << 20) + 1, 0),
    ((7 << 20) - 1, 0),
    (int(1.4 * (1 << 23)), 0),  # ceil ≠ round
    (int(1.5 * (1 << 23)) + 1, 0),
]


@st.composite
def amax_values(draw):
    kind = draw(st.sampled_from(["special", "any", "clamp", "subnormal"]))
    if kind == "special":
        mant, _ = draw(st.sampled_from(SPECIAL))
        return _f32_from(mant, draw(st.integers(-60, 80)) - 23)
    if kind == "clamp":
        return np.float32(float(AMAX_MIN) * draw(st.floats(0.25, 4.0)))
    if kind == "subnormal":
        return _f32_from(draw(st.integers(1, (1 << 23) - 1)), -149)
    mant = draw(st.integers(1 << 23, (1 << 24) - 1))
    return _f32_from(mant, draw(st.integers(-100, 100)) - 23)


def _check_row(amax: np.float32, fmt: str, seed: int):
    rs = np.random.default_rng(seed)
    D = 16
    row = (rs.uniform(-1.0, 1.0, D) * float(amax)).astype(np.float32)
    row[rs.integers(D)] = -amax if seed % 2 else amax
    row[0] = row[0] / np.float32(3.0)
    payload, scale = quantize_keys(row[None, :], fmt)
    amax_f = max(F(float(abs(x))) for x in row)
    alpha = spec_scale(amax_f, fmt)
    assert F(float(scale[0])) == alpha, (float(amax), fmt)
    assert scale.dtype == np.float32
    got = e4m3_values(payload[0])
    for d in range(D):
        assert F(float(got[d])) == spec_payload(F(float(row[d])), alpha), (float(amax), fmt, d)
    deq = dequantize(payload, scale)[0]
    for d in range(D):
        assert F(float(deq[d])) == F(float(got[d])) * alpha


@given(amax_values(), st.sampled_from(["amax", "ue8m0"]), st.integers(0, 2**16))
@example(_f32_from(7 << 20, -23), "ue8m0", 0)
@example(_f32_from((7 << 20) + 1, -23), "ue8m0", 1)
@example(_f32_from(int(1.4 * (1 << 23)), -23 + 9), "ue8m0", 2)
@example(np.float32(1e-5), "ue8m0", 3)
@example(np.float32(1e-5), "amax", 3)
def test_quantize_keys_matches_the_exact_specification(amax, fmt, seed):
    _check_row(amax, fmt, seed)


@pytest.mark.parametrize("fmt", ["amax", "ue8m0"])
def test_scales_at_every_special_mantissa(fmt):
    """Deterministic sweep: every special mantissa at exponents −40..60, both formats."""
    for mant, _ in SPECIAL:
        for e in range(-40, 61, 7):
            a = _f32_from(mant, e - 23)
            got = scales_from_amax(np.array([max(a, AMAX_MIN)], np.float32), fmt)
            assert F(float(got[0])) == spec_scale(F(float(a)), fmt), (mant, e, fmt)
            _check_row(a, fmt, mant + e)


def test_quantize_queries_folds_the_exact_scale():
    rs = np.random.default_rng(5)
    q = rs.standard_normal((2, 3, 8)) * np.array([1e-7, 1.0, 3e3])[None, :, None]
    w = rs.standard_normal((2, 3))
    for fmt in ("amax", "ue8m0"):
        qp, wf = quantize_queries(q, w, fmt)
        assert wf.dtype == np.float32
        for t in range(2):
            for h in range(3):
                q32 = q[t, h].astype(np.float32)
                amax = max(F(float(abs(x))) for x in q32)
                alpha = spec_scale(amax, fmt)
                assert F(float(wf[t, h])) == f32(F(float(np.float32(w[t, h]))) * alpha)
                vals = e4m3_values(qp[t, h])
                for d in range(8):
                    assert F(float(vals[d])) == spec_payload(F(float(q32[d])), alpha)


def test_key_rms_bounds_and_limits():
    """ρ·√D ≥ ‖k̄‖ exactly and ρ is at most a few fp32 ulps above ‖k̄‖/√D; D ≥ 170,000
    is refused (the exact squared-norm argument needs D < 170,000)."""
    rs = np.random.default_rng(2)
    for D in (1, 3, 7, 128, 1000):
        payload = rs.integers(0, 0x7E, (50, D)).astype(np.uint8)
        payload[0] = 0
        rho = key_rms(payload)
        v = e4m3_values(payload)
        for i in range(50):
            n2 = sum(F(float(x)) ** 2 for x in v[i])
            r = F(float(rho[i]))
            assert r * r * D >= n2
            if n2 > 0:
                assert r * r * D <= n2 * (1 + F(1, 2**19))
    assert key_rms(np.zeros((2, 4), np.uint8))[0] <= 2.0**-140
    nan_row = np.zeros((2, 4), np.uint8)
    nan_row[1, 2] = 0x7F
    assert np.isnan(key_rms(nan_row)[1]) and np.isfinite(key_rms(nan_row)[0])
    with pytest.raises(ValueError, match="payload"):
        key_rms(np.zeros((1, 170_000), np.uint8))
    key_rms(np.zeros((1, 169_999), np.uint8))
