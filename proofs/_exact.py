"""Exact arithmetic used by every proof module (the raw layer, in the spirit of mpmath.libmp).

Three kinds of exact values:

``Fraction``
    Rationals.  Every finite float64 is a dyadic rational, so ``fr(x)`` converts a float
    to the rational it denotes without any rounding.
``Dy``
    Dyadic arrays ``m · 2**e`` (``m`` an object array of Python ints, one common exponent
    ``e``).  Matrix products, sums, ReLU and |·| of float inputs are exact and much faster
    than arrays of ``Fraction``.
``Surd``
    Finite sums ``r + Σ_t c_t √m_t`` with rational ``r, c_t`` and integer radicands ``m_t``.
    Norms and the allowances E_P, E_P^joint, E_{P,g} live here.  ``Surd.sign()`` is exact:
    it first encloses the value with mpmath square roots rounded outward (``round_floor`` /
    ``round_ceiling`` at ``PREC`` ≥ 200 bits, endpoints kept as exact rationals); if the
    enclosure contains 0 it reduces the sum to a normal form in which no two radicands
    differ by a rational square factor.  By Besicovitch's theorem the square roots of
    pairwise "square-free-distinct", non-square integers are linearly independent over Q,
    so the value is 0 iff every reduced coefficient is 0; otherwise it is nonzero and the
    precision is raised until the enclosure excludes 0 (this terminates).

No float arithmetic is ever used to decide a comparison.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
from mpmath import libmp

__all__ = ["PREC", "Dy", "Surd", "fr", "to_float", "sqrt"]

PREC = 256  # bits of the first outward-rounded enclosure (raised on demand)
_TWO53 = 9007199254740992.0


def fr(x) -> Fraction:
    """The exact rational value of a finite float / int / Fraction."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"fr: non-finite value {x!r} has no rational value")
    return Fraction(x)


