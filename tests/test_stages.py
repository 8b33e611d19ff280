"""The per-kernel reference stages compose into Algorithm 1 and equal full scoring."""

import numpy as np

from dosa_ref import topk_ids
from dosa_ref.fp8 import dequantize, e4m3_values
from dosa_ref.numeric import build_fp8_plan, screen_bound
from dosa_ref.plan import activation_frequency, build_plan
from dosa_ref.seeds import local_seeds
from dosa_ref.stages import (
    cert_clear_below_tau,
    dense_logits,
    key_rho,
    quantize_keys,
    refine,
    screen,
    seed_ids,
    seed_score,
    select,
)
from dosa_ref.workloads import make_workload


def _fp8_case(seed):
    """3 calibrated queries × 6,000 FP8 keys: (workload, payload, scale, ρ, dequantized
    keys, q, w float64, reference logits)."""
    wl = make_workload("calibrated", 3, 6000, seed=seed)
    payload, scale = quantize_keys(wl.k)
    k = dequantize(payload, scale)
    q, w = wl.q.astype(np.float64), wl.w.astype(np.float64)
    logits = dense_logits(q, w, payload, scale, wl.ks, wl.ke)
    return wl, payload, scale, key_rho(payload), k, q, w, logits


def _fp8_plan(q_t, w_t, k, S):
    """The FP8 screening plan of one query (r = 8, activations from the seeds S)."""
    return build_fp8_plan(build_plan(q_t, w_t, activation_frequency(q_t, k[S]), 8), q_t, w_t)


def test_stages_compose_to_exact_topk():
    K = 256
    wl, payload, scale, rho, k, q, w, logits = _fp8_case(2)
    ref = topk_ids(logits, K)
    pruned = 0
    for t in range(q.shape[0]):
        a, b = int(wl.ks[t]), int(wl.ke[t])
        S = local_seeds(a, b, 1024, 16)
        s_S, tau = seed_score(q[t], w[t], k, S, K)
        fplan = _fp8_plan(q[t], w[t], k, S)
        alive = screen(fplan, payload[a:b], scale[a:b], rho[a:b], tau)
        alive[S - a] = False
        pruned += int((~alive).sum()) - S.size
        rec_ids, rec_s = refine(q[t], w[t], k, a + np.flatnonzero(alive), tau)
        np.testing.assert_array_equal(select(S, s_S, rec_ids, rec_s, K), ref[t])
    assert pruned > 0  # the stages must actually screen something out


def test_explicit_seed_ids_only_raise_tau():
    """Stage ``seed_ids`` (the GPU kernel of the same name): explicit seeds — here the true
    Top-K plus repeats, default seeds, invisible ids and −1 pads — raise τ to exactly τ*
    (the K-th score) and shrink the survivors, while only the default seeds are excluded
    from screening: the stages still compose to the exact Top-K."""
    K = 256
    wl, payload, scale, rho, k, q, w, logits = _fp8_case(4)
    ref = topk_ids(logits, K)
    for t in range(q.shape[0]):
        a, b = int(wl.ks[t]), int(wl.ke[t])
        S = local_seeds(a, b, 64, 4)
        s_S, tau0 = seed_score(q[t], w[t], k, S, K)
        extra = np.concatenate([ref[t], ref[t, :50], S[:10], [-1, -1, b, max(a - 1, -1)]])
        X, s_X, tau = seed_ids(q[t], w[t], k, extra, a, b, S, s_S, K)
        assert np.all(np.diff(X) > 0) and not np.isin(X, S).any()
        assert np.all((X >= a) & (X < b))
        assert tau == logits[t, ref[t, K - 1]] and tau >= tau0
        fplan = _fp8_plan(q[t], w[t], k, S)
        alive0 = screen(fplan, payload[a:b], scale[a:b], rho[a:b], tau0)
        alive = screen(fplan, payload[a:b], scale[a:b], rho[a:b], tau)
        alive0[S - a] = False
        alive[S - a] = False  # explicit seeds are NOT excluded: they must survive to refine
        assert alive[X[s_X >= tau] - a].all()
        assert alive.sum() < alive0.sum()
        rec_ids, rec_s = refine(q[t], w[t], k, a + np.flatnonzero(alive), tau)
        np.testing.assert_array_equal(select(S, s_S, rec_ids, rec_s, K), ref[t])


