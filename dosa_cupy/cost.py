"""The cost model of the GPU route choice (docs/method.md §9 "Route choice"): milliseconds of
the dense route and of DoSA's stages on the H200, linear in the work, and the vocabulary of
the decision — the candidates it compares, the ``RouteChoice`` it returns and the
``RouteMemo`` that keeps it across chunks.

The decision itself is the route stage (``route.py``): it runs the sampled screens this
model scales to the chunk.  Nothing here launches a screen, so the model and its fit
(``dosa_cupy.bench.fit_cost``) are checked on the CPU (tests/test_cost.py).
The reference side's counterpart is ``dosa_ref.cost.choose_r`` (per query: an r, or dense
scoring, in units of work rather than milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dosa_ref.options import check_count

from . import sm90a
from .scorer import QG
from .screen import PAIR_MAX_R, R_WIDE, SCREENS, WGT_QG, auto_screen

__all__ = [
    "H200",
    "H200_FP8",
    "H100_FP8",
    "CostModel",
    "LinearRule",
    "RouteChoice",
    "RouteMemo",
    "candidate_key",
    "candidates",
    "candidates_of",
    "early_route",
    "logits_flop",
    "model_for",
    "samples",
    "sample_scale",
    "samples_any_screen",
]


# The transposed screen's sample: a third of its block row (``sample_size``); bench
# builds=sample384 samples a whole one.
WGT_SAMPLE = WGT_QG // 3


def candidate_key(screen: str, r: int) -> str:
    """The name of a screen candidate in a ``RouteChoice``'s predictions and survivals."""
    return f"{screen}/{r}"


def logits_flop(pairs: float, H: int) -> float:
    """FLOP of the dense logits of ``pairs`` visible (query, key) pairs with H heads: one
    multiply-add per head and coordinate (D = 128)."""
    return 2.0 * 128 * H * pairs


@dataclass(frozen=True)
class CostModel:
    """Milliseconds of the stages on one GPU, linear in the work (docs/method.md §9 "Route
    choice"; fitted by ``dosa_cupy.bench.fit_cost``).

    logits = logits_fixed_ms + 256·H·pairs / logits_flop_per_ms[H] (nearest fitted H);
    dense selection = select_fixed_ms + select_ms_per_key · Qn · N;
    refinement = refine_ms_per_key · Qn · N + refine_ms_per_key_head · survivors · H;
    DoSA's selection and recovery = finish_fixed_ms + finish_ms_per_record · records;
    the plan = plan_ms_per_query_head · Qn · H;
    dosa_floor_ms: the smallest DoSA call measured (the early decision).
    """

    logits_flop_per_ms: dict
    logits_fixed_ms: float
    select_fixed_ms: float
    select_ms_per_key: float
    refine_ms_per_key: float
    refine_ms_per_key_head: float
    finish_fixed_ms: float
    finish_ms_per_record: float
    dosa_floor_ms: float
    plan_ms_per_query_head: float = 0.0
    fitted_on: str = ""

    def logits_rate(self, H: int) -> float:
        """FLOP per ms of the logits at H heads: the fitted rate of the nearest H (ties to the
        smaller)."""
        return self.logits_flop_per_ms[min(self.logits_flop_per_ms, key=lambda x: (abs(x - H), x))]

    def dense_ms(self, Qn: int, N: int, pairs: float, H: int) -> float:
        """The dense route's predicted time: logits of ``pairs`` visible (query, key) pairs
        with H heads, then the selection of Qn rows of N."""
        logits = self.logits_fixed_ms + logits_flop(pairs, H) / self.logits_rate(H)
        return logits + self.select_fixed_ms + self.select_ms_per_key * Qn * N

    def rest_ms(self, Qn: int, N: int, K: int, survivors: float, H: int, screen_ms: float):
        """DoSA's predicted time after its plan: the screen (``screen_ms``, measured on a
        sample and scaled), refinement of ``survivors`` and the finish (records bounded by
        the survivors and by 16·K per query)."""
        refine = self.refine_ms_per_key * Qn * N + self.refine_ms_per_key_head * survivors * H
        records = min(survivors, 16.0 * K * Qn)
        return screen_ms + refine + self.finish_fixed_ms + self.finish_ms_per_record * records

    def plan_ms(self, Qn: int, H: int) -> float:
        """The plan stage's predicted time for Qn queries with H heads."""
        return self.plan_ms_per_query_head * Qn * H

    def dosa_ms(self, Qn: int, N: int, K: int, survivors: float, H: int, screen_ms: float):
        """DoSA's predicted time from the route decision on: the chunk's plan, then
        ``rest_ms`` (the sampled decision's candidates: nothing of the plan is spent yet)."""
        return self.plan_ms(Qn, H) + self.rest_ms(Qn, N, K, survivors, H, screen_ms)


