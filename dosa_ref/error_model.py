"""The arithmetic error model of the numerical certificate (docs/method.md §8, docs/numerics.md).

An ``Arithmetic`` describes how one kernel evaluates its dot products and the scalar
operations after them; an ``ErrorModel`` pairs the screening kernel's arithmetic with the
original scorer's and turns both into the coefficients of steps 4–5 of the dominance chain
(``numeric``'s docstring), always joined with the CPU reference's own float64 arithmetic.
``simulate_dot`` / ``simulate_scorer`` evaluate dot products and scores the way a kernel
following a model may (one admissible behaviour), for fuzzing and GPU checks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .rounding import INF, TINY64, add_up, div_up, gamma_up, mul_up, sub_down, sub_up

__all__ = [
    "ACCUMULATORS",
    "DEFAULT_MODEL",
    "EPILOGUES",
    "Arithmetic",
    "ErrorModel",
    "simulate_dot",
    "simulate_scorer",
]

ACCUMULATORS = ("truncating", "wgmma_e4m3_fresh", "ieee_fp32_rn", "ieee_fp64_rn", "exact")
EPILOGUES = ("ieee_fp32_rn", "ieee_fp64_rn", "exact")
_UNIT = {"ieee_fp32_rn": 2.0**-24, "ieee_fp64_rn": 2.0**-53, "exact": 0.0}


@dataclass(frozen=True)
class Arithmetic:
    """How one kernel evaluates its dot products and the scalar operations after them.

    dot_length: products per dot product (None = the head dimension D; must be ≥ D).
    accumulator: ``"truncating"`` (the mma.sync tensor-core sum, see ``ErrorModel``),
        ``"wgmma_e4m3_fresh"`` (native e4m3 wgmma k32 steps, each from a fresh accumulator,
        the step results added in fp32: the H200's model ``dosa_ref.mma_model.WGMMA_E4M3``,
        docs/numerics.md "The e4m3 wgmma accumulator"), ``"ieee_fp32_rn"`` /
        ``"ieee_fp64_rn"`` (IEEE round-to-nearest, any order, FMA allowed: γ_n) or
        ``"exact"`` (for experiments; unsound for any real kernel).
    kept_bits: truncating — W, the bits kept below the leading bit of the largest term of
        one MMA step; every term loses less than 2^(E−W) where 2^E ≤ max|term|.
        wgmma_e4m3_fresh — W below the largest exponent-field sum E ≤ 16 of the step's
        e4m3 products (W = 13 observed), the sum then truncated to W + 1 bits.
    k_step: truncating and wgmma_e4m3_fresh — products per MMA instruction (32 for e4m3).
    exact_products: products are exact in the accumulator (e4m3 × e4m3 always is in
        fp32); otherwise each product is rounded once more.
    epilogue: format of the scalar operations after the dots (scales, weights, ReLU,
        head sums, aux combination): ``"ieee_fp32_rn"``, ``"ieee_fp64_rn"`` or ``"exact"``.
    underflow: absolute error allowed per rounded operation whose result lies below the
        normal range (fp32 with flush-to-zero, as CuPy compiles: 2^-126).
    """

    dot_length: int | None = None
    accumulator: str = "truncating"
    kept_bits: int = 17
    k_step: int = 32
    exact_products: bool = True
    epilogue: str = "ieee_fp32_rn"
    underflow: float = 2.0**-126

    def __post_init__(self):
        if self.accumulator not in ACCUMULATORS:
            raise ValueError(f"accumulator: expected one of {ACCUMULATORS}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue: expected one of {EPILOGUES}")
        if int(self.kept_bits) < 1 or int(self.k_step) < 1:
            raise ValueError("kept_bits, k_step: expected positive integers")
        if self.dot_length is not None and int(self.dot_length) < 1:
            raise ValueError("dot_length: expected None or a positive integer")
        if not (np.isfinite(self.underflow) and self.underflow >= 0):
            raise ValueError("underflow: expected a finite nonnegative number")
        if self.accumulator == "wgmma_e4m3_fresh" and not self.exact_products:
            raise ValueError("exact_products: e4m3 products are exact in the wgmma accumulator")
        if self.accumulator == "exact" and not self.exact_products:
            raise ValueError("exact_products: an exact accumulator needs exact products")

    def length(self, D: int) -> int:
        n = D if self.dot_length is None else int(self.dot_length)
        if n < D:
            raise ValueError(f"dot_length: {n} is shorter than the head dimension D={D}")
        return n

    def step_theta(self) -> float:
        """Truncating accumulator: θ with |step error| ≤ θ(|c| + Σ_t|p_t|) (rounded up)."""
        W, k = int(self.kept_bits), int(self.k_step)
        uf = 2.0**-23  # write-back to fp32, truncation or rounding: relative < 2^-23
        drop = mul_up(float(k + 1), 2.0**-W)
        return float(add_up(mul_up(drop, add_up(1.0, uf)), uf))

    def dot_relative_error(self, n: int) -> float:
        """γ with |fl(Σ a_d b_d) − Σ a_d b_d| ≤ γ Σ|a_d b_d| + ``dot_absolute_error``."""
        if self.accumulator == "exact":
            return 0.0
        if self.accumulator == "wgmma_e4m3_fresh":
            # each step's (W+1)-bit write-back: 2^-W of its kept sum (≤ the step's Σ|p|);
            # the S − 1 fp32 additions of the step results: γ_{S−1} of Σ|x_s| ≤ Σ|p|
            S = -(-n // int(self.k_step))
            return float(add_up(2.0 ** -int(self.kept_bits), gamma_up(max(S - 1, 1), 2.0**-24)))
        if self.accumulator == "truncating":
            S = -(-n // int(self.k_step))
            St = float(mul_up(float(S), self.step_theta()))
            g = INF if St >= 1.0 else float(div_up(St, sub_down(1.0, St)))
            if not self.exact_products:
                g = float(sub_up(mul_up(add_up(1.0, g), add_up(1.0, 2.0**-23)), 1.0))
            return g
        u = _UNIT[self.accumulator]
        return gamma_up(n + (0 if self.exact_products else 1), u)

    def dot_absolute_error(self, n: int) -> float:
        """Absolute allowance of one dot: underflow (2n operations, each ≤ underflow); for
        ``wgmma_e4m3_fresh`` also each step's window, k terms below 2^(E − W) with
        2^E ≤ 2^16 (e4m3 exponent fields ≤ 8): S·k·2^(16 − W), in payload units."""
        g = self.dot_relative_error(n)
        a = mul_up(mul_up(2.0 * n, self.underflow), add_up(1.0, g))
        if self.accumulator == "wgmma_e4m3_fresh":
            S = -(-n // int(self.k_step))
            win = float(S * int(self.k_step)) * 2.0 ** (16 - int(self.kept_bits))
            a = add_up(a, mul_up(win, add_up(1.0, g)))
        return float(a)

    def epilogue_gamma(self, m: int) -> float:
        """γ^e_m for a chain of m epilogue operations."""
        return gamma_up(m, _UNIT[self.epilogue])

    def to_dict(self) -> dict:
        return asdict(self)


# The CPU reference evaluates both the screening value and the original scorer in float64
# (FP8 dot products are exact there).  Its arithmetic is covered explicitly so that the
# CPU bound is valid whatever model the user picks for the GPU.
_CPU_FP64 = Arithmetic(
    accumulator="ieee_fp64_rn", epilogue="ieee_fp64_rn", underflow=TINY64, exact_products=False
)


@dataclass(frozen=True)
class ErrorModel:
    """The arithmetic the guard must cover: ``screen`` (the screening kernel's dot products
    q̂_j·k̄, p_m·k̄ and its epilogue) and ``scorer`` (the original indexer score, whose
    computed value defines the selection).  Users may read and change every field; the
    default is the conservative Hopper FP8 tensor-core model, derived here.

    Default (``ErrorModel.hopper_fp8()``): both kernels use FP8 e4m3 MMA with fp32
    accumulators (m16n8k32, k = 32 products per step), exact products (e4m3 × e4m3 has 8
    significant bits), a truncating sum, and an fp32 round-to-nearest epilogue with
    flush-to-zero (underflow 2^-126 per operation).

    Truncating accumulator, worst case per MMA step (docs/numerics.md; not a fit to random
    data).  A step adds k exact products p_t to the running fp32 value c: the k + 1 terms
    are aligned to the exponent E of the largest (2^E ≤ m = max|term|), bits below
    2^(E−W) are dropped, the kept parts are added exactly and the result is written back
    to fp32 (relative error < 2^-23).  Each of the k + 1 terms loses less than
    2^(E−W) ≤ 2^-W m ≤ 2^-W (|c| + Σ|p_t|), so

        |c' − (c + Σ_t p_t)| ≤ θ (|c| + Σ_t |p_t|),  θ = (k+1) 2^-W (1 + 2^-23) + 2^-23.

    With A = Σ_d |a_d b_d| and S = ⌈n/k⌉ steps, induction gives |c_s| ≤ (1+θ)^s A and a
    total error ≤ ((1+θ)^S − 1) A ≤ Sθ/(1 − Sθ) A, independent of the order of the steps.
    (The per-step bound is nearly attained: k products just below the window beside a
    large term all vanish; see proofs/numerical_dominance.py.)

    Kept bits W (default 17).  Evidence, all on H200 ``mma.sync`` e4m3 m16n8k32:
      * docs/numerics.md: 31 × 2^-10 beside a product 2^8 vanished, and 256 + 2^-9 gave
        256 + 2^-10 — both losses are below 2^(E−17), and W = 18 would not cover the first:
        W = 17 is the largest window consistent with every recorded observation.
      * this module's probe (2026-11-30, 20,000 random wide-range dots per regime, 1 and 4
        chained steps, plus crafted cases): products are exact (subnormal operands
        included); beside C = 256 every product down to fp32's ulp was kept; the largest
        loss beyond fp32 write-back rounding was 2^-21.3 of the largest term, i.e. ≤ 0.05
        units of 2^(E−17) — the W = 17 model has ≥ 4 bits of margin on this hardware.
    Native e4m3 ``wgmma`` is another datapath (probed on the H200, docs/numerics.md "The
    e4m3 wgmma accumulator"): 13 bits below the largest exponent-field sum, a 14-bit
    write-back.  ``hopper_fp8(13)`` does not cover it (its write-back term is 2^-23, and
    it aligns to the largest term's value); a scorer on it uses ``wgmma_e4m3_fresh``
    (``hopper_wgmma_fresh``).  The guard's cost grows by 2^(17−W): on a DSA-like workload
    (H = 32, D = 128) it measured 0.9 pp at W = 20, 4.6 pp at W = 17 and 42 pp at W = 13
    (the fp32 / float64 floor: 0.4 pp).
    For D = 128: S = 4, θ ≈ 33·2^-17, γ ≈ 1.0e-3 (W = 13: γ ≈ 0.0164).

    Epilogue: the screening value is a sum of r + 1 products plus the aux combination
    (chains of ≤ r + 3 operations: γ^e_{r+3}); the scorer multiplies by α_i and w_h and
    sums H heads (≤ H + 2 operations: γ^e_{H+2}); γ_m = m u/(1 − m u), u = 2^-24.

    The CPU reference's own float64 arithmetic (exact FP8 dots, float64 BLAS scorer) is
    always added on top (componentwise maximum), so ``fp8_topk`` is valid for any model.
    """

    screen: Arithmetic = field(default_factory=Arithmetic)
    scorer: Arithmetic = field(default_factory=Arithmetic)

    @classmethod
    def hopper_fp8(cls, kept_bits: int = 17, k_step: int = 32) -> ErrorModel:
        a = Arithmetic(accumulator="truncating", kept_bits=kept_bits, k_step=k_step)
        return cls(screen=a, scorer=a)

    @classmethod
    def hopper_wgmma_fresh(cls) -> ErrorModel:
        """The screen on the f16 chain (W = 17) and the scorer on native e4m3 wgmma k32 steps
        from fresh accumulators (the candidate FP8 canonical scorer, csrc/dense_fp8.cu)."""
        fresh = Arithmetic(accumulator="wgmma_e4m3_fresh", kept_bits=13, k_step=32)
        return cls(screen=Arithmetic(accumulator="truncating", kept_bits=17), scorer=fresh)

    @classmethod
    def ieee_fp32(cls) -> ErrorModel:
        a = Arithmetic(accumulator="ieee_fp32_rn")
        return cls(screen=a, scorer=a)

    @classmethod
    def cpu_fp64(cls) -> ErrorModel:
        """Only the CPU reference's float64 arithmetic (not valid for GPU kernels)."""
        return cls(screen=_CPU_FP64, scorer=_CPU_FP64)

    @classmethod
    def exact(cls) -> ErrorModel:
        """Exact arithmetic everywhere: UNSOUND for real kernels (tests use it to show the
        fuzzers catch a missing allowance).  The CPU float64 term is still added."""
        a = Arithmetic(accumulator="exact", epilogue="exact", underflow=0.0)
        return cls(screen=a, scorer=a)

    def to_dict(self) -> dict:
        return {"screen": self.screen.to_dict(), "scorer": self.scorer.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> ErrorModel:
        return cls(screen=Arithmetic(**d["screen"]), scorer=Arithmetic(**d["scorer"]))

    # Combined coefficients (model ∨ CPU float64), see the module docstring, steps 4–5.
    def screen_coefficients(self, D: int, r: int) -> tuple[float, float, float]:
        """(ε_s, dot_abs, epi_abs): |Û − exact| ≤ ε_s·M + dot_abs·W1 + epi_abs with
        M = Σ_j|ω_j|X_j + Σ_m σ_m Y_m and W1 = Σ_j|ω_j| + Σ_m σ_m."""
        out = []
        for a in (self.screen, _CPU_FP64):
            n = a.length(D)
            g = a.dot_relative_error(n)
            ge = a.epilogue_gamma(r + 3)
            eps = float(sub_up(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))
            dabs = float(mul_up(a.dot_absolute_error(n), add_up(1.0, ge)))
            eabs = float(mul_up(mul_up(2.0 * r + 4.0, a.underflow), add_up(1.0, ge)))
            out.append((eps, dabs, eabs))
        return tuple(max(x, y) for x, y in zip(*out, strict=True))

    def scorer_coefficients(self, D: int, H: int) -> tuple[float, float, float]:
        """(ε_r, dot_abs, epi_abs): |s^ref − s| ≤ α(ε_r Σ_h|w_h|X_h + dot_abs Σ_h|w_h|)
        + epi_abs·(Σ_h|w_h| + 2H + 1)."""
        out = []
        for cpu, a in ((False, self.scorer), (True, _CPU_FP64)):
            n = a.length(D)
            g = a.dot_relative_error(n)
            ge = a.epilogue_gamma(H + 2)
            eps = float(sub_up(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))
            dabs = float(mul_up(a.dot_absolute_error(n), add_up(1.0, ge)))
            if cpu:
                # The CPU scorer works on dequantized keys (score units): its product
                # underflow is absolute in score units, 2D per head.
                eabs = float(mul_up(mul_up(2.0 * n + 2.0, a.underflow), add_up(1.0, ge)))
                dabs = 0.0
            else:
                eabs = float(mul_up(a.underflow, add_up(1.0, ge)))
            out.append((eps, dabs, eabs))
        return tuple(max(x, y) for x, y in zip(*out, strict=True))


DEFAULT_MODEL = ErrorModel.hopper_fp8()


# --------------------------------------------------------------------------------------
# Faithful simulation of the truncating accumulator (for fuzzing and GPU checks)
# --------------------------------------------------------------------------------------


def simulate_dot(a, B, arith: Arithmetic, c0: float = 0.0) -> np.ndarray:
    """Simulate ``arith`` on Σ_d a_d B[i, d] for each row i (float64 [n] out).

    truncating: per step of k products, align the k+1 terms to the largest term's
    exponent E, truncate each toward zero to a multiple of 2^(E−W), add exactly, and
    truncate the sum to fp32 — one admissible behaviour of the model (worse than the
    H200's by 4 bits at the default W).  ieee_*: sequential round-to-nearest.
    Products must be exact in float64 (e.g. e4m3 × e4m3).
    """
    a = np.asarray(a, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    P = B * a[None, :]
    n = P.shape[0]
    acc = np.full(n, c0, dtype=np.float64)
    if arith.accumulator == "exact":
        return acc + P.sum(axis=1)
    if arith.accumulator.startswith("ieee"):
        dt = np.float32 if arith.accumulator == "ieee_fp32_rn" else np.float64
        acc = acc.astype(dt)
        for d in range(P.shape[1]):
            acc = (acc + P[:, d].astype(dt)).astype(dt)
        return acc.astype(np.float64)
    k, W = int(arith.k_step), int(arith.kept_bits)
    for s0 in range(0, P.shape[1], k):
        terms = np.concatenate([acc[:, None], P[:, s0 : s0 + k]], axis=1)
        m = np.max(np.abs(terms), axis=1)
        E = np.frexp(m)[1] - 1  # 2^E ≤ m < 2^(E+1)
        unit = np.ldexp(1.0, E - W)[:, None]
        with np.errstate(invalid="ignore"):
            kept = np.where(m[:, None] > 0, np.trunc(terms / unit) * unit, 0.0)
        acc = _trunc_f32(kept.sum(axis=1))
    return acc


def _trunc_f32(x: np.ndarray) -> np.ndarray:
    """Truncate float64 toward zero to float32 precision (24 significant bits)."""
    m, e = np.frexp(x)
    return np.ldexp(np.trunc(np.ldexp(m, 24)), e - 24)


def simulate_scorer(q_t, w_t, kbar, alpha, arith: Arithmetic | None = None):
    """The original score of FP8 keys computed like a GPU dense kernel following
    ``arith`` (default: the Hopper model): per head ``simulate_dot`` in payload units,
    × α, ReLU, × w_h, summed over heads in fp32.  ``q_t`` must be e4m3-valued (exact
    products).  float64 [n]."""
    arith = arith or DEFAULT_MODEL.scorer
    f32 = np.float32
    al = np.asarray(alpha, dtype=f32)
    s = np.zeros(kbar.shape[0], dtype=f32)
    for h in range(q_t.shape[0]):
        x = simulate_dot(q_t[h], kbar, arith).astype(f32)
        y = np.maximum((al * x).astype(f32), f32(0))
        s = (s + (f32(w_t[h]) * y).astype(f32)).astype(f32)
    return s.astype(np.float64)
