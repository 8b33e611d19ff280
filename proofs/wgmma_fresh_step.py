"""The error of the FP8 fresh-step scorer's dots (docs/error_model.md "A native FP8 scorer";
the arithmetic: docs/numerics.md "The e4m3 wgmma accumulator", ``dosa_ref.mma_model``).

Statement.  Let one k32 step of ``WGMMA_E4M3`` start from c = 0 (scale-d = 0) on e4m3
operands a, b of 32 dims, with products p_t = a_t b_t, E = max(ea_t + eb_t) over the nonzero
products (ea, eb the exponent fields; subnormals −6) and x the step's fp32 result.  Then

    |x − Σ_t p_t| ≤ L + 2^-13·|S'|,   L = Σ_{p_t ≠ 0} min(|p_t|, 2^(E−13)) < 32·2^(E−13),

S' the sum of the kept terms, |S'| ≤ Σ|p_t|.  With eq, ek the largest exponent fields of a
and b over the step (ek ≤ 8 for any e4m3 value), 2^E ≤ 2^(eq+ek), so the step loses less
than 2^(eq+ek−8) ≤ 2^(eq) plus 2^-13 of Σ|p_t|.  The fresh-step dot of D = 128,
x̂ = ((x_0 + x_1) + x_2) + x_3 in fp32 round-to-nearest (flush-to-zero), therefore satisfies

    |x̂ − q̄·k̄| ≤ (1 + γ_3)·Σ_s 2^(eq_s) + (2^-13 + γ_3(1 + 2^-13))·Σ_d|q̄_d||k̄_d| + 3·2^-126,

which is ``dosa_cupy.plan.scorer_allowance("fp8_fresh")``'s per-dot part (its a_h and the
MMA part of g_ref).

Proof.  Truncation toward zero to a multiple of 2^(E−13) moves a term by less than the
quantum and never past zero, so by less than min(|p_t|, 2^(E−13)); at most 32 terms are
nonzero.  The kept sum S' is then truncated toward zero to 14 significant bits: the change
is below 2^(⌊log2|S'|⌋ − 13) ≤ 2^-13·|S'|, and |S'| ≤ Σ|p_t| because every kept term has at
most the magnitude of its product.  2^(ea+eb) ≤ 2^(eq+ek) for every product.  The three fp32
additions add at most γ_3 of the magnitudes of their operands, each ≤ Σ_{step}|p_t| + the
step's error (the standard bound for a sum, u = 2^-24), plus 2^-126 per flushed result.

What is checked (exact rationals: every float is taken at its dyadic value):

* ``check``: queries q and keys k (e4m3 codes) — every step's result of the bit-exact model
  against the step bound (L exactly, with the kept sum), and every fresh-step dot (the
  model's fp32 adds) against the dot bound; the largest ratio error / bound is reported.
* Mutant "window14" (a window of 14 kept bits claimed, halving L) must fail on the crafted
  one-large-many-small cases: the observed window of 13 bits is needed.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dosa_ref.fp8 import e4m3_bits, e4m3_values
from dosa_ref.mma_model import WGMMA_E4M3, e4m3_exponent, step, window_rows

from ._audit import Audit, Result

NAME = "wgmma_fresh_step"
STATEMENT = (
    "fresh e4m3 k32 step: |x − Σp| ≤ Σ min(|p|, 2^(E−13)) + 2^-13|S'|; fresh dot: "
    "|x̂ − q·k| ≤ (1+γ3)Σ_s 2^(eq_s) + (2^-13 + γ3(1+2^-13))Σ|q||k| + 3·2^-126"
)
MUTANTS = ("window14",)
_U = Fraction(1, 2**24)
_G3 = 3 * _U / (1 - 3 * _U)
_TINY = Fraction(1, 2**126)


def _fr(x) -> Fraction:
    return Fraction(float(x))


def check(q, k, mutate=None, context="") -> Result:
    """The statement on e4m3 codes q uint8 [H, 128] and k uint8 [n, 128]."""
    au = Audit(NAME, tightness=False, context=context)
    q, k = np.asarray(q, np.uint8), np.asarray(k, np.uint8)
    qv, kv = e4m3_values(q), e4m3_values(k)
    qe, ke = e4m3_exponent(q), e4m3_exponent(k)
    bits = 14 if mutate == "window14" else 13
    worst = 0.0
    for h in range(q.shape[0]):
        for i in range(k.shape[0]):
            xs = []
            step_abs = Fraction(0)
            for s in range(4):
                sl = slice(32 * s, 32 * s + 32)
                p = qv[h, sl] * kv[i, sl]  # exact in float64
                pe = qe[h, sl] + ke[i, sl]
                x = step(WGMMA_E4M3, np.zeros(1), p[None, :], pe[None, :])[0]
                xs.append(np.float32(x))
                nz = p != 0
                exact = sum((_fr(v) for v in p), Fraction(0))
                if nz.any():
                    E = int(pe[nz].max())
                    quantum = Fraction(2) ** (E - bits)
                    L = sum((min(abs(_fr(v)), quantum) for v in p[nz]), Fraction(0))
                    kept = sum((_fr(np.trunc(v / 2.0 ** (E - 13)) * 2.0 ** (E - 13)) for v in p),
                               Fraction(0))  # fmt: skip
                    au.ge(L + abs(kept) / 2**13, abs(_fr(x) - exact), f"head {h} key {i} step {s}")
                    au.claim(abs(kept) <= sum((abs(_fr(v)) for v in p), Fraction(0)),
                             f"head {h} key {i} step {s}: |S'| ≤ Σ|p|")  # fmt: skip
                    eq = int(qe[h, sl][qv[h, sl] != 0].max())
                    step_abs += Fraction(2) ** eq
                    au.claim(E <= eq + 8 and int(ke[i, sl].max()) <= 8, "2^E ≤ 2^(eq + 8)")
                else:
                    au.claim(x == 0, f"head {h} key {i} step {s}: no product, a nonzero sum")
            xh = ((xs[0] + xs[1]) + xs[2]) + xs[3]  # fp32 round-to-nearest, in k order
            dot = sum((_fr(v) for v in qv[h] * kv[i]), Fraction(0))
            mag = sum((abs(_fr(v)) for v in qv[h] * kv[i]), Fraction(0))
            g = Fraction(1, 2**13) + _G3 * (1 + Fraction(1, 2**13))
            if mutate == "window14":
                step_abs /= 2
            bound = (1 + _G3) * step_abs + g * mag + 3 * _TINY
            err = abs(_fr(xh) - dot)
            au.ge(bound, err, f"head {h} key {i}: fresh dot")
            if bound > 0:
                worst = max(worst, float(err / bound))
    au.track("error / dot bound", worst)
    return au.result()


def window_witness() -> dict:
    """q = 1 everywhere; each key step: 448 and 31 values 1.875·2^-5 — every small product
    loses 0.875 of the quantum 2^(8−13), 31·0.875 of the 32 quanta L allows (85 %): a
    window of 14 bits would not cover it."""
    k = np.full((1, 128), e4m3_bits(np.float32(1.875 * 2.0**-5)), np.uint8)
    k[:, ::32] = e4m3_bits(np.float32(448.0))
    return dict(q=np.full((1, 128), 0x38, np.uint8), k=k, context="window witness")


def cases(rng: np.random.Generator) -> list[dict]:
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    g = rng.standard_normal((6, 128))
    gk = rng.standard_normal((10, 128))
    out = [
        dict(q=rng.choice(finite, (4, 128)), k=rng.choice(finite, (8, 128)),
             context="uniform codes"),
        dict(q=e4m3_bits((g / np.abs(g).max(1, keepdims=True) * 448).astype(np.float32)),
             k=e4m3_bits((gk / np.abs(gk).max(1, keepdims=True) * 448).astype(np.float32)),
             context="quantized gaussians"),
        dict(q=np.full((2, 128), 0x38, np.uint8), k=window_rows(rng, 8), context="window (q = 1)"),
        dict(q=window_rows(rng, 3), k=window_rows(rng, 6), context="window both"),
        dict(q=np.full((1, 128), 0x7E, np.uint8), k=np.full((2, 128), 0xFE, np.uint8),
             context="all ±448"),
        dict(q=rng.integers(1, 8, (2, 128)).astype(np.uint8),
             k=rng.integers(0, 8, (3, 128)).astype(np.uint8), context="subnormals and zeros"),
        window_witness(),
    ]  # fmt: skip
    return out