def to_float(x) -> float:
    """Nearest float of an exact rational (±inf beyond the float range); display only."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _pow2(e: int) -> Fraction:
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)


# ----------------------------------------------------------------------------- dyadic arrays


class Dy:
    """Exact dyadic array: value = m · 2**e with ``m`` an object ndarray of Python ints."""

    __slots__ = ("m", "e")

    def __init__(self, m, e: int):
        self.m = m
        self.e = int(e)

    @classmethod
    def of(cls, a) -> Dy:
        """Exact dyadic image of a finite float array (any shape)."""
        a = np.asarray(a, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            raise ValueError("Dy.of: non-finite input")
        mant, ex = np.frexp(a)
        M = (mant * _TWO53).astype(np.int64)  # exact: |mant| < 1 has at most 53 bits
        E = ex.astype(np.int64) - 53
        nz = M != 0
        if not nz.any():
            return cls(np.zeros(a.shape, dtype=object), 0)
        e0 = int(E[nz].min())
        sh = np.where(nz, E - e0, 0).astype(object)
        return cls(np.left_shift(M.astype(object), sh), e0)

    @classmethod
    def ints(cls, a) -> Dy:
        return cls(np.asarray(a, dtype=object), 0)

    # shape helpers
    @property
    def shape(self):
        return self.m.shape

    @property
    def T(self) -> Dy:
        return Dy(self.m.T, self.e)

    def __getitem__(self, idx) -> Dy:
        return Dy(self.m[idx], self.e)

    def __len__(self):
        return len(self.m)

    # arithmetic
    def __matmul__(self, o: Dy) -> Dy:
        return Dy(self.m @ o.m, self.e + o.e)

    def __mul__(self, o) -> Dy:
        if isinstance(o, Dy):
            return Dy(self.m * o.m, self.e + o.e)
        return Dy(self.m * int(o), self.e)

    __rmul__ = __mul__

    @staticmethod
    def _align(a: Dy, b: Dy):
        e = min(a.e, b.e)
        return a.m * (1 << (a.e - e)), b.m * (1 << (b.e - e)), e

    def __add__(self, o: Dy) -> Dy:
        x, y, e = Dy._align(self, o)
        return Dy(x + y, e)

    def __sub__(self, o: Dy) -> Dy:
        x, y, e = Dy._align(self, o)
        return Dy(x - y, e)

    def __neg__(self) -> Dy:
        return Dy(-self.m, self.e)

    def relu(self) -> Dy:
        return Dy(np.where(self.m > 0, self.m, 0), self.e)

    def abs(self) -> Dy:
        return Dy(np.abs(self.m), self.e)

    def sum(self, axis=None) -> Dy:
        return Dy(np.sum(self.m, axis=axis, dtype=object), self.e)

    def sq(self, axis=-1) -> Dy:
        """Σ x² along ``axis`` (squared Euclidean norms)."""
        return Dy(np.sum(self.m * self.m, axis=axis, dtype=object), 2 * self.e)

    def positive(self) -> np.ndarray:
        return np.asarray(self.m > 0, dtype=bool)

    def negative(self) -> np.ndarray:
        return np.asarray(self.m < 0, dtype=bool)

    def frac(self, idx=()) -> Fraction:
        """Exact value of one entry (``idx=()`` for a 0-d array)."""
        v = self.m[idx] if idx != () else self.m
        v = int(v.item() if isinstance(v, np.ndarray) else v)
        return v * _pow2(self.e)

    def fracs(self) -> list:
        """Exact values of a 1-d array as a list of Fractions."""
        s = _pow2(self.e)
        return [int(v) * s for v in self.m]


# ----------------------------------------------------------------------------- square roots


@lru_cache(maxsize=1 << 16)
def _sqrt_enclosure(m: int, prec: int) -> tuple[Fraction, Fraction]:
    """lo ≤ √m ≤ hi as exact rationals, from mpmath's directed-rounding square root."""
    x = libmp.from_int(m)  # exact (no precision given)
    lo = libmp.mpf_sqrt(x, prec, libmp.round_floor)
    hi = libmp.mpf_sqrt(x, prec, libmp.round_ceiling)
    return _mpf_to_frac(lo), _mpf_to_frac(hi)


def _mpf_to_frac(t) -> Fraction:
    sign, man, exp, _ = t
    v = int(man) * _pow2(int(exp))
    return -v if sign else v


def _is_square(n: int) -> int | None:
    if n < 0:
        return None
    r = math.isqrt(n)
    return r if r * r == n else None


def _term(c: Fraction, m: int):
    """c·√m normalised: powers of 4 pulled out; returns (rational, term-or-None)."""
    if c == 0 or m == 0:
        return Fraction(0), None
    tz = (m & -m).bit_length() - 1
    t = tz // 2
    if t:
        m >>= 2 * t
        c = c * (1 << t)
    r = _is_square(m)
    if r is not None:
        return c * r, None
    return Fraction(0), (c, m)


