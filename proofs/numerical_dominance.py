"""Numerical dominance for FP8 keys (docs/method.md §8; paper appendix C).

Statement.  Keys k_i = α_i k̄_i (fp32 scale α_i > 0, e4m3 payload k̄_i), summary ρ_i with
ρ_i √D ≥ ‖k̄_i‖, screening rows (q̂_j, ω_j, v_0 = σ_0 p_0, v_1 = σ_1 p_1) and guard
(C, ε_raw, ε_out) built by ``dosa_ref.numeric.build_fp8_plan``.  For every screening value
Û_i and every computed score s^ref_i that an arithmetic within the ``ErrorModel`` can
produce,

    s^ref_i ≤ U^num_i = Eval_up[ α_i (Û_i + ρ_i C + ε_raw) + ε_out ],
    C ≥ √D (Σ_g [E_g^+ + ‖J^(g)‖]²)^{1/2},

J the coordinate envelope (aux reconstruction |e_A| or |e_V|, folded-weight and row
rounding, screening arithmetic, scorer arithmetic) and E_g^+ an upper enclosure of a valid
grouped positive allowance.  Proof: the six steps of ``dosa_ref.numeric``'s docstring
(exact certificate; 1-Lipschitz ReLU/|·| for row rounding and aux reconstruction; model
error bounds; two Cauchy–Schwarz steps and ρ√D ≥ ‖k̄‖; positive homogeneity in α).

What ``check`` verifies, exactly (fractions; e4m3 and fp32 values are dyadic):
  1. the dominance margin m = α(Ŝ − err_scr + ρC + ε_raw) + ε_out − (s + err_ref) ≥ 0
     for every key, with Ŝ and s the exact screening value and score and err_* the
     model's worst-case errors for that pair (``dosa_ref.margins.exact_margin``, its own
     implementation of the model's coefficients);
  2. the CPU evaluation: the float U^num ≥ the float64 score of the dequantized key;
  3. for e4m3-valued queries, a simulated GPU (truncating tensor-core sums, fp32
     epilogues; ``simulate_screen`` / ``simulate_scorer``): U^num(Û_sim) ≥ s_sim.
What it does not establish: that a real kernel stays within the model (the GPU issue
measures that), nor anything about keys whose scale or summary is invalid (they are
never pruned).

Tightness notes.  The guard is not vacuous: ``check_necessity`` builds a key with zero
certificate slack (all heads retained) and shows that removing C (and ε) lets a simulated
truncating scorer exceed U^num.  The per-step truncation bound θ(|c| + Σ|p_t|) is attained
up to the factor k/(k+1)·(1 − 2^-4) by k products just below the window beside a large
accumulator (``check_truncation_witness``); the Cauchy–Schwarz steps are tight for keys
parallel to J within each group (not attained by FP8 keys in general).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from dosa_ref.error_model import Arithmetic, ErrorModel, simulate_dot, simulate_scorer
from dosa_ref.fp8 import dequantize, e4m3_values, key_rms, quantize_keys, quantize_queries
from dosa_ref.margins import exact_margin
from dosa_ref.numeric import build_fp8_plan, default_plan, screen_bound, simulate_screen
from dosa_ref.plan import PlanOptions
from dosa_ref.scorer import score_keys

from ._audit import Audit, Result

NAME = "numerical_dominance"
STATEMENT = "s^ref ≤ U^num = Eval_up[α(Û + ρC + ε_raw) + ε_out] for FP8 keys (§8)"


def check(
    q,
    w,
    keys,
    r=1,
    options=None,
    form="base",
    scale_fmt="amax",
    kept_bits=13,
    fp8_queries=False,
    c_scale=1.0,
    context="",
) -> Result:
    """Verify numerical dominance for one query (q [H, D], w [H]) on float keys [n, D]
    (quantized here with ``scale_fmt``).  ``c_scale`` multiplies C (mutation tests use 0)."""
    au = Audit(NAME, tightness=False, context=context)
    q = np.asarray(q, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if fp8_queries:
        qp, wf = quantize_queries(q[None], w[None], scale_fmt)
        q, w = e4m3_values(qp[0]), wf[0].astype(np.float64)
    payload, scale = quantize_keys(np.asarray(keys, dtype=np.float64), scale_fmt)
    kbar = e4m3_values(payload)
    rho = key_rms(payload)
    model = ErrorModel.hopper_fp8(kept_bits)
    plan = default_plan(q, w, kbar, r, PlanOptions(**(options or {})))
    fp = build_fp8_plan(plan, q, w, model, form)
    if c_scale != 1.0:
        fp = dataclasses.replace(fp, C=np.float32(float(fp.C) * c_scale))
    au.claim(fp.valid, "plan valid (finite C, ω, aux scales, ε)")
    if not fp.valid:
        return au.result()
    U = screen_bound(fp, kbar, scale, rho)
    s_ref = score_keys(q, w, dequantize(payload, scale))
    for i in range(kbar.shape[0]):
        ex = exact_margin(fp, q, w, kbar[i], scale[i], rho[i], model, U[i], s_ref[i])
        rel = ex["margin"] / ex["scale"] if ex["scale"] > 0 else ex["margin"]
        au.margin(rel, f"key {i}: U^num ≥ worst-case s^ref (margin / pair scale)")
        cm = ex["computed_margin"]
        au.margin(cm / ex["scale"] if ex["scale"] > 0 else cm, f"key {i}: float U^num ≥ float64 s")
    if fp8_queries:
        s_sim = simulate_scorer(q, w, kbar, scale, model.scorer)
        U_sim = screen_bound(fp, kbar, scale, rho, Uhat=simulate_screen(fp, kbar, model.screen))
        for i in range(kbar.shape[0]):
            au.ge(Fraction(float(U_sim[i])), Fraction(float(s_sim[i])), f"key {i}: simulated GPU")
    return au.result()


def check_truncation_witness(kept_bits=13, k_step=32, context="") -> Result:
    """k products just below the window beside c = 2^8: all vanish; the loss stays below
    the per-step bound θ(|c| + Σ|p|) and reaches ≥ 90% of it (recorded as a note)."""
    au = Audit(NAME, tightness=False, context=context)
    ar = Arithmetic(kept_bits=kept_bits, k_step=k_step)
    c0 = 256.0
    small = 2.0 ** (8 - kept_bits) * 0.9375
    got = simulate_dot(np.full(k_step, small), np.ones((1, k_step)), ar, c0=c0)
    loss = Fraction(c0) + k_step * Fraction(small) - Fraction(float(got[0]))
    bound = Fraction(ar.step_theta()) * (Fraction(c0) + k_step * Fraction(small))
    au.ge(bound, loss, "per-step truncation bound")
    au.claim(loss >= bound * Fraction(9, 10), "witness attains ≥ 90% of the per-step bound")
    au.track("truncation_witness_attained", float(loss / bound))
    au.note(f"truncation witness attains {float(loss / bound):.3f} of θ(|c|+Σ|p|)")
    return au.result()


def check_necessity(kept_bits=13, context="") -> Result:
    """A key with zero certificate slack (every head retained): with C = ε = 0 a simulated
    truncating scorer beats U^num; with the guard it does not."""
    au = Audit(NAME, tightness=False, context=context)
    D = 64
    q = np.zeros((2, D))
    q[0, 0] = 16.0
    q[0, 1:33] = -(2.0**-5)
    q[1, :] = 1.0
    w = np.array([1.0, -(2.0**-20)])
    k = np.zeros((1, D))
    k[0, 0] = 16.0
    k[0, 1:33] = 2.0**-5 * 16.0 / 15.0
    payload, scale = quantize_keys(k)
    kbar = e4m3_values(payload)
    rho = key_rms(payload)
    model = ErrorModel.hopper_fp8(kept_bits)
    fp = build_fp8_plan(default_plan(q, w, kbar, 2), q, w, model, "base")
    s_sim = simulate_scorer(q, w, kbar, scale, model.scorer)
    U = screen_bound(fp, kbar, scale, rho)
    bare = dataclasses.replace(fp, C=np.float32(0.0), eps_raw=0.0, eps_out=0.0)
    U0 = screen_bound(bare, kbar, scale, rho)
    au.ge(Fraction(float(U[0])), Fraction(float(s_sim[0])), "guarded U^num ≥ simulated score")
    au.claim(s_sim[0] > U0[0], "without the guard the simulated score exceeds U^num")
    au.note("guard necessary: removing C lets a truncating scorer exceed U^num")
    return au.result()


KINDS = ("normal", "cancel", "saturated", "subnormal", "clamp", "huge", "tiny")


def _keys(rng, kind, n, D, q):
    k = rng.standard_normal((n, D))
    if kind == "cancel":
        c = rng.choice([-1.0, 1.0], (n, q.shape[0])) * rng.integers(1, 4, (n, q.shape[0]))
        k = c @ q + 1e-3 * k
    elif kind == "saturated":
        k = np.sign(k) * 3.0
    elif kind == "subnormal":
        k = 1e-3 * k
        k[:, 0] = 1e2
    elif kind == "clamp":
        k = 1e-7 * k
    elif kind == "huge":
        k = 1e30 * k
    elif kind == "tiny":
        k = 1e-30 * k
    return k


def cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for t in range(28):
        H = int(rng.choice([2, 4, 8]))
        D = int(rng.choice([8, 32, 128]))
        q = rng.standard_normal((H, D)) + (rng.standard_normal(D) if t % 2 else 0.0)
        w = -np.abs(rng.standard_normal(H))
        w[: 1 + t % 3] *= -1
        if t % 9 == 4:
            w = (1.0 + 2.0**-24) * np.sign(w)  # ω at a float32 tie
        kind = KINDS[t % len(KINDS)]
        qs = [1.0, 1e-100, 1e30][t % 3] if t % 4 != 1 else 1.0
        out.append(
            dict(
                q=q * qs,
                w=w,
                keys=_keys(rng, kind, 5, D, q),
                r=int(rng.integers(1, H + 1)),
                options=dict(
                    allowance=["triangle", "joint", "grouped"][t % 3],
                    neg_aggregate=["majority", "all", "none"][(t // 3) % 3],
                    groups=int(rng.choice([1, 2, 4])),
                ),
                form=["base", "abs"][(t // 2) % 2],
                scale_fmt=["amax", "ue8m0"][t % 2],
                kept_bits=[13, 17][(t // 4) % 2],
                fp8_queries=t % 4 == 1,
                context=f"case {t} keys={kind} q×{qs:g}",
            )
        )
    out.append(dict(_check="check_truncation_witness", kept_bits=13, context="W=13"))
    out.append(dict(_check="check_truncation_witness", kept_bits=17, context="W=17"))
    out.append(dict(_check="check_necessity", kept_bits=13, context="necessity"))
    return out