def test_certificate_seeds_clear_survivors():
    """Stages ``screen_cert`` + ``seed_ids`` + ``cert_clear_below_tau`` (the GPU's
    certificate-guided seeds, docs/method.md §2): the m survivors of largest U, scored exactly,
    raise τ (a superset of the seeds); survivors whose bound is below the new τ are dropped
    — never a key of the Top-K — and the stages still compose to the exact Top-K."""
    K, m = 256, 256
    wl, payload, scale, rho, k, q, w, logits = _fp8_case(6)
    ref = topk_ids(logits, K)
    for t in range(q.shape[0]):
        a, b = int(wl.ks[t]), int(wl.ke[t])
        S = local_seeds(a, b, 64, 4)
        s_S, tau0 = seed_score(q[t], w[t], k, S, K)
        fplan = _fp8_plan(q[t], w[t], k, S)
        U = screen_bound(fplan, e4m3_values(payload[a:b]), scale[a:b], rho[a:b])
        alive = U >= tau0
        alive[S - a] = False
        surv = a + np.flatnonzero(alive)
        # the m survivors of largest U (U desc, id asc, as the record order on the GPU)
        order = np.lexsort((surv, -U[surv - a]))[:m]
        X, s_X, tau = seed_ids(q[t], w[t], k, surv[order], a, b, S, s_S, K)
        assert X.size == min(m, surv.size) and tau >= tau0
        kept = cert_clear_below_tau(surv, U[surv - a], tau)
        assert np.isin(np.intersect1d(ref[t], surv), kept).all()  # no Top-K key dropped
        assert kept.size < surv.size / 4  # here τ0 = −inf (68 seeds < K): all from U
        rec_ids, rec_s = refine(q[t], w[t], k, kept, tau)
        np.testing.assert_array_equal(select(S, s_S, rec_ids, rec_s, K), ref[t])


