"""Directed rounding in float64 (docs/numerics.md): every function that rounds says which
way in its name (``_up``: an upper bound of the exact result, ``_down``: a lower bound).

numpy cannot switch the FPU rounding mode, so each correctly rounded operation is widened by
one ulp toward ±inf with ``np.nextafter``; this encloses the exact result, also in the
subnormal range, and an overflow gives ±inf / ±max, still a valid bound.  BLAS dot products
and numpy sums (unknown order, maybe FMA) are never trusted: they are bounded with
γ_n = nu/(1−nu) whatever the order.  Products that may underflow carry an absolute term.

Intervals are (lo, hi) pairs of float64 arrays; ``iv_*`` keep the enclosure outward.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "INF",
    "TINY64",
    "add_down",
    "add_up",
    "div_up",
    "down",
    "f32_add_ru",
    "f32_mul_ru",
    "f32_up",
    "gamma_up",
    "iv_abs",
    "iv_add",
    "iv_mag",
    "iv_mul",
    "iv_sub",
    "matmul_abs_up",
    "matmul_enclose",
    "mul_down",
    "mul_up",
    "norm_up",
    "sqrt_up",
    "sub_down",
    "sub_up",
    "sum_down",
    "sum_up",
    "up",
]

INF = np.inf
TINY64 = 2.0**-1074  # smallest positive float64 (subnormal)


def up(x):
    """Next float64 toward +inf (x itself may be the exact value: one ulp of slack)."""
    return np.nextafter(x, INF)


def down(x):
    """Next float64 toward −inf."""
    return np.nextafter(x, -INF)


def _directed(name: str, op, step, what: str):
    """The binary operation ``name``: ``step`` (up or down) of the correctly rounded
    ``op(a, b)``, documented as an upper/lower bound of ``what``.  Overflow, NaN,
    underflow and division by zero stay silent (they give ±inf / NaN bounds, which the
    callers treat as "no bound")."""

    def f(a, b):
        with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
            return step(op(a, b))

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"{'Upper' if step is up else 'Lower'} bound of {what}."
    return f


add_up = _directed("add_up", np.add, up, "a + b")
add_down = _directed("add_down", np.add, down, "a + b")
sub_up = _directed("sub_up", np.subtract, up, "a − b")
sub_down = _directed("sub_down", np.subtract, down, "a − b")
mul_up = _directed("mul_up", np.multiply, up, "a·b")
mul_down = _directed("mul_down", np.multiply, down, "a·b")
div_up = _directed("div_up", np.divide, up, "a / b")


def sqrt_up(x):
    """Upper bound of sqrt(x) for x ≥ 0 (NaN for negative x)."""
    with np.errstate(invalid="ignore"):
        return up(np.sqrt(x))


def f32_up(x) -> np.ndarray:
    """Smallest-or-next float32 ≥ x (float64 in, float32 out; NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32)
        low = y.astype(np.float64) < x
        y = np.where(low, np.nextafter(y, np.float32(INF)), y).astype(np.float32)
    return y


