"""Rules that a fresh mutation sample on the final stage layout showed unchecked
(docs/mutation.md, "Fresh samples at the final layout").  Every input is fixed.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from strategies import repick_problem

from dosa_ref import cost as cost_mod
from dosa_ref import pipeline as pipeline_mod
from dosa_ref.certificate import upper_bound
from dosa_ref.error_model import ErrorModel
from dosa_ref.fp8 import E4M3_MAX, e4m3_bits, e4m3_values, quantize_keys, quantize_rows
from dosa_ref.numeric import build_fp8_plan, default_plan
from dosa_ref.plan import PlanOptions, activation_frequency, build_plan, choose_retained
from dosa_ref.rounding import iv_abs, matmul_enclose
from dosa_ref.scorer import topk_ids


def test_iv_abs_of_an_interval_around_zero_starts_at_zero():
    """iv_abs((lo, hi)) must enclose |x| for every x in [lo, hi]: when the interval holds 0
    (also with hi below 1) the lower end is 0, otherwise min(|lo|, |hi|).  A lower end
    above some |x| would make every bound built on it too small (unsound)."""
    lo = np.array([-1.0, -0.25, -3.0, 0.0, 0.5, -2.0, -1e-300])
    hi = np.array([0.5, 0.0, 1e-300, 0.75, 2.0, -0.5, 1e-300])
    mig, mag = iv_abs((lo, hi))
    np.testing.assert_array_equal(mig, [0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0])
    np.testing.assert_array_equal(mag, [1.0, 0.25, 3.0, 0.75, 2.0, 2.0, 1e-300])
    for x in np.linspace(lo, hi, 9):
        assert np.all((mig <= np.abs(x)) & (np.abs(x) <= mag))


def test_quantize_rows_takes_any_leading_shape():
    """x [..., D]: one row (ndim 1) is quantized like a one-row matrix, and the D = 0 check
    is on the last axis whatever the leading shape (a ValueError naming x)."""
    x = np.array([1.0, -2.0, 3.5, 0.125])
    p1, s1 = quantize_rows(x)
    p2, s2 = quantize_rows(x[None, :])
    assert p1.shape == (4,) and s1.shape == ()
    np.testing.assert_array_equal(p1, p2[0])
    assert s1 == s2[0]
    p3, s3 = quantize_rows(np.zeros((2, 0, 3)) + 1.0)
    assert p3.shape == (2, 0, 3) and s3.shape == (2, 0)
    with pytest.raises(ValueError, match="x: expected shape"):
        quantize_rows(np.zeros((2, 3, 0)))


def test_choose_r_tries_the_documented_grid_at_h17():
    """r runs over 1, 1 + s, … < H with s = ⌈H/16⌉ (at most 16 plans per query,
    docs/method.md §6 "Cost"): at H = 17 the stride is 2, so 8 plans are built and
    sample_work = Σ_r n (r + d_a)/H over r = 1, 3, …, 15."""
    rng = np.random.default_rng(11)
    H, D = 17, 8
    q_t = rng.standard_normal((H, D)) + rng.standard_normal(D)
    w_t = -np.abs(rng.standard_normal(H))
    w_t[:4] *= -1
    ks = rng.standard_normal((64, D)) + 0.5 * q_t[0]
    p, popt = activation_frequency(q_t, ks), PlanOptions()
    U1 = upper_bound(build_plan(q_t, w_t, p, 1, popt), ks, "base", "up", q_t, w_t)
    tau = float(np.sort(U1)[40])
    ch = cost_mod.choose_r(q_t, w_t, p, tau, ks, popt, "base", 0.25)
    n = ks.shape[0]
    assert ch.sample_work == pytest.approx(sum(n * (r + 2) / H for r in range(1, H, 2)))
    assert ch.r % 2 == 1


def test_zero_weight_heads_are_never_retained():
    """A head with w_h = 0 adds nothing to the score, so R holds only positive heads and
    then negative ones (docs/method.md §3): with fewer nonzero heads than r, R is smaller
    than r rather than padded with zero-weight heads (retaining one only costs work), and
    a zero-weight head never displaces a negative head whose priority is 0 (p = 1)."""
    q = np.eye(4, 5) + 0.25
    w = np.array([1.0, 0.0, -1.0, -2.0])
    p = np.array([0.5, 0.5, 0.5, 0.5])
    np.testing.assert_array_equal(choose_retained(q, w, p, 4), [0, 2, 3])
    w2 = np.array([0.0, 1.0, -1.0])
    p2 = np.array([0.5, 0.5, 1.0])
    np.testing.assert_array_equal(choose_retained(np.eye(3, 4) + 0.25, w2, p2, 2), [1, 2])


def test_auto_r_is_not_picked_again_when_tau_did_not_rise(monkeypatch):
    """The cost model is re-run after the certificate seeds only when τ rose
    (docs/method.md §7): its inputs are otherwise the same, so a second run would only add
    its sample work to bound_work.  Here the most recent keys (seeded by the local window)
    are the top K, so the certificate seeds cannot raise τ: one call, and bound_work is the
    one sample work plus the screen's own work."""
    taus, works = [], []
    orig = pipeline_mod.choose_r

    def spy(q_t, w_t, p, tau, *a, **kw):
        ch = orig(q_t, w_t, p, tau, *a, **kw)
        taus.append(tau)
        works.append(ch.sample_work)
        return ch

    monkeypatch.setattr(pipeline_mod, "choose_r", spy)
    rng = np.random.default_rng(6)
    H, D, N, K = 8, 16, 600, 4
    base = rng.standard_normal(D)
    q = 0.5 * base + rng.standard_normal((1, H, D))
    w = -np.abs(rng.standard_normal((1, H)))
    w[:, :3] *= -1
    k = rng.standard_normal((N, D)) + base
    s = pipeline_mod.index_scores(q, w, k)[0]
    assert s.max() > 0
    k[-8:] = np.outer(2.0 + 0.125 * np.arange(8), k[int(np.argmax(s))])  # s is 1-homogeneous
    s = pipeline_mod.index_scores(q, w, k)[0]
    assert set(np.argsort(-s, kind="stable")[:K]) <= set(range(N - 8, N))
    res = pipeline_mod.dosa_topk(q, w, k, K, seeds="local,certificate", window=8, sinks=0)
    st = res.stats
    assert st.cert_seeds[0] > 0 and not st.dense[0]
    assert len(taus) == 1 and taus[0] == st.tau[0]
    plan_work = N * (st.r[0] + 2) / H
    assert st.bound_work[0] == pytest.approx(works[0] + plan_work, rel=1e-12)


