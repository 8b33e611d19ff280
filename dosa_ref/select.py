"""Algorithm 1 (docs/method.md §7): exact Top-K with certificate screening, a bounded candidate
buffer that is reduced by exact merging (never by dropping), and full-domain recovery.

Per query: seeds S → τ = τ_K(S) (Prop. 4) → plan (R, anchors, A) → U for every visible
key → screen V = {i ∉ S : U_i ≥ τ} (strict rejection U < τ; equality survives) → score V
with the original scorer → keep C = {s ≥ τ} in the buffer → TopK(S ∪ C) (Theorem 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .certificate import FORMS, KeySummary, upper_bound
from .options import parse_strategies
from .plan import PlanOptions, activation_frequency, build_plan
from .scorer import score_keys, topk_of
from .seeds import anchor_pool, explicit_seeds, kth_score, local_seeds
from .validate import check_K, check_qwk, check_ranges

__all__ = ["DosaResult", "DosaStats", "SelectOptions", "choose_r", "dosa_topk"]


@dataclass(frozen=True)
class SelectOptions:
    """Options of ``dosa_topk`` (all keyword arguments; unknown names raise ValueError).

    seeds: strategies joined by "+" (``options.STRATEGIES``); seed_ids: explicit ids
    [Qn, S] (−1 pads) for "explicit"; window / sinks: local seeds; n_anchors: anchor
    queries; cert_seeds: keys scored by the certificate-guided rule.
    r: retained heads, "auto" (cost model, ``choose_r``) or an int (r ≥ H: full scoring).
    form: "base" (eq. (9)) or "abs" (absolute-value form).
    buffer: candidate-buffer capacity in records (≥ 1); overflow merges exactly.
    refine_batch: survivors scored per batch.  slack_sample: keys per query on which the
    Prop. 6 slack components are averaged for ``stats`` (0 = off).
    Plan switches: neg_aggregate, neg_priority, pos_projection, allowance, groups.
    """

    seeds: str = "local+anchor+certificate"
    seed_ids: object = None
    window: int = 2048
    sinks: int = 16
    n_anchors: int = 4
    cert_seeds: int = 2048
    r: object = "auto"
    form: str = "base"
    buffer: int = 65536
    refine_batch: int = 16384
    slack_sample: int = 0
    neg_aggregate: str = "majority"
    neg_priority: str = "activation"
    pos_projection: bool = True
    allowance: str = "grouped"
    groups: int = 4

    def __post_init__(self):
        parse_strategies(self.seeds)
        for name in ("window", "sinks", "n_anchors", "cert_seeds", "slack_sample"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name}: expected a nonnegative integer, got {v!r}")
        for name in ("buffer", "refine_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if self.r != "auto" and (
            isinstance(self.r, bool) or not isinstance(self.r, (int, np.integer)) or self.r < 1
        ):
            raise ValueError(f"r: expected 'auto' or a positive integer, got {self.r!r}")
        if self.form not in FORMS:
            raise ValueError(f"form: expected one of {FORMS}, got {self.form!r}")
        self.plan_options()  # validates the plan switches

    def plan_options(self) -> PlanOptions:
        return PlanOptions(
            neg_aggregate=self.neg_aggregate,
            neg_priority=self.neg_priority,
            pos_projection=self.pos_projection,
            allowance=self.allowance,
            groups=self.groups,
        )

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> SelectOptions:
        names = {f.name for f in fields(cls)}
        for key in kwargs:
            if key not in names:
                raise ValueError(f"{key}: unknown option; expected one of {sorted(names)}")
        return cls(**kwargs)


_PER_QUERY = (
    "seeds",
    "screened",
    "survivors",
    "refined",
    "kept",
    "overflows",
    "r",
    "omitted_positive",
    "aggregated",
)


@dataclass
class DosaStats:
    """Per-query statistics of ``dosa_topk`` (arrays of length Qn).

    seeds: |S| scored seeds; tau: τ from seeds; tau_final: K-th selected score (the true
    τ*, since the result is exact; −inf when fewer than K visible); tau_gap: (τ* − τ)/|τ*|;
    screened: |Ω \\ S|; survivors: |V| (U ≥ τ); refined: keys scored after screening;
    kept: records written (s ≥ τ at the time); overflows: exact buffer merges;
    recovered: full-domain recovery (non-finite bound); full: scored fully by rule
    (|Ω| ≤ K, too few seeds, or r ≥ H); r: retained heads; omitted_positive: |P|;
    aggregated: |A|; slack_*: mean Prop. 6 components over a key sample (if asked).
    """

    Qn: int
    seeds: np.ndarray = None
    tau: np.ndarray = None
    tau_final: np.ndarray = None
    screened: np.ndarray = None
    survivors: np.ndarray = None
    refined: np.ndarray = None
    kept: np.ndarray = None
    overflows: np.ndarray = None
    recovered: np.ndarray = None
    full: np.ndarray = None
    r: np.ndarray = None
    omitted_positive: np.ndarray = None
    aggregated: np.ndarray = None
    slack: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in _PER_QUERY:
            setattr(self, name, np.zeros(self.Qn, dtype=np.int64))
        self.tau = np.full(self.Qn, -np.inf)
        self.tau_final = np.full(self.Qn, -np.inf)
        self.recovered = np.zeros(self.Qn, dtype=bool)
        self.full = np.zeros(self.Qn, dtype=bool)

    @property
    def tau_gap(self) -> np.ndarray:
        """Relative τ gap (τ* − τ)/|τ*| per query (nan where undefined)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            g = (self.tau_final - self.tau) / np.abs(self.tau_final)
        ok = np.isfinite(self.tau_final) & np.isfinite(self.tau)
        return np.where(ok, g, np.nan)

    @property
    def survival(self) -> float:
        """Σ survivors / Σ screened over screened queries (1 − pruning)."""
        n = int(self.screened.sum())
        return float(self.survivors.sum()) / n if n else float("nan")

    @property
    def pruning(self) -> float:
        """p = 1 − N_keep/N_screen with N_keep the keys that survive screening."""
        return 1.0 - self.survival

    @property
    def scored_fraction(self) -> float:
        """Keys scored with all H heads (seeds + refined) / keys screened-or-seeded."""
        n = int(self.screened.sum() + self.seeds.sum())
        return float(self.seeds.sum() + self.refined.sum()) / n if n else float("nan")

    def totals(self) -> dict:
        d = {name: int(getattr(self, name).sum()) for name in _PER_QUERY if name != "r"}
        d.update(
            queries=self.Qn,
            recovered=int(self.recovered.sum()),
            full=int(self.full.sum()),
            survival=self.survival,
            pruning=self.pruning,
            tau_gap_median=float(np.nanmedian(self.tau_gap))
            if np.any(~np.isnan(self.tau_gap))
            else float("nan"),
            scored_fraction=self.scored_fraction,
            positive_projection_rows=float(np.mean(self.omitted_positive > 0)) if self.Qn else 0.0,
        )
        d.update({f"slack_{k}": float(np.nanmean(v)) for k, v in self.slack.items()})
        return d