class Surd:
    """Exact value r + Σ c_t √m_t (r, c_t rational; m_t > 1 integers, not squares)."""

    __slots__ = ("rat", "terms", "_enc")

    def __init__(self, rat=0, terms=()):
        self.rat = fr(rat)
        self.terms = tuple(terms)
        self._enc = None

    @staticmethod
    def of(x) -> Surd:
        return x if isinstance(x, Surd) else Surd(fr(x))

    # construction
    @staticmethod
    def sqrt(x) -> Surd:
        """√x for a rational x ≥ 0 (exact when x is a rational square)."""
        x = fr(x)
        if x < 0:
            raise ValueError(f"sqrt: negative radicand {x}")
        n, d = x.numerator, x.denominator
        r, t = _term(Fraction(1, d), n * d)
        return Surd(r, (t,) if t else ())

    # arithmetic
    def __add__(self, o) -> Surd:
        o = Surd.of(o)
        return Surd(self.rat + o.rat, self.terms + o.terms)

    __radd__ = __add__

    def __neg__(self) -> Surd:
        return Surd(-self.rat, tuple((-c, m) for c, m in self.terms))

    def __sub__(self, o) -> Surd:
        return self + (-Surd.of(o))

    def __rsub__(self, o) -> Surd:
        return Surd.of(o) - self

    def __mul__(self, o) -> Surd:
        if not isinstance(o, Surd):
            o = fr(o)
            if o == 0:
                return Surd(0)
            return Surd(self.rat * o, tuple((c * o, m) for c, m in self.terms))
        rat = self.rat * o.rat
        terms = []
        for c, m in self.terms:
            if o.rat:
                terms.append((c * o.rat, m))
        for c, m in o.terms:
            if self.rat:
                terms.append((c * self.rat, m))
        for c1, m1 in self.terms:
            for c2, m2 in o.terms:
                r, t = _term(c1 * c2, m1 * m2)
                rat += r
                if t:
                    terms.append(t)
        return Surd(rat, terms)

    __rmul__ = __mul__

    # exact decisions
    def is_rational(self) -> bool:
        return not self.normal().terms

    def normal(self) -> Surd:
        """Equal value with pairwise independent radicands (zero coefficients dropped)."""
        acc: dict[int, Fraction] = {}
        for c, m in self.terms:
            acc[m] = acc.get(m, Fraction(0)) + c
        rads = [m for m, c in acc.items() if c != 0]
        out: dict[int, Fraction] = {}
        for m in rads:
            c = acc[m]
            for b in out:
                r = _is_square(m * b)
                if r is not None:  # √m = (r/b)·√b
                    out[b] += c * Fraction(r, b)
                    break
            else:
                out[m] = c
        return Surd(self.rat, tuple((c, m) for m, c in out.items() if c != 0))

    def enclosure(self, prec: int = PREC) -> tuple[Fraction, Fraction]:
        """lo ≤ value ≤ hi (exact rational endpoints, outward-rounded square roots)."""
        lo = hi = self.rat
        for c, m in self.terms:
            a, b = _sqrt_enclosure(m, prec)
            if c > 0:
                lo += c * a
                hi += c * b
            else:
                lo += c * b
                hi += c * a
        return lo, hi

    def sign(self) -> int:
        """Exact sign (−1, 0, 1)."""
        return self._decide()[0]

    def _decide(self):
        if self._enc is not None:
            return self._enc
        if not self.terms:
            s = (self.rat > 0) - (self.rat < 0)
            self._enc = (s, self.rat, self.rat)
            return self._enc
        prec = PREC
        lo, hi = self.enclosure(prec)
        if lo > 0 or hi < 0:
            self._enc = (1 if lo > 0 else -1, lo, hi)
            return self._enc
        n = self.normal()
        if not n.terms:
            s = (n.rat > 0) - (n.rat < 0)
            self._enc = (s, n.rat, n.rat)
            return self._enc
        while True:  # nonzero by linear independence: terminates
            prec *= 4
            lo, hi = n.enclosure(prec)
            if lo > 0 or hi < 0:
                self._enc = (1 if lo > 0 else -1, lo, hi)
                return self._enc

    def lower(self) -> Fraction:
        """A rational lower bound that has the value's sign (exact 0 for 0)."""
        s, lo, hi = self._decide()
        return lo if s > 0 else (hi if s < 0 else Fraction(0))

    def __float__(self) -> float:
        s, lo, hi = self._decide()
        if s == 0:
            return 0.0
        return to_float(lo if s > 0 else hi)

    def __repr__(self) -> str:
        return f"Surd({float(self):.6g})"


def sqrt(x) -> Surd:
    """Exact √x of a rational x ≥ 0."""
    return Surd.sqrt(x)


def smin(a: Surd, b: Surd) -> Surd:
    """Exact minimum of two Surds."""
    return a if (Surd.of(a) - b).sign() <= 0 else b
