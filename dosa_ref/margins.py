"""Dominance margins of the FP8 guard (docs/method.md §8), evaluated two independent ways
for the guard audit (``audit``):

  * ``exact_margin``: exact rational arithmetic (``fractions.Fraction``; FP8 and fp32
    values are dyadic, so it is exact) with its own implementation of the error model's
    coefficients (``model_coefficients_exact``);
  * ``interval_margins``: interval arithmetic on many pairs at once (every operation
    widened outward, BLAS bounded with γ_n), a rigorous lower bound of the margin;
  * ``slack_parts``: the decomposition of U^num − s^ref into Prop. 6's components and the
    guard's own parts.

The margin of a (query, key) pair is m = α(Ŝ − err_scr + ρC + ε_raw) + ε_out − (s + err_ref)
(``audit``'s docstring); m ≥ 0 means U^num dominates every score the model allows.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .certificate import slack as cert_slack
from .certificate import upper_bound
from .error_model import ErrorModel
from .fp8 import e4m3_values
from .numeric import FP8ScreenPlan, screen_values
from .rounding import add_down, matmul_abs_up, matmul_enclose, mul_down, mul_up, sub_down

__all__ = ["exact_margin", "interval_margins", "model_coefficients_exact", "slack_parts"]

# --------------------------------------------------------------------------------------
# Exact (rational) side: an independent implementation of the model's coefficients.
# --------------------------------------------------------------------------------------

_UNIT_EXACT = {
    "ieee_fp32_rn": Fraction(1, 2**24),
    "ieee_fp64_rn": Fraction(1, 2**53),
    "exact": Fraction(0),
}
_CPU64 = {
    "accumulator": "ieee_fp64_rn",
    "epilogue": "ieee_fp64_rn",
    "underflow": 2.0**-1074,
    "exact_products": False,
    "dot_length": None,
    "kept_bits": 17,
    "k_step": 32,
}


def _gamma(n: int, u: Fraction) -> Fraction:
    nu = n * u
    if nu >= 1:
        return Fraction(10**30)
    return nu / (1 - nu)


def _dot_gamma(a: dict, n: int) -> Fraction:
    acc = a["accumulator"]
    if acc == "exact":
        return Fraction(0)
    if acc == "truncating":
        k, W = int(a["k_step"]), int(a["kept_bits"])
        uf = Fraction(1, 2**23)
        theta = (k + 1) * Fraction(1, 2**W) * (1 + uf) + uf
        S = -(-n // k)
        g = S * theta / (1 - S * theta) if S * theta < 1 else Fraction(10**30)
        if not a["exact_products"]:
            g = (1 + g) * (1 + uf) - 1
        return g
    return _gamma(n + (0 if a["exact_products"] else 1), _UNIT_EXACT[acc])


def model_coefficients_exact(model: ErrorModel, D: int, H: int, r: int) -> dict:
    """Exact Fractions of the model's per-pair worst-case error coefficients (the model
    joined with the CPU's float64 arithmetic, as ``error_model`` does):

    screen: |Û − Ŝ| ≤ eps_s·(Σ_j|ω_j|X̂_j + Σ_m σ_m Y_m) + dabs_s·(Σ|ω| + Σσ) + eabs_s
    scorer: |s^ref − s| ≤ α(eps_r Σ_h|w_h|X_h + dabs_r Σ|w|) + eabs_r·(Σ|w| + 2H + 1)
    """
    out = {}
    for part, m_e in (("screen", r + 3), ("scorer", H + 2)):
        cands = []
        for a in (getattr(model, part).to_dict(), _CPU64):
            n = D if a["dot_length"] is None else int(a["dot_length"])
            g = _dot_gamma(a, n)
            ge = _gamma(m_e, _UNIT_EXACT[a["epilogue"]])
            eps = (1 + g) * (1 + ge) - 1
            mu = Fraction(a["underflow"])
            dabs = 2 * n * mu * (1 + g) * (1 + ge)
            if part == "screen":
                eabs = (2 * r + 4) * mu * (1 + ge)
            elif a is _CPU64:
                dabs, eabs = Fraction(0), (2 * n + 2) * mu * (1 + ge)
            else:
                eabs = mu * (1 + ge)
            cands.append((eps, dabs, eabs))
        out[part] = tuple(max(x, y) for x, y in zip(*cands, strict=True))
    return out


def _F(x) -> Fraction:
    return Fraction(float(x))


def _int_vec(v: np.ndarray) -> tuple[list[int], int]:
    """Exact (ints, e) with v = ints · 2^e (float64 vector)."""
    v = np.asarray(v, dtype=np.float64)
    m, e = np.frexp(v)
    mi = np.ldexp(m, 53).astype(np.int64)  # exact 53-bit mantissas
    e = e.astype(np.int64) - 53
    nz = mi != 0
    emin = int(e[nz].min()) if nz.any() else 0
    return [int(a) << int(b - emin) if a else 0 for a, b in zip(mi, e, strict=True)], emin


def _dot_exact(a_int, ea, b_int, eb) -> Fraction:
    s = sum(x * y for x, y in zip(a_int, b_int, strict=True))
    e = ea + eb
    return Fraction(s * 2**e) if e >= 0 else Fraction(s, 2 ** (-e))


def exact_margin(
    fplan: FP8ScreenPlan | dict,
    q_t: np.ndarray,
    w_t: np.ndarray,
    kbar: np.ndarray,
    alpha: float,
    rho: float,
    model: ErrorModel,
    U_computed: float | None = None,
    s_computed: float | None = None,
) -> dict:
    """Exact dominance margin of one pair (Fractions).  ``fplan`` is an FP8ScreenPlan or
    its ``kernel_arrays()``.  Returns {"margin": Fraction, "scale": Fraction, and, when
    ``U_computed``/``s_computed`` are given, "computed_margin" = U_computed − s_computed}.
    """
    ka = fplan.kernel_arrays() if isinstance(fplan, FP8ScreenPlan) else fplan
    H, D = q_t.shape
    r = int(np.asarray(ka["R"]).shape[0])
    co = model_coefficients_exact(model, D, H, r)
    a = _F(alpha)
    kb = np.asarray(kbar, dtype=np.float64)
    k_int = [int(x) for x in np.round(kb * 512).astype(np.int64)]  # e4m3 = n·2^-9
    k_abs = [abs(x) for x in k_int]
    # Exact original score and the scorer's worst case.
    s_bar = Fraction(0)
    sum_wX = Fraction(0)
    sum_w = Fraction(0)
    scale = Fraction(0)
    knorm = math.sqrt(float(np.sum(kb * kb)))
    for h in range(H):
        qi, eq = _int_vec(q_t[h])
        wh = _F(w_t[h])
        x = _dot_exact(qi, eq, k_int, -9)
        if x > 0:
            s_bar += wh * x
        X = _dot_exact([abs(v) for v in qi], eq, k_abs, -9)
        sum_wX += abs(wh) * X
        sum_w += abs(wh)
        scale += abs(wh) * _F(np.linalg.norm(q_t[h]) * knorm)
    eps_r, dabs_r, eabs_r = co["scorer"]
    s = a * s_bar
    err_ref = a * (eps_r * sum_wX + dabs_r * sum_w) + eabs_r * (sum_w + 2 * H + 1)
    # Exact screening value of the stored rows and the screening worst case.
    qv = e4m3_values(np.asarray(ka["q_payload"]))
    pv = e4m3_values(np.asarray(ka["aux_payload"]))
    qi_all = np.round(qv * 512).astype(np.int64)
    pi_all = np.round(pv * 512).astype(np.int64)
    kv = np.asarray(k_int, dtype=np.int64)
    S = Fraction(0)
    M = Fraction(0)
    W1 = Fraction(0)
    base = ka["form"] == "base"
    om = np.asarray(ka["omega"], dtype=np.float64)
    for j in range(r):
        x = Fraction(int(qi_all[j] @ kv), 2**18)
        X = Fraction(int(np.abs(qi_all[j]) @ np.abs(kv)), 2**18)
        oj = _F(om[j])
        S += oj * (max(x, Fraction(0)) if base else abs(x))
        M += abs(oj) * X
        W1 += abs(oj)
    z = Fraction(0)
    for m in range(2):
        sg = _F(np.asarray(ka["aux_scale"])[m])
        y = Fraction(int(pi_all[m] @ kv), 2**18)
        Y = Fraction(int(np.abs(pi_all[m]) @ np.abs(kv)), 2**18)
        z += sg * y
        M += sg * Y
        W1 += sg
    S -= max(z, Fraction(0)) if base else z
    eps_s, dabs_s, eabs_s = co["screen"]
    err_scr = eps_s * M + dabs_s * W1 + eabs_s
    U_lo = a * (S - err_scr + _F(rho) * _F(ka["C"]) + _F(ka["eps_raw"])) + _F(ka["eps_out"])
    out = {"margin": U_lo - (s + err_ref), "scale": a * scale, "s": s, "U_lo": U_lo}
    if U_computed is not None and s_computed is not None:
        out["computed_margin"] = _F(U_computed) - _F(s_computed)
    return out


# --------------------------------------------------------------------------------------
# Interval side: rigorous lower bounds of the margin for all pairs of one query.
# --------------------------------------------------------------------------------------


def _matmul_abs_down(A, B):
    n = A.shape[-1]
    from .rounding import gamma_up

    g = gamma_up(max(n, 1), 2.0**-53)
    p = A @ B
    return np.maximum(mul_down(sub_down(p, n * 2.0**-1073), 1.0 - 2.0 * g), 0.0)


def interval_margins(fplan: FP8ScreenPlan, q_t, w_t, kbar, alpha, rho, model) -> dict:
    """Rigorous lower bounds of the dominance margin for keys ``kbar`` [n, D] (float64
    [n]), plus the pair scale α Σ_h|w_h|‖q_h‖‖k̄‖ (float64 [n])."""
    H, D = q_t.shape
    r = fplan.r
    co = model_coefficients_exact(model, D, H, r)
    eps_r, dabs_r, eabs_r = (float(_up_frac(x)) for x in co["scorer"])
    eps_s, dabs_s, eabs_s = (float(_up_frac(x)) for x in co["screen"])
    a = np.asarray(alpha, dtype=np.float64)
    rh = np.asarray(rho, dtype=np.float64)
    # s (payload units) upper bound: Σ_h w_h [q_h·k̄]_+.
    xlo, xhi = matmul_enclose(kbar, q_t.T)
    rlo, rhi = np.maximum(xlo, 0.0), np.maximum(xhi, 0.0)
    wp, wn = np.maximum(w_t, 0.0), np.maximum(-w_t, 0.0)
    sbar_hi = _sub_up(matmul_abs_up(rhi, wp), _matmul_abs_down(rlo, wn))
    absq = np.abs(q_t)
    X = matmul_abs_up(np.abs(kbar), absq.T)  # [n, H]
    aw = np.abs(w_t)
    sum_w = float(matmul_abs_up(aw[None, :], np.ones((H, 1)))[0, 0])
    wX = matmul_abs_up(X, aw)
    errref_raw = _add_up(mul_up(eps_r, wX), mul_up(dabs_r, sum_w))  # payload units (× α)
    errref_out = mul_up(eabs_r, _add_up(sum_w, 2.0 * H + 1.0))
    # Screening exact value lower bound and its worst-case error.
    qv = e4m3_values(fplan.q_payload)
    pv = e4m3_values(fplan.aux_payload)
    x = kbar @ qv.T  # exact
    y = kbar @ pv.T  # exact
    om = fplan.omega.astype(np.float64)
    sg = fplan.aux_scale.astype(np.float64)
    phi = np.maximum(x, 0.0) if fplan.form == "base" else np.abs(x)
    Alo, _ = matmul_enclose(phi, om[:, None]) if r else (np.zeros((kbar.shape[0], 1)),) * 2
    Alo = Alo.ravel()
    z0, z1 = sg[0] * y[:, 0], sg[1] * y[:, 1]  # exact (powers of two)
    zhi = _add_up(z0, z1)
    Slo = sub_down(Alo, np.maximum(zhi, 0.0)) if fplan.form == "base" else sub_down(Alo, zhi)
    Xq = np.abs(kbar) @ np.abs(qv).T  # exact (nonneg e4m3 products)
    Yp = np.abs(kbar) @ np.abs(pv).T
    M = _add_up(
        matmul_abs_up(Xq, np.abs(om)) if r else np.zeros(kbar.shape[0]),
        matmul_abs_up(Yp, sg),
    )
    W1 = float(np.sum(np.abs(om)) + np.sum(sg)) * (1 + 2.0**-40)
    errscr = _add_up(_add_up(mul_up(eps_s, M), dabs_s * W1 * (1 + 2.0**-40)), eabs_s)
    inner = sub_down(Slo, errscr)
    inner = add_down(inner, mul_down(rh, np.float64(fplan.C)))
    inner = add_down(inner, fplan.eps_raw)
    Ulo = add_down(_mul_down_signed(a, inner), fplan.eps_out)
    s_hi = _add_up(_mul_up_signed(a, sbar_hi), _add_up(mul_up(a, errref_raw), errref_out))
    margin = sub_down(Ulo, s_hi)
    scale = a * (np.linalg.norm(kbar, axis=1) * float(aw @ np.linalg.norm(q_t, axis=1)))
    return {"margin": margin, "scale": scale, "s_hi": s_hi, "U_lo": Ulo}


def _up_frac(x: Fraction) -> float:
    f = float(x)
    return float(np.nextafter(f, np.inf)) if Fraction(f) < x else f


def _add_up(a, b):
    from .rounding import add_up

    return add_up(a, b)


def _sub_up(a, b):
    from .rounding import sub_up

    return sub_up(a, b)


def _mul_down_signed(a, b):
    return mul_down(a, b)


def _mul_up_signed(a, b):
    return mul_up(a, b)


# --------------------------------------------------------------------------------------
# Slack decomposition (float64, for reporting)
# --------------------------------------------------------------------------------------


def slack_parts(fplan: FP8ScreenPlan, q_t, w_t, k, kbar, alpha, rho, U, s_ref) -> dict:
    """U^num − s^ref per key split into the certificate's Prop. 6 parts and the guard's
    parts (float64 [n] each; approximations for reporting, not proofs)."""
    plan = fplan.plan
    out = {}
    sl = cert_slack(plan, q_t, w_t, k) if fplan.form == "base" else None
    Ucert = upper_bound(plan, k, fplan.form, "none")
    s = k @ q_t.T
    s = np.maximum(s, 0.0) @ w_t
    if sl is not None:
        out["cert_positive"] = sl["positive"]
        out["cert_missed_negative"] = sl["missed_negative"]
        out["cert_cancellation"] = sl["cancellation"]
    else:
        out["cert_total"] = Ucert - s
    gb = fplan.group_bounds
    gn = np.stack(
        [np.linalg.norm(kbar[:, gb[g] : gb[g + 1]], axis=1) for g in range(gb.size - 1)], axis=1
    )
    Ehat = gn @ fplan.E_plus
    Uhat = screen_values(fplan, kbar)
    out["rows"] = alpha * (Uhat + Ehat) - Ucert
    absk = np.abs(kbar)
    env_total = np.zeros(kbar.shape[0])
    for name, J in fplan.J_parts.items():
        v = alpha * (absk @ J)
        out[f"envelope_{name}"] = v
        env_total += v
    out["norm"] = alpha * (rho * float(fplan.C)) - alpha * Ehat - env_total
    out["absolute"] = alpha * fplan.eps_raw + fplan.eps_out
    total = U - s_ref
    acc = sum(v for v in out.values())
    out["residual"] = total - acc
    out["total"] = total
    return out
