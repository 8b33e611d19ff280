"""fp32 pre-test of the screen's guard (docs/method.md §8; dosa_cupy/csrc/kernels.cu,
``DOSA_SCREEN_FAST32``).

Statement.  The screen rejects key i when U^num_i < τ, where (plan.py)

    V_i = α_i (Û_i + ρ_i C + ε_raw) + ε_out ≥ s_i        (the numerical certificate)

and U^num_i is V_i evaluated in float64 with upward rounding.  The pre-test evaluates the
same expression in **fp32** with upward rounding under CuPy's flush-to-zero (``-ftz=true``:
a denormal operand is read as ±0 and a denormal result is written as ±0) and rejects when

    u32_i < τ_fast = RD_ftz(τ − 2^-59),   u32 = RU(RU(α·RU(RU(Û + RU(ρ·C_f)) + e_f)) + o_f)

with C_f = RU32(C), e_f = RU32(ε_raw), o_f = RU32(ε_out), and only under the
preconditions: α normal with α ≤ 2^64, ρ zero or normal (per key); C_f, e_f, o_f
normal and τ finite (per query).  Then V_i < τ, so s_i < τ: the rejection is sound.

Proof.  Round-up gives each result ≥ the exact operation on its (computed) operands; a
flush lowers a result, or the value read from a denormal operand, by < 2^-126.  The
preconditions exclude flushes of α, ρ, C_f, e_f, o_f; the flushes that remain are Û read
as an operand and the outputs of ρC_f, Û + ρC_f, (·) + e_f (each < 2^-126 inside the
bracket, which α ≤ 2^64 scales to < 2^-60 in all) and of α(·), (·) + o_f (< 2^-125):
u32 > V − 2^-60 − 2^-125.  RD_ftz(τ − 2^-59) ≤ τ − 2^-59 + 2^-126 (a flushed negative
denormal rises by < 2^-126).  So u32 < τ_fast gives V < τ − 2^-59 + 2^-126 + 2^-60 + 2^-125
< τ.

``check`` evaluates the pre-test with an exact model of fp32 directed rounding and
flush-to-zero (rationals; no float arithmetic decides anything) and verifies, on each
input, the claimed implication pre-test-rejects ⇒ V < τ, recording the margin τ − V of
every rejection.  Cases are adversarial near the underflow threshold (denormal Û, products
that flush, α = 2^64), near the decision (τ within 2^-59 of V), at huge magnitudes and with
non-finite values.  Informational: how many rejections a slack of 0 instead of 2^-59
would have made unsoundly (``counts["unsound without slack"]``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._audit import Audit, Result

NAME = "fp32_pretest"
STATEMENT = "fp32 RU/FTZ pre-test u32 < RD(τ − 2^-59) ⇒ V < τ (sound rejection)"

F32_MIN = Fraction(1, 2**126)  # smallest normal fp32
SLACK = Fraction(1, 2**59)
ALPHA_MAX = Fraction(2**64)
_F32_MAX = Fraction(float(np.finfo(np.float32).max))


def _f32(x: float) -> np.float32:
    return np.float32(x)


def round_f32(x, up: bool) -> float:
    """The fp32 value next to the exact rational ``x`` in the given direction (±inf
    beyond the range), as a Python float."""
    if x > _F32_MAX:
        return float("inf") if up else float(np.finfo(np.float32).max)
    if x < -_F32_MAX:
        return -float(np.finfo(np.float32).max) if up else float("-inf")
    f = _f32(float(x))  # nearest-ish; adjusted exactly below
    if not np.isfinite(f):  # |x| rounded past FLT_MAX in the first rounding
        f = np.float32(np.finfo(np.float32).max) * np.float32(1 if x > 0 else -1)
    inf = np.float32(np.inf)
    if up:
        while Fraction(float(f)) < x:
            f = np.nextafter(f, inf)
        while True:
            g = np.nextafter(f, -inf)
            if np.isfinite(g) and Fraction(float(g)) >= x:
                f = g
            else:
                break
    else:
        while Fraction(float(f)) > x:
            f = np.nextafter(f, -inf)
        while True:
            g = np.nextafter(f, inf)
            if np.isfinite(g) and Fraction(float(g)) <= x:
                f = g
            else:
                break
    return float(f)


def ftz(v: float) -> float:
    """Flush a denormal fp32 value to a signed zero (results and operands alike)."""
    if v != 0 and abs(v) < float(F32_MIN):
        return 0.0 if v > 0 else -0.0
    return v


def _op(a: float, b: float, kind: str, up: bool = True) -> float:
    """One fp32 operation under -ftz=true: operands flushed, exact result rounded in the
    given direction, result flushed.  NaN / inf follow IEEE."""
    a, b = ftz(a), ftz(b)
    if not (np.isfinite(a) and np.isfinite(b)):
        r = (a + b) if kind == "add" else (a * b) if kind == "mul" else (a - b)
        return float(np.float32(r))
    x = (
        Fraction(a) + Fraction(b)
        if kind == "add"
        else (Fraction(a) * Fraction(b) if kind == "mul" else Fraction(a) - Fraction(b))
    )
    return ftz(round_f32(x, up))


def pretest(uh, rho, alpha, C, eps_raw, eps_out, tau, slack=SLACK):
    """The kernel's pre-test for one key: (fast path allowed, rejects, u32, τ_fast)."""
    Cf = round_f32(Fraction(C), True) if np.isfinite(C) else float(C)
    ef = round_f32(Fraction(eps_raw), True)
    of = round_f32(Fraction(eps_out), True)
    q_ok = all(np.isfinite(v) and v >= float(F32_MIN) for v in (Cf, ef, of))
    k_ok = (
        np.isfinite(alpha)
        and float(F32_MIN) <= alpha <= float(ALPHA_MAX)
        and (rho == 0 or rho >= float(F32_MIN))  # the kernel tests ρ == 0 on the bits
    )
    u = _op(uh, _op(rho, Cf, "mul"), "add")
    u = _op(u, ef, "add")
    u = _op(alpha, u, "mul")
    u = _op(u, of, "add")
    if np.isfinite(tau):
        t_fast = ftz(round_f32(Fraction(float(np.float32(tau))) - slack, False))
    else:
        t_fast = float("-inf")  # the kernel pre-tests against finite τ only
    ok = q_ok and k_ok
    return ok, bool(ok and u < t_fast), u, t_fast


