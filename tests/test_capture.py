"""The graph-capturable prefill step (dosa_cupy/capture.py; docs/serving.md "Prefill capture").

CPU: the options a captured step refuses, each with a ValueError naming the argument, and
the arena's block arithmetic.  GPU: a step captured once (CuPy stream capture and
``torch.cuda.CUDAGraph``) and replayed on new inputs copied into the same arrays equals
the dense route bitwise after ``finish`` on every regime; overflowed and invalid-scale
queries are flagged in the replay and completed by ``finish``; bad input raises there.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from gpu_support import cp, gpu, numpy_as_cupy, replay_decode_walk

from dosa_cupy import capture as C

# GPU tests of the route choice see the library's default route ("auto"); every other GPU test
# runs route="dosa" (conftest.py _screening_route)
route_choice = pytest.mark.route_choice

# ---------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"seed_ids": np.zeros((1, 1), np.int64)}, "seed_ids"),
        ({"cert_seeds": 64}, "cert_seeds"),
        ({"return_stats": True}, "return_stats"),
        ({"debug_bounds": True}, "debug_bounds"),
        ({"timing": True}, "timing"),
        ({"screen": "pair"}, "screen"),
        ({"screen": "nope"}, "screen"),
        ({"seeds": "local+anchor+certificate"}, "seeds"),
        ({"route": "fused"}, "route"),
        ({"check": 1}, "check"),
        ({"r": 0}, "r"),
    ],
)
def test_refused_options_name_their_argument(kw, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        C.PrefillSelectorGPU(64, **kw)


@pytest.mark.parametrize("K", [0, 4097, 2.0, True, np.zeros(2, np.int64)])
def test_bad_K(K):
    with pytest.raises(ValueError, match="^K:"):
        C.PrefillSelectorGPU(K)


def test_accepted_options():
    sel = C.PrefillSelectorGPU(np.asarray(16), route="dosa", screen="fp64", seeds="local",
                               check=False)  # fmt: skip
    assert sel.K == 16 and sel.check is False
    assert C.PrefillSelectorGPU(4096).K == 4096  # the selection kernel's largest K


def test_pair_is_refused_even_where_its_r_fits():
    with pytest.raises(ValueError, match="^screen: 'pair' is not available"):
        C.PrefillSelectorGPU(64, screen="pair", r=6)


def test_K_as_a_0d_device_array():
    dev = types.SimpleNamespace(ndim=0, get=lambda: np.int64(32))  # a 0-d CuPy array's API
    assert C.PrefillSelectorGPU(dev).K == 32


def test_flagged_is_neither_a_key_id_nor_the_padding():
    assert C.FLAGGED < 0 and C.FLAGGED != -1


def test_counter_rounds_every_block_up():
    seen = []
    c = C._Counter(lambda n: seen.append(n) or n)
    for n in (1, 256, 257, 0, 1000):
        c.malloc(n)
    assert seen == [1, 256, 257, 0, 1000]  # passed through unchanged
    assert c.nbytes == 256 + 256 + 512 + 0 + 1024


class _FakeCuda:
    """cupy.cuda's Memory / MemoryPointer for the arena's arithmetic on the CPU."""

    class Memory:
        def __init__(self, n):
            self.size = n

    @staticmethod
    def MemoryPointer(mem, off):  # noqa: N802 (CuPy's name)
        return (mem, off)


def test_arena_blocks_are_aligned_fixed_and_bounded(monkeypatch):
    """Block i of a step starts where block i − 1 ended, rounded up to ALIGN; a reset step
    gets the same offsets; a step asking for more than the arena raises (never writes past
    it)."""
    shim = numpy_as_cupy()
    shim.cuda = _FakeCuda
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    sizes = [1, 300, 0, 256, 4097]
    c = C._Counter(lambda n: n)
    for n in sizes:
        c.malloc(n)
    a = C.Arena(c.nbytes)
    assert a._mem.size >= a.nbytes  # one allocation holds every block
    first = [a.malloc(n)[1] for n in sizes]
    assert first == [0, 256, 768, 768, 1024] and a.used == a.nbytes == 1024 + 4352
    assert all(off % C.ALIGN == 0 for off in first)
    a.reset()
    assert [a.malloc(n)[1] for n in sizes] == first  # the same addresses every step
    a.reset()
    a.malloc(a.nbytes)
    with pytest.raises(RuntimeError, match="^arena:"):
        a.malloc(1)


def test_shape_key_separates_what_changes_the_allocations():
    x, sc = np.zeros((4, 8), np.uint8), np.zeros(4, np.float32)
    base = C._shape_key(x, x, x, sc, None, None, x)
    assert base == C._shape_key(x.copy(), x, x, sc.copy(), None, None, x)  # same layout
    assert base != C._shape_key(x, x, x, sc, np.zeros(4, np.int32), None, x)  # ranges given
    assert base != C._shape_key(x.astype(np.int8), x, x, sc, None, None, x)  # dtype
    assert base != C._shape_key(np.asfortranarray(x), x, x, sc, None, None, x)  # strides
    strided = np.zeros((4, 2), np.float32)[:, 0]  # a scale view the checks would copy
    assert base != C._shape_key(x, x, x, strided, None, None, x)
    buf = np.zeros(4 * 8 + 16, np.uint8)
    at = (-buf.ctypes.data) % 16  # an aligned view and one 1 byte off
    aligned, odd = (buf[a : a + 32].reshape(4, 8) for a in (at, at + 1))
    assert C._shape_key(aligned, x, x, sc, None, None, x) == base
    assert C._shape_key(odd, x, x, sc, None, None, x) != base


def test_off_values_of_refused_options_are_accepted():
    C.PrefillSelectorGPU(8, cert_seeds=0, return_stats=False, timing=False, seed_ids=None)
    for kw in ({"cert_seeds": 1}, {"return_stats": 0}, {"cert_seeds": True}):
        with pytest.raises(ValueError, match=f"^{next(iter(kw))}:"):
            C.PrefillSelectorGPU(8, **kw)


def test_an_empty_chunk_takes_no_route(monkeypatch):
    """Qn = 0 or N = 0: the shape's decisions are the dense route's (−1 rows), without the
    route choice (which has nothing to choose from)."""
    from dosa_cupy import prepare

    shim = numpy_as_cupy()
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(prepare, "cupy_or_raise", lambda: shim)
    b, _ = _problem()
    sel = C.PrefillSelectorGPU(5, check=False)
    for q, w, kp, ksc in ((b.q[:0], b.w[:0], b.kp, b.ksc), (b.q, b.w, b.kp[:0], b.ksc[:0])):
        sh = sel._first(q, w, kp, ksc, None, None)
        assert sh.route == "dense" and sh.anchors is None


def test_route_per_step_is_a_flag():
    with pytest.raises(ValueError, match="^route_per_step:"):
        C.PrefillSelectorGPU(8, route_per_step="yes")
    assert not C.PrefillSelectorGPU(8, route_per_step=False).route_per_step


def test_per_step_rule_takes_the_fastest_sampled_candidate(monkeypatch):
    """A shape whose route is chosen per step: DoSA's body takes the sampled candidate
    predicted fastest (even where the dense route won the first step), and the rule's screen
    share is that candidate's measured sample time scaled to the chunk, per visible pair."""
    from dosa_cupy import cost

    monkeypatch.setattr(C, "device_name", lambda: "NVIDIA H200")
    b = types.SimpleNamespace(Qn=4096, N=131072, K=2048, heads=64, scorer="fp8",
                              visible=np.full(4096, 65536, np.int64))  # fmt: skip
    choice = cost.RouteChoice(
        "dense", "sampled", predicted_ms={"dense": 5.0, "wg/14": 7.0, "wgt/6": 6.0, "wg/30": 9.0},
        sample={"wg/14": 96, "wgt/6": 128, "wg/30": 96},
        sample_ms={"wg/14": 0.2, "wgt/6": 0.1, "wg/30": 0.3},
    )  # fmt: skip
    screen, r, rule = C.PrefillSelectorGPU(2048)._rule(b, choice)
    assert (screen, r) == ("wgt", 6)
    want = cost.LinearRule.of(cost.H200_FP8, 4096, 131072, 2048, 64,
                              0.1 * (4096 / 128) / (4096 * 65536))  # fmt: skip
    assert rule == want


