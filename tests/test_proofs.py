"""The executable proofs (``proofs/``): the full audit finds no violation, every check CAN
fail (a deliberately broken bound on a witness is reported), and the exact arithmetic
decides what it claims to decide."""

from fractions import Fraction

import numpy as np
import pytest

import proofs
from proofs import (
    b3_margin_identity,
    certificate_bound,
    gpu_screen_epilogue,
    grouped_allowance,
    prop1_anchor_projection,
    prop2_negative_aggregate,
    prop3_joint_allowance,
    prop4_seed_threshold,
    prop5_optimal_projection,
    prop6_slack_decomposition,
    theorem1_exact_topk,
)
from proofs._exact import Dy, Surd
from proofs._gen import spread_witness

# Every statement except numerical dominance, the fp32 pre-test and the GPU screen's
# epilogue (bounds with an allowance, not claimed tight).
# statements that claim a bound and no tightness (wgmma_fresh_step: its witness uses 80 % of the
# dot bound, test_wgmma_fresh_step_can_fail)
TIGHT = set(proofs.MODULES) - {"numerical_dominance", "gpu_screen_epilogue", "wgmma_fresh_step"}


@pytest.fixture(scope="module")
def audit():
    return proofs.run_all(seed=0)


def test_run_all_no_violations(audit):
    assert [r.name for r in audit] == proofs.MODULES
    for r in audit:
        assert r.cases > 0 and r.checks > 0, r.name
        assert not r.violations, (r.name, r.violations)
        if r.n_violations == 0:
            assert r.worst_margin is None or r.worst_margin >= 0.0, r.name


def test_tightness_witnesses_attained(audit):
    for r in audit:
        if r.name in TIGHT:
            assert r.tight_attained is True, r.name


def test_registry_loads_every_module():
    for name in proofs.MODULES:
        mod = proofs.load(name)
        assert mod.NAME == name and mod.STATEMENT and callable(mod.check)
        assert mod.__doc__ and "Statement" in mod.__doc__ and "Proof" in mod.__doc__


# --------------------------------------------------------------------------- known issue


def test_mixed_magnitude_heads_regression():
    """Regression: heads 2^-560 apart once lost a residual norm to underflow (the plan
    now scales each head by its own power of two)."""
    q, w, k = spread_witness()
    res = certificate_bound.check(q[0], w[0], k[:2], R=np.array([2]))
    assert res.ok, res.violations
    for form in ("base", "abs"):
        th = theorem1_exact_topk.check(
            q, w, k, 1, options=dict(seeds="local", window=1, sinks=0, r=1, form=form)
        )
        assert th.ok, th.violations


# --------------------------------------------------------------------------- mutation tests


def _two_head_witness():
    """q0 anchor, q1 = q0 + e2 omitted positive: β* = 1 (exact in float), d = e2."""
    q = np.array([[1.0, 0.0], [1.0, 1.0]])
    w = np.array([1.0, 2.0])
    k = np.array([[0.0, 1.0], [1.0, 0.0]])
    return q, w, k


def test_prop1_can_fail():
    q, w, k = _two_head_witness()
    ok = prop1_anchor_projection.check(q, w, k, R=np.array([0]), beta="optimal")
    assert ok.ok and ok.tight_attained
    bad = prop1_anchor_projection.check(q, w, k, R=np.array([0]), beta="optimal", scale=0.5)
    assert not bad.ok and any("witness" in v for v in bad.violations)


def test_prop2_can_fail():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w = np.array([-1.0, -2.0, -1.0])
    k = np.array([[1.0, 1.0]])  # every head active: M(k) = N, the aggregate over N is exact
    ok = prop2_negative_aggregate.check(q, w, k)
    assert ok.ok and ok.tight_attained
    assert not prop2_negative_aggregate.check(q, w, k, scale=2).ok


def test_prop3_can_fail():
    v = np.array([3.0, 4.0])
    u = np.array([v, 2 * v])  # parallel rows: E_joint = E_P, key v attains the bound
    ok = prop3_joint_allowance.check(u, v[None])
    assert ok.ok and ok.tight_attained
    assert not prop3_joint_allowance.check(u, v[None], scale=Fraction(1, 2)).ok


def test_grouped_can_fail():
    d = np.array([[3.0, 4.0, 0.0, 2.0]])  # group norms 5 and 2 (rational)
    ok = grouped_allowance.check([1.0], d, d, groups=2)
    assert ok.ok and ok.tight_attained
    assert not grouped_allowance.check([1.0], d, d, groups=2, scale=Fraction(1, 2)).ok


def test_prop4_can_fail():
    s = np.zeros(6)  # all ties: every key is a legitimate Top-K member
    ok = prop4_seed_threshold.check(s, S=[0, 1, 2], K=2)
    assert ok.ok and ok.tight_attained
    bad = prop4_seed_threshold.check(s, S=[0, 1, 2], K=2, strict=False)
    assert not bad.ok and any("in TopK" in v for v in bad.violations)