def test_seed_ranges_cover_exactly_the_screens_default_seeds():
    """The GPU seed kernel scores each query's default seeds as three index ranges
    (``stages.seed_ranges``); the screen excludes the keys of the default-seed predicate
    (``dosa_cupy.seeds.explicit_seed_table``'s, run here with numpy).  The ranges must be
    disjoint and their union must be exactly that predicate's keys: a key excluded from
    screening but never scored would be lost, a key scored twice could lift τ (§2)."""
    from dosa_cupy.seeds import explicit_seed_table
    from dosa_ref.seeds import local_seeds
    from dosa_ref.stages import pool_ids, pool_mask, seed_ranges

    rng = np.random.default_rng(4)
    for N in (1, 33, 300, 2048):
        NW = -(-N // 32)
        pool = pool_ids(rng.integers(-1, N, (3, rng.integers(0, 60))))
        mask = pool_mask(pool, NW)
        Qn = 40
        ks = rng.integers(0, N + 1, Qn)
        ke = np.maximum(ks, rng.integers(0, N + 1, Qn))
        for sinks, window in ((0, 0), (4, 9), (16, 100), (N, N)):
            rg = seed_ranges(pool, ks, ke, sinks, window)
            all_ids = np.tile(np.arange(N), (Qn, 1))
            # the screen's complement: visible keys that are NOT default seeds
            rest = explicit_seed_table(all_ids, ks, ke, sinks, window, mask, np)
            for t in range(Qn):
                parts = [np.arange(rg[0, t], rg[1, t]), np.arange(rg[2, t], rg[3, t]),
                         pool[rg[4, t] : rg[5, t]]]  # fmt: skip
                got = np.concatenate(parts)
                assert np.unique(got).size == got.size, "a key in two ranges"
                vis = set(range(ks[t], ke[t]))
                screened = set(int(i) for i in rest[t] if i >= 0)
                assert set(got.tolist()) == vis - screened, (N, sinks, window, t)
                # and the reference's own default seeds (dosa_ref.seeds): local ∪ visible pool
                local = local_seeds(int(ks[t]), int(ke[t]), window, sinks).tolist()
                assert set(got.tolist()) == set(local) | (set(pool.tolist()) & vis)


def test_check_values_reference_flags():
    """``stages.check_values`` (the reference of csrc/prepare.cu check_values_*): one bit per
    failing check, in the order of prepare's error messages, none for valid input."""
    from dosa_ref.stages import check_values

    q = np.zeros((2, 3, 128), np.uint8)
    kp = np.full((5, 128), 0x7E, np.uint8)
    w = np.ones((2, 3), np.float32)
    ks, ke = np.array([0, 2]), np.array([5, 3])
    assert check_values(q, w, kp, ks, ke, 5) == 0
    cases = [
        (0, lambda a: a["q"].__setitem__((1, 2, 127), 0xFF)),
        (1, lambda a: a["kp"].__setitem__((4, 0), 0x7F)),
        (2, lambda a: a["w"].__setitem__((0, 1), np.inf)),
        (3, lambda a: a["ks"].__setitem__(0, -1)),
        (4, lambda a: a["ke"].__setitem__(1, 6)),
        (5, lambda a: (a["ks"].__setitem__(1, 3), a["ke"].__setitem__(1, 2))),
    ]
    for bit, edit in cases:
        a = {"q": q.copy(), "kp": kp.copy(), "w": w.copy(), "ks": ks.copy(), "ke": ke.copy()}
        edit(a)
        assert check_values(a["q"], a["w"], a["kp"], a["ks"], a["ke"], 5) == 1 << bit


def test_reference_boundaries():
    """The references' boundary cases (what the GPU kernels are compared with): ranges at
    0, N and ks = ke are valid and a wrapped uint64 is not; the pool keeps id 0 and drops
    repeats and −1; seed ranges from lists are int32; a bound equal to τ is kept; the
    selection pads with −1."""
    from dosa_ref.stages import cert_clear_below_tau, check_values, pool_ids, seed_ranges, select

    q = np.zeros((2, 1, 128), np.uint8)
    kp = np.zeros((5, 128), np.uint8)
    w = np.ones((2, 1), np.float32)
    assert check_values(q, w, kp, [0, 5], [5, 5], 5) == 0  # ks = 0, ke = N, ks = ke = N
    assert check_values(q, w, kp, [3, 0], [3, 0], 5) == 0  # empty ranges
    huge = np.array([2**63 + 5, 0], np.uint64)
    assert check_values(q, w, kp, huge, [5, 5], 5) & 0b1000  # wraps negative: refused
    assert np.array_equal(pool_ids([[0, -1, 3, 3], [3, 0, -1, 7]]), [0, 3, 7])
    assert pool_ids([[0, -1, 3]]).dtype == np.int32 and pool_ids([[-1, -1]]).size == 0
    rg = seed_ranges([1, 4, 6, 9], [0, 2], [10, 8], 2, 3)
    assert rg.dtype == np.int32
    # query 0: sinks [0, 2), window [7, 10), pool ids in [2, 7): 4, 6 → indices [1, 3)
    # query 1: sinks [2, 4), window [5, 8), pool ids in [4, 5): 4 → indices [1, 2)
    assert np.array_equal(rg, [[0, 2], [2, 4], [7, 5], [10, 8], [1, 1], [3, 2]])
    kept = cert_clear_below_tau([1, 2, 3, 4], [0.5, 1.0, np.nan, 2.0], 1.0)
    assert np.array_equal(kept, [2, 3, 4])  # U = τ survives (strict rejection), NaN kept
    assert np.array_equal(select([5], [1.0], [], [], 3), [5, -1, -1])


def test_explicit_seed_table_edges():
    """Repeats of an id that is not the row's smallest are dropped too; no query or no seed
    column gives an empty table; validated ids come back as int32."""
    from dosa_cupy.seeds import check_seed_ids, explicit_seed_table

    mask = np.zeros(1, np.uint32)
    seeds = np.array([[9, 5, 9, 7, 9, -1, 7]])
    got = explicit_seed_table(seeds, np.array([0]), np.array([30]), 2, 4, mask, np)
    assert np.array_equal(got, [[5, 7, 9]])
    ks, ke = np.zeros(0, np.int64), np.zeros(0, np.int64)
    assert explicit_seed_table(np.zeros((0, 3), np.int64), ks, ke, 2, 4, mask, np).shape == (0, 0)
    empty = explicit_seed_table(np.zeros((2, 0), np.int64), np.zeros(2), np.full(2, 30), 2, 4,
                                mask, np)  # fmt: skip
    assert empty.shape == (2, 0)
    assert check_seed_ids(np.array([[3, -1]], np.int64), 1, 10).dtype == np.int32
