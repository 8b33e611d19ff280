"""Laws of the certificate: s ≤ U for every variant (docs/method.md §4–§6), slack (Prop. 6),
allowance inequalities (Prop. 3, grouped), Prop. 5 witnesses, B.3 margins."""

import numpy as np
from hypothesis import given, target
from hypothesis import strategies as st
from strategies import SCALES, arrays

from dosa_ref import build_plan, score_keys, slack, upper_bound
from dosa_ref.plan import (
    PlanOptions,
    activation_frequency,
    coordinate_groups,
    joint_allowance,
    safe_norm,
)

OPTIONS = st.builds(
    PlanOptions,
    neg_aggregate=st.sampled_from(("majority", "all", "none")),
    neg_priority=st.sampled_from(("activation", "strength")),
    pos_projection=st.booleans(),
    allowance=st.sampled_from(("triangle", "joint", "grouped")),
    groups=st.integers(1, 5),
)


@st.composite
def query_and_keys(draw):
    H = draw(st.integers(1, 8))
    D = draw(st.integers(1, 8))
    n = draw(st.integers(1, 60))
    q = draw(arrays((H, D), draw(st.sampled_from(SCALES))))
    k = draw(arrays((n, D), draw(st.sampled_from(SCALES))))
    w = draw(arrays((H,), draw(st.sampled_from((None, 1.0, 1e3, 1e-3)))))
    return q, w, k


@given(query_and_keys(), OPTIONS, st.data())
def test_score_never_exceeds_bound(qwk, options, data):
    """s_i ≤ U_i (computed scores vs the rounding-safe bound) for any R, any A ⊆ N,
    both forms, every ablation switch — the premise of every rejection (Theorem 1)."""
    q, w, k = qwk
    H = q.shape[0]
    R = data.draw(st.lists(st.integers(0, H - 1), unique=True, max_size=H))
    use_rule = data.draw(st.booleans())
    p = activation_frequency(q, k)
    r = data.draw(st.integers(1, max(1, H - 1)))
    if use_rule:
        plan = build_plan(q, w, p, r, options)
    else:
        Nn = [h for h in range(H) if w[h] < 0 and h not in R]
        A = data.draw(st.lists(st.sampled_from(Nn), unique=True)) if Nn else []
        plan = build_plan(q, w, p, r, options, R=np.array(R, dtype=np.int64), A=np.array(A))
    s = score_keys(q, w, k)
    for form in ("base", "abs"):
        U = upper_bound(plan, k, form, "up", q, w)
        assert np.all(np.isfinite(U))
        gap = U - s
        scale = np.abs(w) @ np.linalg.norm(q, axis=1) * np.linalg.norm(k, axis=1) + 1e-300
        target(float(-np.min(gap / scale)), label=f"tightness {form}")
        assert np.all(gap >= 0), (form, gap.min())


