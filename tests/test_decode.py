"""Decode selector with witnesses (docs/method.md §10): every step's ids equal brute-force
``topk_ids(index_scores(...))`` exactly, tie order included, over random walks of
slowly drifting queries (so the witnesses are useful)."""

from __future__ import annotations

import re
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_ref.decode import DecodeSelector
from dosa_ref.scorer import index_scores, topk_ids

# ---------------------------------------------------------------------------------------
# Random walks
# ---------------------------------------------------------------------------------------


def _visible(mode, L, n, window, ks_walk):
    """Expected ranges [B, n] for the walk's mode (computed independently of decode.py)."""
    B = L.shape[0]
    ke = np.zeros((B, n), dtype=np.int64)
    for b in range(B):
        for j in range(n):
            ke[b, j] = max(0, int(L[b]) - n + j + 1)  # DeepGEMM: k <= q_offset
    if mode == "lengths":
        ks = np.zeros_like(ke)
    elif mode == "window":
        ks = np.maximum(0, ke - window)
    else:  # "ranges": ks moves forward on its own
        ks = np.minimum(ks_walk[:, None], ke)
    return ks, ke


class Walk:
    """A drawn walk; its repr names the parameters (the seed reproduces the arrays)."""

    def __init__(self, params: dict, cfg: dict, steps: list):
        self.params, self.cfg, self.steps = params, cfg, steps

    def __repr__(self) -> str:
        return f"Walk({self.params})"


