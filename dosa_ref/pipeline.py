"""Algorithm 1 (docs/method.md §7): exact Top-K with certificate screening, one per-query loop
for both bounds (the float64 certificate of ``dosa_topk`` and the FP8 numerical
certificate of ``fp8_topk``).

Per query, stage by stage (``prepare`` → ``seeds`` → ``cost``/plan → ``screen`` → ``refine``
→ ``select``): seeds S → τ = τ_K(S) (Prop. 4) → r from the cost model, or dense scoring when
screening would not pay (docs/method.md §6 "Cost") → plan (R, anchors, A) → U for every
visible key → certificate-guided seeds (τ rises; re-plan once if the cost model now
prefers another r) → screen V = {i ∉ S : U_i ≥ τ} → score V with the original scorer,
keep C = {s ≥ τ} in the buffer → TopK(S ∪ C) (Theorem 1).  A bound that proves nothing
sends the query to full-domain recovery (C.3), and so does a query whose scores the
finiteness envelope cannot prove finite (docs/method.md §1 "The scorer's domain"): full
scoring then raises the brute force's own error wherever a visible score overflows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .certificate import slack
from .cost import RChoice, aux_rows, choose_r
from .error_model import DEFAULT_MODEL, ErrorModel
from .fp8 import dequantize
from .options import SelectStats
from .plan import Plan, activation_frequency, build_plan
from .prepare import Chunk, QueryContext, check_fp8_inputs, prepare_chunk, prepare_fp8
from .refine import refine
from .scorer import finite_envelope, index_scores, topk_ids, topk_of
from .screen import Float64Bound, FP8Bound, ScreenRule, zero_plateau
from .seeds import SeedSet, add_certificate_seeds, seed_set, stride_sample
from .select import CandidateBuffer, full_topk

__all__ = [
    "DosaResult",
    "DosaStats",
    "FP8Result",
    "FP8Stats",
    "dosa_topk",
    "fp8_topk",
    "run_queries",
    "topk_check",
]


@dataclass
class DosaStats(SelectStats):
    """``SelectStats`` (the shared vocabulary, ``options.STATS``) plus ``slack``: mean Prop. 6
    components per screened query over a key sample (option ``slack_sample``)."""

    slack: dict = field(default_factory=dict)

    def totals(self) -> dict:
        d = super().totals()
        d.update({f"slack_{k}": float(np.nanmean(v)) for k, v in self.slack.items()})
        return d


@dataclass
class FP8Stats(DosaStats):
    """``DosaStats`` plus the guard's cost: survivors_exact — keys (outside the seeds)
    with exact-arithmetic certificate U ≥ τ for the same plan and τ; invalid_keys — keys
    whose bound was +inf (invalid scale/summary)."""

    survivors_exact: np.ndarray = None
    invalid_keys: np.ndarray = None

    def __post_init__(self):
        super().__post_init__()
        self.survivors_exact = np.zeros(self.Qn, dtype=np.int64)
        self.invalid_keys = np.zeros(self.Qn, dtype=np.int64)

    @property
    def survival_exact(self) -> float:
        n = int(self.screened.sum())
        return float(self.survivors_exact.sum()) / n if n else float("nan")

    def totals(self) -> dict:
        d = super().totals()
        d.update(
            survivors_exact=int(self.survivors_exact.sum()),
            survival_exact=self.survival_exact,
            guard_cost_pp=100.0 * (self.survival - self.survival_exact),
            invalid_keys=int(self.invalid_keys.sum()),
        )
        return d


@dataclass
class DosaResult:
    """``ids`` int64 [Qn, K] (the ``topk_ids`` contract) and ``stats`` (DosaStats)."""

    ids: np.ndarray
    stats: DosaStats


@dataclass
class FP8Result(DosaResult):
    """``DosaResult`` plus ``plans`` (FP8ScreenPlan or None per query) and ``tau``
    (float64 [Qn], the seed threshold used for screening; −inf when not screened)."""

    plans: list = None
    tau: np.ndarray = None


def dosa_topk(q, w, k, K, ks=None, ke=None, progress=None, **options) -> DosaResult:
    """Exact Top-K of the original scorer with certificate screening (Algorithm 1).

    Args:
        q: [Qn, H, D], w: [Qn, H], k: [N, D] (float32/float64); K ≥ 1;
        ks, ke: int [Qn] visible ranges (default all keys).
        progress: optional callable, called once per finished query.
        **options: see ``options.SelectOptions``.
    Returns:
        DosaResult: ``ids`` int64 [Qn, K], equal to ``topk_ids(index_scores(...), K)``
        (score desc, id asc, −1 padding); ``stats`` per query (DosaStats).
    """
    chunk = prepare_chunk(q, w, k, K, ks, ke, options)
    st = DosaStats(chunk.Qn)
    ids = run_queries(chunk, st, Float64Bound(chunk.opt.form), progress)
    return DosaResult(ids=ids, stats=st)


_FP8_ONLY = ("error_model", "guard_stats")


def fp8_topk(q, w, payload, scale, K, ks=None, ke=None, progress=None, **options) -> FP8Result:
    """Exact Top-K on FP8 keys with the numerical certificate (Algorithm 1, docs/method.md §8).

    Args:
        q [Qn, H, D], w [Qn, H]: query heads and weights (float; for FP8 queries pass
            ``e4m3_values(q_payload)`` and the folded weights of ``quantize_queries``).
        payload uint8 [N, D], scale float32 [N]: FP8 keys (``quantize_keys``).
        K ≥ 1; ks, ke: visible ranges.  progress: callable per finished query.
        **options: ``SelectOptions`` fields, plus ``error_model`` (ErrorModel, default
            ``ErrorModel.hopper_fp8()``) and ``guard_stats`` (count exact-certificate
            survivors for the guard's cost; default True).
    Returns:
        FP8Result with ``ids`` == ``topk_ids(index_scores(q, w, dequantize(payload,
        scale)), K)`` (score desc, id asc, −1 padding), ``stats`` (FP8Stats), ``plans``.
    Raises ValueError for NaN payload codes or non-finite scales (the reference scorer is
    undefined there); a non-positive scale only disables pruning for that key.
    """
    options = dict(options)
    extra = {k_: options.pop(k_) for k_ in _FP8_ONLY if k_ in options}
    model = extra.get("error_model") or DEFAULT_MODEL
    if not isinstance(model, ErrorModel):
        raise ValueError("error_model: expected an ErrorModel")
    chunk, keys = prepare_fp8(q, w, payload, scale, K, ks, ke, options)
    st = FP8Stats(chunk.Qn)
    guard_stats = bool(extra.get("guard_stats", True))
    bound = FP8Bound(keys, model, chunk.opt.form, guard_stats, chunk.Qn)
    ids = run_queries(chunk, st, bound, progress)
    return FP8Result(ids=ids, stats=st, plans=bound.plans, tau=st.tau.copy())


def topk_check(q, w, payload, scale, K, ks=None, ke=None) -> np.ndarray:
    """Reference ids int64 [Qn, K]: full float64 scoring of the dequantized keys."""
    q, w, payload, scale = check_fp8_inputs(q, w, payload, scale, strict=True)
    return topk_ids(index_scores(q, w, dequantize(payload, scale), ks, ke), K)


def run_queries(chunk: Chunk, st: DosaStats, bound, progress=None) -> np.ndarray:
    """Algorithm 1's outer loop: a query is scored densely when screening cannot pay by
    rule (|Ω| ≤ K, H = 1, r ≥ H) or when its scores are not proven finite (recovered),
    and otherwise screened with ``bound`` (Float64Bound or FP8Bound).  Returns ids int64
    [Qn, K] with −1 padding; fills ``st``.  Raises ``scorer.SCORE_OVERFLOW`` where a
    visible score overflows."""
    Qn, H, K, opt = chunk.Qn, chunk.H, chunk.K, chunk.opt
    ids_out = np.full((Qn, K), -1, dtype=np.int64)
    st.anchor_scored = chunk.anchor_scored
    no_screen = H == 1 or (opt.r != "auto" and int(opt.r) >= H)
    slack_acc: dict[str, list] = {}
    for t in range(Qn):
        a, b = int(chunk.ks[t]), int(chunk.ke[t])
        ctx = QueryContext(t, a, b, chunk.q[t], chunk.w[t], chunk, st)
        st.visible[t] = b - a
        if b - a <= K or no_screen:
            top, sc = full_topk(ctx)
            st.dense[t], st.scored[t] = True, b - a
        elif not finite_envelope(ctx.q_t, ctx.w_t, chunk.k_amax):
            # No bound is trusted where a score may overflow: every visible key is scored,
            # so the call raises exactly where the brute force raises (scorer.SCORE_OVERFLOW).
            top, sc = full_topk(ctx)
            st.dense[t] = st.recovered[t] = True
            st.scored[t] = b - a
        else:
            top, sc = _screened_query(ctx, bound, slack_acc)
        ids_out[t, : top.size] = top
        if top.size == K:
            st.tau_final[t] = sc[-1]
        if progress is not None:
            progress(t)
    for name, vals in slack_acc.items():
        st.slack[name] = np.array(vals)
    return ids_out


def _pick_r(ctx: QueryContext, p: np.ndarray, tau: float, seeds: SeedSet) -> RChoice:
    """The cost model's choice (r="auto") or the fixed r, with the model's inputs."""
    c, opt = ctx.chunk, ctx.chunk.opt
    f = seeds.ids.size / ctx.visible
    if opt.r != "auto":
        return RChoice(int(opt.r), False, f, float("nan"), float("nan"), 0.0)
    ids = stride_sample(ctx.a, ctx.b, 512)
    sample = c.k[ids]
    survive = None
    if opt.tie_reject and np.isfinite(tau):
        # m under the rule the screen will apply (docs/method.md §7 "Tie-aware rejection
        # and zero plateaus"): on a plateau with τ = 0 the plain U ≥ τ keeps every key
        rule = ScreenRule(tau, seeds.ids, ctx.a, int(topk_of(seeds.scores, seeds.ids, c.K)[0][-1]))
        plateau = zero_plateau(ctx.q_t, ctx.w_t, sample)
        survive = lambda plan, U: rule.alive(U, ids, plateau if plan.P.size == 0 else None)  # noqa: E731
    ch = choose_r(ctx.q_t, ctx.w_t, p, tau, sample, c.opt.plan, opt.form, f, survive)
    ctx.st.bound_work[ctx.t] += ch.sample_work
    return ch if opt.auto_dense else replace(ch, dense=False)


def _plan_and_bound(ctx: QueryContext, bound, p: np.ndarray, r: int):
    """Step 3: the plan with r retained heads and the bound of every visible key
    (None when it proves nothing)."""
    st, t = ctx.st, ctx.t
    plan = build_plan(ctx.q_t, ctx.w_t, p, r, ctx.chunk.opt.plan)
    st.r[t], st.omitted_positive[t], st.aggregated[t] = plan.r, plan.P.size, plan.A.size
    st.bound_work[t] += ctx.visible * (plan.r + aux_rows(ctx.chunk.opt.form)) / ctx.chunk.H
    return plan, bound.evaluate(ctx, plan)


def _screened_query(ctx: QueryContext, bound, slack_acc: dict):
    c, st, t, K = ctx.chunk, ctx.st, ctx.t, ctx.chunk.K
    seeds = seed_set(ctx)
    st.seeds[t], st.explicit_seeds[t] = seeds.ids.size, seeds.explicit
    S = seeds.ids
    if S.size >= ctx.visible:  # the seeds are every visible key: no bound can save work
        return _dense_rest(ctx, seeds)
    p = activation_frequency(ctx.q_t, c.k[S[stride_sample(0, S.size, 1024)]])
    tau0 = seeds.tau(K)
    choice = _pick_r(ctx, p, tau0, seeds)
    cert = "certificate" in c.strategies and c.cert_seeds > 0
    plan = U = None
    if cert or not choice.dense:
        plan, U = _plan_and_bound(ctx, bound, p, choice.r)
        if U is None:
            return _recover(ctx, seeds)
    if cert:
        seeds = add_certificate_seeds(ctx, U, seeds, c.cert_seeds)
        st.cert_seeds[t] = seeds.ids.size - st.seeds[t]
        tau1 = seeds.tau(K)
        if c.opt.r == "auto" and tau1 > tau0:
            # τ rose: the cost model may now prefer another r (a loose τ makes every r
            # look alike and picks the smallest) or screening at all; re-plan once.
            choice = _pick_r(ctx, p, tau1, seeds)
            if not choice.dense and choice.r != plan.r:
                plan, U = _plan_and_bound(ctx, bound, p, choice.r)
                if U is None:
                    return _recover(ctx, seeds)
    st.est_survival[t], st.est_work[t] = choice.est_survival, choice.est_work
    if choice.dense or seeds.ids.size < K:
        return _dense_rest(ctx, seeds)

    buf = CandidateBuffer(K, c.opt.buffer, seeds.ids, seeds.scores, c.opt.tie_reject)
    st.tau[t] = buf.tau
    floor = -np.inf if c.tau_floor is None else float(c.tau_floor[t])
    # A floor above the seeds' τ (another shard's τ, docs/method.md §12 "Sharded contexts")
    # screens with the plain rule U < floor: a key below it is in no Top-K of the context.
    if floor > buf.tau:
        rule = ScreenRule(floor, seeds.ids, ctx.a)
    else:
        rule = _screen_rule(ctx, plan, seeds, buf)
    bound.screened(ctx, plan, seeds, rule)
    V = rule.survivors(U)
    st.screened[t] = ctx.visible - seeds.ids.size
    st.survivors[t] = V.size
    if rule.kth_id is not None:
        st.tie_rejected[t] = ScreenRule(buf.tau, seeds.ids, ctx.a).survivors(U).size - V.size
    refine(ctx, V, buf)
    _finish(ctx, seeds, V, buf)
    if c.opt.slack_sample:
        _slack_sample(ctx, plan, slack_acc)
    return buf.result()


def _screen_rule(ctx: QueryContext, plan: Plan, seeds: SeedSet, buf: CandidateBuffer):
    """Step 4's rule: plain (U < τ rejects) or, with ``tie_reject``, tie-aware at the K-th
    seed record (τ, j), with the zero plateau bound where every positive head is retained
    (P = ∅, so the retained dots certify them; docs/method.md §3, §7 "Tie-aware rejection
    and zero plateaus")."""
    if not ctx.chunk.opt.tie_reject:
        return ScreenRule(buf.tau, seeds.ids, ctx.a)
    plateau = None
    if plan.P.size == 0:
        plateau = zero_plateau(ctx.q_t, ctx.w_t, ctx.chunk.k[ctx.a : ctx.b])
    return ScreenRule(buf.tau, seeds.ids, ctx.a, buf.kth_id, plateau)


def _finish(ctx: QueryContext, seeds: SeedSet, refined: np.ndarray, buf: CandidateBuffer):
    st, t = ctx.st, ctx.t
    st.refined[t] = refined.size
    st.kept[t], st.overflows[t] = buf.kept, buf.overflows
    st.scored[t] = seeds.ids.size + refined.size


def _dense_rest(ctx: QueryContext, seeds: SeedSet):
    """Dense route after seeding: score every visible non-seed key and select exactly from
    S ∪ those (the seeds' scores are the canonical ones, so nothing is scored twice)."""
    st, t = ctx.st, ctx.t
    st.dense[t] = True
    st.r[t] = st.omitted_positive[t] = st.aggregated[t] = 0
    opt = ctx.chunk.opt
    buf = CandidateBuffer(ctx.chunk.K, opt.buffer, seeds.ids, seeds.scores, opt.tie_reject)
    rest = np.setdiff1d(np.arange(ctx.a, ctx.b, dtype=np.int64), seeds.ids)
    refine(ctx, rest, buf)
    _finish(ctx, seeds, rest, buf)
    return buf.result()


def _recover(ctx: QueryContext, seeds: SeedSet):
    """C.3: a bound that proves nothing; full-domain recovery (seeds ∪ every other key)."""
    ctx.st.recovered[ctx.t] = True
    return _dense_rest(ctx, seeds)


def _slack_sample(ctx: QueryContext, plan: Plan, slack_acc: dict) -> None:
    ks_ = ctx.chunk.k[stride_sample(ctx.a, ctx.b, ctx.chunk.opt.slack_sample)]
    for name, v in slack(plan, ctx.q_t, ctx.w_t, ks_).items():
        slack_acc.setdefault(name, []).append(float(np.mean(v)))
