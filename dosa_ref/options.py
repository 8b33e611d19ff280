"""The option and statistics vocabulary shared by ``dosa_ref`` and ``dosa_cupy``.

One name means one thing in both packages (docs/design.md, "Public contract"):

* ``OPTIONS``: the selection options both packages accept, name → meaning.  Each package
  keeps its own defaults and its own extra options (the float64 plan switches of
  ``dosa_ref``; the kernel choices of ``dosa_cupy``), but a shared name is never reused
  with another meaning.  In particular ``seeds=`` names seed *strategies* and
  ``seed_ids=`` carries explicit key ids.
* ``SelectStats``: the per-query statistics both pipelines report, with one meaning per
  field (``STATS`` lists them), and the aggregates computed from them: survival and the
  work accounting (fully scored fraction, estimated and measured work ratio against
  dense scoring, docs/method.md §6 "Cost").
* ``SelectOptions``: the options of ``dosa_ref``'s ``dosa_topk`` / ``fp8_topk``.
* Defaults that scale with K (``default_window``, ``default_cert_seeds``) and the
  validators of the shared options.

This module needs no GPU: ``dosa_cupy`` imports it (``dosa_ref`` never imports ``dosa_cupy``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .certificate import FORMS
from .plan import PlanOptions
from .validate import as_array

__all__ = [
    "OPTIONS",
    "STATS",
    "STRATEGIES",
    "SelectOptions",
    "SelectStats",
    "check_count",
    "check_flag",
    "check_seed_ids",
    "default_cert_seeds",
    "default_window",
    "parse_strategies",
]

STRATEGIES = ("explicit", "local", "anchor", "certificate")

OPTIONS = {
    "seeds": "seed strategies joined by '+' (or a sequence of names) from STRATEGIES: "
    "'explicit' (the ids of seed_ids), 'local' (window + sinks), 'anchor' (the exact "
    "Top-K of n_anchors queries of the chunk), 'certificate' (the cert_seeds keys of "
    "largest bound, scored after the bound is computed)",
    "seed_ids": "explicit seed key ids, an integer array [Qn, S]; -1 pads, every other id "
    "lies in [0, N); ids outside the query's visible range are ignored, repeats count "
    "once.  They are scored exactly and may only raise tau (docs/method.md §2, Prop. 4); "
    "giving seed_ids turns the 'explicit' strategy on",
    "window": "local seeds: the most recent `window` visible keys (None: default_window(K, seeds))",
    "sinks": "local seeds: the first `sinks` visible keys",
    "n_anchors": "anchor queries spread over the chunk whose full exact Top-K seeds every "
    "query (their full scoring is counted in the work accounting)",
    "anchor_segments": "S >= 1: each anchor contributes its exact Top-K within each of S "
    "nearly equal segments of the keys to the pool (1: its Top-K; a larger pool raises "
    "tau and costs its scoring for every query, docs/method.md §2)",
    "cert_seeds": "certificate-guided seeds: keys of largest bound scored exactly to raise "
    "tau (None: default_cert_seeds(K); 0: off)",
    "r": "retained heads of the plan (docs/method.md §3); r >= H means dense scoring; "
    "dosa_ref also takes 'auto' (the cost model of docs/method.md §6 picks r, or dense)",
    "buffer": "candidate-buffer capacity in records per query; a full buffer is reduced "
    "or extended exactly, never truncated (docs/method.md §7, C.3)",
}

STATS = {
    "visible": "int [Qn]: |Omega|, keys visible to the query",
    "seeds": "int [Qn]: distinct keys scored before the bound to set tau (default seeds "
    "and explicit seeds)",
    "explicit_seeds": "int [Qn]: of `seeds`, keys that came only from seed_ids",
    "cert_seeds": "int [Qn]: keys scored by the certificate-guided rule (beyond `seeds`)",
    "tau": "float [Qn]: the threshold the screen compared against (-inf: none)",
    "tau_final": "float [Qn]: the K-th selected score tau* (-inf: fewer than K visible)",
    "screened": "int [Qn]: visible keys the bound could reject (not kept as seeds)",
    "survivors": "int [Qn]: screened keys that passed the screen (U >= tau; with the "
    "tie-aware rule, not rejected by it either)",
    "tie_rejected": "int [Qn]: screened keys with U >= tau that the tie-aware rule rejected "
    "(U = tau with id above the K-th seed record's, or a certified zero plateau bound "
    '0 below that record; docs/method.md §7 "Tie-aware rejection and zero plateaus")',
    "refined": "int [Qn]: keys scored with all H heads after the seeds: the survivors, or "
    "every visible non-seed key when dense after seeding",
    "kept": "int [Qn]: candidate records written (s >= tau when written; with the "
    "tie-aware rule, not (tau, id) with id above the K-th record's)",
    "overflows": "int [Qn]: times a full candidate buffer was reduced or extended exactly",
    "scored": "int [Qn]: key scorings with all H heads for this query (seeds, certificate "
    "seeds, refinement; every visible key when dense)",
    "recovered": "bool [Qn]: full-domain recovery (non-finite bound or invalid plan)",
    "dense": "bool [Qn]: scored densely without screening (|Omega| <= K, H = 1, r >= H, "
    "too few seeds, a recovery, or the cost model found that screening would not pay)",
    "r": "int [Qn]: retained heads of the plan that screened (0 when dense)",
    "omitted_positive": "int [Qn]: |P|, positive heads left out of the plan",
    "aggregated": "int [Qn]: |A|, negative heads in the aggregate",
    "bound_work": "float [Qn]: the bounds' cost in full key scorings: Σ over bound "
    "evaluations (cost-model samples included) of keys·(r + d_a)/H",
    "est_survival": "float [Qn]: the cost model's survivor fraction m at the chosen r "
    "(nan: not estimated)",
    "est_work": "float [Qn]: the cost model's work_DoSA/work_dense = f + (1-f)((r+d_a)/H "
    "+ m) at the chosen r (nan: not estimated; dense when >= 1)",
    "anchor_scored": "int: key scorings of the anchor queries' full Top-K (chunk total)",
}


def parse_strategies(seeds) -> tuple[str, ...]:
    """Seed strategy names from ``"local+anchor"``, ``["local", "anchor"]``, ...

    Raises ValueError naming ``seeds`` for an empty list or an unknown name."""
    if isinstance(seeds, str):
        names = tuple(s for s in seeds.replace(",", "+").split("+") if s)
    else:
        names = tuple(seeds)
    if not names:
        raise ValueError("seeds: need at least one strategy")
    for s in names:
        if s not in STRATEGIES:
            raise ValueError(f"seeds: unknown strategy {s!r}; expected some of {STRATEGIES}")
    return names


def check_count(name: str, v, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer option in [minimum, maximum] (bool and float rejected): int."""
    ok = not isinstance(v, bool) and isinstance(v, (int, np.integer))
    if ok and v >= minimum and (maximum is None or v <= maximum):
        return int(v)
    hi = "" if maximum is None else f", at most {maximum}"
    raise ValueError(f"{name}: expected an integer of at least {minimum}{hi}, got {v!r}")


