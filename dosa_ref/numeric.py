"""Numerical certificate for FP8 keys (docs/method.md §8, Appendix C): the FP8 screening
plan (screening rows and the guard C, ε), the screening value Û and the bound U^num.

What must hold.  Keys are ``k_i = α_i k̄_i`` (fp32 scale, e4m3 payload).  The scorer that
defines the result computes s^ref_i ≈ s_i = Σ_h w_h [q_h·k_i]_+ with its own rounding; the
screening kernel computes, in payload units and with its own rounding,

    base:  Û_i = fl( Σ_{j∈R} ω_j [q̂_j·k̄_i]_+ − [σ_0 p_0·k̄_i + σ_1 p_1·k̄_i]_+ )
    abs:   Û_i = fl( Σ_{j∈R} ω_j |q̂_j·k̄_i|  − (σ_0 p_0·k̄_i + σ_1 p_1·k̄_i) )

(q̂_j: e4m3 retained query rows; ω_j: fp32 folded weights; v_m = σ_m p_m: the two FP8
auxiliary rows).  The guarantee we prove is

    s^ref_i ≤ U^num_i = Eval_up[ α_i (Û_i + ρ_i C + ε_raw) + ε_out ]                  (★)

for every key whose scale and summary are valid, for *any* screening and scorer arithmetic
that satisfies the ``ErrorModel``.  The chain (payload units, k̄ = k̄_i, c_j = w̃_j in the
base form and ½w̃_j in the absolute-value form, exact reals throughout):

 1. Exact certificate (§6):  s̄ := Σ_h w_h[q_h·k̄]_+ ≤ Σ_R c_j φ(q_j·k̄) + lin − agg
    + Σ_g E_g ‖k̄^(g)‖, with φ = [·]_+ (base) or |·| (abs), E_g a valid positive allowance
    computed from the plan's β_h (taken as exact numbers: Prop. 1 holds for any β ≥ 0 with
    d_h := q_h − β_h q_{j*} exactly), E_g ≤ E_g^+ (outward-rounded enclosure).
 2. Row rounding: c_j φ(q_j·k̄) ≤ ω_j φ(q̂_j·k̄) + Σ_d | |c_j| q_{j,d} − |ω_j| q̂_{j,d} | |k̄_d|
    when c_j and ω_j have the same sign (φ is 1-Lipschitz and positively homogeneous),
    else + Σ_d (|c_j||q_{j,d}| + |ω_j||q̂_{j,d}|)|k̄_d|.  This is J^ω (weight rounding
    |w̃_j − ω_j/σ_j| and query-row quantization together).
 3. Aux reconstruction: −[a·k̄]_+ ≤ −[(v_0+v_1)·k̄]_+ + Σ_d |e_d||k̄_d| with e = a − v_0 − v_1
    (a = a_A, or V for the abs form); |e_d| is enclosed by intervals: J^aux.
 4. Screening arithmetic: |Û − (exact screening value)| ≤ Σ_d J^scr_d |k̄_d| + ε_raw^scr.
 5. Scorer arithmetic: |s^ref − α s̄| ≤ α(Σ_d J^ref_d |k̄_d| + ε_raw^ref) + ε_out.
 6. Σ_g E_g^+‖k̄^(g)‖ + Σ_d J_d|k̄_d| ≤ Σ_g (E_g^+ + ‖J^(g)‖)‖k̄^(g)‖
    ≤ (Σ_g [E_g^+ + ‖J^(g)‖]²)^{1/2} ‖k̄‖ ≤ ρ_i C   (Cauchy–Schwarz twice, ρ_i√D ≥ ‖k̄‖).
 Adding 1–6 and multiplying by α_i > 0 (ReLU is positively homogeneous) gives (★).

Outward rounding.  Every quantity of the guard is evaluated with the directed rounding of
``rounding`` (``add_up``, ``mul_down``, ``sqrt_up`` …); the arithmetic the guard must cover
is an ``error_model.ErrorModel``.

Recovery.  A non-finite or non-positive scale, a non-finite summary or a NaN payload code
makes that key's bound +inf (it survives and is scored); a non-finite C, ω, aux scale or ε
makes the query's plan invalid (every key survives, i.e. full-domain scoring).  Nothing
non-finite passes silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .error_model import DEFAULT_MODEL, Arithmetic, ErrorModel, simulate_dot
from .fp8 import E4M3_MAX, e4m3_bits, e4m3_values, key_rms, nan_codes
from .plan import Plan, PlanOptions, activation_frequency, build_plan
from .prepare import check_fp8_inputs
from .rounding import (
    INF,
    add_down,
    add_up,
    down,
    f32_up,
    iv_abs,
    iv_add,
    iv_mag,
    iv_mul,
    iv_sub,
    matmul_abs_up,
    matmul_enclose,
    mul_down,
    mul_up,
    norm_up,
    sqrt_up,
    sub_down,
    sub_up,
    sum_down,
    sum_up,
    up,
)
from .seeds import stride_sample
from .validate import check_ranges

__all__ = [
    "FP8Bounds",
    "FP8ScreenPlan",
    "build_fp8_plan",
    "default_plan",
    "fp8_bounds",
    "screen_bound",
    "screen_values",
    "simulate_screen",
]

# --------------------------------------------------------------------------------------
# Screening plan (the contract the GPU kernels consume)
# --------------------------------------------------------------------------------------


@dataclass
class FP8ScreenPlan:
    """FP8 screening rows and guard of one query (docs/method.md §8).  This is the contract the
    GPU screening kernel consumes; r = |R|, D = head dimension, G = allowance groups.

    Kernel inputs:
        form: ``"base"`` (ReLU rows, aux subtracted through a ReLU) or ``"abs"``
            (absolute-value rows, aux subtracted linearly).
        valid: bool — False means "do not prune this query" (every key survives).
        R: int64 [r] — retained head ids (indices into the query's H heads).
        q_payload: uint8 [r, D] — e4m3 bit patterns q̂_j of the retained query rows
            (q_j ≈ q_scale_j · q̂_j; the scale is folded into ``omega``).
        omega: float32 [r] — stored folded weights ω_j = fl32(c_j · q_scale_j), with
            c_j = w̃_j (base) or ½ w̃_j (abs); w̃ the folded weights of Prop. 1.
        aux_payload: uint8 [2, D] — e4m3 bits of the auxiliary rows p_0, p_1 with
            v_m = aux_scale_m · p_m and v_0 + v_1 ≈ a_A (base) or V (abs).
        aux_scale: float32 [2] — σ_0, σ_1 (powers of two in fp32's normal range).
        C: float32 — the RMS coefficient, rounded up:
            C ≥ √D (Σ_g [E_g^+ + ‖J^(g)‖]²)^{1/2}.
        eps_raw: float64 — absolute allowance in payload units (rounded up).
        eps_out: float64 — absolute allowance in score units (rounded up).
      The kernel computes Û_i in payload units (see the module docstring) and
      U^num_i = α_i (Û_i + ρ_i C + eps_raw) + eps_out with upward rounding (fp64
      ``__dmul_ru``/``__dadd_ru``), rejecting key i iff U^num_i < τ.  A key with a
      non-finite or non-positive α_i, non-finite ρ_i or NaN payload code is never rejected.

    Diagnostics (CPU only): q_scale float64 [r]; c_lo, c_hi float64 [r] (enclosure of
    c_j); E_plus float64 [G]; group_bounds int64 [G+1]; J float64 [D] (total envelope,
    upper bound) and J_parts {"aux", "omega", "screen", "scorer"} → float64 [D];
    eps_parts; model (ErrorModel); plan (the float64 ``Plan``); H, D.
    """

    form: str
    valid: bool
    R: np.ndarray
    q_payload: np.ndarray
    omega: np.ndarray
    aux_payload: np.ndarray
    aux_scale: np.ndarray
    C: np.float32
    eps_raw: float
    eps_out: float
    q_scale: np.ndarray
    c_lo: np.ndarray
    c_hi: np.ndarray
    E_plus: np.ndarray
    group_bounds: np.ndarray
    J: np.ndarray
    J_parts: dict
    eps_parts: dict
    model: ErrorModel
    plan: Plan | None
    H: int
    D: int

    @property
    def r(self) -> int:
        return int(self.R.shape[0])

    def kernel_arrays(self) -> dict:
        """The kernel inputs as a dict of numpy arrays (fixed dtypes, see above)."""
        return {
            "form": self.form,
            "valid": bool(self.valid),
            "R": self.R.astype(np.int64),
            "q_payload": self.q_payload.astype(np.uint8),
            "omega": self.omega.astype(np.float32),
            "aux_payload": self.aux_payload.astype(np.uint8),
            "aux_scale": self.aux_scale.astype(np.float32),
            "C": np.float32(self.C),
            "eps_raw": float(self.eps_raw),
            "eps_out": float(self.eps_out),
        }


def _pow2_scale(amax: float, lo_exp: int = -1074, hi_exp: int = 1023) -> float:
    """Power of two σ with amax/σ in (224, 448] (clamped exponent); 1 for amax = 0."""
    if not (amax > 0) or not np.isfinite(amax):
        return 1.0
    m, e = np.frexp(amax / E4M3_MAX)  # amax/448 = m·2^e, m in [0.5, 1)
    e = int(e - 1) if m == 0.5 else int(e)
    return float(np.ldexp(1.0, min(max(e, lo_exp), hi_exp)))


def _quantize_vec(x: np.ndarray, sigma: float) -> np.ndarray:
    """e4m3 bits of x/σ (saturating RNE via float32)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.asarray(x, dtype=np.float64) / sigma
    y = np.where(np.isfinite(y), y, 0.0)
    return e4m3_bits(np.clip(y, -1e30, 1e30).astype(np.float32))


def _row_rounding_envelope(c_lo, c_hi, q_row, omega, qhat_vals):
    """Σ-term of step 2 for one row: upper bound of | |c| q_d − |ω| q̂_d | per d [D]."""
    om = float(omega)
    same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)
    ca = iv_abs((np.float64(c_lo), np.float64(c_hi)))
    aq = np.abs(om) * qhat_vals  # exact: fp32 × e4m3 fits float64
    if same:
        prod = iv_mul(ca, (q_row, q_row))
        return iv_mag(iv_sub(prod, (aq, aq)))
    return add_up(mul_up(ca[1], np.abs(q_row)), np.abs(aq))


def _w_tilde_enclosure(plan: Plan, w_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Enclosure of w̃_j = w_j + Σ_{h∈P, j*_h = j} w_h β_h (β_h taken as exact numbers)."""
    lo = plan.w_R.astype(np.float64).copy()
    hi = lo.copy()
    pos = {int(h): i for i, h in enumerate(plan.R)}
    for i, h in enumerate(plan.P):
        a = int(plan.anchor[i])
        if a < 0 or plan.beta[i] == 0.0:
            continue
        j = pos[a]
        wb_lo = mul_down(w_t[h], plan.beta[i])
        wb_hi = mul_up(w_t[h], plan.beta[i])
        lo[j] = add_down(lo[j], wb_lo)
        hi[j] = add_up(hi[j], wb_hi)
    return lo, hi


def _d_enclosure(plan: Plan, q_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Enclosure of d_h = q_h − β_h q_{j*_h} for h ∈ P ([|P|, D] each)."""
    P = plan.P
    lo = q_t[P].astype(np.float64).copy()
    hi = lo.copy()
    for i in range(P.size):
        a = int(plan.anchor[i])
        if a < 0 or plan.beta[i] == 0.0:
            continue
        qa = q_t[a]
        b = plan.beta[i]
        lo[i] = sub_down(lo[i], mul_up(b, qa))
        hi[i] = sub_up(hi[i], mul_down(b, qa))
    return lo, hi


def _joint_up(u_lo: np.ndarray, u_hi: np.ndarray) -> float:
    """Upper bound of Prop. 3's ½(‖Σ_h u_h‖ + sqrt(Σ_{h,l}|u_h·u_l|)) over an enclosure."""
    if u_lo.shape[0] == 0:
        return 0.0
    mx = float(np.max(np.maximum(np.abs(u_lo), np.abs(u_hi))))
    if mx == 0.0:
        return 0.0
    if not np.isfinite(mx):
        return INF
    e = int(np.frexp(mx)[1])
    with np.errstate(under="ignore"):
        lo, hi = np.ldexp(u_lo, -e), np.ldexp(u_hi, -e)
        if e > 0:  # downscaling may round: widen
            lo, hi = down(lo), up(hi)
    S = (sum_down(lo, axis=0), sum_up(hi, axis=0))
    nS = norm_up(iv_mag(S))
    m = 0.5 * (lo + hi)
    rad = np.maximum(sub_up(hi, m), sub_up(m, lo))
    am = np.abs(m)
    mlo, mhi = matmul_enclose(m, m.T)
    G = np.maximum(np.abs(mlo), np.abs(mhi))
    G = add_up(G, matmul_abs_up(am, rad.T))
    G = add_up(G, matmul_abs_up(rad, am.T))
    G = add_up(G, matmul_abs_up(rad, rad.T))
    val = mul_up(0.5, add_up(nS, sqrt_up(sum_up(G))))
    return float(up(np.ldexp(val, e)))


def _positive_enclosure(plan: Plan, q_t: np.ndarray, w_t: np.ndarray):
    """E_g^+ (float64 [G], upper) matching ``plan.positive_coefficients()`` and its cuts."""
    gb = plan.allowance_groups()
    G = gb.size - 1
    if plan.P.size == 0:
        return np.zeros(G), gb
    d_lo, d_hi = _d_enclosure(plan, q_t)
    wP = w_t[plan.P]
    dmag = iv_mag((d_lo, d_hi))
    u = iv_mul((wP[:, None], wP[:, None]), (d_lo, d_hi))
    opt = plan.options.allowance
    E = np.zeros(G)
    for g in range(G):
        sl = slice(gb[g], gb[g + 1])
        tri = float(sum_up(mul_up(wP, norm_up(dmag[:, sl], axis=1))))
        if opt == "triangle":
            E[g] = tri
        else:
            E[g] = min(tri, _joint_up(u[0][:, sl], u[1][:, sl]))
    return E, gb


def build_fp8_plan(
    plan: Plan,
    q_t: np.ndarray,
    w_t: np.ndarray,
    model: ErrorModel | None = None,
    form: str = "base",
) -> FP8ScreenPlan:
    """FP8 screening rows, envelope J, E_g^+, C and ε for one query (outward-rounded).

    ``plan`` is the float64 plan of (q_t [H, D], w_t [H]); its R, P, anchors, β and A are
    used as exact inputs (any choice is valid), everything else is recomputed here with
    enclosures.  Returns an ``FP8ScreenPlan`` (``valid`` False if anything is non-finite).
    """
    if form not in ("base", "abs"):
        raise ValueError(f"form: expected 'base' or 'abs', got {form!r}")
    model = model or DEFAULT_MODEL
    q_t = np.asarray(q_t, dtype=np.float64)
    w_t = np.asarray(w_t, dtype=np.float64)
    H, D = q_t.shape
    R = plan.R
    r = R.size

    # c_j = w̃_j (base) or ½ w̃_j (abs), enclosed.
    c_lo, c_hi = _w_tilde_enclosure(plan, w_t)
    if form == "abs":
        with np.errstate(under="ignore"):
            c_lo, c_hi = down(np.ldexp(c_lo, -1)), up(np.ldexp(c_hi, -1))

    # Retained rows: e4m3 payload with a per-row scale folded into ω (pick the scale with
    # the smaller reconstruction residual: a power of two keeps e4m3-valued rows exact).
    q_payload = np.zeros((r, D), dtype=np.uint8)
    q_scale = np.ones(r)
    omega = np.zeros(r, dtype=np.float32)
    J_omega = np.zeros(D)
    for j in range(r):
        q_row = q_t[R[j]]
        amax = float(np.max(np.abs(q_row)))
        best = None
        for sigma in (_pow2_scale(amax), max(amax, 1e-300) / E4M3_MAX):
            pay = _quantize_vec(q_row, sigma)
            with np.errstate(over="ignore", invalid="ignore"):
                res = float(np.sum(np.abs(q_row - sigma * e4m3_values(pay))))
            if best is None or res < best[0]:
                best = (res, sigma, pay)
        _, sigma, pay = best
        c_mid = 0.5 * (c_lo[j] + c_hi[j])
        with np.errstate(over="ignore", under="ignore"):
            omega[j] = np.float32(c_mid * sigma)
        q_payload[j], q_scale[j] = pay, sigma
        J_omega = add_up(
            J_omega, _row_rounding_envelope(c_lo[j], c_hi[j], q_row, omega[j], e4m3_values(pay))
        )

    # Aux target: a_A (base) or V = a_A − Σ_j c_j q_j (abs; c_j = ½ w̃_j), enclosed.
    t_lo, t_hi = np.zeros(D), np.zeros(D)
    for h in plan.A:
        t = iv_mul((np.abs(w_t[h]), np.abs(w_t[h])), (q_t[h], q_t[h]))
        t_lo, t_hi = iv_add((t_lo, t_hi), t)
    if form == "abs":
        for j in range(r):
            t = iv_mul((c_lo[j], c_hi[j]), (q_t[R[j]], q_t[R[j]]))
            t_lo, t_hi = iv_sub((t_lo, t_hi), t)
    target = 0.5 * (t_lo + t_hi)
    aux_payload = np.zeros((2, D), dtype=np.uint8)
    aux_scale = np.ones(2, dtype=np.float32)
    resid = target
    e_lo, e_hi = t_lo, t_hi
    for m in range(2):
        amax = float(np.max(np.abs(resid))) if np.all(np.isfinite(resid)) else 0.0
        sigma = _pow2_scale(amax, -126, 127)
        pay = _quantize_vec(resid, sigma)
        v = sigma * e4m3_values(pay)  # exact
        aux_payload[m], aux_scale[m] = pay, np.float32(sigma)
        e_lo, e_hi = sub_down(e_lo, v), sub_up(e_hi, v)
        with np.errstate(over="ignore", invalid="ignore"):
            resid = resid - v
    J_aux = iv_mag((e_lo, e_hi))

    # Screening arithmetic (payload units).
    eps_s, dabs_s, eabs_s = model.screen_coefficients(D, r)
    qv = e4m3_values(q_payload)
    pv = e4m3_values(aux_payload)
    absom = np.abs(omega.astype(np.float64))
    sig = aux_scale.astype(np.float64)
    M_row = add_up(
        matmul_abs_up(absom[None, :], np.abs(qv)).ravel() if r else np.zeros(D),
        matmul_abs_up(sig[None, :], np.abs(pv)).ravel(),
    )
    J_screen = mul_up(eps_s, M_row)
    W1 = float(add_up(sum_up(absom), sum_up(sig)))
    eps_raw_screen = float(add_up(mul_up(dabs_s, W1), eabs_s))

    # Original scorer arithmetic (payload units, × α in the bound).
    eps_r, dabs_r, eabs_r = model.scorer_coefficients(D, H)
    aw = np.abs(w_t)
    J_scorer = mul_up(eps_r, matmul_abs_up(aw[None, :], np.abs(q_t)).ravel())
    sw = float(sum_up(aw))
    eps_raw_scorer = float(mul_up(dabs_r, sw))
    eps_out = float(mul_up(eabs_r, add_up(sw, 2.0 * H + 1.0)))

    J = add_up(add_up(J_aux, J_omega), add_up(J_screen, J_scorer))
    E_plus, gb = _positive_enclosure(plan, q_t, w_t)
    G = gb.size - 1
    nJ = np.array([norm_up(J[gb[g] : gb[g + 1]]) for g in range(G)])
    tot = add_up(E_plus, nJ)
    C64 = mul_up(sqrt_up(float(D)), sqrt_up(sum_up(mul_up(tot, tot))))
    C = f32_up(C64)
    eps_raw = float(add_up(eps_raw_screen, eps_raw_scorer))
    valid = bool(
        np.isfinite(C)
        and np.all(np.isfinite(omega))
        and np.all(np.isfinite(aux_scale))
        and np.isfinite(eps_raw)
        and np.isfinite(eps_out)
        and np.all(np.isfinite(c_lo))
        and np.all(np.isfinite(c_hi))
    )
    return FP8ScreenPlan(
        form=form,
        valid=valid,
        R=R.astype(np.int64),
        q_payload=q_payload,
        omega=omega,
        aux_payload=aux_payload,
        aux_scale=aux_scale,
        C=np.float32(C),
        eps_raw=eps_raw,
        eps_out=eps_out,
        q_scale=q_scale,
        c_lo=c_lo,
        c_hi=c_hi,
        E_plus=E_plus,
        group_bounds=gb,
        J=J,
        J_parts={"aux": J_aux, "omega": J_omega, "screen": J_screen, "scorer": J_scorer},
        eps_parts={
            "raw_screen": eps_raw_screen,
            "raw_scorer": eps_raw_scorer,
            "out_scorer": eps_out,
        },
        model=model,
        plan=plan,
        H=H,
        D=D,
    )


# --------------------------------------------------------------------------------------
# Screening value and U^num
# --------------------------------------------------------------------------------------


def screen_values(fplan: FP8ScreenPlan, kbar: np.ndarray) -> np.ndarray:
    """Û for payload values ``kbar`` float64 [n, D] (CPU: exact FP8 dots, float64
    epilogue — one admissible evaluation of the model's arithmetic)."""
    qv = e4m3_values(fplan.q_payload)
    pv = e4m3_values(fplan.aux_payload)
    with np.errstate(invalid="ignore", over="ignore"):
        x = kbar @ qv.T  # exact (multiples of 2^-18 below 2^35)
        y = kbar @ pv.T
        om = fplan.omega.astype(np.float64)
        z = y @ fplan.aux_scale.astype(np.float64)
        if fplan.form == "base":
            return np.maximum(x, 0.0) @ om - np.maximum(z, 0.0)
        return np.abs(x) @ om - z


def screen_bound(
    fplan: FP8ScreenPlan,
    kbar: np.ndarray,
    scale: np.ndarray,
    rho: np.ndarray,
    Uhat: np.ndarray | None = None,
) -> np.ndarray:
    """U^num = Eval_up[α(Û + ρC + ε_raw) + ε_out] for keys (payload values ``kbar``
    float64 [n, D], ``scale`` α fp32 [n], ``rho`` fp32 [n]); float64 [n].

    +inf where the key is invalid (α not finite and > 0, ρ not finite, Û not finite)
    and everywhere when the plan is invalid.
    """
    n = kbar.shape[0]
    if not fplan.valid:
        return np.full(n, INF)
    if Uhat is None:
        Uhat = screen_values(fplan, kbar)
    a = np.asarray(scale, dtype=np.float64)
    rh = np.asarray(rho, dtype=np.float64)
    t = add_up(Uhat, mul_up(rh, np.float64(fplan.C)))
    t = add_up(t, fplan.eps_raw)
    U = add_up(mul_up(a, t), fplan.eps_out)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(a) & (a > 0) & np.isfinite(rh) & (rh >= 0) & np.isfinite(U)
    return np.where(ok, U, INF)


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


@dataclass
class FP8Bounds:
    """``fp8_bounds`` output: U [Qn, N] float64 (U^num; −inf where not visible, +inf where
    pruning is disabled), Uhat [Qn, N] (screening values, NaN where not visible), plans
    (FP8ScreenPlan per query), rho float32 [N]."""

    U: np.ndarray
    Uhat: np.ndarray
    plans: list
    rho: np.ndarray


def default_plan(q_t, w_t, kbar_sample, r=None, options: PlanOptions | None = None) -> Plan:
    """A deterministic plan for bounds/audits: p from a key sample, r = H//2 by default."""
    H = q_t.shape[0]
    p = activation_frequency(q_t, kbar_sample)
    rr = max(1, H // 2) if r is None else int(r)
    return build_plan(q_t, w_t, p, rr, options or PlanOptions())


def fp8_bounds(
    q,
    w,
    payload,
    scale,
    ks=None,
    ke=None,
    *,
    plans=None,
    r=None,
    form: str = "base",
    error_model: ErrorModel | None = None,
    rho=None,
    sample: int = 1024,
    plan_options: PlanOptions | None = None,
) -> FP8Bounds:
    """U^num per (query, key), for audits and for checking the GPU.

    Args:
        q [Qn, H, D], w [Qn, H]: as for ``fp8_topk``; payload uint8 [N, D]; scale fp32 [N].
        ks, ke: visible ranges (default all).
        plans: optional list of ``FP8ScreenPlan`` (or float64 ``Plan``) per query to
            evaluate (e.g. ``fp8_topk(...).plans``); otherwise a deterministic default plan
            (activation frequencies from a stride sample of visible keys, r = H//2).
        form, error_model, plan_options: as for ``fp8_topk``.
        rho: optional fp32 [N] summaries (default ``key_rms(payload)``).
    Invalid scales / summaries / NaN codes give +inf for that key (no pruning).
    """
    q, w, payload, scale = check_fp8_inputs(q, w, payload, scale, strict=False)
    Qn, H, D = q.shape
    N = payload.shape[0]
    ks, ke = check_ranges(ks, ke, Qn, N)
    model = error_model or DEFAULT_MODEL
    kbar = e4m3_values(payload)
    if rho is None:
        rho = key_rms(payload)
    rho = np.asarray(rho, dtype=np.float32)
    if rho.shape != (N,):
        raise ValueError(f"rho: expected shape ({N},), got {rho.shape}")
    U = np.full((Qn, N), -INF)
    Uhat = np.full((Qn, N), np.nan)
    out_plans = []
    for t in range(Qn):
        a, b = int(ks[t]), int(ke[t])
        fp = None if plans is None else plans[t]
        if isinstance(fp, Plan):
            fp = build_fp8_plan(fp, q[t], w[t], model, form)
        if fp is None:
            smp = kbar[stride_sample(a, b, sample)] if b > a else kbar[:0]
            smp = np.nan_to_num(smp)
            fp = build_fp8_plan(
                default_plan(q[t], w[t], smp, r, plan_options), q[t], w[t], model, form
            )
        out_plans.append(fp)
        if b > a:
            kb = kbar[a:b]
            uh = screen_values(fp, kb)
            Uhat[t, a:b] = uh
            U[t, a:b] = screen_bound(fp, kb, scale[a:b], rho[a:b], uh)
            bad = np.any(nan_codes(payload[a:b]), axis=1)
            U[t, a:b][bad] = INF
    return FP8Bounds(U=U, Uhat=Uhat, plans=out_plans, rho=rho)


def simulate_screen(fplan: FP8ScreenPlan, kbar: np.ndarray, arith: Arithmetic | None = None):
    """Û for payload rows ``kbar`` [n, D] computed the way a GPU kernel following
    ``arith`` (default: the plan's screening model) may: ``simulate_dot`` for each row,
    then an fp32 round-to-nearest epilogue in a fixed order.  float64 [n]."""
    arith = arith or fplan.model.screen
    f32 = np.float32
    qv = e4m3_values(fplan.q_payload)
    pv = e4m3_values(fplan.aux_payload)
    acc = np.zeros(kbar.shape[0], dtype=f32)
    for j in range(fplan.r):
        x = simulate_dot(qv[j], kbar, arith).astype(f32)
        v = np.abs(x) if fplan.form == "abs" else np.maximum(x, f32(0))
        acc = (acc + (f32(fplan.omega[j]) * v).astype(f32)).astype(f32)
    y0 = simulate_dot(pv[0], kbar, arith).astype(f32)
    y1 = simulate_dot(pv[1], kbar, arith).astype(f32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = ((f32(fplan.aux_scale[0]) * y0).astype(f32) + (f32(fplan.aux_scale[1]) * y1)).astype(
            f32
        )
    if fplan.form == "base":
        z = np.maximum(z, f32(0))
    return (acc - z).astype(f32).astype(np.float64)