def test_conditional_nodes_need_cuda_bindings_13(monkeypatch):
    """Without cuda.bindings ≥ 13 (``_graph._runtime`` None) no shape chooses per step."""
    from dosa_cupy import _graph, cost

    monkeypatch.setattr(_graph, "_runtime", lambda: None)
    assert not _graph.available()
    sampled = cost.RouteChoice("dosa", "sampled", "wgt", 6)
    assert not C.PrefillSelectorGPU(8, route_per_step=True)._per_step(sampled)


@pytest.mark.parametrize("kw", [{"return_stats": True}, {"timing": True}, {"cert_seeds": 8},
                                {"seed_ids": np.zeros((2, 1), np.int64)}, {"screen": "pair"},
                                {"tau_floor": np.zeros(2, np.float32)},
                                {"seeds": "local+anchor+certificate"}])  # fmt: skip
def test_step_graphs_leave_uncapturable_calls_to_the_eager_path(kw):
    """``StepGraphs.topk`` answers None (``dosa_topk`` then runs eagerly) for options a graph
    cannot hold, before touching an input."""
    assert C.StepGraphs().topk(None, None, None, None, 8, None, None, dict(kw, graph=1)) is None


def test_graph_option_is_checked():
    from dosa_cupy.options import check_options

    for bad in (1, "yes", object()):
        with pytest.raises(ValueError, match="^graph:"):
            check_options({"graph": bad})
    check_options({"graph": C.StepGraphs()})


def test_addresses():
    dev = types.SimpleNamespace(__cuda_array_interface__={"data": (1027, False)})
    assert C._address(dev) == 1027
    x = np.zeros(3)
    assert C._address(x) == x.ctypes.data
    assert C._address(object()) == 0