@dataclass(frozen=True)
class LinearRule:
    """A ``CostModel``'s two predictions for one chunk shape as functions of a step's counts:
    the route decision of a captured prefill step, which runs on the device (csrc/route.cu
    route_pick; capture.py; docs/method.md §9 "A route chosen inside a graph").

    DoSA  = dosa_fixed + dosa_per_survivor·S + dosa_per_record·min(S, record_cap)
            + dosa_per_pair·pairs
    dense = dense_fixed + dense_per_pair·pairs

    for S survivors and ``pairs`` visible (query, key) pairs: ``CostModel.dosa_ms`` with the
    screen's time proportional to the pairs (``screen_ms_per_pair``, measured on the shape's
    first step) and ``CostModel.dense_ms``.  The ``*_rn`` methods are the kernel's host twin:
    the same double operations in the same order, each rounded to nearest (no fused
    multiply-add on either side), so both take the same branch on the same counts."""

    dosa_fixed: float
    dosa_per_survivor: float
    dosa_per_record: float
    record_cap: float
    dosa_per_pair: float
    dense_fixed: float
    dense_per_pair: float

    @classmethod
    def of(cls, model: CostModel, Qn: int, N: int, K: int, H: int,
           screen_ms_per_pair: float) -> LinearRule:  # fmt: skip
        """The rule of a chunk of Qn queries × N keys, selection size K, H heads."""
        return cls(
            dosa_fixed=model.plan_ms(Qn, H) + model.refine_ms_per_key * Qn * N
            + model.finish_fixed_ms,
            dosa_per_survivor=model.refine_ms_per_key_head * H,
            dosa_per_record=model.finish_ms_per_record,
            record_cap=16.0 * K * Qn,
            dosa_per_pair=float(screen_ms_per_pair),
            dense_fixed=model.logits_fixed_ms + model.select_fixed_ms
            + model.select_ms_per_key * Qn * N,
            dense_per_pair=logits_flop(1.0, H) / model.logits_rate(H),
        )  # fmt: skip

    def coefficients(self) -> tuple[float, ...]:
        """route_pick's ``rule`` [7], in its order."""
        return (self.dosa_fixed, self.dosa_per_survivor, self.dosa_per_record, self.record_cap,
                self.dosa_per_pair, self.dense_fixed, self.dense_per_pair)  # fmt: skip

    @staticmethod
    def survivors_rn(pairs: int, sample_survivors: int, sample_visible: int) -> float:
        """The chunk's predicted survivors: the sample's survivors per visible pair × the
        chunk's visible pairs (0 for a sample that sees no key)."""
        if int(sample_visible) <= 0:
            return 0.0
        return float(sample_survivors) * float(pairs) / float(sample_visible)

    def dosa_ms_rn(self, survivors: float, pairs: float) -> float:
        """DoSA's predicted time from the decision on (the chunk's plan included)."""
        t = self.dosa_fixed + self.dosa_per_survivor * survivors
        t = t + self.dosa_per_record * min(survivors, self.record_cap)
        return t + self.dosa_per_pair * pairs

    def dense_ms_rn(self, pairs: float) -> float:
        """The dense route's predicted time."""
        return self.dense_fixed + self.dense_per_pair * pairs

    def picks_dosa(self, pairs: int, sample_survivors: int, sample_visible: int) -> bool:
        """route_pick's branch for a chunk of ``pairs`` visible pairs whose sample kept
        ``sample_survivors`` of ``sample_visible`` visible pairs."""
        surv = self.survivors_rn(pairs, sample_survivors, sample_visible)
        return self.dosa_ms_rn(surv, float(pairs)) < self.dense_ms_rn(float(pairs))