def test_prop5_can_fail():
    q, p = np.array([1.0, 1.0]), np.array([1.0, 0.0])
    ok = prop5_optimal_projection.check(q, p)
    assert ok.ok and ok.tight_attained
    # c* reduced by 2^-40 relative: caught exactly at the witness key
    bad = prop5_optimal_projection.check(q, p, c_scale=1 - Fraction(1, 2**40))
    assert not bad.ok and any("witness" in v for v in bad.violations)


def test_prop6_can_fail():
    q = np.array([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    w = np.array([1.0, -1.0, -1.0])
    k = np.array([[1.0, 0.0]])  # head 2 inactive inside A: cancellation > 0
    args = dict(R=np.array([0]), A=np.array([1, 2]))
    assert prop6_slack_decomposition.check(q, w, k, **args).ok
    bad = prop6_slack_decomposition.check(q, w, k, mutate="drop_cancellation", **args)
    assert not bad.ok and any("U − s" in v for v in bad.violations)


def test_certificate_can_fail():
    q, w, k = _two_head_witness()
    ok = certificate_bound.check(q, w, k, R=np.array([0]), options=dict(allowance="triangle"))
    assert ok.ok and ok.tight_attained  # k = d: U = s exactly
    bad = certificate_bound.check(
        q, w, k, R=np.array([0]), options=dict(allowance="triangle"), scale=0.5
    )
    assert not bad.ok and any("eq. 9" in v for v in bad.violations)


def test_theorem1_can_fail():
    s = np.array([3.0, 1.0, 2.0, 0.0])
    ok = theorem1_exact_topk.check_abstract(s, s, S=[1, 3], K=2)
    assert ok.ok
    U = s.copy()
    U[0] = -1.0  # invalid bound (below s and below τ = 0) on the best key: it is lost
    bad = theorem1_exact_topk.check_abstract(s, U, S=[1, 3], K=2)
    assert any("TopK(S ∪ C)" in v for v in bad.violations)


def test_theorem1_catches_a_wrong_tie_order():
    from dosa_ref import dosa_topk

    def id_descending(q, w, k, K, ks, ke, **opt):
        res = dosa_topk(q, w, k, K, ks, ke, **opt)
        res.ids = res.ids[:, ::-1].copy()  # same set, wrong order
        return res

    rng = np.random.default_rng(0)
    q, w = rng.standard_normal((1, 2, 3)), np.array([[1.0, -1.0]])
    k = np.zeros((8, 3))  # all scores tie
    assert theorem1_exact_topk.check(q, w, k, 3).ok
    assert not theorem1_exact_topk.check(q, w, k, 3, selector=id_descending).ok


def test_b3_can_fail():
    s = np.array([2.0, 1.0, 0.0])
    U = np.array([2.0, 1.0, 1.0])  # key 2 sits exactly at τ = 1
    ok = b3_margin_identity.check(s, U, tau=1.0, K=2)
    assert ok.ok and ok.tight_attained
    assert not b3_margin_identity.check(s, U, tau=1.0, K=2, strict=False).ok


def test_exception_is_reported_not_raised(monkeypatch):
    def boom(**_):
        raise RuntimeError("boom")

    monkeypatch.setattr(b3_margin_identity, "check", boom)
    r = proofs.run_module("b3_margin_identity")
    assert not r.ok and "boom" in r.violations[0]


# --------------------------------------------------------------------------- exact layer


def test_surd_exact_zero_and_sign():
    r2 = Surd.sqrt(2)
    assert (r2 + Surd.sqrt(8) - r2 * 3).sign() == 0  # √2 + 2√2 − 3√2
    assert (Surd.sqrt(Fraction(1, 2)) * 2 - r2).sign() == 0  # 2·√(1/2) = √2
    assert (r2 - Fraction(14142135623730951, 10**16)).sign() == -1
    assert (r2 + Surd.sqrt(3) - Surd.sqrt(Fraction(49, 10)) - Fraction(2, 3)).sign() != 0
    assert Surd.sqrt(Fraction(9, 4)).is_rational() and Surd.sqrt(Fraction(9, 4)).rat == Fraction(
        3, 2
    )
    # a difference far below the first enclosure's precision is still decided
    tiny = Fraction(1, 2**600)
    assert (Surd.sqrt(2 + tiny) - r2).sign() == 1


def test_dyadic_is_exact():
    x = np.array([5e-324, -1e308, 0.1, 0.0, 2.0**-1074 * 3])
    d = Dy.of(x)
    assert d.fracs() == [Fraction(v) for v in x]
    assert (Dy.of(x[None]) @ Dy.of(x[None]).T).frac((0, 0)) == sum(Fraction(v) ** 2 for v in x)


def test_gpu_screen_epilogue_can_fail(monkeypatch):
    """The epilogue check catches a paired evaluation that loses a term (what a NaN row of
    the partner did through fmaf(0, NaN, x) before pipeline.pair_plan zeroed invalid
    plans), and an unpaired one that rounds once more than the claimed depth allows."""
    g = gpu_screen_epilogue
    x = np.array([3.0, 1.0, 2.0, 0.5, 1.5, 2.5, 0, 4.0, 0, 0, 0, 0, 0, 0, 0, 1.0], np.float32)
    w = np.full(16, 0.75, np.float32)
    case = dict(x=x, w=w, sig=np.float32(0.5), xb=x[::-1].copy(), wb=w, sigb=np.float32(0.25))
    assert g.check(**case).ok
    real = g.eval_pair

    def lossy(xa, wa, sa, xb, wb, sb):
        wa = list(wa)
        wa[0] = Fraction(0)  # lane 0 of query a contributes nothing
        return real(xa, wa, sa, xb, wb, sb)

    monkeypatch.setattr(g, "eval_pair", lossy)
    assert not g.check(**case).ok
    monkeypatch.setattr(g, "DEPTH", 0)  # claim exactness: rounding makes it fail
    xr = (np.float32(1) + np.float32(2.0**-20) * np.arange(16, dtype=np.float32)) / 3
    assert not g.check(x=xr.astype(np.float32), w=np.full(16, 0.1, np.float32),
                       sig=np.float32(0.3)).ok  # fmt: skip


@pytest.mark.parametrize("rows", [8, 16, 32])
def test_gpu_screen_epilogue_wgt_can_fail(monkeypatch, rows):
    """The transposed screen's orders: a claimed depth of 0 fails on inputs that round, and
    an evaluation that drops the aux term fails where the aux term is not zero."""
    g = gpu_screen_epilogue
    n = 32 if rows == 32 else 16
    xr = (np.float32(1) + np.float32(2.0**-20) * np.arange(n, dtype=np.float32)) / 3
    case = dict(x=xr.astype(np.float32), w=np.full(n, 0.1, np.float32), sig=np.float32(0.3),
                rows=rows)  # fmt: skip
    assert g.check_wgt(**case).ok
    depth = g.DEPTH_WGT[rows]
    monkeypatch.setitem(g.DEPTH_WGT, rows, 0)
    assert not g.check_wgt(**case).ok
    monkeypatch.setitem(g.DEPTH_WGT, rows, depth)
    name = f"eval_wgt{rows}"
    real = getattr(g, name)
    monkeypatch.setattr(g, name, lambda x, w, sig: real(x, w, Fraction(0)))
    assert not g.check_wgt(**case).ok


def test_wgmma_fresh_step_can_fail():
    """A window of 14 kept bits (half the observed step loss) is caught by the crafted
    witness; the observed 13 bits hold on it with 80 % of the dot bound used."""
    from proofs import wgmma_fresh_step as W

    c = W.window_witness()
    assert W.check(c["q"], c["k"], mutate="window14").n_violations > 0
    ok = W.check(c["q"], c["k"])
    assert ok.n_violations == 0 and ok.maxima["error / dot bound"] > 0.75


@pytest.mark.parametrize("rows", [16, 8])
def test_gpu_screen_epilogue_fp8_can_fail(monkeypatch, rows):
    """The FP8 build's composition: on the window witness of proofs/wgmma_fresh_step.py (q = 1,
    each key step one 448 and 31 small values: every small product truncated by most of a
    quantum, all of one sign), dropping the per-row constants (no step exponent: a_j = 0)
    fails, and so does an epilogue that drops the aux term; the statement as written holds."""
    from dosa_cupy.plan import NO_EXPONENT
    from proofs import wgmma_fresh_step as W

    g = gpu_screen_epilogue
    c = W.window_witness()
    q = np.repeat(c["q"], 16, axis=0)
    q[15] = 0  # the aux dot x_7 + x_15 = x_7: its term does not cancel the retained rows' loss
    case = dict(q=q, k=c["k"], w=np.full(16, 0.5, np.float32), sig=np.float32(0.25), rows=rows)
    assert g.check_wgt_fp8(**case).ok
    real = g.step_exponents
    monkeypatch.setattr(g, "step_exponents", lambda c, xp: np.full_like(real(c, xp), NO_EXPONENT))
    assert not g.check_wgt_fp8(**case).ok
    monkeypatch.setattr(g, "step_exponents", real)
    name = f"eval_wgt{rows}"
    ev = getattr(g, name)
    monkeypatch.setattr(g, name, lambda x, w, sig: ev(x, w, Fraction(0)))
    assert not g.check_wgt_fp8(**case).ok
