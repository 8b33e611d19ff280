"""The route choice on the GPU (dosa_cupy/route.py with the model of dosa_cupy/cost.py,
docs/method.md §9 "Route choice"): every branch returns the dense route's ids bitwise, the
sampled survival is the full screen's on the sampled queries, and the statistics say which
route ran and why.

The cost model's constants decide which branch a shape takes; these tests replace them
(``pipeline.model_for``) to drive each branch at small shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gpu_support import cp, gpu

import dosa_cupy
from dosa_cupy import cost, pipeline
from dosa_cupy.workload import make_gpu_workload

pytestmark = pytest.mark.route_choice

# never decision 1; at these sizes the committed rates then choose dense after sampling
SAMPLED = dataclasses.replace(cost.H200, dosa_floor_ms=0.0)
NEVER_DENSE = dataclasses.replace(SAMPLED, logits_flop_per_ms={32: 1.0, 64: 1.0})
ALWAYS_DENSE = dataclasses.replace(
    SAMPLED,
    logits_flop_per_ms={32: np.inf, 64: np.inf},
    logits_fixed_ms=0.0,
    select_fixed_ms=0.0,
    select_ms_per_key=0.0,
    dosa_floor_ms=-1.0,
)  # fmt: skip  (dense predicted at 0 ms; a floor below it keeps decision 1 out)


def _args(regime, Qn, N, H, K=256, seed=7):
    wl = make_gpu_workload(regime, Qn, N, H, seed=seed)
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


@gpu
def test_gpu_small_chunk_takes_the_dense_route_early():
    a = _args("calibrated", 16, 16384, 64)
    ids, st = dosa_cupy.dosa_topk(*a, return_stats=True)
    assert (st.route.route, st.route.reason) == ("dense", "early")
    assert st.screen is None and st.dense.all() and (st.seeds == 0).all()
    assert (st.scored == st.visible).all() and st.scored_fraction == 1.0
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*a))
    ids2, st2 = dosa_cupy.dosa_topk(*a, route="dense", return_stats=True)
    assert st2.route.reason == "option" and cp.array_equal(ids2, ids)


@pytest.mark.parametrize("regime", ["calibrated", "isotropic", "many_positive", "ties", "equal"])
@pytest.mark.parametrize("H", [32, 64])
@gpu
def test_gpu_every_branch_is_exact(regime, H, monkeypatch):
    a = _args(regime, 520, 24000, H)
    dense = dosa_cupy.dense_topk(*a)
    seen = {}
    for name, model in (("sampled", SAMPLED), ("dosa", NEVER_DENSE), ("dense", ALWAYS_DENSE)):
        monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="", m=model: m)
        ids, st = dosa_cupy.dosa_topk(*a, return_stats=True)
        assert cp.array_equal(ids, dense), name
        assert st.route.reason == "sampled", name
        seen[name] = st
    st = seen["dosa"]
    assert st.route.route == "dosa" and st.screen == st.route.screen
    assert (st.dense == st.recovered).all()  # only query-level recovery is dense
    key = cost.candidate_key(st.route.screen, st.route.r)
    assert np.isfinite(st.est_survival).all() and (st.est_survival == st.route.survival[key]).all()
    assert set(st.route.predicted_ms) >= {"dense", key}
    assert st.bound_work.sum() > 0
    st = seen["dense"]
    assert st.route.route == "dense" and st.dense.all() and st.screen is None
    assert (st.refined == st.visible - (st.seeds - st.explicit_seeds)).all()
    # the seeds were scored before the route was chosen: counted
    assert (st.seeds > 0).any() and (st.scored == st.seeds + st.visible).all()


@pytest.mark.parametrize("regime,H", [("calibrated", 32), ("many_positive", 64), ("ties", 32),
                                      ("isotropic", 64)])  # fmt: skip
@gpu
def test_gpu_sampled_survival_is_the_full_screens(regime, H, monkeypatch):
    """The sample screens the sampled queries exactly as the whole chunk's screen does
    (same plans, same τ, same build): its survival equals theirs in the full run."""
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    a = _args(regime, 520, 24000, H, seed=11)
    _, st = dosa_cupy.dosa_topk(*a, return_stats=True)
    for key, m in st.route.survival.items():
        screen, r = key.split("/")
        _, full = dosa_cupy.dosa_topk(*a, route="dosa", screen=screen, r=int(r),
                                      return_stats=True)  # fmt: skip
        idx = cp.asnumpy(cp.linspace(0, 519, st.route.sample[key]).astype(cp.int64))
        s, n = full.survivors[idx].sum(), full.screened[idx].sum()
        assert m == (s / n if n else 0.0), key


@pytest.mark.parametrize("model,want", [(NEVER_DENSE, "dosa"), (ALWAYS_DENSE, "dense")])
@gpu
def test_gpu_route_memo_reuses_the_choice(model, want, monkeypatch):
    """A second chunk of the same kind takes the remembered route without sampling (and,
    when dense, without seeds); ids stay the dense route's; the refresh samples again."""
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": model)
    memo = dosa_cupy.RouteMemo(refresh=3)
    reasons = []
    for seed in (1, 2, 3, 4):
        a = _args("many_positive", 520, 24000, 32, seed=seed)
        ids, st = dosa_cupy.dosa_topk(*a, route_memo=memo, return_stats=True, timing=True)
        assert cp.array_equal(ids, dosa_cupy.dense_topk(*a)), seed
        assert st.route.route == want
        reasons.append(st.route.reason)
        if st.route.reason == "memo" and want == "dense":  # no prepare, no seeds
            assert (st.seeds == 0).all() and set(st.stage_ms) == {"dense"}
        if st.route.reason == "memo" and want == "dosa":  # seeds, no sample
            assert "seeds" in st.stage_ms and "route" not in st.stage_ms
    assert reasons == ["sampled", "memo", "memo", "sampled"]