def check_flag(name: str, v) -> bool:
    """A switch option: a bool (numpy bools too; 0, 1 and None rejected)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise ValueError(f"{name}: expected a bool, got {v!r}")


def check_seed_ids(seed_ids, Qn: int, N: int, xp=np):
    """Validate explicit seed ids (docs/method.md §2) → int64 [Qn, S] (an ``xp`` array: numpy
    here, CuPy for ``dosa_cupy``), each −1 (padding) or a key id in [0, N).

    ValueError naming ``seed_ids`` otherwise.  Unsigned ids are compared in their own dtype
    first: an uint64 id ≥ 2^63 would wrap to a negative int64 and −1 would pass as padding.
    """
    a = as_array(seed_ids, "seed_ids") if xp is np else seed_ids
    if a.ndim != 2 or a.shape[0] != Qn or a.dtype.kind not in "iu":
        raise ValueError(
            f"seed_ids: expected an integer array [Qn={Qn}, S], got {a.dtype} {tuple(a.shape)}"
        )
    if a.size:
        if a.dtype.kind == "u":
            bad = bool(xp.any(a >= np.uint64(N))) if N else True
        else:
            b = a.astype(xp.int64)
            bad = bool(xp.any((b < -1) | (b >= N)))
        if bad:
            raise ValueError(f"seed_ids: every id must be -1 or lie in [0, N={N})")
    return a.astype(xp.int64)


# The seeds set τ = τ_K(S) (docs/method.md §2, Prop. 4).  The local window alone gives the
# K-th score of about `window` recent keys: with window ≈ K that is their minimum, far below
# τ*, and the cost model then scores densely; 2K recent keys make screening pay.  Anchor
# and certificate seeds lift τ to near τ* by themselves, and a wider window only adds
# scored keys there.  Certificate seeds need about K keys of largest bound to reach τ*.
_WINDOW_MIN, _CERT_MIN = 2048, 2048


def default_window(K: int, strategies=("local",)) -> int:
    """Default local window for selection size K: max(2048, 2K) when the local window is
    the only default source of τ (no "anchor" or "certificate" strategy), else 2048."""
    if {"anchor", "certificate"} & set(parse_strategies(strategies)):
        return _WINDOW_MIN
    return max(_WINDOW_MIN, 2 * int(K))


def default_cert_seeds(K: int) -> int:
    """Default number of certificate-guided seeds for selection size K: max(2048, K)."""
    return max(_CERT_MIN, int(K))


_INT_FIELDS = (
    "visible",
    "seeds",
    "explicit_seeds",
    "cert_seeds",
    "screened",
    "survivors",
    "tie_rejected",
    "refined",
    "kept",
    "overflows",
    "scored",
    "r",
    "omitted_positive",
    "aggregated",
)


@dataclass
class SelectStats:
    """Per-query statistics of an exact selection (arrays of length Qn; ``STATS`` gives
    each field's meaning).  Both packages fill these fields with the same meaning; each
    adds its own (``slack`` here, FP8 guard counts, GPU stage times) in a subclass.

    The aggregates (properties and ``totals()`` keys), each defined here and only here
    (Σ: the sum over the chunk's queries):

        name                      formula                                     range
        survival                  Σ survivors / Σ screened                    [0, 1]
        pruning                   1 − survival                                [0, 1]
        scored_fraction           Σ min(scored, visible) / Σ visible          [0, 1]
        anchor_scored_fraction    anchor_scored / Σ visible                   [0, 1]
        work_ratio                (Σ scored + anchor_scored + Σ bound_work)   [0, ∞)
                                  / Σ visible                                 (a ratio)
        tau_gap_median            median of tau_gap where it is defined       [0, ∞]
        positive_projection_rows  share of queries with omitted_positive > 0  [0, 1]

    A 0/0 is nan, never a number (printed "-"): survival and pruning when no key was
    screened (every query dense), the ones over Σ visible when no key was visible,
    tau_gap_median when no query has both τ and τ* finite; positive_projection_rows is 0
    for Qn = 0.

    ``scored_fraction`` is the share of the visible keys fully scored *for the selection*:
    seeds, certificate seeds and refined keys of screened queries, every visible key of a
    dense query.  Here each key is scored at most once per query, so min(scored, visible)
    = scored; ``dosa_cupy``'s ``scored`` also counts re-scorings of a key (an overflow
    extension, a recovery: ``DosaGpuStats``), which are work, not more keys, so the min
    keeps the fraction a share of keys.  ``anchor_scored_fraction`` is the anchor queries'
    full scoring (their exact Top-K, whose union seeds every query): the anchors are
    distinct queries of the chunk, so it is at most 1.  It is *not* part of
    ``scored_fraction``: an anchor query is scored twice, once as an anchor and once for
    its own selection, so the sum of the two can reach 2.  ``work_ratio`` is the measured
    work_DoSA / work_dense in full key scorings: every scoring, re-scorings and anchors
    included, plus the bounds' cost; above 1 when DoSA cost more than dense scoring.
    """

    Qn: int
    visible: np.ndarray = None
    seeds: np.ndarray = None
    explicit_seeds: np.ndarray = None
    cert_seeds: np.ndarray = None
    tau: np.ndarray = None
    tau_final: np.ndarray = None
    screened: np.ndarray = None
    survivors: np.ndarray = None
    tie_rejected: np.ndarray = None
    refined: np.ndarray = None
    kept: np.ndarray = None
    overflows: np.ndarray = None
    scored: np.ndarray = None
    recovered: np.ndarray = None
    dense: np.ndarray = None
    r: np.ndarray = None
    omitted_positive: np.ndarray = None
    aggregated: np.ndarray = None
    bound_work: np.ndarray = None
    est_survival: np.ndarray = None
    est_work: np.ndarray = None
    anchor_scored: int = 0

    def __post_init__(self):
        for name in _INT_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(self.Qn, dtype=np.int64))
        for name in ("tau", "tau_final"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(self.Qn, -np.inf))
        for name, fill in (("est_survival", np.nan), ("est_work", np.nan), ("bound_work", 0.0)):
            if getattr(self, name) is None:
                setattr(self, name, np.full(self.Qn, fill))
        for name in ("recovered", "dense"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(self.Qn, dtype=bool))

    @property
    def tau_gap(self) -> np.ndarray:
        """Relative τ gap (τ* − τ)/|τ*| per query (nan where undefined)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            g = (self.tau_final - self.tau) / np.abs(self.tau_final)
        ok = np.isfinite(self.tau_final) & np.isfinite(self.tau)
        return np.where(ok, g, np.nan)

    @property
    def survival(self) -> float:
        """Σ survivors / Σ screened (1 − pruning; nan when nothing was screened)."""
        n = int(self.screened.sum())
        return float(self.survivors.sum()) / n if n else float("nan")

    @property
    def pruning(self) -> float:
        """1 − survival: the share of screened keys the bound rejected (nan with survival)."""
        return 1.0 - self.survival

    @property
    def scored_fraction(self) -> float:
        """Share of the visible keys fully scored for the selection, in [0, 1]:
        Σ min(scored, visible) / Σ visible (the class docstring; nan when none is visible).

        The anchor queries' own full scoring is ``anchor_scored_fraction``, and every
        scoring together with the bounds' cost is ``work_ratio`` (docs/method.md §6 "Cost")."""
        n = int(self.visible.sum())
        done = int(np.minimum(self.scored, self.visible).sum())
        return done / n if n else float("nan")

    @property
    def anchor_scored_fraction(self) -> float:
        """anchor_scored / Σ visible, in [0, 1]: the anchor queries' full scoring as a share
        of the chunk's visible keys (nan when none is visible)."""
        n = int(self.visible.sum())
        return float(self.anchor_scored) / n if n else float("nan")

    @property
    def work_ratio(self) -> float:
        """Measured work_DoSA/work_dense in full key scorings (docs/method.md §6 "Cost"):
        (Σ scored + anchor_scored + Σ bound_work) / Σ visible, a ratio in [0, ∞) (nan when
        none is visible)."""
        n = int(self.visible.sum())
        work = float(self.scored.sum()) + self.anchor_scored + float(self.bound_work.sum())
        return work / n if n else float("nan")

    def totals(self) -> dict:
        """Sums of the count fields and the aggregates (the class docstring's table), as
        plain Python numbers; nan where an aggregate is undefined."""
        d = {name: int(getattr(self, name).sum()) for name in _INT_FIELDS if name != "r"}
        gap = self.tau_gap
        d.update(
            queries=self.Qn,
            recovered=int(self.recovered.sum()),
            dense=int(self.dense.sum()),
            anchor_scored=int(self.anchor_scored),
            survival=self.survival,
            pruning=self.pruning,
            scored_fraction=self.scored_fraction,
            anchor_scored_fraction=self.anchor_scored_fraction,
            bound_work=float(self.bound_work.sum()),
            work_ratio=self.work_ratio,
            tau_gap_median=float(np.nanmedian(gap)) if np.any(~np.isnan(gap)) else float("nan"),
            positive_projection_rows=float(np.mean(self.omitted_positive > 0)) if self.Qn else 0.0,
        )
        return d


@dataclass(frozen=True)
class SelectOptions:
    """Options of ``dosa_topk`` / ``fp8_topk`` (keyword arguments; unknown names raise
    ValueError).  The shared names mean what ``OPTIONS`` says.

    seeds: strategies ("local+anchor+certificate" by default); seed_ids: explicit ids
    [Qn, S] (−1 pads); window (None: ``default_window(K, seeds)``) / sinks: local seeds;
    n_anchors: anchor queries; anchor_segments: the segments of the keys each anchor's Top-K
    is taken in; cert_seeds (None: ``default_cert_seeds(K)``).
    r: retained heads, "auto" (the cost model ``cost.choose_r``: an r, or dense scoring
    when screening would not pay) or an int (r ≥ H: dense scoring).  auto_dense=False
    keeps r="auto" screening with the cost model's best r (to measure the certificate).
    form: "base" (eq. (9)) or "abs" (absolute-value form).
    buffer: candidate-buffer capacity in records (≥ 1); overflow merges exactly.
    refine_batch: survivors scored per batch.  slack_sample: keys per query on which the
    Prop. 6 slack components are averaged for ``stats`` (0 = off).
    tie_reject: the tie-aware screen and buffer (docs/method.md §7 "Tie-aware rejection and
    zero plateaus"; exact, on by default; False gives the plain rule U < τ for A/B tests).
    plan: the plan switches (``plan.PlanOptions``: neg_aggregate, neg_priority,
    pos_projection, allowance, groups), given to ``dosa_topk`` as flat keywords.
    tau_floor: float [Qn] or None: a lower bound, per query, on the K-th score of a context
    that contains these keys (another shard's τ, docs/method.md §12 "Sharded contexts");
    a query screens against it where it exceeds its own τ.  The ids returned are then
    exact only where their score is at least tau_floor (the merge of the shards reads no
    other); without it, the exact Top-K of these keys.
    """

    seeds: object = "local+anchor+certificate"
    seed_ids: object = None
    window: int | None = None
    sinks: int = 16
    n_anchors: int = 4
    anchor_segments: int = 1
    cert_seeds: int | None = None
    r: object = "auto"
    auto_dense: bool = True
    form: str = "base"
    buffer: int = 65536
    refine_batch: int = 16384
    slack_sample: int = 0
    tie_reject: bool = True
    tau_floor: object = None
    plan: PlanOptions = PlanOptions()

    def __post_init__(self):
        parse_strategies(self.seeds)
        for name in ("window", "cert_seeds"):
            if getattr(self, name) is not None:
                check_count(name, getattr(self, name))
        for name in ("sinks", "n_anchors", "slack_sample"):
            check_count(name, getattr(self, name))
        for name in ("buffer", "refine_batch", "anchor_segments"):
            check_count(name, getattr(self, name), 1)
        if self.r != "auto":
            check_count("r", self.r, 1)
        for name in ("auto_dense", "tie_reject"):
            check_flag(name, getattr(self, name))
        if self.form not in FORMS:
            raise ValueError(f"form: expected one of {FORMS}, got {self.form!r}")
        if not isinstance(self.plan, PlanOptions):
            raise ValueError(f"plan: expected PlanOptions, got {self.plan!r}")

    def strategies(self) -> tuple[str, ...]:
        """The seed strategies; explicit ids (``seed_ids``) turn "explicit" on."""
        names = parse_strategies(self.seeds)
        if self.seed_ids is not None and "explicit" not in names:
            names = ("explicit", *names)
        if "explicit" in names and self.seed_ids is None:
            raise ValueError("seed_ids: the 'explicit' seed strategy needs seed_ids")
        return names

    def window_for(self, K: int) -> int:
        return default_window(K, self.strategies()) if self.window is None else int(self.window)

    def cert_seeds_for(self, K: int) -> int:
        return default_cert_seeds(K) if self.cert_seeds is None else int(self.cert_seeds)

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> SelectOptions:
        """Options from flat keyword arguments; the plan switches (``PlanOptions``
        fields) are gathered into ``plan``."""
        plan_names = {f.name for f in fields(PlanOptions)}
        names = ({f.name for f in fields(cls)} - {"plan"}) | plan_names
        for key in kwargs:
            if key not in names:
                raise ValueError(f"{key}: unknown option; expected one of {sorted(names)}")
        plan = PlanOptions(**{k: v for k, v in kwargs.items() if k in plan_names})
        return cls(plan=plan, **{k: v for k, v in kwargs.items() if k not in plan_names})