def test_subnormal_scorer_term_is_rounded_up():
    """ε_raw^ref = dabs_ref·Σ|w_h| and ε_out = eabs_ref·(Σ|w_h| + 2H + 1) (docs/numerics.md)
    must bound the exact products.  With the float64 CPU model dabs_ref (and eabs_ref) is
    subnormal (a few multiples of 2^-1074), so the product
    is a subnormal too, and rounding it down loses whole 2^-1074 steps (here 35 · 4.75 =
    166.25 steps would become 165), far more than the upward margin of Σ|w| covers."""
    rs = np.random.default_rng(12)
    H, D = 4, 16
    q = rs.standard_normal((H, D))
    w = np.array([1.25, -1.5, 1.125, -0.875])
    model = ErrorModel.cpu_fp64()
    _, dabs_r, eabs_r = model.scorer_coefficients(D, H)
    assert 0 < dabs_r < np.finfo(np.float64).tiny and 0 < eabs_r < np.finfo(np.float64).tiny
    sw = sum(abs(F(float(x))) for x in w)
    for form in ("base", "abs"):
        plan = default_plan(q, w, rs.standard_normal((8, D)), 2, PlanOptions(neg_aggregate="all"))
        fp = build_fp8_plan(plan, q, w, model, form)
        assert F(fp.eps_parts["raw_scorer"]) >= F(dabs_r) * sw, form
        assert F(fp.eps_out) >= F(eabs_r) * (sw + 2 * H + 1), form


def _l1_residual(row: np.ndarray, sigma: float) -> float:
    """Σ_d |q_d − σ·e4m3(q_d/σ)| with the saturating RNE encoding via float32."""
    pay = e4m3_bits((row / sigma).astype(np.float32))
    return float(np.sum(np.abs(row - sigma * e4m3_values(pay))))