class _Tensor:
    """A DLPack tensor that is not an array (torch's ``out`` reaches CuPy this way)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_out_is_checked(monkeypatch):
    shim = numpy_as_cupy()
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    ok = np.zeros((3, 4), np.int32)
    assert C._device_out(ok, 3, 4) is ok
    view = C._device_out(_Tensor(ok), 3, 4)  # viewed, not copied
    assert isinstance(view, np.ndarray) and np.shares_memory(view, ok)
    assert C._as_out(None) is None and C._as_out(ok) is ok
    lst = [[0] * 4] * 3
    assert C._as_out(lst) is lst  # not a DLPack tensor: left to _device_out's check
    for bad in (None, [[0] * 4] * 3, np.zeros((3, 5), np.int64), np.zeros((3, 4), np.float32),
                np.zeros((4, 3), np.int64).T):  # fmt: skip
        with pytest.raises(ValueError, match="^out:"):
            C._device_out(bad, 3, 4)


def _problem(Qn=6, N=40, H=4, K=5, seed=0):
    from dosa_cupy.prepare import Batch
    from dosa_ref import index_scores, topk_ids
    from dosa_ref.fp8 import e4m3_values, quantize_keys, quantize_queries

    rs = np.random.default_rng(seed)
    kp, ksc = quantize_keys(rs.standard_normal((N, 128)).astype(np.float32))
    q, w = quantize_queries(rs.standard_normal((Qn, H, 128)), rs.standard_normal((Qn, H)))
    ks, ke = np.zeros(Qn, np.int32), np.arange(N - Qn + 1, N + 1, dtype=np.int32)
    b = Batch(q, w, kp, ksc, K, ks, ke)

    def exact(bb):  # the dense route's ids of a sub-batch (float64 stand-in)
        k = e4m3_values(bb.kp) * np.asarray(bb.ksc, np.float64)[:, None]
        s = index_scores(e4m3_values(bb.q), np.asarray(bb.w, np.float64), k, bb.ks, bb.ke)
        return topk_ids(s, bb.K).astype(np.int32)

    return b, exact


def test_finish_completes_exactly_the_flagged_rows(monkeypatch):
    """``finish`` reads the status, re-runs the flagged queries on the dense route (here an
    exact float64 stand-in receiving the sub-batch of those queries) and leaves every other
    row as the step wrote it."""
    shim = numpy_as_cupy()
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    b, exact = _problem()
    monkeypatch.setattr(C, "dense_ids", exact)
    want = exact(b)
    redo = np.array([False, True, False, False, True, False])
    ids = np.where(redo[:, None], C.FLAGGED, want).astype(np.int64)
    ids[0, 0] = 123  # an unflagged row is the step's: finish must not touch it
    h = C.PrefillStep(ids, np.array([0, redo.sum()]), redo, b)
    assert h.finish() == 2
    assert np.array_equal(ids[redo], want[redo]) and ids[0, 0] == 123
    assert np.array_equal(ids[2:4], want[2:4])
    h = C.PrefillStep(want.copy(), np.array([0, 0]), None, b)  # nothing flagged: no re-run
    assert h.finish() == 0


def test_finish_reads_the_checks_only_when_their_flag_word_is_set(monkeypatch):
    shim = numpy_as_cupy()
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    b, _ = _problem()

    class Check:  # raises if read: the flag word 0 says the values are good
        def forget(self):
            raise AssertionError("read although the flag word is 0")

        raise_if_bad = forget

    assert (
        C.PrefillStep(np.zeros((6, 5), np.int64), np.array([0, 0]), None, b, Check()).finish() == 0
    )


def test_finish_raises_on_the_checks_flag_word(monkeypatch):
    shim = numpy_as_cupy()
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    b, _ = _problem()

    class Check:  # a ValueCheck whose replayed flag word says q holds a NaN code
        forgotten = False

        def forget(self):
            self.forgotten = True

        def raise_if_bad(self):
            assert self.forgotten, "the flags must be read again after a replay"
            raise ValueError("q: contains an e4m3 NaN code")

    chk = Check()
    h = C.PrefillStep(np.zeros((6, 5), np.int64), np.array([1, 0]), None, b, chk)
    with pytest.raises(ValueError, match="^q:"):
        h.finish()


def _per_step_host(monkeypatch, picks, capturing=False, node=None):
    """A selector whose shape chooses its route per step, its stages replaced by host stubs
    (numpy for CuPy): ``picks`` are route_pick's answers in turn; the DoSA body's plan marks
    query 1 invalid, so its flags differ from the prefix's.  Returns (selector, shape, the
    problem's batch, the exact stand-in, the bodies run in order)."""
    import contextlib

    shim = numpy_as_cupy()
    shim.cuda = types.SimpleNamespace(get_current_stream=lambda: "stream")
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)
    b, exact = _problem()
    ran, picks = [], iter(picks)
    none = lambda *a, **k: None  # noqa: E731
    for name in ("key_rho", "anchor_stage", "pool_capacity", "sample_counts"):
        monkeypatch.setattr(C, name, none)
    monkeypatch.setattr(C, "pad_batch", lambda *a, **k: b)
    monkeypatch.setattr(C, "sample_rows", lambda Qn, screen: (np.arange(2), 2))
    monkeypatch.setattr(C, "pick_route", lambda b, s, rule, cond, pick: pick.fill(next(picks)))
    seeds = types.SimpleNamespace(pool=None, pcount=None, tau=None, default=None)
    monkeypatch.setattr(C, "seed_stage", lambda *a, **k: seeds)
    plan = types.SimpleNamespace(valid=np.arange(b.Qn) != 1)
    monkeypatch.setattr(C, "plan_stage", lambda *a, **k: (ran.append("dosa"), plan)[1])
    monkeypatch.setattr(C, "screen_stage", lambda *a, **k: types.SimpleNamespace(surv=None))
    recs = types.SimpleNamespace(over=np.zeros(b.Qn, bool))
    monkeypatch.setattr(C, "refine_stage", lambda *a, **k: recs)
    monkeypatch.setattr(C, "select_ids", lambda K, d, r: (exact(b), None))
    monkeypatch.setattr(C, "recovery_queries", lambda bb: np.zeros(bb.Qn, bool))
    monkeypatch.setattr(C, "dense_ids", exact)

    def dense_raw(*a, **k):
        ran.append("dense")
        return exact(b)

    monkeypatch.setattr(C, "_dense_topk_raw", dense_raw)
    monkeypatch.setattr(C._graph, "capturing", lambda s: capturing)
    monkeypatch.setattr(C._graph, "condition", lambda s: "handle")
    monkeypatch.setattr(C._graph, "if_else", node or none)

    @contextlib.contextmanager
    def part(self, sh, name):
        yield

    monkeypatch.setattr(C.PrefillSelectorGPU, "_part", part)
    sel = C.PrefillSelectorGPU(b.K, check=False, route_per_step=True)
    sh = C._Shape("per_step", "wgt", 6, False, None)
    return sel, sh, b, exact, ran


def _step(sel, sh, b):
    out = np.full((b.Qn, b.K), 7, np.int64)
    return sel._run(sh, b.q, b.w, b.kp, b.ksc, b.ks, b.ke, out), out


def test_per_step_first_step_runs_both_bodies_the_picked_one_last(monkeypatch):
    """An eager step reads route_pick's answer once: the shape's first step (no arenas yet)
    runs both bodies, the one picked last, so its ids, flags and count are the picked
    route's; a later eager step runs the picked body alone."""
    sel, sh, b, exact, ran = _per_step_host(monkeypatch, [1, 0, 1])
    h, out = _step(sel, sh, b)
    assert ran == ["dense", "dosa"] and h.route == "dosa"
    assert int(h.status[1]) == 1 and h.redo.tolist() == [False, True] + [False] * 4
    assert (out[1] == C.FLAGGED).all() and np.array_equal(np.delete(out, 1, 0),
                                                           np.delete(exact(b), 1, 0))  # fmt: skip
    assert h.finish() == 1 and np.array_equal(out, exact(b)) and h.route == "dosa"
    sh.arenas = {}
    ran.clear()
    h, out = _step(sel, sh, b)
    assert ran == ["dense"] and h.route == "dense" and int(h.status[1]) == 0
    assert h.finish() == 0 and np.array_equal(out, exact(b)) and h.route == "dense"
    ran.clear()
    h, out = _step(sel, sh, b)
    assert ran == ["dosa"] and h.route == "dosa" and h.finish() == 1
    assert np.array_equal(out, exact(b))


def test_a_replay_in_which_no_body_ran_is_finished_whole(monkeypatch):
    """Captured: the prefix flags every row before the if/else node; a node that ran no body
    (a fault, simulated here) leaves them flagged, and ``finish`` completes every row on the
    dense route — never the last replay's ids."""
    seen = []
    sel, sh, b, exact, ran = _per_step_host(
        monkeypatch, [1], capturing=True, node=lambda *a: seen.append(a[:3])
    )
    sh.arenas = {}
    h, out = _step(sel, sh, b)
    assert seen == [("stream", None, "handle")] and ran == []
    assert int(h.status[1]) == b.Qn and h.redo.all()
    assert h.finish() == b.Qn and np.array_equal(out, exact(b))