@st.composite
def walks(draw, data=None, mode=None, next_n=None, B=None, shared=None, short=False):
    """A decode walk: list of per-step kwargs plus the selector configuration."""
    seed = draw(st.integers(0, 2**32 - 1))
    data = data or draw(st.sampled_from(["float", "int"]))
    mode = mode or draw(st.sampled_from(["lengths", "window", "ranges"]))
    n = next_n or draw(st.sampled_from([1, 2]))
    B = B or draw(st.integers(1, 3))
    shared = draw(st.booleans()) if shared is None else shared
    H = draw(st.integers(1, 4))
    D = draw(st.integers(1, 5))
    K = draw(st.integers(1, 8))
    steps = draw(st.integers(1, 6))
    history = draw(st.integers(0, 3))
    within = draw(st.booleans())
    window = draw(st.integers(1, 2 * K + 2))
    rng = np.random.default_rng(seed)

    n_max = K - 1 if short else 48
    Ns = [int(rng.integers(max(1, n_max // 2), n_max + 1)) if n_max > 0 else 0 for _ in range(B)]
    if shared:
        Ns = [max(Ns)] * B

    def keys_of(N):
        if data == "int":
            return rng.integers(-2, 3, size=(N, D)).astype(np.float64)
        return rng.standard_normal((N, D))

    if shared:
        k = keys_of(Ns[0])
    else:
        k = [keys_of(N) for N in Ns]

    if data == "int":
        q = rng.integers(-1, 2, size=(B, n, H, D)).astype(np.float64)
        w = rng.integers(-2, 3, size=(B, n, H)).astype(np.float64)
    else:
        q = rng.standard_normal((B, n, H, D))
        w = rng.standard_normal((B, n, H)) + 0.5
    L = np.array([int(rng.integers(0, N + 1)) for N in Ns], dtype=np.int64)
    ks_walk = np.zeros(B, dtype=np.int64)

    out = []
    for _ in range(steps):
        ks, ke = _visible(mode, L, n, window, ks_walk)
        kw = dict(q=q.copy(), w=w.copy(), k=k)
        if mode == "ranges":
            kw.update(ks=ks, ke=ke)
        else:
            kw.update(lengths=L.copy())
            if mode == "window":
                kw.update(ks=ks)
        out.append((kw, ks, ke))
        # Drift: small moves for floats, occasional unit moves for integers.
        if data == "int":
            m = rng.random((B, n, H, D)) < 0.1
            q = np.clip(q + m * rng.integers(-1, 2, size=q.shape), -2, 2)
        else:
            q = q + 0.05 * rng.standard_normal(q.shape)
            w = w + 0.05 * rng.standard_normal(w.shape)
        # Contexts grow by 0..next_n+1 keys; ks of the "ranges" mode jumps forward.
        L = np.minimum(L + rng.integers(0, n + 2, size=B), np.array(Ns))
        ks_walk = ks_walk + rng.integers(0, K + 1, size=B) * (rng.random(B) < 0.5)
    screen_r = draw(st.integers(0, H - 1))
    cfg = dict(K=K, history=history, within_step=within, screen_r=screen_r)
    params = dict(seed=seed, data=data, mode=mode, next_n=n, B=B, shared=shared, H=H, D=D)
    params.update(steps=steps, window=window, Ns=Ns, **cfg)
    return Walk(params, cfg, out)


def _brute(kw, ks, ke, K):
    q, w, k = kw["q"], kw["w"], kw["k"]
    B, n = q.shape[:2]
    out = np.empty((B, n, K), dtype=np.int64)
    for b in range(B):
        kb = k if isinstance(k, np.ndarray) else k[b]
        out[b] = topk_ids(index_scores(q[b], w[b], kb, ks[b], ke[b]), K)
    return out


def _brute_lengths(q, w, k, L, K):
    """The brute force of a step over shared keys ``k`` with context lengths ``L`` (query j
    of request b sees [0, L[b] − next_n + j + 1)): int64 [B, next_n, K]."""
    B, n, H, D = q.shape
    ke = (np.asarray(L)[:, None] - n + 1 + np.arange(n)).ravel()
    return topk_ids(index_scores(q.reshape(B * n, H, D), w.reshape(B * n, H), k, ke=ke), K).reshape(
        B, n, K
    )


def _run_walk(cfg, walk):
    """Run the walk, check every step against brute force and the stats invariants."""
    K, history = cfg["K"], cfg["history"]
    sel = DecodeSelector(**cfg)
    B = walk[0][0]["q"].shape[0]
    past = [deque(maxlen=max(history, 1)) for _ in range(B)]
    results = []
    for kw, ks, ke in walk:
        before = [sel.witnesses(b) for b in range(B)]
        res = sel.step(**kw)
        want = _brute(kw, ks, ke, K)
        np.testing.assert_array_equal(res.ids, want)
        s = res.stats
        np.testing.assert_array_equal(s.visible, ke - ks)
        assert np.all(s.compacted >= np.minimum(K, s.visible))
        assert np.all(s.compacted <= s.scored)
        assert np.all(s.scored <= s.visible)
        if not cfg["screen_r"]:
            np.testing.assert_array_equal(s.scored, s.visible)
        assert np.all(s.scored[s.tau == -np.inf] == s.visible[s.tau == -np.inf])
        assert np.all(s.witnesses <= s.visible)
        assert np.all((s.tau == -np.inf) == (s.witnesses < K))
        full = s.visible >= K
        assert np.all(s.tau[full] <= s.tau_final[full])
        assert np.all(s.tau_final[~full] == -np.inf)
        for b in range(B):
            if not cfg["within_step"]:
                for j in range(ks.shape[1]):
                    W = before[b]
                    assert s.witnesses[b, j] == np.count_nonzero((W >= ks[b, j]) & (W < ke[b, j]))
            if history > 0:
                ids = res.ids[b].ravel()
                past[b].append(np.unique(ids[ids >= 0]))
                expect = np.unique(np.concatenate(list(past[b])))
            else:
                expect = np.zeros(0, dtype=np.int64)
            np.testing.assert_array_equal(sel.witnesses(b), expect)
        results.append(res)
    return results


# ---------------------------------------------------------------------------------------
# Exactness over random walks
# ---------------------------------------------------------------------------------------


@given(walks())
@settings(deadline=None)
def test_walk_matches_bruteforce(w):
    _run_walk(w.cfg, w.steps)


@given(walks(mode="lengths"))
@settings(deadline=None)
def test_first_step_has_no_witnesses(w):
    cfg, walk = w.cfg, w.steps
    res = _run_walk(cfg, walk[:1])[0]
    s = res.stats
    # Query 0 of each request has nothing to go on (query 1 may use query 0's selection
    # when within_step is on).
    rows = slice(None) if not cfg["within_step"] else slice(0, 1)
    assert np.all(s.witnesses[:, rows] == 0)
    assert np.all(s.tau[:, rows] == -np.inf)
    np.testing.assert_array_equal(s.compacted[:, rows], s.visible[:, rows])


@given(walks(mode="lengths", next_n=2))
@settings(deadline=None)
def test_next_n_2_growing_context(w):
    cfg, walk = w.cfg, w.steps
    for res in _run_walk(cfg, walk):
        v = res.stats.visible
        # query j sees one more key than query j-1 (unless both see none).
        assert np.all((v[:, 1] == v[:, 0] + 1) | (v[:, 1] == 0))


@given(walks(mode="window"))
@settings(deadline=None)
def test_sliding_window_drops_witnesses(w):
    _run_walk(w.cfg, w.steps)


@given(walks(mode="ranges"))
@settings(deadline=None)
def test_ks_moving_forward(w):
    _run_walk(w.cfg, w.steps)


@given(walks(B=3, shared=False))
@settings(deadline=None)
def test_batch_of_requests_with_own_keys(w):
    _run_walk(w.cfg, w.steps)


@given(walks(short=True))
@settings(deadline=None)
def test_rows_shorter_than_K(w):
    cfg, walk = w.cfg, w.steps
    for res in _run_walk(cfg, walk):
        s = res.stats
        assert np.all(s.visible < cfg["K"])
        assert np.all(s.tau == -np.inf)
        pads = (res.ids == -1).sum(axis=2)
        np.testing.assert_array_equal(pads, cfg["K"] - s.visible)


@given(walks(data="int"))
@settings(deadline=None)
def test_integer_data_massive_ties(w):
    _run_walk(w.cfg, w.steps)


def test_integer_ties_resolved_by_id():
    # All keys equal: every score ties; the selection is the K smallest visible ids, and
    # with witnesses τ equals the common score, so every visible key is compacted.
    sel = DecodeSelector(K=3)
    k = np.ones((10, 2))
    q = np.ones((1, 2, 1, 2))
    w = np.ones((1, 2, 1))
    for L in (6, 8, 10):
        ks = np.array([[2, 3]])
        res = sel.step(q, w, k, np.array([L]), ks=ks)
        np.testing.assert_array_equal(res.ids[0, 0], [2, 3, 4])
        np.testing.assert_array_equal(res.ids[0, 1], [3, 4, 5])
        np.testing.assert_array_equal(res.stats.compacted, res.stats.visible)
    assert res.stats.tau[0, 0] == 2.0


# ---------------------------------------------------------------------------------------
# Compaction actually happens (fails if τ never rises above −inf)
# ---------------------------------------------------------------------------------------


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2]))
@settings(deadline=None)
def test_compaction_on_coherent_walk(seed, n):
    rng = np.random.default_rng(seed)
    B, H, D, K, N = 2, 4, 16, 8, 600
    k = rng.standard_normal((N, D))
    q = rng.standard_normal((B, n, H, D))
    w = np.abs(rng.standard_normal((B, n, H))) + 0.1
    L = np.array([400, 500])
    sel = DecodeSelector(K)
    for t in range(6):
        res = sel.step(q, w, k, L)
        want = _brute_lengths(q, w, k, L, K)
        np.testing.assert_array_equal(res.ids, want)
        s = res.stats
        if t == 0:
            np.testing.assert_array_equal(s.compacted, s.visible)
        else:
            assert np.all(s.witnesses >= K)
            assert np.all(np.isfinite(s.tau))
            assert np.all(s.compacted < s.visible)
            assert s.compaction < 0.25, s.totals()
        q = q + 0.01 * rng.standard_normal(q.shape)
        L = L + n


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 2])
def test_certificate_screen_prunes_and_stays_exact(seed, n):
    # Heads close to one direction: the omitted heads project onto a retained anchor with a
    # small residual (docs/method.md §4), so the bound is tight and most keys fall below τ.
    rng = np.random.default_rng(seed)
    B, H, D, K, N, r = 2, 8, 16, 8, 3000, 2
    k = rng.standard_normal((N, D))
    base = rng.standard_normal((B, n, 1, D))
    q = base + 0.05 * rng.standard_normal((B, n, H, D))
    w = np.abs(rng.standard_normal((B, n, H))) + 0.1
    L = np.array([2500, 2900])
    plain, screened = DecodeSelector(K), DecodeSelector(K, screen_r=r)
    for t in range(4):
        a, b = plain.step(q, w, k, L), screened.step(q, w, k, L)
        want = _brute_lengths(q, w, k, L, K)
        np.testing.assert_array_equal(b.ids, want)
        np.testing.assert_array_equal(a.ids, want)
        np.testing.assert_array_equal(b.stats.tau, a.stats.tau)  # the same witnesses
        np.testing.assert_array_equal(b.stats.compacted, a.stats.compacted)
        if t == 0:
            np.testing.assert_array_equal(b.stats.scored, b.stats.visible)
        else:
            assert b.stats.survival < 0.2, b.stats.totals()
        q = q + 0.01 * rng.standard_normal(q.shape)
        L = L + n