def test_retained_rows_take_the_scale_with_the_smaller_l1_residual():
    """Each retained row q_j is stored as σ_j·e4m3 with σ_j the candidate (the power of two
    with amax/σ in (224, 448], or amax/448) whose reconstruction Σ_d|q_d − σ q̂_d| is smaller
    (docs/method.md §8).  The rounding envelope J_ω grows with that residual, so the pick
    keeps the guard tight (a tightness rule, not a soundness one: either scale is
    enclosed); a signed residual would let errors of opposite signs cancel and pick the
    worse scale.  Ties go to the power of two."""
    rs = np.random.default_rng(21)
    H, D = 8, 16
    picked_amax = picked_pow2 = 0
    for _ in range(6):
        q = rs.standard_normal((H, D)) * np.exp(rs.standard_normal((H, 1)))
        w = rs.standard_normal(H)
        w[0] = abs(w[0])
        plan = default_plan(q, w, rs.standard_normal((8, D)), 4, PlanOptions(neg_aggregate="all"))
        fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
        for j, h in enumerate(plan.R):
            amax = float(np.max(np.abs(q[h])))
            m, e = np.frexp(amax / E4M3_MAX)
            pow2 = float(np.ldexp(1.0, int(e - 1) if m == 0.5 else int(e)))
            r_pow2, r_amax = _l1_residual(q[h], pow2), _l1_residual(q[h], amax / E4M3_MAX)
            got = float(np.sum(np.abs(q[h] - fp.q_scale[j] * e4m3_values(fp.q_payload[j]))))
            assert got == min(r_pow2, r_amax), (h, got, r_pow2, r_amax)
            assert fp.q_scale[j] == (pow2 if r_pow2 <= r_amax else amax / E4M3_MAX)
            picked_pow2 += r_pow2 <= r_amax
            picked_amax += r_pow2 > r_amax
    assert picked_pow2 > 0 and picked_amax > 0


def test_cost_model_sees_the_zero_plateau_when_every_positive_head_is_retained():
    """Every key scores exactly 0 (the one positive head and all negative heads have
    negative dots), the sinks make the K-th seed record (τ = 0, id K − 1), so the screen's
    tie-aware rule with the zero plateau (applied when P = ∅, docs/method.md §7
    "Tie-aware rejection and zero plateaus") keeps only ids below K − 1.  The cost model
    must estimate m under that same rule: m = (K − 1)/512 on the stride sample, so
    screening pays; without the plateau every key would look alive and the query would
    be scored densely."""
    rng = np.random.default_rng(3)
    H, D, N, K = 8, 16, 600, 4
    base = rng.standard_normal(D)
    base /= np.linalg.norm(base)
    q = -base + 0.1 * rng.standard_normal((1, H, D))
    w = -np.abs(rng.standard_normal((1, H)))
    w[0, 0] = 1.0
    k = 3.0 * base + 0.1 * rng.standard_normal((N, D))
    assert np.all(pipeline_mod.index_scores(q, w, k) == 0.0)
    res = pipeline_mod.dosa_topk(q, w, k, K, seeds="local", window=8, sinks=K, tie_reject=True)
    st = res.stats
    assert st.tau[0] == 0.0 and not st.dense[0] and st.survivors[0] == 0
    assert st.est_survival[0] == (K - 1) / 512
    np.testing.assert_array_equal(res.ids[0], np.arange(K))


def test_matmul_enclose_covers_underflow_of_every_product():
    """Each product 3·2^-538 · 2^-537 = 1.5·2^-1074 is a tie between subnormals and rounds
    to 2·2^-1074: eight of them make the float64 dot 16·2^-1074 while the exact value is
    12·2^-1074.  The relative term γ_n Σ|a||b| is negligible there, so only the absolute
    underflow term (docs/numerics.md "Rounding without rounding modes") can cover the
    gap: the interval must still hold the exact product (rationals)."""
    for n in (1, 3, 8, 64):
        A = np.full((2, n), 3.0 * 2.0**-538)
        A[1, ::2] *= -1.0
        B = np.full((n, 1), 2.0**-537)
        lo, hi = matmul_enclose(A, B)
        for i in range(2):
            exact = sum(F(float(A[i, t])) * F(float(B[t, 0])) for t in range(n))
            assert F(float(lo[i, 0])) <= exact <= F(float(hi[i, 0])), (n, i)
    assert F(float((A @ B)[0, 0])) == F(2) ** -1074 * 2 * 64  # every product rounded up