@dataclass
class DosaResult:
    """``ids`` int64 [Qn, K] (the ``topk_ids`` contract) and ``stats`` (DosaStats)."""

    ids: np.ndarray
    stats: DosaStats


def _stride_sample(a: int, b: int, m: int) -> np.ndarray:
    n = b - a
    if n <= m:
        return np.arange(a, b, dtype=np.int64)
    return (a + (np.arange(m, dtype=np.int64) * n) // m).astype(np.int64)


def choose_r(
    q_t: np.ndarray,
    w_t: np.ndarray,
    p: np.ndarray,
    tau: float,
    k_sample: np.ndarray,
    plan_options: PlanOptions,
    form: str = "base",
) -> int:
    """Per-query default r from the cost model of docs/method.md §6.

    work_DoSA/work_dense ≈ (r + d_a)/H + m(r) for the screened keys, with d_a = 2
    auxiliary FP8 rows (v0 + v1) in the base form and 1 (V) in the absolute-value form,
    and m(r) the survivor fraction estimated on a stride sample of visible keys against
    the seed τ.  r runs over 1..H−1 (stride ⌈H/16⌉); ties go to the smaller r.  Without a
    finite τ there is nothing to estimate and r = ⌊H/2⌋ (the paper's H=32 → r=16).
    """
    H = q_t.shape[0]
    if not np.isfinite(tau) or k_sample.shape[0] == 0:
        return max(1, H // 2)
    d_a = 2 if form == "base" else 1
    best, best_cost = max(1, H // 2), np.inf
    ksum = KeySummary(k_sample)
    for r in range(1, H, max(1, -(-H // 16))):
        plan = build_plan(q_t, w_t, p, r, plan_options)
        U = upper_bound(plan, k_sample, form, "up", q_t, w_t, ksum)
        cost = (r + d_a) / H + float(np.mean(U >= tau))
        if cost < best_cost:
            best, best_cost = r, cost
    return best


class _Buffer:
    """Candidate records (id, original score) with exact overflow reduction (C.3).

    ``top`` holds the exact Top-K of everything merged so far (seeds first) and ``tau``
    its K-th score; ``buf`` holds at most ``capacity`` records with s ≥ tau.  When full,
    buf is merged into top by exact Top-K — a record not in the Top-K of a subset can
    never be in the Top-K of the whole — which can only raise tau.
    """

    def __init__(self, K: int, capacity: int, seed_ids: np.ndarray, seed_scores: np.ndarray):
        self.K, self.capacity = K, capacity
        self.top_ids, self.top_scores = topk_of(seed_scores, seed_ids, K)
        self.tau = kth_score(self.top_scores, K)
        self.buf_ids: list[np.ndarray] = []
        self.buf_scores: list[np.ndarray] = []
        self.size = 0
        self.kept = 0
        self.overflows = 0

    def _merge(self):
        ids = np.concatenate([self.top_ids, *self.buf_ids])
        sc = np.concatenate([self.top_scores, *self.buf_scores])
        self.top_ids, self.top_scores = topk_of(sc, ids, self.K)
        self.tau = kth_score(self.top_scores, self.K)
        self.buf_ids, self.buf_scores, self.size = [], [], 0

    def offer(self, ids: np.ndarray, scores: np.ndarray):
        """Write records with s ≥ τ (the current τ); merge exactly when full."""
        while ids.size:
            keep = scores >= self.tau
            ids, scores = ids[keep], scores[keep]
            take = min(ids.size, self.capacity - self.size)
            if take:
                self.buf_ids.append(ids[:take])
                self.buf_scores.append(scores[:take])
                self.size += take
                self.kept += take
                ids, scores = ids[take:], scores[take:]
            if ids.size:
                self.overflows += 1
                self._merge()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self.top_ids, self.top_scores


def _full_topk(q_t, w_t, k, a, b, K):
    ids = np.arange(a, b, dtype=np.int64)
    return topk_of(score_keys(q_t, w_t, k[a:b]), ids, K)


def dosa_topk(q, w, k, K, ks=None, ke=None, progress=None, **options) -> DosaResult:
    """Exact Top-K of the original scorer with certificate screening (Algorithm 1).

    Args:
        q: [Qn, H, D], w: [Qn, H], k: [N, D] (float32/float64); K ≥ 1;
        ks, ke: int [Qn] visible ranges (default all keys).
        progress: optional callable, called once per finished query.
        **options: see ``SelectOptions``.
    Returns:
        DosaResult: ``ids`` int64 [Qn, K], equal to ``topk_ids(index_scores(...), K)``
        (score desc, id asc, −1 padding); ``stats`` per query.
    """
    q, w, k = check_qwk(q, w, k)
    K = check_K(K)
    Qn, H, D = q.shape
    N = k.shape[0]
    ks, ke = check_ranges(ks, ke, Qn, N)
    opt = SelectOptions.from_kwargs(options)
    strategies, seed_ids, pool = _seed_sources(q, w, k, ks, ke, K, opt)
    popt = opt.plan_options()
    st = DosaStats(Qn)
    ksum = None  # key summaries, built on first use and shared by all queries
    slack_acc: dict[str, list] = {}

    def screened(t, a, b):
        nonlocal ksum
        if ksum is None:
            ksum = KeySummary(k)
        return _screened_query(
            t, q[t], w[t], k, a, b, K, opt, popt, strategies, seed_ids, pool, st, slack_acc, ksum
        )

    ids_out = _per_query(q, w, k, K, ks, ke, opt, st, screened, progress)
    for name, vals in slack_acc.items():
        st.slack[name] = np.array(vals)
    return DosaResult(ids=ids_out, stats=st)


def _seed_sources(q, w, k, ks, ke, K, opt):
    """Seed strategies, validated explicit ids [Qn, S] (or None) and the anchor pool."""
    Qn = q.shape[0]
    strategies = parse_strategies(opt.seeds)
    seed_ids = None
    if "explicit" in strategies:
        if opt.seed_ids is None:
            raise ValueError("seed_ids: the 'explicit' seed strategy needs seed_ids")
        seed_ids = np.asarray(opt.seed_ids)
        if seed_ids.ndim != 2 or seed_ids.shape[0] != Qn or seed_ids.dtype.kind not in "iu":
            raise ValueError(f"seed_ids: expected an int array [Qn={Qn}, S]")
    pool = anchor_pool(q, w, k, ks, ke, K, opt.n_anchors) if "anchor" in strategies else None
    return strategies, seed_ids, pool


def _per_query(q, w, k, K, ks, ke, opt, st, screened, progress) -> np.ndarray:
    """Algorithm 1's outer loop: each query is scored fully when screening cannot pay
    (|Ω| ≤ K, H = 1, r ≥ H) and otherwise by ``screened(t, a, b) -> (ids, scores)``.
    Returns ids int64 [Qn, K] with −1 padding; fills st.full and st.tau_final."""
    Qn, H, _ = q.shape
    ids_out = np.full((Qn, K), -1, dtype=np.int64)
    no_screen = H == 1 or (opt.r != "auto" and int(opt.r) >= H)
    for t in range(Qn):
        a, b = int(ks[t]), int(ke[t])
        if b - a <= K or no_screen:
            top, sc = _full_topk(q[t], w[t], k, a, b, K)
            st.full[t] = True
        else:
            top, sc = screened(t, a, b)
        ids_out[t, : top.size] = top
        if top.size == K:
            st.tau_final[t] = sc[-1]
        if progress is not None:
            progress(t)
    return ids_out


def _initial_seeds(t, q_t, w_t, k, a, b, K, opt, strategies, seed_ids, pool):
    """Steps 1–2 (Prop. 4): seed ids S (sorted, distinct, visible), their exact scores, τ_0
    = τ_K(S), and activation frequencies p_h from (a sample of) the scored seeds."""
    parts = []
    if "explicit" in strategies:
        parts.append(explicit_seeds(seed_ids[t], a, b))
    if "local" in strategies or strategies == ("certificate",):
        parts.append(local_seeds(a, b, opt.window, opt.sinks))
    if "anchor" in strategies:
        parts.append(pool[(pool >= a) & (pool < b)])
    S = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    s_S = score_keys(q_t, w_t, k[S])
    p = activation_frequency(q_t, k[S[_stride_sample(0, S.size, 1024)]])
    return S, s_S, kth_score(s_S, K), p


def _certificate_seeds(U, a, b, S, s_S, q_t, w_t, k, m):
    """Certificate-guided seeds: score the ``m`` largest-U visible keys exactly (any exact
    score of a visible key is a valid witness; this raises τ)."""
    m = min(m, b - a)
    cand = a + np.argpartition(-U, m - 1)[:m]
    extra = np.setdiff1d(cand, S)
    S = np.concatenate([S, extra])
    s_S = np.concatenate([s_S, score_keys(q_t, w_t, k[extra])])
    return S, s_S


def _screen_and_refine(t, U, buf, S, a, b, q_t, w_t, k, opt, st):
    """Steps 4–6: screen (strict rejection U < τ; equality survives), score the
    survivors with the original scorer in batches and keep s ≥ τ in the buffer."""
    alive = U >= buf.tau
    alive[S - a] = False
    V = a + np.flatnonzero(alive)
    st.screened[t] = (b - a) - S.size
    st.survivors[t] = V.size
    for lo in range(0, V.size, opt.refine_batch):
        ids = V[lo : lo + opt.refine_batch]
        buf.offer(ids, score_keys(q_t, w_t, k[ids]))
    st.refined[t] = V.size
    st.kept[t] = buf.kept
    st.overflows[t] = buf.overflows


def _record_plan(t, plan, st):
    st.r[t], st.omitted_positive[t], st.aggregated[t] = plan.r, plan.P.size, plan.A.size


def _screened_query(
    t, q_t, w_t, k, a, b, K, opt, popt, strategies, seed_ids, pool, st, slack_acc, ksum
):
    S, s_S, tau0, p = _initial_seeds(t, q_t, w_t, k, a, b, K, opt, strategies, seed_ids, pool)

    # Step 3: plan and the bound for every visible key.
    def pick_r(tau):
        if opt.r == "auto":
            return choose_r(q_t, w_t, p, tau, k[_stride_sample(a, b, 512)], popt, opt.form)
        return int(opt.r)

    def plan_and_bound(r):
        plan = build_plan(q_t, w_t, p, r, popt)
        _record_plan(t, plan, st)
        return plan, upper_bound(plan, k[a:b], opt.form, "up", q_t, w_t, ksum.slice(a, b))

    plan, U = plan_and_bound(pick_r(tau0))
    if not np.all(np.isfinite(U)):
        # C.3: a non-finite bound proves nothing; recover over the full domain.
        st.recovered[t] = True
        return _full_topk(q_t, w_t, k, a, b, K)

    if "certificate" in strategies and opt.cert_seeds > 0:
        S, s_S = _certificate_seeds(U, a, b, S, s_S, q_t, w_t, k, opt.cert_seeds)
        tau1 = kth_score(s_S, K)
        if opt.r == "auto" and tau1 > tau0 and (r1 := pick_r(tau1)) != plan.r:
            # τ rose: the cost model may now prefer another r (a loose τ makes every r
            # look alike and picks the smallest); re-plan once against the new τ.
            plan, U = plan_and_bound(r1)
            if not np.all(np.isfinite(U)):
                st.recovered[t] = True
                return _full_topk(q_t, w_t, k, a, b, K)
    st.seeds[t] = S.size
    if S.size < K:
        st.full[t] = True
        return _full_topk(q_t, w_t, k, a, b, K)

    buf = _Buffer(K, opt.buffer, S, s_S)
    st.tau[t] = buf.tau
    _screen_and_refine(t, U, buf, S, a, b, q_t, w_t, k, opt, st)
    if opt.slack_sample:
        from .certificate import slack

        ks_ = k[_stride_sample(a, b, opt.slack_sample)]
        for name, v in slack(plan, q_t, w_t, ks_).items():
            slack_acc.setdefault(name, []).append(float(np.mean(v)))
    # Step 7: exact Top-K of S ∪ C (Theorem 1).
    return buf.result()