def _recover_host(monkeypatch, Qn=6):
    """``select.recover_first`` on the host (numpy for CuPy): the problem's batch, its exact
    ids, and the dense route's stand-in that records the rows it was asked for."""
    from dosa_cupy import select as S

    shim = numpy_as_cupy()
    monkeypatch.setattr(S, "cupy_or_raise", lambda: shim)
    b, exact = _problem(Qn=Qn)
    asked = []

    def dense(bb):
        asked.append(len(bb.ks))
        return exact(bb)

    monkeypatch.setattr(S, "dense_ids", dense)
    return S, b, exact, asked


@pytest.mark.parametrize("flags,m", [([1, 3, 4], 2), ([1, 3, 4], 3), ([0, 5], 8), ([], 2),
                                     (list(range(6)), 4)])  # fmt: skip
def test_recover_first_completes_the_first_m_flagged_rows(monkeypatch, flags, m):
    """The first min(m, Qn) flagged rows (in row order) get the dense route's ids and lose
    their flags, status[1] counts the rest; every other row keeps its ids (a slot without a
    flagged row recomputes a real row's own ids); the dense route sees min(m, Qn) rows
    whatever is flagged (fixed sizes)."""
    S, b, exact, asked = _recover_host(monkeypatch)
    redo = np.zeros(b.Qn, bool)
    redo[flags] = True
    ids = np.where(redo[:, None], C.FLAGGED, exact(b)).astype(np.int64)
    status = np.array([0, len(flags), 1], np.int64)
    S.recover_first(b, ids, redo, status, m)
    left = flags[m:]
    assert asked == [min(m, b.Qn)]
    assert redo.tolist() == [t in left for t in range(b.Qn)] and int(status[1]) == len(left)
    want = exact(b)
    for t in range(b.Qn):
        assert (ids[t] == C.FLAGGED).all() if t in left else (ids[t] == want[t]).all(), t
    assert status[0] == 0 and status[2] == 1


def _recovering_host(monkeypatch, picks, route_node):
    """``_per_step_host`` captured, with the recovery inside the step (RECOVER_ROWS = 1):
    ``route_node(then, otherwise)`` runs the bodies the route's if/else node would, every
    recovery node runs its body where recover_pick would set it (status[1] > 0)."""
    import dosa_cupy.select as S

    nodes = []

    def node(stream, side, cond, then, otherwise=None):
        nodes.append(cond)
        if otherwise is not None:
            route_node(then, otherwise)
        elif cond["flagged"]:
            then()

    sel, sh, b, exact, ran = _per_step_host(monkeypatch, picks, capturing=True, node=node)
    monkeypatch.setattr(S, "cupy_or_raise", C.cupy_or_raise)
    conds = []

    def condition(stream):
        conds.append({"flagged": False})
        return conds[-1]

    monkeypatch.setattr(C._graph, "condition", condition)
    monkeypatch.setattr(C, "recover_condition",
                        lambda status, cond: cond.update(flagged=int(status[1]) > 0))  # fmt: skip
    monkeypatch.setattr(S, "dense_ids", exact)
    sh.arenas, sh.recover = {}, 1
    return sel, sh, b, exact, ran, nodes


def test_recovery_inside_the_step_runs_where_a_row_is_flagged(monkeypatch):
    """Captured with the recovery inside the step: DoSA's body flags query 1, the recovery
    node completes it (status 0, ids exact before finish); where the dense body ran nothing
    is flagged and the node's body does not run; where no body ran (a fault), the node
    completes one row and finish the others."""
    sel, sh, b, exact, ran, nodes = _recovering_host(monkeypatch, [1], lambda t, o: t())
    h, out = _step(sel, sh, b)
    assert ran == ["dosa"] and len(nodes) == 2 and nodes[1]["flagged"]
    assert int(h.status[1]) == 0 and not h.redo.any() and np.array_equal(out, exact(b))
    assert h.finish() == 0
    sel, sh, b, exact, ran, nodes = _recovering_host(monkeypatch, [0], lambda t, o: o())
    h, out = _step(sel, sh, b)
    assert ran == ["dense"] and not nodes[1]["flagged"] and np.array_equal(out, exact(b))
    sel, sh, b, exact, ran, nodes = _recovering_host(monkeypatch, [1], lambda t, o: None)
    h, out = _step(sel, sh, b)
    assert ran == [] and nodes[1]["flagged"] and int(h.status[1]) == b.Qn - 1
    assert np.array_equal(out[0], exact(b)[0]) and (out[1:] == 7).all()
    assert h.finish() == b.Qn - 1 and np.array_equal(out, exact(b))


def test_first_step_sizes_the_recovery_on_copies(monkeypatch):
    """The shape's first (eager) step runs the recovery once to size its arena, on copies of
    the flags and the status: the flagged row's ids come out exact, its flag and the count
    stay for finish; a later eager step leaves its flagged rows to finish."""
    import dosa_cupy.select as S

    sel, sh, b, exact, ran = _per_step_host(monkeypatch, [1, 1])
    monkeypatch.setattr(S, "cupy_or_raise", C.cupy_or_raise)
    asked = []
    monkeypatch.setattr(S, "dense_ids", lambda bb: (asked.append(len(bb.ks)), exact(bb))[1])
    sh.recover = 2
    h, out = _step(sel, sh, b)
    assert asked == [2] and np.array_equal(out, exact(b))
    assert int(h.status[1]) == 1 and h.redo.tolist() == [False, True] + [False] * 4
    sh.arenas = {}
    h, out = _step(sel, sh, b)
    assert asked == [2] and (out[1] == C.FLAGGED).all() and h.finish() == 1


class _FakeStream:
    """A stream for ``_Graphed.run`` on the host: records what it is asked to do."""

    def __init__(self, log):
        self.log = log

    def record(self):
        return "event"

    def wait_event(self, e):
        self.log.append("wait")

    def begin_capture(self):
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        log = self.log
        return types.SimpleNamespace(launch=lambda s: log.append("launch"))

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_step_graphs_run_eager_then_capture_then_replay(monkeypatch):
    """Per shape: call 1 runs the step eagerly, call 2 captures it and launches the graph,
    later calls copy their inputs in and launch it; every call finishes its step and returns
    a copy of the ids (``_Graphed.run`` with host stand-ins)."""
    log = []
    shim = numpy_as_cupy()
    shim.cuda = types.SimpleNamespace(get_current_stream=lambda: _FakeStream(log))
    monkeypatch.setattr(C, "cupy_or_raise", lambda: shim)

    class Sel:
        def step(self, *x, out):
            log.append("step")
            out[...] = x[0].sum()
            return types.SimpleNamespace(finish=lambda: log.append("finish"))

    x0 = (np.zeros((3, 2)), None)
    e = C._Graphed(Sel(), x0, 4)
    stream = _FakeStream(log)
    got = []
    for v in (1.0, 2.0, 3.0):
        log.clear()
        ids = e.run((np.full((3, 2), v), None), stream)
        got.append((list(log), ids.copy()))
        assert ids is not e.out and np.array_equal(e.x[0], np.full((3, 2), v))
    assert got[0][0] == ["wait", "step", "finish", "wait"]
    assert got[1][0] == ["wait", "begin", "step", "end", "launch", "finish", "wait"]
    assert got[2][0] == ["wait", "launch", "finish", "wait"]
    assert (got[0][1] == 6).all() and (got[1][1] == 12).all()  # the stand-in step's writes


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------