def check(keys, C, eps_raw, eps_out, tau, context="") -> Result:
    """keys: rows (Û, ρ, α) fp32; C, ε_raw, ε_out float64 ≥ 0; τ fp32 (may be ±inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _check(keys, C, eps_raw, eps_out, tau, context)


def _check(keys, C, eps_raw, eps_out, tau, context) -> Result:
    au = Audit(NAME, tightness=False, context=context)
    tau = float(np.float32(tau))
    for j, (uh, rho, alpha) in enumerate(np.asarray(keys, dtype=np.float32).tolist()):
        ok, rej, u, tf = pretest(uh, rho, alpha, C, eps_raw, eps_out, tau)
        if not (np.isfinite(uh) and np.isfinite(rho) and np.isfinite(alpha)):
            au.claim(not rej, f"key {j}: a non-finite input was rejected")
            continue
        V = Fraction(alpha) * (Fraction(uh) + Fraction(rho) * Fraction(C) + Fraction(eps_raw))
        V += Fraction(eps_out)
        if rej:
            au.claim(np.isfinite(tau), f"key {j}: rejected against a non-finite τ")
            if np.isfinite(tau):
                au.margin(Fraction(tau) - V, f"key {j}: rejection needs V < τ")
                au.claim(V < Fraction(tau), f"key {j}: rejected with V = τ")
        if ok and np.isfinite(tau):
            _, rej0, _, _ = pretest(uh, rho, alpha, C, eps_raw, eps_out, tau, slack=0)
            if rej0 and not V < Fraction(tau):
                au.track("unsound without slack", 1.0)
        au.track("rejections", float(rej))
    return au.result()


def _f32s(rng, n, kind):
    if kind == "unit":
        return rng.normal(size=n)
    if kind == "denormal":
        return rng.normal(size=n) * 2.0**-130
    if kind == "edge":
        return rng.choice([0.0, -0.0, 2.0**-126, -(2.0**-126), 2.0**-149, 1.0, -1.0], n)
    if kind == "huge":
        return rng.normal(size=n) * 2.0**100
    return rng.normal(size=n) * 2.0 ** rng.integers(-140, 60, n)


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    alphas = [2.0**-126, 2.0**-100, 1.0, 3.0, 2.0**64, 2.0**64 * (1 + 2.0**-23), 2.0**-127]
    for t in range(60):
        n = 24
        uh = _f32s(rng, n, ["unit", "denormal", "edge", "huge", "wide"][t % 5])
        rho = np.abs(_f32s(rng, n, ["unit", "edge", "denormal", "wide"][t % 4]))
        alpha = rng.choice(alphas, n)
        keys = np.stack([uh, rho, alpha], axis=1).astype(np.float32)
        C = float(rng.choice([0.0, 2.0**-140, 2.0**-126, 1e-3, 1.0, 7.5, 1e30, 1e300]))
        eps_raw = float(rng.choice([24 * 2.0**-126, 2.0**-126, 2.0**-150]))
        eps_out = float(rng.choice([2.0**-126, 2.0**-130]))
        # τ near the certificate value of a random key: within a few 2^-60 of V (the
        # slack's scale), or exactly at it, or far, or non-finite
        j = int(rng.integers(n))
        u, r, a = (float(x) for x in keys[j])
        V = a * (u + r * C + eps_raw) + eps_out if np.isfinite(C * r) else 0.0
        mode = t % 6
        if mode == 0:
            tau = V
        elif mode == 1:
            tau = V + float(rng.integers(-4, 5)) * 2.0**-60
        elif mode == 2:
            tau = float(rng.normal()) * 2.0**-58
        elif mode == 3:
            tau = V * (1 + float(rng.normal()) * 2.0**-22)
        elif mode == 4:
            tau = float(rng.choice([np.inf, -np.inf, 0.0, 2.0**-126]))
        else:
            tau = float(rng.normal()) * 10.0
        with np.errstate(over="ignore"):
            if not np.isfinite(np.float32(tau)) and np.isfinite(tau):
                tau = 0.0
        out.append(dict(keys=keys, C=C, eps_raw=eps_raw, eps_out=eps_out, tau=tau,
                        context=f"case {t}"))  # fmt: skip
    # the flush-heavy witness: α = 2^64, Û and every bracket term denormal-sized
    keys = np.array([[2.0**-127, 2.0**-126, 2.0**64], [-(2.0**-127), 0.0, 2.0**64]], np.float32)
    # u32 = 2^-62 + 2^-126 while V ≈ 1.5·2^-62: without the slack, τ in between is an
    # unsound rejection (counted in "unsound without slack"); with it, none
    for k in range(0, 9):
        out.append(dict(keys=keys, C=2.0**-126, eps_raw=2.0**-126, eps_out=2.0**-126,
                        tau=float(np.float32(2.0**-62 * (1 + k / 8))),
                        context=f"flush witness {k}"))  # fmt: skip
    return out