# Fitted by `python -m dosa_cupy.bench.fit_cost` on docs/records/results/2026-12-01_00406f8/
# (bench_prefill.json, bench_iso_many.json, bench_small_qn.json: H200, commit 00406f8).
H200 = CostModel(
    logits_flop_per_ms={32: 409314952870.3138, 64: 367592850279.1628},
    logits_fixed_ms=0.029360919619065062,
    select_fixed_ms=0.16003952187393025,
    select_ms_per_key=8.669729647330647e-09,
    refine_ms_per_key=3.0614518122289503e-09,
    refine_ms_per_key_head=1.1961580291805044e-09,
    finish_fixed_ms=1.694305378625485,
    finish_ms_per_record=1.5755722196898893e-08,
    dosa_floor_ms=6.120543956756592,
    plan_ms_per_query_head=8.237489943605586e-06,
    fitted_on="00406f8: results/2026-12-01_00406f8/bench_{prefill,iso_many,small_qn}.json",
)


@dataclass
class RouteChoice:
    """The route taken and why (``DosaGpuStats.route``; the route stage's result, route.py).

    route: "dense" or "dosa"; reason: "option", "early" (decision 1), "sampled" (decision 2),
    "memo" (a ``RouteMemo``'s earlier choice) or "small" (too few queries to sample: DoSA
    with ``auto_screen``'s pick); screen, r: the
    screen that ran (None when dense); predicted_ms: the model's time per candidate
    ("dense", and "screen/r" such as "pair/6" or "wg/14": the time from the decision on,
    the plan included);
    survival: the
    sampled survival per candidate; sample: the sampled queries per candidate; sample_ms:
    the measured screen time of each candidate's sample (before it is scaled to the chunk).
    """

    route: str
    reason: str
    screen: str | None = None
    r: int | None = None
    predicted_ms: dict = field(default_factory=dict)
    survival: dict = field(default_factory=dict)
    sample: dict = field(default_factory=dict)
    sample_ms: dict = field(default_factory=dict)
    # this call's prepare and seeds (ms, measured), charged to DoSA's candidates when a memo
    # keeps the choice for later chunks (route.route_stage); 0 otherwise
    spent_ms: float = 0.0
    # the samples' bound evaluations in full key scorings, per query (numpy [Qn]; the
    # work accounting of docs/method.md §6 "Cost" counts them)
    bound_work: object = None
    # the whole chunk's screen build, read with the route stage's counts (sampled and
    # "small" choices; ``screen.tie_screen_wanted``; None otherwise): the screen stage takes
    # it instead of reading it again
    tie: bool | None = None
    # the sampled winner's plan of the whole chunk (``plan.DevicePlan``, built during the
    # decision with ``route.CHUNK_PLANS``): the plan stage takes it instead of planning again
    plan: object = field(default=None, repr=False, compare=False)

    def summary(self, reason: str | None = None) -> RouteChoice:
        """The decision, its predictions and survivals without the per-query arrays (what a
        ``RouteMemo`` keeps), with ``reason`` replaced when given."""
        c = self
        return RouteChoice(c.route, reason or c.reason, c.screen, c.r, dict(c.predicted_ms),
                           dict(c.survival), sample_ms=dict(c.sample_ms),
                           spent_ms=c.spent_ms)  # fmt: skip