@pytest.mark.parametrize("allowance", ["joint", "grouped"])
def test_joint_enclosure_with_largest_entry_exactly_one(allowance):
    """One omitted positive head, w = 1 and q_h = (1 − 2^-53, 0, 0, 0), not projected:
    the enclosure of u_h = w_h d_h has upper end up(1 − 2^-53) = 1.0 exactly.  E^+ of the
    group holding coordinate 0 must still cover the exact allowance ‖u_h‖ = 1 − 2^-53
    (docs/method.md §3, Prop. 3): an enclosure whose largest entry is 1 is not empty."""
    q = np.zeros((3, 4))
    q[0] = [0.0, 1.0, 0.0, 0.0]
    q[1] = [1.0 - 2.0**-53, 0.0, 0.0, 0.0]
    q[2] = [0.0, 0.0, 1.0, 0.0]
    w = np.array([1.0, 1.0, -1.0])
    opt = PlanOptions(allowance=allowance, pos_projection=False)
    plan = build_plan(q, w, np.full(3, 0.5), 1, opt, R=[0])
    assert list(plan.P) == [1]
    fp = build_fp8_plan(plan, q, w, ErrorModel(), "base")
    gb = plan.allowance_groups()
    g0 = int(np.searchsorted(gb, 0, side="right")) - 1
    assert F(float(fp.E_plus[g0])) >= F(1) - F(2) ** -53


def _fp8_problem(seed=5, Qn=2, H=6, D=16, N=300):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(D)
    q = 0.5 * base + rng.standard_normal((Qn, H, D))
    w = -np.abs(rng.standard_normal((Qn, H)))
    w[:, :2] *= -1
    payload, scale = quantize_keys(rng.standard_normal((N, D)) + base)
    return q, w, payload, scale


def test_fp8_topk_validates_q_and_w():
    """fp8_topk checks q [Qn, H, D] and w [Qn, H] like dosa_topk (ValueError naming the
    argument): non-finite entries make the reference scorer undefined, and array-likes
    (nested lists) are accepted as arrays."""
    q, w, payload, scale = _fp8_problem()
    ref = pipeline_mod.fp8_topk(q, w, payload, scale, 4).ids
    np.testing.assert_array_equal(
        pipeline_mod.fp8_topk(q.tolist(), w.tolist(), payload, scale, 4).ids, ref
    )
    bad_q = q.copy()
    bad_q[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="q: contains non-finite"):
        pipeline_mod.fp8_topk(bad_q, w, payload, scale, 4)
    bad_w = w.copy()
    bad_w[0, 1] = np.inf
    with pytest.raises(ValueError, match="w: contains non-finite"):
        pipeline_mod.fp8_topk(q, bad_w, payload, scale, 4)


def test_fp8_topk_counts_keys_with_an_invalid_scale():
    """A key with scale α ≤ 0 has no valid FP8 bound (U = +inf, docs/method.md §8): it is
    never pruned, the result stays exact, and stats.invalid_keys counts it for every
    screened query (a local window of 16: the seeds are not every key, so there is a
    screen)."""
    q, w, payload, scale = _fp8_problem()
    scale = scale.copy()
    scale[[3, 7, 11]] = [0.0, -1.0, 0.0]
    res = pipeline_mod.fp8_topk(q, w, payload, scale, 4, r=2, window=16)
    np.testing.assert_array_equal(res.ids, pipeline_mod.topk_check(q, w, payload, scale, 4))
    st = res.stats
    assert not np.any(st.dense)
    np.testing.assert_array_equal(st.invalid_keys, [3, 3])