@pytest.mark.parametrize("r", [-1, 1.5, True, "2"])
def test_bad_screen_r_names_argument(r):
    with pytest.raises(ValueError, match="screen_r"):
        DecodeSelector(4, screen_r=r)


def test_screen_r_must_leave_a_head_out():
    q, w, k = np.ones((1, 1, 2, 3)), np.ones((1, 1, 2)), np.ones((5, 3))
    with pytest.raises(ValueError, match="screen_r"):
        DecodeSelector(2, screen_r=2).step(q, w, k, np.array([5]))


def test_history_zero_disables_witnesses():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((50, 4))
    q = rng.standard_normal((1, 1, 2, 4))
    w = np.ones((1, 1, 2))
    sel = DecodeSelector(4, history=0)
    for _ in range(3):
        res = sel.step(q, w, k, np.array([40]))
        assert res.stats.witnesses[0, 0] == 0
        assert res.stats.compacted[0, 0] == 40
    assert sel.witnesses(0).size == 0


def test_foreign_witnesses_stay_exact_and_reset_clears():
    # Witnesses chosen for other keys (request slot reused without reset) are still
    # distinct visible keys scored exactly: the result stays exact.
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 3, 4))
    w = rng.standard_normal((1, 2, 3))
    sel = DecodeSelector(5)
    for _ in range(2):
        k = rng.standard_normal((30, 4))
        res = sel.step(q, w, k, np.array([30]))
        want = topk_ids(index_scores(q[0], w[0], k, ke=np.array([29, 30])), 5)
        np.testing.assert_array_equal(res.ids[0], want)
    assert res.stats.witnesses[0, 0] > 0
    sel.reset(0)
    assert sel.witnesses(0).size == 0
    res = sel.step(q, w, k, np.array([30]))
    assert res.stats.witnesses[0, 0] == 0
    sel.reset()
    assert sel.witnesses(0).size == 0