def f32_mul_ru(a, b) -> np.ndarray:
    """a·b of float32 arrays correctly rounded toward +inf in float32, subnormals kept (PTX
    mul.rp.f32 without .ftz): the float64 product of two float32 values is exact, then
    rounded to nearest float32 and moved up one float32 where that fell below it."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    return f32_up(p)


def f32_add_ru(a, b) -> np.ndarray:
    """a + b of float32 arrays correctly rounded toward +inf in float32, subnormals kept (PTX
    add.rp.f32 without .ftz): the float64 sum s with its exact error e (TwoSum: a + b = s + e
    exactly), r = RN32(s), and r moved up one float32 where r < s + e, decided exactly as
    r − s < e (r − s is exact: r is within a factor of two of s, or zero)."""
    a64 = np.asarray(a, np.float32).astype(np.float64)
    b64 = np.asarray(b, np.float32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        s = a64 + b64
        bb = s - a64
        e = (a64 - (s - bb)) + (b64 - bb)
        r = s.astype(np.float32)
        low = (r.astype(np.float64) - s) < e
        return np.where(low, np.nextafter(r, np.float32(INF)), r).astype(np.float32)


def gamma_up(n, u: float) -> float:
    """Upper bound of γ_n = n·u/(1 − n·u) (inf when n·u ≥ 1)."""
    if u == 0.0 or n <= 0:
        return 0.0
    nu = float(mul_up(float(n), u))
    if nu >= 1.0:
        return INF
    return float(div_up(nu, sub_down(1.0, nu)))


def sum_up(x, axis=None):
    """Upper bound of the exact Σ x (any signs) from numpy's sum: + γ_n Σ|x|.

    Additions never incur underflow error (a subnormal sum is exact), so no absolute
    term is needed.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[axis] if axis is not None else x.size
    g = gamma_up(max(n, 1), 2.0**-53)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.sum(x, axis=axis)
        a = np.sum(np.abs(x), axis=axis)
    err = mul_up(mul_up(a, 1.0 + 2.0 * g), g)
    return add_up(s, err)


def sum_down(x, axis=None):
    """Lower bound of the exact Σ x."""
    return -sum_up(-np.asarray(x, dtype=np.float64), axis=axis)


def _blas_matmul(A, B):
    """(A @ B in float64 by BLAS, the dot length n, γ_n for float64 in any order)."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    n = A.shape[-1]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        p = A @ B
    return p, n, gamma_up(max(n, 1), 2.0**-53)


def matmul_abs_up(A, B):
    """Upper bound of the exact A @ B for nonnegative A [.., n], B [n, ..] (BLAS result
    bounded with γ_n, plus 2^-1073 per product for underflow)."""
    p, n, g = _blas_matmul(A, B)
    return add_up(mul_up(p, add_up(1.0, 2.0 * g)), n * 2.0**-1073)


def matmul_enclose(A, B) -> tuple[np.ndarray, np.ndarray]:
    """Interval (lo, hi) enclosing the exact A @ B (any signs): BLAS ± γ_n Σ|a||b|."""
    p, n, g = _blas_matmul(A, B)
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    rad = add_up(mul_up(matmul_abs_up(np.abs(A), np.abs(B)), g), n * 2.0**-1073)
    return sub_down(p, rad), add_up(p, rad)


def norm_up(m, axis=-1):
    """Upper bound of the Euclidean norm of nonnegative upper bounds ``m`` along ``axis``.

    Each row is scaled by a power of two first (squares neither underflow nor overflow);
    a downscaled element is widened upward, so the result stays an upper bound.
    """
    m = np.asarray(m, dtype=np.float64)
    if m.shape[axis] == 0:
        return np.zeros(np.delete(m.shape, axis % m.ndim)) if m.ndim > 1 else np.float64(0.0)
    mx = np.max(m, axis=axis, keepdims=True)
    e = np.frexp(mx)[1]
    e = np.where(np.isfinite(mx) & (mx > 0), e, 0)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        ms = np.ldexp(m, -e)
        ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact
        r = sqrt_up(sum_up(mul_up(ms, ms), axis=axis))
        out = up(np.ldexp(r, np.squeeze(e, axis)))
    return out


def iv_add(a, b):
    return add_down(a[0], b[0]), add_up(a[1], b[1])


def iv_sub(a, b):
    return sub_down(a[0], b[1]), sub_up(a[1], b[0])


def iv_mul(a, b):
    """Interval product (a may be an interval of scalars, b of arrays)."""
    lo_c = [mul_down(x, y) for x in a for y in b]
    hi_c = [mul_up(x, y) for x in a for y in b]
    return np.minimum.reduce(lo_c), np.maximum.reduce(hi_c)


def iv_mag(a):
    return np.maximum(np.abs(a[0]), np.abs(a[1]))


def iv_abs(a):
    """Interval of |x| for x in a."""
    lo, hi = a
    mag = np.maximum(np.abs(lo), np.abs(hi))
    mig = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    return mig, mag