@gpu
def test_gpu_a_memo_samples_a_chunk_the_early_rule_sends_dense():
    """With a memo, a chunk that the early rule sends dense (520 × 24,000 at H 32 on the
    committed model) is sampled once and the next chunk of its kind takes the memo's route;
    ids stay the dense route's."""
    _, st = dosa_cupy.dosa_topk(*_args("calibrated", 520, 24000, 32), return_stats=True)
    assert (st.route.route, st.route.reason) == ("dense", "early")
    memo = dosa_cupy.RouteMemo()
    reasons = []
    for seed in (1, 2):
        a = _args("calibrated", 520, 24000, 32, seed=seed)
        ids, st = dosa_cupy.dosa_topk(*a, route_memo=memo, return_stats=True)
        assert cp.array_equal(ids, dosa_cupy.dense_topk(*a)), seed
        reasons.append(st.route.reason)
    assert reasons == ["sampled", "memo"]


@gpu
def test_gpu_the_sample_gate_opens_on_its_ticket_and_by_itself():
    """csrc/route.cu route_gate (``route.SAMPLE_GATE``): a gate the host opens after queuing
    the work behind it lets that work run at once; a gate nobody opens holds the stream for
    its time limit and no longer (it never hangs a stream); every sampled decision behind
    gates returns the dense route's ids, with each candidate's sample time recorded."""
    from dosa_cupy import route

    def timed(open_it: bool, limit_ns: int) -> float:
        saved = route.GATE_MAX_NS
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        route.GATE_MAX_NS = limit_ns
        try:
            opened = route._gate()
        finally:
            route.GATE_MAX_NS = saved
        end.record()
        if open_it:
            opened()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end)

    assert timed(True, 2_000_000_000) < 100.0  # opened: far below its 2 s limit
    held = timed(False, 20_000_000)  # never opened: 20 ms, then it opens itself
    assert 15.0 <= held < 1000.0, held
    a = _args("calibrated", 1024, 30000, 64)
    dense = dosa_cupy.dense_topk(*a)
    # a first call may use its kernels for the first time (a fresh process) and then is
    # charged nothing; the second one's prepare and seeds are charged (pipeline.py)
    for warm in (False, True):
        ids, st = dosa_cupy.dosa_topk(*a, return_stats=True, route_memo=dosa_cupy.RouteMemo())
        assert cp.array_equal(ids, dense) and st.route.reason == "sampled"
        assert st.route.sample_ms and all(v > 0 for v in st.route.sample_ms.values())
        if warm:
            assert st.route.spent_ms > 0
    ids, st = dosa_cupy.dosa_topk(*a, return_stats=True)
    if st.route.reason == "sampled":  # without a memo nothing spent is charged
        assert st.route.spent_ms == 0.0


