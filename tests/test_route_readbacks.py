"""CPU: the sampled decision's read-backs (dosa_cupy/route.py ``route_stage``) with its device
work stubbed — the chunk's counts, the samples' plans and screens — so that only the host
logic runs: ``ONE_READBACK`` (the histogram read before the seeds, the counts with the
samples, the samples taken again on the tie-aware build where the chunk's flag asks for it)
decides as the two read-backs do, and ``CHUNK_PLANS`` keeps the first candidate's chunk plan
exactly when that candidate wins.  The GPU side: tests/test_gpu_route.py."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from gpu_support import numpy_as_cupy

from dosa_cupy import cost
from dosa_cupy import route as route_mod

Hp = 64
# the dense route predicted slower than any sample: the choice is among the candidates
NEVER_DENSE = dataclasses.replace(cost.H200_FP8, logits_flop_per_ms={32: 1.0, 64: 1.0})


class _Batch:
    def __init__(self, Qn, positive):
        self.Qn, self.N, self.K, self.heads = Qn, 131072, 2048, Hp
        self.w = np.where(np.arange(Hp)[None, :] < positive, 1.0, -1.0).astype(np.float32)
        self.w = np.repeat(self.w, Qn, axis=0)

    def rows(self, idx):
        return types.SimpleNamespace(Qn=len(idx), idx=idx)


def _install(monkeypatch, tie_flag: bool, survival: dict):
    """Stubs for the device work; ``survival[(screen, r, tie)]``: the sample's survivors
    per screened key.  Returns the log of the stubs' calls."""
    log = []
    shim = numpy_as_cupy()
    shim.cuda = types.SimpleNamespace(get_elapsed_time=lambda a, b: 0.25)
    monkeypatch.setattr(route_mod, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(route_mod, "device_const", lambda xp, key, make: make())

    def head_counts(b, seeds, o, auto):
        log.append(("head", auto))
        hist = route_mod.positive_heads_hist(b.w, np) if auto else np.zeros(0, np.int64)
        return np.concatenate([[b.Qn * 1000, b.Qn * 900, int(tie_flag)], hist]).astype(np.int64)

    def plan_stage(bs, pool, rr, o, pcount, screen):
        log.append(("plan", bs.Qn, rr, screen))
        return types.SimpleNamespace(r=np.full(bs.Qn, rr), r_max=rr, screen=screen, Qn=bs.Qn)

    def sample(bs, plan, seeds, idx, rho, o, tie):
        log.append(("sample", o["screen"], int(plan.r_max), tie))
        n = len(idx)
        m = survival[(o["screen"], int(plan.r_max), tie)]
        head = [int(m * 900 * n), 900 * n]
        return "start", "end", np.concatenate([head, np.full(n, 1000), plan.r]).astype(np.int64)

    def read_back_async(x):
        log.append(("async",))
        return np.asarray(x), types.SimpleNamespace(synchronize=lambda: log.append(("wait",)))

    monkeypatch.setattr(route_mod, "_head_counts", head_counts)
    monkeypatch.setattr(route_mod, "plan_stage", plan_stage)
    monkeypatch.setattr(route_mod, "_sample", sample)
    monkeypatch.setattr(route_mod, "read_back_async", read_back_async)
    return log


def _chunk(monkeypatch, one: bool, chunk: bool, tie_flag: bool, positive: int, survival):
    """The stubs installed (``_install``) with the read-back switches, and a chunk of 1,024
    queries with ``positive`` positive heads: (batch, options, ``head_prefetch``'s histogram,
    the stubs' log)."""
    monkeypatch.setattr(route_mod, "ONE_READBACK", one)
    monkeypatch.setattr(route_mod, "CHUNK_PLANS", chunk)
    log = _install(monkeypatch, tie_flag, survival)
    monkeypatch.setattr(route_mod, "auto_pick", lambda r, h: ("wgt", 30) if h[40:].sum() else
                        ("wgt", 6))  # fmt: skip
    b = _Batch(1024, positive)
    o = dict(route="auto", screen="auto", r=14, cert_seeds=0, tie_reject=True, seed_ids=None,
             tau_floor=None)  # fmt: skip
    hist = route_mod.head_prefetch(b, o)
    assert (hist is not None) == one
    return b, o, hist, log


def _chunk_seeds():
    """The stand-in of a chunk's seeds: what the samples' plans read."""
    return types.SimpleNamespace(pool=np.arange(10), pcount=None)


def _decide(monkeypatch, one: bool, chunk: bool, tie_flag: bool, positive: int, survival):
    b, o, hist, log = _chunk(monkeypatch, one, chunk, tie_flag, positive, survival)
    return route_mod.route_stage(b, _chunk_seeds(), None, o, NEVER_DENSE, hist), log


SURV = {(s, r, t): v for (s, r), v in {("wgt", 6): 0.02, ("wgt", 30): 0.01, ("wgt", 14): 0.03}
        .items() for t, v in ((False, v), (True, v / 2))}  # fmt: skip


@pytest.mark.parametrize("tie_flag", [False, True])
@pytest.mark.parametrize("positive", [3, 50])  # one candidate (wgt 6); two (wgt 30, wgt 14)
@pytest.mark.parametrize("chunk", [False, True])
def test_one_read_back_decides_as_two(monkeypatch, tie_flag, positive, chunk):
    two, log2 = _decide(monkeypatch, False, chunk, tie_flag, positive, SURV)
    one, log1 = _decide(monkeypatch, True, chunk, tie_flag, positive, SURV)
    fields = ("route", "reason", "screen", "r", "tie", "predicted_ms", "survival", "sample")
    assert all(getattr(one, f) == getattr(two, f) for f in fields)
    assert np.array_equal(one.bound_work, two.bound_work)
    assert one.tie is tie_flag
    # the two read-backs ask for the histogram with the counts; one read-back asks for the
    # counts alone, and samples the plain build first, again on the tie build if flagged
    assert ("head", True) in log2 and ("head", True) not in log1 and ("head", False) in log1
    builds = [e[3] for e in log1 if e[0] == "sample"]
    ncand = 2 if positive == 50 else 1
    assert builds == [False] * ncand + ([True] * ncand if tie_flag else [])
    assert [e[3] for e in log2 if e[0] == "sample"] == [tie_flag] * ncand


@pytest.mark.parametrize("positive", [3, 50])
def test_chunk_plan_kept_when_the_first_candidate_wins(monkeypatch, positive):
    """``CHUNK_PLANS``: one plan of the whole chunk (1,024 queries) per decision, the first
    candidate's, queued after the samples' read-back copy and before its wait; kept exactly
    when that candidate wins."""
    surv = dict(SURV)
    for first_wins in (True, False):
        if positive == 50:  # candidates wgt 30 then wgt 14: make either the cheaper one
            surv[("wgt", 30, False)] = 0.001 if first_wins else 0.2
            surv[("wgt", 14, False)] = 0.2 if first_wins else 0.001
        choice, log = _decide(monkeypatch, False, True, False, positive, surv)
        chunk = [e for e in log if e[0] == "plan" and e[1] == 1024]
        assert len(chunk) == 1 and log.index(("async",)) < log.index(chunk[0]) < log.index(
            ("wait",))  # fmt: skip
        assert choice.route == "dosa"
        wins = (choice.screen, choice.r) == (("wgt", 6) if positive == 3 else ("wgt", 30))
        assert wins == (first_wins or positive == 3)
        assert (choice.plan is not None) == wins
        if wins:
            assert choice.plan.Qn == 1024 and choice.plan.r_max == choice.r


ALWAYS_DENSE = dataclasses.replace(
    cost.H200_FP8, logits_flop_per_ms={32: np.inf, 64: np.inf}, logits_fixed_ms=0.0,
    select_fixed_ms=0.0, select_ms_per_key=0.0,
)  # fmt: skip


@pytest.mark.parametrize("dense_wins", [False, True])
@pytest.mark.parametrize("tie_flag", [False, True])
@pytest.mark.parametrize("positive", [3, 50])
def test_sample_seeds_decide_as_the_chunk_seeds(monkeypatch, tie_flag, positive, dense_wins):
    """``SAMPLE_SEEDS``: given the chunk's anchor pool instead of its seeds, the route stage
    seeds the sampled rows once (``_sample_seeds``, n = the candidates' sample size) and
    decides as it does on the chunk's seeds — the same route, screen, r, predictions and
    survival — but leaves the chunk's rule undecided (the sample's flag chose the samples'
    build only) and returns the seeds it scored.  The chunk's seeds are queued once, after
    the samples' read-back copy and before its wait, with a fresh cancellation: handed on
    where DoSA wins, cancelled where the dense route does — and cancelled before the samples
    are taken again on the tie-aware build (which must not wait behind them; the pipeline
    then seeds the chunk after the decision)."""
    model = ALWAYS_DENSE if dense_wins else NEVER_DENSE
    b, o, hist, log = _chunk(monkeypatch, True, False, tie_flag, positive, SURV)
    full = route_mod.route_stage(b, _chunk_seeds(), None, o, model, hist)
    monkeypatch.setattr(route_mod, "SAMPLE_SEEDS", True)
    assert route_mod.sample_seeding_wanted(o, hist)
    assert not route_mod.sample_seeding_wanted(dict(o, tau_floor=np.zeros(1024)), hist)
    assert not route_mod.sample_seeding_wanted(dict(o, seed_ids=np.zeros((1024, 1))), hist)
    assert not route_mod.sample_seeding_wanted(o, None)
    calls = []

    def sample_seeds(b, ap, o, n):
        calls.append((ap, n))
        return _chunk_seeds(), "scored"

    class Cancel:
        made = []

        def __init__(self):
            self.fired = False
            Cancel.made.append(self)

        @staticmethod
        def new():
            return Cancel()

        def fire(self):
            log.append(("fire",))
            self.fired = True

    def seed_stage(b, o, ap=None, cancel=None):
        log.append(("chunk seeds", cancel))
        return "chunk seeds"

    monkeypatch.setattr(route_mod, "_sample_seeds", sample_seeds)
    monkeypatch.setattr(route_mod, "SeedCancel", Cancel)
    monkeypatch.setattr(route_mod, "seed_stage", seed_stage)
    log.clear()
    ap = route_mod.AnchorPool(None, np.arange(10), None, None, None)
    got = route_mod.route_stage(b, ap, None, o, model, hist)
    assert calls == [(ap, cost.sample_size("wgt"))]
    for f in ("route", "reason", "screen", "r", "predicted_ms", "survival", "sample"):
        assert getattr(got, f) == getattr(full, f), f
    assert got.route == ("dense" if dense_wins else "dosa")
    assert got.tie is None and full.tie is tie_flag and got.scored_seeds == "scored"
    (cancel,) = Cancel.made
    queued = [e for e in log if e[0] == "chunk seeds"]
    assert queued == [("chunk seeds", cancel)]
    at = log.index(("async",))  # the samples' read-back (the histogram's wait is before it)
    assert at < log.index(queued[0]) < log.index(("wait",), at)
    assert cancel.fired == (dense_wins or tie_flag) and log.count(("fire",)) == cancel.fired
    builds = [e[3] for e in log if e[0] == "sample"]
    ncand = 2 if positive == 50 else 1
    assert builds == [False] * ncand + ([True] * ncand if tie_flag else [])
    if tie_flag:  # cancelled before the retaken samples
        first_tie = next(i for i, e in enumerate(log) if e[0] == "sample" and e[3])
        assert log.index(("fire",)) < first_tie
    handed = not dense_wins and not tie_flag
    assert got.chunk_seeds == ("chunk seeds" if handed else None)


def test_seed_cancel_epochs_are_never_shared(monkeypatch):
    """``seeds.SeedCancel.new``: one flag and stream per device, and an epoch per call that no
    other call gets, also when calls come from several threads at once (a shared epoch would
    let one call's cancellation stop another call's seeds); every epoch is above the flag's
    initial 0."""
    import threading

    from dosa_cupy import seeds

    shim = types.SimpleNamespace(
        zeros=np.zeros, int64=np.int64,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                   Stream=lambda non_blocking: object()),
    )  # fmt: skip
    monkeypatch.setattr(seeds, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(seeds, "_CANCEL", {})
    got = [[] for _ in range(4)]

    def take(out):
        out.extend(seeds.SeedCancel.new() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [c for g in got for c in g]
    assert len({c.epoch for c in made}) == len(made) == 8000
    assert min(c.epoch for c in made) > 0
    assert len({id(c.flag) for c in made}) == 1 and len({id(c.stream) for c in made}) == 1
    assert made[0].args()[1] == np.int64(made[0].epoch)