FIELDS = ("q", "w", "k_payload", "k_scale", "ks", "ke")


def _sets(regime, Qn, N, H, n, seed=0):
    from dosa_cupy.workload import make_gpu_workload

    out = []
    for s in range(n):
        try:
            wl = make_gpu_workload(regime, Qn, N, H, seed=seed + s)
        except ModuleNotFoundError as e:  # the trained regime without its encoder and corpus
            pytest.skip(str(e))
        out.append([cp.ascontiguousarray(wl[f]) for f in FIELDS])
    return out


def _dense(x, K):
    from dosa_cupy import dense_topk

    return dense_topk(*x[:4], K, x[4], x[5])


def _replay_cupy(sel, sets, K, out_dtype=np.int64, mutate=None, steps=None):
    """Eager first step on sets[0], capture of a step on static copies, replays on every
    set copied in; yields (set index, ids after replay, rows re-run by finish, ids before
    finish); ``steps``: a list that receives the captured step's ``PrefillStep``."""
    static = [a.copy() for a in sets[0]]
    out = cp.empty((static[0].shape[0], K), dtype=out_dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        sel.step(*static, out=out).finish()  # the shape's first step: decides, measures
        stream.begin_capture()
        h = sel.step(*static, out=out)
        graph = stream.end_capture()
    stream.synchronize()
    if steps is not None:
        steps.append(h)
    for i, x in enumerate(sets):
        for dst, src in zip(static, x, strict=True):
            dst[...] = src
        if mutate is not None:
            mutate(i, static)
        cp.cuda.Device().synchronize()
        out.fill(7)  # stale ids must not survive a replay
        cp.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        before = out.copy()
        with stream:
            n = h.finish()
        stream.synchronize()
        yield i, out, n, before, static


CASES = [
    ("calibrated", 512, 16384, 32, 256, {}),
    ("calibrated", 300, 12000, 64, 2048, {"screen": "wg"}),
    ("h64", 512, 16384, 64, 512, {}),
    ("many_positive", 256, 16384, 32, 256, {"r": 30}),
    ("structured", 384, 8192, 64, 512, {"screen": "fp64"}),
    ("gaussian", 256, 8192, 32, 256, {"screen": "fp64", "r": 30}),
    ("ties", 512, 16384, 32, 256, {}),
    ("equal", 256, 8192, 32, 128, {}),
    ("isotropic", 256, 16384, 32, 256, {}),
    ("trained", 256, 16384, 64, 512, {}),
]


@gpu
@pytest.mark.parametrize("regime,Qn,N,H,K,kw", CASES)
def test_captured_replay_equals_dense(regime, Qn, N, H, K, kw):
    """Captured once, replayed on three new input sets: ids == dense_topk bitwise after
    ``finish``; rows not re-run were already final in the replay."""
    sel = C.PrefillSelectorGPU(K, route="dosa", **kw)
    sets = _sets(regime, Qn, N, H, 3, seed=11)
    for i, out, n, before, static in _replay_cupy(sel, sets, K):
        dense = _dense(static, K)
        assert cp.array_equal(out, dense), f"{regime} set {i}: replay != dense"
        redo = cp.any(before != dense, axis=1)
        assert int(redo.sum()) <= n, "a row differed from dense without being flagged"
        assert bool(cp.all(cp.where(redo[:, None], before == C.FLAGGED, True)))


@gpu
@pytest.mark.parametrize("route", ["auto", "dense"])
def test_captured_route_choices(route):
    """route="auto" (the cost model's choice on the first step, kept) and "dense"."""
    K = 256
    sel = C.PrefillSelectorGPU(K, route=route)
    sets = _sets("calibrated", 64, 16384, 64, 2, seed=3)
    for i, out, _, _, static in _replay_cupy(sel, sets, K, out_dtype=np.int32):
        assert cp.array_equal(out, _dense(static, K).astype(cp.int32)), f"set {i}"


@gpu
@route_choice
def test_auto_route_choosing_screening_is_kept(monkeypatch):
    """route="auto", ``route_per_step=False``, with a cost model under which screening always
    wins: the shape's first step chooses DoSA (the sampled decision), and the replays screen
    with that choice."""
    import dataclasses

    from dosa_cupy import cost, pipeline

    never_dense = dataclasses.replace(cost.H200, dosa_floor_ms=0.0,
                                      logits_flop_per_ms={32: 1.0, 64: 1.0})  # fmt: skip
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": never_dense)
    K = 256
    sel = C.PrefillSelectorGPU(K, route_per_step=False)
    sets = _sets("calibrated", 512, 16384, 64, 2, seed=4)
    for i, out, _, _, static in _replay_cupy(sel, sets, K):
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"
    (sh,) = sel._shapes.values()
    assert sh.choice.reason == "sampled", sh.choice  # the first step's decision
    assert sh.route == "dosa" and sh.screen in ("wgt", "wg", "fp64")  # never the paired one


# ---------------------------------------------------------------------------------------
# GPU: the route chosen per step (route_per_step; csrc/route.cu route_pick, _graph.py)
# ---------------------------------------------------------------------------------------

DOSA_RULE = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # DoSA predicted 0 ms, dense 1 ms
DENSE_RULE = (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # DoSA 1 ms, dense 0 ms


def _per_step_selector(monkeypatch, K, **kw):
    """A selector under a cost model without the early floor: a shape's first step (Qn ≥
    512) takes the sampled decision, so its route is chosen per step."""
    import dataclasses

    from dosa_cupy import _graph, cost, pipeline

    if not _graph.available():
        pytest.skip("conditional graph nodes need cuda-bindings >= 13 and a CUDA 12.8 driver")
    from dosa_cupy import options

    # without the mark, conftest.py makes route="dosa" the default and no step samples
    assert options.OPTIONS["route"] == "auto", "mark the test route_choice (conftest.py)"
    sampled = dataclasses.replace(cost.H200_FP8, dosa_floor_ms=0.0)
    monkeypatch.setattr(pipeline, "model_for", lambda scorer, device="": sampled)
    monkeypatch.setattr(C, "model_for", lambda scorer, device="": sampled)
    return C.PrefillSelectorGPU(K, route_per_step=True, **kw)


def _mixed_sets(regimes, Qn, N, H, seed):
    """One input set per regime (the same shape), in the given order."""
    return [_sets(r, Qn, N, H, 1, seed=seed + i)[0] for i, r in enumerate(regimes)]


@gpu
def test_route_pick_is_its_host_twin():
    """csrc/route.cu route_pick == ``cost.LinearRule.picks_dosa`` on random ranges, samples
    and rules — exact ties (DoSA = dense: dense) and samples that see nothing included."""
    from dosa_cupy import cost, route

    rs = np.random.default_rng(5)
    pick = cp.zeros(1, dtype=cp.int64)
    seen = set()
    for i in range(300):
        Qn, n = int(rs.integers(1, 5000)), int(rs.integers(1, 400))
        ks = rs.integers(0, 1 << 20, Qn).astype(np.int32)
        ke = (ks + rs.integers(0, 1 << 20, Qn)).astype(np.int32)
        vis = rs.integers(0, 1 << 20, n) * (i % 7 != 0)  # every 7th sample sees nothing
        sample = np.concatenate([[int(rs.integers(0, vis.sum() + 1)), 0], vis, np.zeros(n)])
        pairs = int((ke.astype(np.int64) - ks).sum())
        if i % 4 == 0:  # small integers and halves: ties are exact
            ke[:], ks[:] = 4, 0
            pairs = 4 * Qn
            rule = cost.LinearRule(1.0, 0.5, 0.0, 1e9, 0.0, float(rs.integers(1, 8)), 0.0)
            sample[0], sample[2 : 2 + n] = int(rs.integers(0, 4)), 0
            sample[2] = int(rs.integers(0, 3)) * pairs
        else:
            scale = np.array([5.0, 1e-8, 1e-8, 1e9, 1e-9, 10.0, 1e-8])
            rule = cost.LinearRule(*(rs.uniform(0, 2, 7) * scale).tolist())
        s_dev = cp.asarray(sample.astype(np.int64))
        b = types.SimpleNamespace(ks=cp.asarray(ks), ke=cp.asarray(ke), Qn=Qn)
        route.pick_route(b, s_dev, cp.asarray(rule.coefficients(), dtype=cp.float64), None, pick)
        svis = int(sample[2 : 2 + n].astype(np.int64).sum())
        want = rule.picks_dosa(pairs, int(sample[0]), svis)
        assert int(pick[0]) == int(want), f"case {i}: {rule} {pairs} {sample[0]} {svis}"
        seen.add(want)
    assert seen == {True, False}


@gpu
@route_choice
def test_captured_route_chosen_per_replay(monkeypatch):
    """One graph, replayed on calibrated and isotropic inputs in turn, its rule on the device
    set per replay to DoSA, to dense, or the cost model's: each replay runs the body its rule
    picks — DoSA's writes the redo rows, the dense route's leaves them — and ids ==
    dense_topk after ``finish``, every replay; eager steps likewise."""
    K = 256
    sel = _per_step_selector(monkeypatch, K)
    sets = _mixed_sets(["calibrated", "isotropic"] * 3, 512, 16384, 64, seed=31)
    rules, steps = {}, []

    def set_rule(i, static):
        (sh,) = sel._shapes.values()
        assert sh.route == "per_step", sh.choice  # the first step's decision
        rules.setdefault("model", sh.rule.copy())
        rule = (DOSA_RULE, DENSE_RULE, None)[i % 3]
        sh.rule[...] = rules["model"] if rule is None else cp.asarray(rule, dtype=cp.float64)
        steps[0].redo.fill(True)  # the DoSA body rewrites it; the dense body does not

    taken = []
    for i, out, _, _, static in _replay_cupy(sel, sets, K, mutate=set_rule, steps=steps):
        h = steps[0]
        assert cp.array_equal(out, _dense(static, K)), f"replay {i}"
        if i % 3 < 2:
            assert h.route == ("dosa", "dense")[i % 3], f"replay {i}"
        assert bool(h.redo.all()) == (h.route == "dense"), f"replay {i}: the other body ran"
        taken.append(h.route)
    (sh,) = sel._shapes.values()
    for i, x in enumerate(sets[:3]):  # eager steps, arenas of the shape, the same rules
        sh.rule[...] = cp.asarray(DENSE_RULE if i % 2 else DOSA_RULE, dtype=cp.float64)
        out = cp.full((512, K), 7, dtype=cp.int64)
        h = sel.step(*x, out=out)
        h.finish()
        assert h.route == ("dense" if i % 2 else "dosa")
        assert cp.array_equal(out, _dense(x, K)), f"eager {i}"


@gpu
@route_choice
@pytest.mark.parametrize("H", [32, 64])
def test_captured_route_per_step_on_every_regime(monkeypatch, H):
    """The cost model's own rule, one graph replayed on every regime of the prefill cases in
    turn (the same shape): ids == dense_topk after ``finish`` whichever route each replay
    chose."""
    K = 256
    sel = _per_step_selector(monkeypatch, K)
    regimes = ["calibrated", "isotropic", "ties", "equal", "gaussian", "structured",
               "many_positive", "h64", "trained", "calibrated"]  # fmt: skip
    try:
        sets = _mixed_sets(regimes, 512, 16384, H, seed=51)
    except pytest.skip.Exception:  # the trained regime without its encoder and corpus
        regimes.remove("trained")
        sets = _mixed_sets(regimes, 512, 16384, H, seed=51)
    steps = []
    for i, out, _, _, static in _replay_cupy(sel, sets, K, steps=steps):
        assert cp.array_equal(out, _dense(static, K)), f"{regimes[i]}: replay != dense"
        assert steps[0].route in ("dosa", "dense")
    (sh,) = sel._shapes.values()
    assert sh.route == "per_step", sh.choice  # every replay chose its own route


@gpu
@pytest.mark.parametrize("kw", [{"seeds": "local"}, {"n_anchors": 1, "p_sample": 4096}])
def test_small_or_empty_anchor_pool(kw):
    """No anchors (the pool is one padding id, the plan's sample key 0) and a pool smaller
    than the plan's sample (repeats): ids equal the dense route's."""
    K = 128
    sel = C.PrefillSelectorGPU(K, route="dosa", **kw)
    for i, out, _, _, static in _replay_cupy(sel, _sets("calibrated", 256, 8192, 32, 2), K):
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"


@gpu
def test_unpadded_heads_flagged_rows_use_the_padded_copy():
    """H = 20 (padded to 32 inside the step) with a small buffer: the flagged rows are
    re-run from the step's padded copy of q and w, which the replay rewrote."""
    K = 64
    sel = C.PrefillSelectorGPU(K, route="dosa", buffer=16)
    flagged = 0
    for i, out, n, _, static in _replay_cupy(sel, _sets("ties", 256, 8192, 20, 3, seed=6), K):
        flagged += n
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"
    assert flagged > 0


@gpu
def test_empty_chunks_and_a_strided_scale():
    """Qn = 0 and N = 0 give −1 rows (Qn = 0: none); a k_scale view that the checks copy
    is a shape of its own (the arena is measured with the copy)."""
    K = 32
    sel = C.PrefillSelectorGPU(K, route="dosa")
    (x,) = _sets("calibrated", 64, 4096, 32, 1)
    q, w, kp, ksc, ks, ke = x
    out = cp.empty((64, K), dtype=cp.int64)
    for _ in range(2):  # the first step of each shape, then its arena's
        sel.step(q, w, kp[:0], ksc[:0], cp.zeros(64, cp.int32), cp.zeros(64, cp.int32),
                 out=out).finish()  # fmt: skip
        assert bool((out == -1).all())
        empty = cp.empty((0, K), dtype=cp.int64)
        sel.step(q[:0], w[:0], kp, ksc, ks[:0], ke[:0], out=empty).finish()
    wide = cp.stack([ksc, ksc], axis=1)  # ksc as a strided view: column 0
    for scale in (ksc, wide[:, 0], ksc, wide[:, 0]):
        sel.step(q, w, kp, scale, ks, ke, out=out).finish()
        assert cp.array_equal(out, _dense(x, K))


@gpu
def test_overflow_is_flagged_and_finished():
    """buffer=16 compact records: most queries overflow in the replay, their rows read
    FLAGGED, and ``finish`` completes them exactly."""
    K = 64
    sel = C.PrefillSelectorGPU(K, route="dosa", buffer=16, check=False)
    sets = _sets("ties", 256, 8192, 32, 2, seed=5)
    flagged = 0
    for i, out, n, before, static in _replay_cupy(sel, sets, K):
        flagged += n
        rows = cp.all(before == C.FLAGGED, axis=1)
        assert int(rows.sum()) == n
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"
    assert flagged > 0


@gpu
def test_overflow_recovered_inside_the_graph(monkeypatch):
    """RECOVER_ROWS = 32: the replay's if node completes the first 32 flagged rows on the
    device — before ``finish`` every row not FLAGGED equals dense_topk's, and finish re-runs
    exactly max(0, flagged − 32) rows, flagged counted by a selector that recovers nothing
    on the same replays; ids == dense after finish."""
    from dosa_cupy import _graph

    if not _graph.available():
        pytest.skip("conditional graph nodes need cuda-bindings >= 13 and a CUDA 12.8 driver")
    K = 64
    sets = _sets("ties", 256, 8192, 32, 3, seed=5)
    plain = C.PrefillSelectorGPU(K, route="dosa", buffer=16, check=False)
    flagged = [n for _, _, n, _, _ in _replay_cupy(plain, sets, K)]
    monkeypatch.setattr(C, "RECOVER_ROWS", 32)
    sel = C.PrefillSelectorGPU(K, route="dosa", buffer=16, check=False)
    for i, out, n, before, static in _replay_cupy(sel, sets, K):
        want = _dense(static, K)
        rows = cp.all(before == C.FLAGGED, axis=1)
        assert n == max(0, flagged[i] - 32) and int(rows.sum()) == n, f"set {i}"
        assert cp.array_equal(before[~rows], want[~rows]), f"set {i}: a recovered row"
        assert cp.array_equal(out, want), f"set {i}"
    assert max(flagged) > 32  # finish had rows left to complete


@gpu
def test_invalid_scales_in_a_replay_are_finished():
    """A replay whose inputs hold NaN / negative key scales: the queries that see them are
    flagged and re-run on the dense route (query-level recovery outside the graph)."""
    K = 128

    def spoil(i, x):
        if i == 1:
            x[3][[100, 5000]] = cp.asarray([np.nan, -1.0], dtype=cp.float32)

    sel = C.PrefillSelectorGPU(K, route="dosa", check=False)
    sets = _sets("calibrated", 256, 8192, 32, 2, seed=8)
    for i, out, n, _, static in _replay_cupy(sel, sets, K, mutate=spoil):
        assert (n > 0) == (i == 1)
        assert cp.array_equal(out, _dense(static, K)), f"set {i}"


@gpu
def test_bad_input_in_a_replay_raises_in_finish():
    """check=True: the value checks run inside the graph; ``finish`` raises naming q."""
    K = 64

    def spoil(i, x):
        if i == 1:
            x[0][3, 0, 5] = 0x7F  # an e4m3 NaN code

    sel = C.PrefillSelectorGPU(K, route="dosa")
    sets = _sets("calibrated", 128, 4096, 32, 2, seed=2)
    with pytest.raises(ValueError, match="^q:"):
        for i, out, _, _, static in _replay_cupy(sel, sets, K, mutate=spoil):
            assert i == 0 and cp.array_equal(out, _dense(static, K))


def _torch_captured(torch, sel, static, out):
    """(torch.cuda.CUDAGraph, the captured ``PrefillStep``): the shape's first step and its
    arenas' first step run eagerly, then one step captured by torch (CuPy on torch's
    capture stream)."""
    sel.step(*static, out=out).finish()
    sel.step(*static, out=out).finish()  # the arenas' first step (outside the capture)
    cp.cuda.Device().synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            h = sel.step(*static, out=out)
    return g, h


@gpu
def test_captured_in_a_torch_graph():
    """The step captured by torch.cuda.CUDAGraph (CuPy launching on torch's capture
    stream, capture mode "global": no allocation, no synchronization in the step)."""
    torch = pytest.importorskip("torch")
    K = 256
    sets = _sets("h64", 256, 16384, 64, 3, seed=21)
    static = [a.copy() for a in sets[0]]
    out = cp.empty((256, K), dtype=cp.int64)
    sel = C.PrefillSelectorGPU(K, route="dosa")
    g, h = _torch_captured(torch, sel, static, out)
    for i, x in enumerate(sets[1:]):
        for dst, src in zip(static, x, strict=True):
            dst[...] = src
        cp.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        h.finish()
        assert cp.array_equal(out, _dense(static, K)), f"set {i + 1}"


@gpu
@route_choice
def test_step_graphs_equal_dense_call_after_call(monkeypatch):
    """``dosa_topk(..., graph=StepGraphs())``: calls of one shape — eager, captured, then
    replays — on calibrated and isotropic inputs in turn, a second shape beside it, a call
    with statistics (eager): ids == dense_topk every call; the shape's route chosen per step;
    bad input in a replayed call raises the eager call's ValueError."""
    import dosa_cupy

    K = 256
    _per_step_selector(monkeypatch, K)  # the cost model without the early floor
    g = C.StepGraphs()
    sets = _mixed_sets(["calibrated", "isotropic"] * 3, 512, 16384, 64, seed=71)
    small = _sets("calibrated", 256, 8192, 32, 2, seed=81)
    for i, x in enumerate(sets):
        ids = dosa_cupy.dosa_topk(*x[:4], K, x[4], x[5], graph=g)
        assert ids.dtype == cp.int64 and cp.array_equal(ids, _dense(x, K)), f"call {i}"
        if i % 2:
            y = small[i % 2]
            assert cp.array_equal(dosa_cupy.dosa_topk(*y[:4], K, y[4], y[5], graph=g),
                                  _dense(y, K)), f"small shape, call {i}"  # fmt: skip
    entries = list(g._entries.values())
    assert len(entries) == 2 and all(e.graph is not None for e in entries)
    sh = next(iter(entries[0].sel._shapes.values()))
    assert sh.route == "per_step", sh.choice  # the first step's decision
    x = sets[0]
    ids, st = dosa_cupy.dosa_topk(*x[:4], K, x[4], x[5], graph=g, return_stats=True)
    assert cp.array_equal(ids, _dense(x, K)) and st.route is not None
    bad = [a.copy() for a in sets[1]]
    bad[0][3, 0, 5] = 0x7F  # an e4m3 NaN code
    with pytest.raises(ValueError, match="^q:"):
        dosa_cupy.dosa_topk(*bad[:4], K, bad[4], bad[5], graph=g)
    g.release()
    assert not g._entries


@gpu
@route_choice
def test_route_per_step_captured_in_a_torch_graph(monkeypatch):
    """The per-step route under torch.cuda.CUDAGraph (capture mode "global"): the if/else
    node's bodies captured beside torch's capture; replays forced to DoSA, then dense, then
    DoSA by the rule on the device: the body the rule picks runs, ids == dense_topk."""
    torch = pytest.importorskip("torch")
    K = 256
    sets = _mixed_sets(["calibrated", "isotropic", "h64", "calibrated"], 512, 16384, 64, seed=61)
    static = [a.copy() for a in sets[0]]
    out = cp.empty((512, K), dtype=cp.int64)
    sel = _per_step_selector(monkeypatch, K)
    g, h = _torch_captured(torch, sel, static, out)
    (sh,) = sel._shapes.values()
    assert sh.route == "per_step", sh.choice  # the first step's decision
    for i, x in enumerate(sets[1:]):
        want = ("dense", "dosa")[i % 2]
        sh.rule[...] = cp.asarray(DOSA_RULE if want == "dosa" else DENSE_RULE, dtype=cp.float64)
        h.redo.fill(True)
        for dst, src in zip(static, x, strict=True):
            dst[...] = src
        cp.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        h.finish()
        assert h.route == want and bool(h.redo.all()) == (want == "dense")
        assert cp.array_equal(out, _dense(static, K)), f"set {i + 1}"


# ---------------------------------------------------------------------------------------
# GPU: the decode step captured, on every regime of the prefill cases
# ---------------------------------------------------------------------------------------


def _decode_walk(regime, B, n, H, N, steps, seed):
    """A regime's keys written into a paged cache behind a shuffled block table (each
    request its own copy of the N keys, the last block partly filled) and its queries as
    the walk's decode steps (B requests × next_n = n per step); every context starts near
    N and grows by one token per step.  Returns (steps of (q, w, lengths), [cache payload,
    cache scale, block table])."""
    from dosa_cupy.decode import PAGE
    from dosa_cupy.workload import make_gpu_workload

    try:
        wl = make_gpu_workload(regime, B * n * steps, N, H, seed=seed)
    except ModuleNotFoundError as e:  # the trained regime without its encoder and corpus
        pytest.skip(str(e))
    rs = np.random.default_rng(seed)
    mb = -(-N // PAGE)
    nb = B * mb + 2  # two spare blocks no request uses
    table = cp.asarray(rs.permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32))
    kp = cp.zeros((mb * PAGE, 128), dtype=cp.uint8)
    kp[:N] = wl["k_payload"]
    ks = cp.zeros(mb * PAGE, dtype=cp.float32)
    ks[:N] = wl["k_scale"]
    kv = cp.zeros((nb, PAGE, 128), dtype=cp.uint8)
    sc = cp.zeros((nb, PAGE), dtype=cp.float32)
    kv[table.ravel()] = cp.tile(kp.reshape(mb, PAGE, 128), (B, 1, 1))
    sc[table.ravel()] = cp.tile(ks.reshape(mb, PAGE), (B, 1))
    L0 = rs.integers(N - 3 * PAGE, N - steps + 1, B)
    q = wl["q"].reshape(steps, B, n, H, 128)
    w = wl["w"].reshape(steps, B, n, H)
    walk = [
        (
            cp.ascontiguousarray(q[t]),
            cp.ascontiguousarray(w[t]),
            cp.asarray((L0 + t).astype(np.int32)),
        )
        for t in range(steps)
    ]
    return walk, [kv, sc, table]


# every prefill case's regime, N, H and K (the serving K = 2048 included)
DECODE_CASES = sorted({(c[0], c[2], c[3], c[4]) for c in CASES})


@gpu
@pytest.mark.parametrize("regime,N,H,K", DECODE_CASES)
def test_decode_step_captured_on_every_regime(regime, N, H, K):
    """The decode step captured once in a CuPy stream graph and replayed on the regime's
    next steps copied into the same buffers: ids == an eager selector's ==
    ``dense_decode_topk`` bitwise at every step (``gpu_support.replay_decode_walk``)."""
    walk, dev = _decode_walk(regime, 2, 2, H, N, 4, seed=5)
    replay_decode_walk(walk, dev, K, regime)