@gpu
def test_gpu_debug_bounds_turn_the_route_choice_off():
    a = _args("calibrated", 16, 16384, 64)  # a chunk the early decision would send dense
    ids, st = dosa_cupy.dosa_topk(*a, debug_bounds=True)
    assert st.route.route == "dosa" and st.route.reason == "option" and st.bounds is not None
    assert cp.array_equal(ids, dosa_cupy.dense_topk(*a))


@pytest.mark.parametrize("regime,H", [("calibrated", 64), ("ties", 32)])
@gpu
def test_route_count_kernels_equal_the_array_path(monkeypatch, regime, H):
    """``route.COUNT_KERNELS`` (csrc/route.cu route_head, route_sample): the two read-backs'
    counts equal the array path's element for element on a real chunk and its seeds (the tie
    flag on a regime with τ = 0 among its queries), and on a random sampled bitmask
    (tests/test_route_counts.py emulates both kernels on the CPU); the histogram read back
    before the seeds (``route.head_prefetch``: route_head with a null ks) likewise."""
    from dosa_cupy import route as route_mod
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import pad_batch
    from dosa_cupy.seeds import seed_stage

    args = _args(regime, 300, 20000, H)
    b = pad_batch(*args)
    o = resolve_options(check_options({}), b.K)
    seeds = seed_stage(b, o)
    idx = cp.asarray(np.linspace(0, b.Qn - 1, 37).astype(np.int64))
    bs = b.rows(idx)
    surv = cp.asarray(np.random.RandomState(1).randint(0, 2**32, (37, bs.NW), dtype=np.uint64)
                      .astype(np.uint32))  # fmt: skip
    plan = dataclasses.make_dataclass("P", ["r"])(cp.arange(37, dtype=cp.int32) % 31)
    ao = dict(o, route="auto", screen="auto", cert_seeds=0)

    def prefetched(b, ao):  # read back before the seeds: route_head with a null ks
        host, ready = route_mod.head_prefetch(b, ao)
        ready.synchronize()
        return np.array(host)

    for f, a in ((route_mod._head_counts, (b, seeds, o, True)),
                 (route_mod._head_counts, (b, seeds, o, False)),
                 (route_mod._sample_counts, (surv, bs, seeds, idx, plan)),
                 (prefetched, (b, ao))):  # fmt: skip
        monkeypatch.setattr(route_mod, "COUNT_KERNELS", True)
        got = cp.asnumpy(f(*a))
        monkeypatch.setattr(route_mod, "COUNT_KERNELS", False)
        assert np.array_equal(got, cp.asnumpy(f(*a))), f.__name__


