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

    def route_head(b, seeds, tie_reject, hist, out):  # head_prefetch's: the histogram alone
        assert seeds is None and hist
        out[3:] = route_mod.positive_heads_hist(b.w, np)

    monkeypatch.setattr(route_mod, "_head_counts", head_counts)
    monkeypatch.setattr(route_mod, "_route_head", route_head)
    monkeypatch.setattr(route_mod, "plan_stage", plan_stage)
    monkeypatch.setattr(route_mod, "_sample", sample)
    monkeypatch.setattr(route_mod, "read_back_async", read_back_async)
    return log


def _decide(monkeypatch, one: bool, chunk: bool, tie_flag: bool, positive: int, survival):
    monkeypatch.setattr(route_mod, "ONE_READBACK", one)
    monkeypatch.setattr(route_mod, "CHUNK_PLANS", chunk)
    log = _install(monkeypatch, tie_flag, survival)
    monkeypatch.setattr(route_mod, "auto_pick", lambda r, h: ("wgt", 30) if h[40:].sum() else
                        ("wgt", 6))  # fmt: skip
    b = _Batch(1024, positive)
    o = dict(route="auto", screen="auto", r=14, cert_seeds=0, tie_reject=True)
    hist = route_mod.head_prefetch(b, o)
    assert (hist is not None) == one
    seeds = types.SimpleNamespace(pool=np.arange(10), pcount=None)
    return route_mod.route_stage(b, seeds, None, o, NEVER_DENSE, hist), log


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