@pytest.mark.parametrize("seed", [9, 14])
def test_screen_uses_the_plan_of_the_re_picked_r(monkeypatch, seed):
    """When the raised τ makes the cost model pick another r (and screening), the query is
    re-planned with that r (docs/method.md §7): the stored r is the second choice, the
    result is exact, and bound_work holds both sample works and both plans' work."""
    calls = []
    orig = pipeline_mod.choose_r

    def spy(*a, **kw):
        calls.append(orig(*a, **kw))
        return calls[-1]

    monkeypatch.setattr(pipeline_mod, "choose_r", spy)
    q, w, k = repick_problem(seed)
    H, N = q.shape[1], k.shape[0]
    res = pipeline_mod.dosa_topk(q, w, k, 4, seeds="local,certificate", window=8, sinks=0)
    st = res.stats
    assert len(calls) == 2 and not calls[1].dense and calls[1].r != calls[0].r
    assert st.r[0] == calls[1].r and not st.dense[0]
    np.testing.assert_array_equal(res.ids, topk_ids(pipeline_mod.index_scores(q, w, k), 4))
    plans = N * (calls[0].r + 2) / H + N * (calls[1].r + 2) / H
    assert st.bound_work[0] == pytest.approx(calls[0].sample_work + calls[1].sample_work + plans)