class RouteMemo:
    """The route choices of earlier calls, for a caller that runs one indexer layer over
    many chunks (``dosa_topk(..., route_memo=memo)``): a chunk of the same kind as a recent
    one takes that one's route without preparing, seeding or sampling — the dense route at
    once, or DoSA with the remembered screen and r — and every ``refresh``-th call of a
    kind samples again, so the choice follows the data.  The kind of a chunk is its shape
    (Qn and N rounded up to powers of two, H, K) and the options the choice depends on.
    Only the time depends on the memo: every route is exact (docs/method.md §9 "Route
    choice").  Not thread-safe; one memo per layer (queries of different layers differ)."""

    def __init__(self, refresh: int = 16):
        self.refresh = check_count("refresh", refresh, 1)
        self._seen: dict = {}  # kind → [RouteChoice, calls since it was sampled]

    @staticmethod
    def kind(b, o: dict) -> tuple:
        """The memo key of batch ``b`` with options ``o``."""
        p2 = lambda n: 1 << max(0, int(n) - 1).bit_length()  # noqa: E731
        opts = (o["screen"], int(o["r"]), int(o["cert_seeds"]), int(o["anchor_segments"]))
        return (p2(b.Qn), p2(b.N), b.heads, b.K, *opts, b.scorer)

    def recall(self, key) -> RouteChoice | None:
        """The remembered choice for ``key`` (counted as one use), or None when there is
        none or it is due to be sampled again."""
        hit = self._seen.get(key)
        if hit is None or hit[1] >= self.refresh - 1:
            return None
        hit[1] += 1
        return hit[0].summary("memo")

    def store(self, key, choice: RouteChoice) -> None:
        """Remember a sampled choice (``RouteChoice.summary``)."""
        self._seen[key] = [choice.summary(), 0]

    def __len__(self) -> int:
        return len(self._seen)


# The FP8 scorer's model (scorer.py "fp8"), fitted by `python -m dosa_cupy.bench.fit_cost` on
# the nineteenth session's FP8 runs (docs/records/results/s19/: bench_calibrated.json at
# 18c8484, bench_calibrated_66f9531.json, bench_trained.json at 4cdc2bd; H200, DeepGEMM in
# the same calls): the FP8 dense logits and selection, the FP8 refinement and finish.  Its
# dense route within 9 % of each of the ten rows it was fitted on (the f16 model's FP8
# logits rates, which it replaces, were 9–34 % high); its early floor (the smallest DoSA
# call measured, 10.55 ms) sends a chunk of 4,096 queries × 128K keys at H = 32 to the dense
# route at once (measured there: dense 9.8–10.0 ms, DoSA with its decision 10.6–13.1).  Ten
# rows of two regimes at Qn = 4096: the decision's time only, never ids.
H200_FP8 = CostModel(
    logits_flop_per_ms={32: 786928805290.629, 64: 841186017772.3127},
    logits_fixed_ms=0.11400909955532199,
    select_fixed_ms=1.0368166651044612,
    select_ms_per_key=6.012378801172653e-09,
    refine_ms_per_key=9.548939427159747e-10,
    refine_ms_per_key_head=9.487810256301224e-10,
    finish_fixed_ms=2.5079092841139414,
    finish_ms_per_record=1.780691577217439e-08,
    dosa_floor_ms=10.551088333129883,
    plan_ms_per_query_head=6.239787384961697e-06,
    fitted_on="18c8484 / 66f9531 / 4cdc2bd: results/s19/bench_calibrated.json, "
    "bench_calibrated_66f9531.json, bench_trained.json",
)

# The FP8 scorer's model on an H100 (``model_for`` picks it by the device's name), fitted by
# `python -m dosa_cupy.bench.fit_cost` on the twenty-ninth session's H100 runs at 814722a
# (docs/records/results/s29/: call3_cal_814722a_h100.json, call4_ab_814722a_h100.json,
# call4_reg_814722a_h100.json; the kernels of every route since 2697382): its selection,
# refinement, finish and plan on the H100's kernels and host (the H200 model's finish, 2.5 ms
# fixed, is 1.1 ms here).  All but one constant are the fit; the early floor is H200_FP8's:
# the fit's own floor (9.31 ms, the smallest DoSA call of these rows) would send every chunk
# of 4,096 queries × 128K keys at H 32 to the sample, which costs the regimes the dense route
# wins 3–4 ms per call (docs/records/benchmarks.md "The sampled rows' seeds measured",
# `floor6`) — a per-call decision's price that issue 28 is about, not a fit.
H100_FP8 = CostModel(
    logits_flop_per_ms={32: 811139191094.3784, 64: 866820126722.7852},
    logits_fixed_ms=0.2531925777473183,
    select_fixed_ms=0.18830799127554335,
    select_ms_per_key=7.290922145961669e-09,
    refine_ms_per_key=1.4158968642016953e-10,
    refine_ms_per_key_head=9.56730670116026e-10,
    finish_fixed_ms=1.0656041259571907,
    finish_ms_per_record=6.052394761752866e-08,
    dosa_floor_ms=H200_FP8.dosa_floor_ms,
    plan_ms_per_query_head=6.139916532370112e-06,
    fitted_on="814722a: results/s29/call3_cal_814722a_h100.json, call4_ab_814722a_h100.json, "
    "call4_reg_814722a_h100.json (H100; the early floor: H200_FP8's)",
)