@given(query_and_keys(), OPTIONS)
def test_slack_decomposition(qwk, options):
    """Prop. 6: U − s = δ_P + missed negative + cancellation, each ≥ 0 (up to float64
    rounding of the same magnitudes as ``rounding_allowance``)."""
    q, w, k = qwk
    plan = build_plan(q, w, activation_frequency(q, k), max(1, q.shape[0] // 2), options)
    parts = slack(plan, q, w, k)
    mag = (
        (np.abs(w) @ np.abs(q)) @ np.abs(k).T
        + np.abs(plan.w_fold) @ np.abs(plan.q_R) @ np.abs(k).T
        + (np.abs(w) @ np.linalg.norm(q, axis=1)) * np.linalg.norm(k, axis=1)
    )
    tol = 64 * (q.shape[0] + q.shape[1] + 8) * 2.0**-53 * mag + 1e-300
    for name in ("positive", "missed_negative", "cancellation"):
        assert np.all(parts[name] >= -tol), name
    total = parts["positive"] + parts["missed_negative"] + parts["cancellation"]
    assert np.all(np.abs(total - parts["total"]) <= tol)


@given(query_and_keys())
def test_joint_and_grouped_never_exceed_triangle(qwk):
    """Prop. 3: E_P^joint ≤ E_P; Minkowski: (Σ_g E_{P,g}²)^{1/2} ≤ E_P; and the joint
    allowance bounds Σ_h [u_h·k]_+ for every key."""
    q, w, k = qwk
    w = np.abs(w)  # all positive: P is everything outside R
    plan = build_plan(q, w, np.full(q.shape[0], 0.5), 1, PlanOptions(groups=3))
    tol = 1e-12 * (plan.E_P + 1e-300)
    assert plan.E_P_joint <= plan.E_P + tol
    assert safe_norm(plan.E_groups) <= plan.E_P + tol
    u = w[plan.P][:, None] * plan.d
    lhs = np.maximum(k @ u.T, 0).sum(axis=1)
    rhs = plan.E_P_joint * safe_norm(k, axis=1)  # np.linalg.norm underflows at |k|~1e-160
    assert np.all(lhs <= rhs * (1 + 1e-12) + 1e-300)


def test_joint_allowance_examples():
    # Orthogonal residuals: ½(√2 + √2) = √2 < E_P = 2.
    u = np.eye(2)
    assert np.isclose(joint_allowance(u), np.sqrt(2))
    # Parallel residuals: joint = triangle.
    u = np.array([[1.0, 0.0], [2.0, 0.0]])
    assert np.isclose(joint_allowance(u), 3.0)
    assert joint_allowance(np.zeros((0, 3))) == 0.0


@given(arrays((5,), 1.0), arrays((5,), 1.0))
def test_prop5_witness_attains_optimal_allowance(q, p):
    """Prop. 5: with β* and d = q − β*p, the witness key attains [q·k]_+ − β*[p·k]_+ =
    ‖d‖‖k‖ (k = q/‖q‖ when q·p ≤ 0, else k = d/‖d‖), so no smaller c is valid."""
    if np.linalg.norm(q) == 0:
        return
    np_ = np.dot(p, p)
    beta = max(np.dot(q, p), 0.0) / np_ if np_ > 0 else 0.0
    d = q - beta * p
    nd = np.linalg.norm(d)
    if nd == 0:
        return
    kw = q / np.linalg.norm(q) if np.dot(q, p) <= 0 or np_ == 0 else d / nd
    lhs = max(np.dot(q, kw), 0.0) - beta * max(np.dot(p, kw), 0.0)
    assert np.isclose(lhs, nd * np.linalg.norm(kw), rtol=1e-9, atol=1e-12)
    # And β* minimises ‖q − βp‖ over β ≥ 0.
    for b in np.linspace(0, 2 * beta + 1, 7):
        assert nd <= np.linalg.norm(q - b * p) + 1e-12


def test_b3_margin_relation():
    """B.3: U_i < τ ⇔ Δ_i > δ_i + b with Δ = τ* − s, b = τ* − τ, δ = U − s."""
    rng = np.random.default_rng(3)
    s = rng.integers(-20, 20, 500).astype(float)
    U = s + rng.integers(0, 10, 500)
    tau_star = 5.0
    tau = 2.0
    Delta, b, delta = tau_star - s, tau_star - tau, U - s
    assert np.array_equal(U < tau, Delta > delta + b)


def test_aggregate_exact_when_active_set_is_A():
    """Prop. 2 tightness: a key whose active set among N is exactly A makes [a_A·k]_+
    equal Σ_{h∈N}|w_h|[q_h·k]_+ (zero cancellation, zero missed)."""
    q = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-1.0, -1.0]])
    w = np.array([1.0, -1.0, -2.0, -1.0])
    k = np.array([[1.0, 1.0]])
    plan = build_plan(q, w, np.array([0.5, 1.0, 1.0, 0.0]), 1, R=np.array([0]))
    assert set(plan.A.tolist()) == {1, 2}
    parts = slack(plan, q, w, k)
    assert parts["cancellation"][0] == 0.0 and parts["missed_negative"][0] == 0.0


def test_coordinate_groups_cover():
    for D in (1, 5, 128):
        for G in (1, 3, 4, 200):
            gb = coordinate_groups(D, G)
            assert gb[0] == 0 and gb[-1] == D and np.all(np.diff(gb) > 0)