def test_default_plan_retains_half_the_heads():
    """default_plan (the deterministic plan of the audits and bounds) retains r = ⌊H/2⌋
    heads unless r is given (its documented default; at least one head)."""
    rng = np.random.default_rng(2)
    for H in (1, 2, 3, 6, 7):
        q = rng.standard_normal((H, 8))
        w = np.abs(rng.standard_normal(H)) + 0.1  # every head positive: |R| = r exactly
        plan = default_plan(q, w, rng.standard_normal((16, 8)))
        assert plan.R.size == max(1, H // 2), H
        assert default_plan(q, w, rng.standard_normal((16, 8)), 1).R.size == 1


@pytest.mark.parametrize("e", [0, -1000, -1040])
def test_scorer_envelope_dominates_its_formula_at_tiny_scales(e):
    """J_scorer,d = ε_ref·Σ_h |w_h||q_hd| (docs/method.md §8) must bound the exact value
    for every coordinate, also when the heads are so small (2^e) that the product with
    ε_ref is subnormal: there a downward rounding would lose a whole 2^-1074 step, which
    the relative margin of the inner sum cannot cover."""
    rs = np.random.default_rng(13)
    H, D = 5, 8
    q = np.ldexp(rs.standard_normal((H, D)), e)
    w = rs.standard_normal(H)
    w[0] = abs(w[0]) + 0.5
    model = ErrorModel()
    plan = default_plan(q, w, rs.standard_normal((8, D)), 2, PlanOptions(neg_aggregate="all"))
    fp = build_fp8_plan(plan, q, w, model, "base")
    eps_r = F(model.scorer_coefficients(D, H)[0])
    J = fp.J_parts["scorer"]
    for d in range(D):
        exact = eps_r * sum(abs(F(float(w[h])) * F(float(q[h, d]))) for h in range(H))
        assert F(float(J[d])) >= exact, (e, d)


def test_choose_r_with_one_head_keeps_one_head():
    """With H = 1 there is no r in 1..H−1 to try: the choice is r = max(1, ⌊H/2⌋) = 1 (a
    plan retains at least one head), at infinite estimated cost, hence dense."""
    rng = np.random.default_rng(1)
    q_t, w_t, ks = rng.standard_normal((1, 4)), np.array([1.0]), rng.standard_normal((8, 4))
    ch = cost_mod.choose_r(q_t, w_t, np.array([0.5]), 0.0, ks, PlanOptions(), "base", 0.5)
    assert ch.r == 1 and ch.dense and ch.sample_work == 0.0


def test_fp8_quantizers_reject_non_numeric_arrays():
    """Boolean, string and object arrays are not key or query values: a ValueError naming
    the argument, instead of a silent cast of True to 1.0 (docs/design.md: bad input gets
    a ValueError naming the argument)."""
    for bad in (np.array([[True, False]]), np.array([["1.0", "2.0"]])):
        with pytest.raises(ValueError, match="k: expected a real numeric array"):
            quantize_keys(bad)
        with pytest.raises(ValueError, match="x: expected a real numeric array"):
            quantize_rows(bad)


def test_build_fp8_plan_accepts_array_likes():
    """build_fp8_plan takes q_t [H, D] and w_t [H] as any array-like (nested lists,
    float32): the FP8 plan is the one of the float64 arrays of the same values."""
    rs = np.random.default_rng(4)
    H, D = 5, 8
    q = rs.standard_normal((H, D)).astype(np.float32).astype(np.float64)
    w = rs.standard_normal(H)
    w[0] = abs(w[0])
    plan = default_plan(q, w, rs.standard_normal((8, D)), 2)
    ref = build_fp8_plan(plan, q, w, ErrorModel(), "base")
    for qq in (q.tolist(), q.astype(np.float32)):
        got = build_fp8_plan(plan, qq, w.tolist(), ErrorModel(), "base")
        np.testing.assert_array_equal(got.q_payload, ref.q_payload)
        np.testing.assert_array_equal(got.E_plus, ref.E_plus)
        assert got.C == ref.C and got.eps_raw == ref.eps_raw and got.eps_out == ref.eps_out


def test_anchor_work_counts_each_anchor_querys_visible_keys():
    """anchor_scored is the work of scoring the anchor queries densely: Σ (ke − ks) over the
    anchor queries (their visible key counts, docs/method.md §2), here with ranges that do
    not start at key 0."""
    from dosa_ref.seeds import anchor_queries

    rng = np.random.default_rng(8)
    Qn, H, D, N = 6, 4, 8, 200
    q = rng.standard_normal((Qn, H, D))
    w = rng.standard_normal((Qn, H))
    k = rng.standard_normal((N, D))
    ks = np.array([10, 20, 30, 40, 50, 60])
    ke = np.array([150, 160, 170, 180, 190, 200])
    res = pipeline_mod.dosa_topk(q, w, k, 4, ks, ke, seeds="local,anchor", n_anchors=3)
    anchors = anchor_queries(Qn, 3)
    assert res.stats.anchor_scored == int(np.sum(ke[anchors] - ks[anchors])) > 0
    np.testing.assert_array_equal(res.ids, topk_ids(pipeline_mod.index_scores(q, w, k, ks, ke), 4))


def test_anchor_strategy_seeds_from_the_anchor_pool():
    """With seeds = "anchor" alone the seeds of a query are the anchor pool's keys visible
    to it (docs/method.md §2): a non-empty seed set, and the result is exact."""
    rng = np.random.default_rng(8)
    Qn, H, D, N = 4, 4, 8, 300
    q = rng.standard_normal((Qn, H, D))
    w = rng.standard_normal((Qn, H))
    k = rng.standard_normal((N, D))
    res = pipeline_mod.dosa_topk(q, w, k, 4, seeds="anchor", n_anchors=2)
    st = res.stats
    screened = ~st.dense
    assert np.any(screened) and np.all(st.seeds[screened] >= 4)
    np.testing.assert_array_equal(res.ids, topk_ids(pipeline_mod.index_scores(q, w, k), 4))


@pytest.mark.parametrize("m", [1, 2, 5])
def test_certificate_seeds_are_the_m_largest_bounds(m):
    """add_certificate_seeds scores the m visible keys of largest U (docs/method.md §2),
    exactly those, for 2000 bounds in a scrambled order (no seed among them); m = 1 (one
    certificate seed) is where a partition at the wrong rank picks an arbitrary key."""
    from dosa_ref.pipeline import DosaStats
    from dosa_ref.prepare import QueryContext, prepare_chunk
    from dosa_ref.scorer import score_keys
    from dosa_ref.seeds import SeedSet, add_certificate_seeds

    rng = np.random.default_rng(m)
    H, D, N = 3, 4, 2000
    q, w, k = rng.standard_normal((H, D)), rng.standard_normal(H), rng.standard_normal((N, D))
    chunk = prepare_chunk(q[None], w[None], k, 3, [0], [N], {})
    ctx = QueryContext(0, 0, N, chunk.q[0], chunk.w[0], chunk, DosaStats(1))
    for trial in range(5):
        U = rng.permutation(N).astype(np.float64)
        S = np.array([int(np.argmin(U))])
        got = add_certificate_seeds(ctx, U, SeedSet(S, score_keys(q, w, k[S]), 0), m)
        want = np.union1d(S, np.argsort(-U)[:m])
        np.testing.assert_array_equal(np.sort(got.ids), want, err_msg=str(trial))