@pytest.mark.parametrize("regime,H", [("calibrated", 64), ("many_positive", 32)])
@gpu
def test_route_stage_chunk_plan_is_the_plan_stage_s(regime, H, monkeypatch):
    """``route.CHUNK_PLANS``: the first candidate's plan of the chunk, built during the
    decision behind the samples, is kept when that candidate wins and equals the plan stage's
    fresh plan field for field, bit for bit; the pipeline's ids with it equal the dense
    route's."""
    from dosa_cupy import route as route_mod
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.plan import plan_stage
    from dosa_cupy.prepare import key_rho, pad_batch
    from dosa_cupy.route import route_stage
    from dosa_cupy.screen import screen_arith
    from dosa_cupy.seeds import seed_stage

    monkeypatch.setattr(route_mod, "CHUNK_PLANS", True)
    a = _args(regime, 520, 24000, H, seed=3)
    b = pad_batch(*a)
    o = resolve_options(check_options({}), b.K)
    seeds = seed_stage(b, o)
    choice = route_stage(b, seeds, key_rho(b.kp), o, NEVER_DENSE)
    first = next(k for k in choice.predicted_ms if k != "dense")  # the candidates in order
    assert choice.route == "dosa"
    if cost.candidate_key(choice.screen, choice.r) != first:
        assert choice.plan is None  # only the first candidate's plan is built
    else:
        arith = screen_arith(choice.screen, bool(choice.tie))
        fresh = plan_stage(b, seeds.pool, choice.r, o, seeds.pcount, screen=arith)

        def same(x, y):  # bitwise for floats (a NaN field equals itself); fields may be
            # strided; a tuple of arrays (the plan's scratch) element by element
            if isinstance(x, tuple):
                return isinstance(y, tuple) and len(x) == len(y) and all(map(same, x, y))
            if not isinstance(x, cp.ndarray):
                return x == y
            x, y = cp.ascontiguousarray(x), cp.ascontiguousarray(y)
            return x.shape == y.shape and bool((x.view(cp.uint8) == y.view(cp.uint8)).all())

        for f in dataclasses.fields(fresh):
            assert same(getattr(choice.plan, f.name), getattr(fresh, f.name)), f.name
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    assert cp.array_equal(dosa_cupy.dosa_topk(*a), dosa_cupy.dense_topk(*a))


@pytest.mark.parametrize("regime,H", [("calibrated", 64), ("ties", 32), ("many_positive", 64)])
@gpu
def test_one_read_back_decides_as_two(regime, H, monkeypatch):
    """``route.ONE_READBACK`` (the histogram read before the seeds, the chunk's counts with
    the samples, the samples taken again on the tie-aware build where the flag asks): the
    same choice as the two read-backs — route, screen, r, tie, every candidate's survival —
    and the dense route's ids (the ties regime has τ = 0 queries: the second round).  The
    samples' timed milliseconds are fixed at 1 (a decision between two candidates whose
    predictions are close would otherwise follow the timing noise, not the read-backs)."""
    from dosa_cupy import route as route_mod

    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    monkeypatch.setattr(cp.cuda, "get_elapsed_time", lambda start, end: 1.0)
    a = _args(regime, 520, 24000, H, seed=5)
    got = {}
    for one in (False, True):
        monkeypatch.setattr(route_mod, "ONE_READBACK", one)
        ids, st = dosa_cupy.dosa_topk(*a, return_stats=True)
        assert cp.array_equal(ids, dosa_cupy.dense_topk(*a)), one
        c = st.route
        got[one] = (c.route, c.reason, c.screen, c.r, c.tie, c.survival, set(c.predicted_ms))
    assert got[True] == got[False]


@pytest.mark.parametrize("regime,H", [("calibrated", 64), ("ties", 32)])
@gpu
def test_pool_at_capacity_gives_the_same_seeds(regime, H, monkeypatch):
    """``seeds.POOL_CAPACITY`` (the eager call's anchor pool at its capacity, P on the
    device): the same P pool ids, the same τ and K-th ids bitwise (the same seed set), and
    the dense route's ids through the whole call, sampled decision included."""
    from dosa_cupy import seeds as seeds_mod
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import pad_batch

    a = _args(regime, 520, 24000, H, seed=4)
    b = pad_batch(*a)
    o = resolve_options(check_options({}), b.K)
    monkeypatch.setattr(seeds_mod, "POOL_CAPACITY", False)
    exact = seeds_mod.seed_stage(b, o)
    monkeypatch.setattr(seeds_mod, "POOL_CAPACITY", True)
    cap = seeds_mod.seed_stage(b, o)
    P = int(exact.pool.size)
    assert exact.pcount is None and int(cap.pcount) == P
    assert cp.array_equal(cap.pool[:P], exact.pool) and cp.array_equal(cap.poolmask, exact.poolmask)
    assert cp.array_equal(cap.tau.view(cp.uint32), exact.tau.view(cp.uint32))
    assert cp.array_equal(cap.kth_id, exact.kth_id)
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    assert cp.array_equal(dosa_cupy.dosa_topk(*a), dosa_cupy.dense_topk(*a))