def model_for(scorer: str, device: str = "") -> CostModel:
    """The cost model of the ``scorer``'s kernels (scorer.py) on the GPU named ``device``:
    ``H100_FP8`` for the FP8 scorer on an H100, ``H200_FP8`` for it elsewhere, ``H200`` for
    the f16 scorer."""
    if scorer != "fp8":
        return H200
    return H100_FP8 if "H100" in device else H200_FP8


def early_route(model: CostModel, Qn: int, N: int, H: int) -> bool:
    """Decision 1: True when the dense route, even with every key visible to every query,
    is predicted faster than the smallest DoSA call measured."""
    return model.dense_ms(Qn, N, float(Qn) * N, H) <= model.dosa_floor_ms


def candidates(screen: str, r: int, cert_seeds: int, w, xp, hopper: bool | None = None) -> list:
    """The (screen, r) pairs the sampled decision compares (``candidates_of`` of
    ``auto_screen``'s pick); w fp32 [Qn, Hp] (an ``xp`` array); ``hopper`` as in
    ``auto_screen``."""
    return candidates_of(screen, r, cert_seeds, auto_screen(screen, r, cert_seeds, w, xp, hopper))


def candidates_of(screen: str, r: int, cert_seeds: int, pick: tuple) -> list:
    """The (screen, r) pairs the sampled decision compares, given ``auto_screen``'s ``pick``
    (screen, r) for the options' ``screen`` and ``r``: with ``screen="auto"``, the narrow
    screen ("wgt" on Hopper, else "pair"; r ≤ 6) alone when auto picks it, else auto's
    kernel with its r and with the other of r and R_WIDE (one and two MMA tiles); any other
    screen, or certificate seeds: the pick alone."""
    pick, rr = pick
    narrow = pick == "pair" or (pick == "wgt" and rr <= PAIR_MAX_R)
    if screen != "auto" or narrow or cert_seeds:
        return [(pick, rr)]
    alt = R_WIDE if rr != R_WIDE else r
    return [(pick, rr)] if alt == rr else [(pick, rr), (pick, alt)]


def samples(Qn: int, screens) -> bool:
    """Whether ``route.route_stage`` samples a chunk of ``Qn`` queries with these candidate
    screens: at least four of their largest sample (``sample_size``); a smaller chunk goes to
    DoSA unsampled (reason "small")."""
    return Qn >= 4 * max(sample_size(s) for s in screens)


def samples_any_screen(Qn: int) -> bool:
    """Whether a chunk of ``Qn`` queries is sampled whichever screens are the candidates."""
    return samples(Qn, [s for s in SCREENS if s != "auto"])


def sample_scale(screen: str, Qn: int, n: int) -> float:
    """The factor from a sample of ``n`` queries' screen time to a chunk of ``Qn``'s: the
    chunk's block rows per sampled block row, or for the transposed screen, whose blocks
    loop over their query groups, its queries per sampled query (``sample_size``)."""
    return Qn / n if screen == "wgt" else float(-(-Qn // n))


def sample_size(screen: str) -> int:
    """Queries of one block row of the screen (QG; pairs: two queries per plan row; the
    Hopper screen sm90a.QG); the transposed screen ``WGT_SAMPLE``, a third of its block row
    (WGT_QG / 3 = 128, eight groups of its 8-row build): its blocks loop over their query
    groups, so the time scales with the groups, and a whole block row (384) would leave
    chunks below 4 · 384 queries without a sampled decision.  The scaled time then counts
    each block's key-tile conversion three times: an overestimate of DoSA, never a changed
    id."""
    if screen == "wg":
        return sm90a.QG
    if screen == "wgt":
        return WGT_SAMPLE
    return 2 * QG if screen == "pair" else QG
