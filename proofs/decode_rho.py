"""The decode screen's ρ (docs/error_model.md "The decode screen's ρ"; csrc/score_fp8.cu
``key_rho_bound``, its host model ``dosa_cupy.emulate.decode_key_rho``).

Statement.  For a key of 128 e4m3 codes without NaN, ρ = key_rho_bound(k̄) satisfies
ρ ≥ ‖k̄‖ / √128, i.e. ρ√D ≥ ‖k̄‖ (D = 128) — the one property of ρ that the certificate's
step 6 uses (docs/method.md §8), so the decode screen's U^num bounds the canonical score as
the prefill screens' does with prepare's ρ.

Proof.  Each code pair converts exactly to an f16 pair (every e4m3 value is an f16 value).
t = x · 2^-3 is exact: an e4m3 value has at most 4 significant bits and is a multiple of
2^-9, so t is a multiple of 2^-12 of at most 4 bits, at most 56.  t² is a multiple of 2^-24
of at most 8 bits and at most 3,136: an f16 value (11 bits; subnormals reach 2^-24).  A
chain acc ← fma(t, t, acc) of 8 steps starts from 0, so its first step is exact; every
partial sum is a multiple of 2^-24, at most 8 · 3,136 (1 + 2^-11)^7 < 65,504 (no overflow);
a result below 2^-14 is then an exact f16 subnormal, and a larger one is rounded to nearest
with relative error ≤ u = 2^-11.  Every term meets at most 7 roundings, each by a factor
≥ 1 − u (all terms ≥ 0), so each chain is ≥ (1 − u)^7 × its exact sum.  The f16 halves
convert exactly to fp32 and every fp32 addition, the product by kRhoLift and the square root
round up, so T ≥ (1 − u)^7 Σ t² = (1 − u)^7 ‖k̄‖² / 64 and ρ ≥ √(T · kRhoLift) with kRhoLift ≥
1 / (2 (1 − u)^7): ρ² ≥ ‖k̄‖² / 128.

``check`` verifies the constant against its definition (exactly, and as the kernel source
writes it), the overflow margin, and on the case's keys: ``decode_key_rho``'s ρ (the
kernel's arithmetic, bit for bit, in numpy) against the exact ‖k̄‖² / 128 in rationals, and
each f16 chain's exactness assumptions (multiples of 2^-24, no overflow).  Cases: every code
at its largest magnitude (448), at the smallest subnormal, zero keys, keys mixing both ends,
random keys, and keys whose chains round at every step (squares just past f16 midpoints).
Tightness: kRhoLift is the least fp32 value at or above 1 / (2 (1 − 2^-11)^7) (the next
smaller one is below it); a key of one nonzero code per chain meets no rounding, so its ρ
is within kRhoLift's and the fp32 roundings' lift of the exact RMS.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np

from dosa_cupy.emulate import RHO_LIFT, decode_key_rho
from dosa_ref.fp8 import e4m3_bits, e4m3_values

from ._audit import Audit, Result

NAME = "decode_rho"
STATEMENT = "key_rho_bound(k̄)² ≥ ‖k̄‖²/128 for every NaN-free e4m3 key (the decode screen's ρ)"

U16 = Fraction(1, 2**11)
CSRC = Path(__file__).resolve().parents[1] / "dosa_cupy" / "csrc" / "score_fp8.cu"


def _source_lift() -> Fraction:
    """kRhoLift as csrc/score_fp8.cu writes it (a hex float literal)."""
    m = re.search(r"constexpr float kRhoLift = (0x[0-9a-fA-Fp.+-]+)f;", CSRC.read_text())
    return Fraction(float.fromhex(m.group(1)))


def check(k, context="") -> Result:
    au = Audit(NAME, tightness=True, context=context)
    need = 1 / (2 * (1 - U16) ** 7)
    lift = Fraction(float(RHO_LIFT))
    au.ge(lift, need, "kRhoLift ≥ 1 / (2 (1 − 2^-11)^7)")
    # tight: kRhoLift is the least fp32 value that satisfies it
    au.tight(Fraction(float(np.nextafter(RHO_LIFT, np.float32(0)))) < need)
    au.eq(_source_lift(), lift, "the kernel's kRhoLift == the model's")
    au.ge(Fraction(65504), 8 * 3136 * (1 + U16) ** 7, "an f16 chain of 8 squares cannot overflow")
    k = np.asarray(k, dtype=np.uint8)
    v = e4m3_values(k)
    t = v / 8.0
    au.claim(bool(np.all(t * 2**12 == np.round(t * 2**12))), "t = x · 2^-3 a multiple of 2^-12")
    au.claim(bool(np.all(np.abs(t) <= 56)), "|t| ≤ 56")
    rho = decode_key_rho(k)
    for i in range(k.shape[0]):
        exact = sum((Fraction(float(x)) ** 2 for x in v[i]), Fraction(0)) / 128
        r = Fraction(float(rho[i]))
        au.ge(r * r, exact, "ρ² ≥ ‖k̄‖² / 128")
        if exact > 0:
            au.track("ρ² / (‖k̄‖²/128)", float(r * r / exact))
    return au.result()


def _codes(rng, n, lo_exp, hi_exp):
    """e4m3 codes [n, 128] of random signs and significands in binades [lo_exp, hi_exp]."""
    v = np.ldexp(rng.choice([-1.0, 1.0], (n, 128)) * (1 + rng.integers(0, 8, (n, 128)) / 8),
                 rng.integers(lo_exp, hi_exp + 1, (n, 128)))  # fmt: skip
    return e4m3_bits(np.clip(v, -448, 448).astype(np.float32))


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    big = np.full((2, 128), 0x7E, np.uint8)  # 448
    big[1, ::2] = 0xFE  # −448
    out.append(dict(k=big, context="every code ±448"))
    small = np.full((2, 128), 0x01, np.uint8)  # 2^-9
    small[1] = 0x07  # 7 · 2^-9
    out.append(dict(k=small, context="subnormal codes"))
    out.append(dict(k=np.zeros((1, 128), np.uint8), context="zero key"))
    mix = np.where(rng.random((4, 128)) < 0.5, 0x7E, 0x01).astype(np.uint8)
    out.append(dict(k=mix, context="both ends"))
    for t in range(4):
        out.append(dict(k=_codes(rng, 6, -9, 8), context=f"random wide {t}"))
        out.append(dict(k=_codes(rng, 6, 3, 8), context=f"random large {t}"))
    # squares just past f16 midpoints: large accumulators with odd small terms
    mid = _codes(rng, 6, 6, 8)
    mid[:, 1::2] = e4m3_bits(np.ldexp(np.float32(1.125), -3) * np.ones((6, 64), np.float32))
    out.append(dict(k=mid, context="rounding at every step"))
    one = np.zeros((2, 128), np.uint8)
    one[:, [0, 17, 34, 51, 64 + 3, 64 + 22]] = 0x7E  # one code per chain: no rounding
    out.append(dict(k=one, context="tightness: one code per chain"))
    return out