@pytest.mark.parametrize(
    "regime,H,anchors",
    [("calibrated", 64, 4), ("ties", 32, 4), ("equal", 64, 4), ("calibrated", 32, 0)],
)
@gpu
def test_side_stream_gives_the_same_seeds(regime, H, anchors, monkeypatch):
    """``seeds.SIDE_STREAM`` (the sinks and the local window scored on a side stream while
    the anchor pool is built): the same records as one stream — each query's list equal as
    a set (their order is the atomic appends' either way), its count, τ and K-th ids bitwise —
    and the dense route's ids through the whole call, sampled decision included; with no
    anchors the stage keeps one stream."""
    from dosa_cupy import seeds as seeds_mod
    from dosa_cupy.options import check_options, resolve_options
    from dosa_cupy.prepare import pad_batch

    a = _args(regime, 520, 24000, H, seed=5)
    b = pad_batch(*a)
    o = resolve_options(check_options({"n_anchors": anchors}), b.K)
    got = {}
    for side in (False, True):
        monkeypatch.setattr(seeds_mod, "SIDE_STREAM", side)
        got[side] = seeds_mod.seed_stage(b, o)
    one, two = got[False], got[True]
    assert cp.array_equal(one.default.cnt, two.default.cnt)
    assert two.default.cap == one.default.cap
    n = cp.asnumpy(one.default.cnt).astype(np.int64)
    r1, r2 = cp.asnumpy(one.default.rec), cp.asnumpy(two.default.rec)
    for t in range(b.Qn):
        assert np.array_equal(np.sort(r1[t, : n[t]]), np.sort(r2[t, : n[t]])), t
    assert cp.array_equal(one.tau.view(cp.uint32), two.tau.view(cp.uint32))
    assert cp.array_equal(one.kth_id, two.kth_id)
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": NEVER_DENSE)
    assert cp.array_equal(dosa_cupy.dosa_topk(*a, n_anchors=anchors), dosa_cupy.dense_topk(*a))


@pytest.mark.parametrize("regime,H", [("calibrated", 64), ("ties", 32), ("equal", 64)])
@pytest.mark.parametrize("options", [dict(route="dosa"), dict(route="dosa", screen="pair", r=6)])
@gpu
def test_speculative_tie_screens_as_the_decided_rule(regime, H, options, monkeypatch):
    """``screen.SPECULATIVE_TIE`` (route="dosa": the rule is not decided by a route stage):
    the chunk screened on the plain rule while its flag is read back, again on the tie-aware
    build where the flag asks for it — the same screen and rule, survivors and tie counts as
    the rule decided first, and the dense route's ids (the ties and equal regimes have τ = 0
    queries)."""
    from dosa_cupy import screen as screen_mod

    a = _args(regime, 300, 20000, H, seed=6)
    got = {}
    for spec in (False, True):
        monkeypatch.setattr(screen_mod, "SPECULATIVE_TIE", spec)
        ids, st = dosa_cupy.dosa_topk(*a, return_stats=True, **options)
        assert cp.array_equal(ids, dosa_cupy.dense_topk(*a)), spec
        got[spec] = (st.screen, st.survivors.tolist(), st.tie_rejected.tolist())
    assert got[True] == got[False]