def test_batch_size_may_change():
    rng = np.random.default_rng(2)
    k = rng.standard_normal((20, 3))
    sel = DecodeSelector(2)
    for B in (1, 3, 2):
        q = rng.standard_normal((B, 1, 2, 3))
        w = rng.standard_normal((B, 1, 2))
        L = np.full(B, 20)
        res = sel.step(q, w, k, L)
        want = topk_ids(index_scores(q[:, 0], w[:, 0], k), 2)
        np.testing.assert_array_equal(res.ids[:, 0], want)


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _ok():
    rng = np.random.default_rng(3)
    return dict(
        q=rng.standard_normal((2, 2, 3, 4)),
        w=rng.standard_normal((2, 2, 3)),
        k=rng.standard_normal((10, 4)),
        lengths=np.array([5, 10]),
    )


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(q=np.zeros((2, 3, 4))), "q"),
        (dict(q=np.full((2, 2, 3, 4), np.nan)), "q"),
        (dict(q=np.zeros((2, 0, 3, 4)), w=np.zeros((2, 0, 3))), "q"),
        (dict(w=np.zeros((2, 1, 3))), "w"),
        (dict(k=np.zeros((10, 5))), "k"),
        (dict(k=np.zeros(10)), "k"),
        (dict(k=[np.zeros((10, 4))]), "k"),
        (dict(k=[np.zeros((10, 4)), np.zeros((10, 3))]), "k[1]"),
        (dict(lengths=np.array([5, 11])), "lengths"),
        (dict(lengths=np.array([-1, 3])), "lengths"),
        (dict(lengths=np.array([5])), "lengths"),
        (dict(lengths=np.array([1.5, 2.0])), "lengths"),
        (dict(ks=np.array([[0, 0], [4, 11]])), "ks"),
        (dict(ks=np.array([[0, 6], [0, 0]])), "ks"),
        (dict(ks=np.array([0, 0])), "ks"),
        (dict(ke=np.array([[1, 2], [3, 4]])), "ke"),
        (dict(lengths=None, ke=np.array([[1, 2], [3, 11]])), "ke"),
    ],
)
def test_bad_input_names_argument(change, name):
    kw = _ok()
    kw.update(change)
    with pytest.raises(ValueError, match="^" + re.escape(name) + ":"):
        DecodeSelector(2).step(**kw)


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(K=0), "K"),
        (dict(K=2.5), "K"),
        (dict(K=2, history=-1), "history"),
        (dict(K=2, history=True), "history"),
        (dict(K=2, within_step=1), "within_step"),
    ],
)
def test_bad_selector_options(kw, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        DecodeSelector(**kw)


def test_score_overflow_is_rejected():
    k = np.full((4, 2), 1e200)
    q = np.full((1, 1, 1, 2), 1e200)
    with pytest.raises(ValueError, match="^q, w, k: a visible key.s score overflows float64"):
        DecodeSelector(1).step(q, np.ones((1, 1, 1)), k, np.array([4]))


@pytest.mark.parametrize("screen_r", [0, 1])
def test_overflow_of_a_zero_weight_head_raises_with_the_screen(screen_r):
    # Head 1 has weight 0 and a dot that overflows on key 350 only (0 · ∞ is NaN): the brute
    # force raises, so the screened step must too — the finiteness envelope floors each
    # weight at 1 (docs/method.md §1), and a row it cannot prove is scored in full.
    rng = np.random.default_rng(0)
    k = rng.standard_normal((400, 4))
    k[350] = 1e10
    q = rng.standard_normal((1, 1, 2, 4))
    q[0, 0, 1] = 1e300
    w = np.array([[[1.0, 0.0]]])
    sel = DecodeSelector(8, screen_r=screen_r)
    sel.step(q, w, k, np.array([300]))  # key 350 not yet visible: witnesses, no error
    with pytest.raises(ValueError, match="overflows float64"):
        sel.step(q, w, k, np.array([400]))
