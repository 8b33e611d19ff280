"""The DoSA pipeline on the GPU (docs/method.md §7 Algorithm 1, §9 execution):

prepare (ρ) → seeds (local window + sinks + anchor-query pool, scored by the canonical
scorer) → τ = K-th seed record → plan (``plan.build_plans``) → screen (U^num vs τ, survivor
bitmask) → refine (canonical scorer on survivors, compact records with s ≥ τ; a full
buffer is *extended* to the exact count and refined again, never dropped) → exact
selection over seed records ∪ compact records → query-level full-domain recovery (dense
route) for invalid scales or non-finite plans.  ids equal ``dense_topk`` bitwise; the
public functions return int64 ids (the ``dosa_ref.topk_ids`` contract, docs/design.md).

Explicit seeds (``seeds=`` [Qn, S] key ids, e.g. the previous chunk's selections) only
raise τ: they are scored by the canonical scorer (``seed_ids`` kernel) and τ is the K-th
record of default ∪ explicit seeds (distinct keys only, docs/method.md §2); they are screened
and refined like any other key, so the final candidate set is unchanged.

The plan runs on the GPU (batched CuPy array operations, ``plan.py``).  Refinement
(``refine_stream.py``) is per query by default (the query index fastest in the grid so
gathered keys are shared in L2); ``stream="shared"`` adds the shared stream for groups of
4 queries (docs/method.md §9; not yet run on a GPU).  Not implemented: grouping queries by
retained-head budget (one r per call), the "certificate" seed strategy of dosa_ref.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import sm90a
from ._build import cupy_or_raise, kernel, tile
from .dense import QG, ROWB, _dense_logits_raw, _dense_topk_raw, select_records, select_rows
from .plan import build_plans
from .plan_fused import build_plans_fused
from .prepare import D, as_device, check_inputs, key_rho, pad_heads
from .refine_stream import (
    GROUP,
    STREAMS,
    Records,
    popcount_rows,
    refine_per_query,
    refine_stage,
)

__all__ = ["DosaGpuStats", "check_seeds", "dosa_topk", "explicit_seed_table", "fused_topk"]

OPTIONS = {
    "window": 2048,
    "sinks": 16,
    "n_anchors": 4,
    "r": 14,
    "buffer": 65536,
    "mma_bits": 17,
    "p_sample": 256,
    "seeds": None,
    "cert_seeds": 0,
    "cert_cap": 16384,
    "return_stats": False,
    "debug_bounds": False,
    "timing": False,
    "stream": "per_query",
    "screen": "fp64",
    "planner": "fused",
}
PLANNERS = ("cupy", "fused")  # plan.build_plans / plan_fused.build_plans_fused
# screen kernel → build defines: "fp64" (default, screen_mt*), "fast32" (an fp32 upward-rounded
# pre-test skips the fp64 guard for warps whose keys it rejects: kernels.cu
# DOSA_SCREEN_FAST32, proofs/fp32_pretest) or "pair" (screen_pair: two queries per tile)
SCREENS = {"fp64": (), "fast32": ("DOSA_SCREEN_FAST32=1",), "pair": (), "auto": (), "wg": ()}
PAIR_MAX_R = 6  # screen="pair": retained rows per query in a paired 16-row tile (kernels.cu)
# screen="auto" pairs a chunk when at least this share of its queries has |H+| ≤ PAIR_MAX_R
# positive heads (all of them retained at r = 6; docs/records/notes.md "Paired screen":
# calibrated H=32
# has |H+| ≤ 4 and pairs at +0.2 pp survival, h64 has |H+| > 6 in a third of its queries)
AUTO_PAIR_SHARE = 0.95


@dataclass
class DosaGpuStats:
    """Per-query counts (numpy) and stage times (ms, when ``timing=True``).

    ``seeds``: default seed records (sinks, local window, anchor pool; excluded from
    screening); ``explicit_seeds``: explicit seeds scored beyond them (distinct, visible,
    not default seeds) — they raise τ but are screened like any other key;
    ``cert_seeds``: certificate-guided seed candidates per query (the survivors of largest
    U, before deduplication against explicit seeds; ``cert_seeds`` > 0).
    """

    seeds: np.ndarray = None
    explicit_seeds: np.ndarray = None
    cert_seeds: np.ndarray = None
    screen: str = None  # the screen kernel that ran ("fp64", "fast32", "pair"; auto's pick)
    tau: np.ndarray = None
    screened: np.ndarray = None
    survivors: np.ndarray = None
    kept: np.ndarray = None
    overflowed: np.ndarray = None
    recovered: np.ndarray = None
    r: np.ndarray = None
    omitted_positive: np.ndarray = None
    aggregated: np.ndarray = None
    stage_ms: dict = field(default_factory=dict)
    bounds: object = None  # fp64 [Qn, N] U^num (debug_bounds=True), NaN where not visible
    # stream="shared" (docs/method.md §9): keys of the query's group shared set (the shared
    # stream scores each for every query of the group whose bit is set) and the query's
    # survivors refined there (the rest, survivors − shared_survivors, per query).
    shared_keys: np.ndarray = None
    shared_survivors: np.ndarray = None


def _opts(kw):
    for k in kw:
        if k not in OPTIONS:
            raise ValueError(f"{k}: unknown option; expected one of {sorted(OPTIONS)}")
    o = dict(OPTIONS)
    o.update(kw)
    for k in ("window", "sinks", "n_anchors", "p_sample", "cert_seeds"):
        v = o[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{k}: expected a nonnegative integer, got {v!r}")
    for k in ("buffer", "cert_cap"):
        v = o[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{k}: expected a positive integer, got {v!r}")
    rr = o["r"]
    if isinstance(rr, bool) or not isinstance(rr, (int, np.integer)) or not 1 <= rr <= 30:
        raise ValueError(f"r: expected an integer in [1, 30], got {rr!r}")
    cs = o["cert_seeds"]
    if cs > 4096:
        raise ValueError(f"cert_seeds: expected an integer in [0, 4096], got {cs!r}")
    mb = o["mma_bits"]
    if isinstance(mb, bool) or not isinstance(mb, (int, np.integer)) or not 8 <= mb <= 24:
        raise ValueError(f"mma_bits: expected an integer in [8, 24], got {mb!r}")
    if o["stream"] not in STREAMS:
        raise ValueError(f"stream: expected one of {STREAMS}, got {o['stream']!r}")
    if o["screen"] not in SCREENS:
        raise ValueError(f"screen: expected one of {tuple(SCREENS)}, got {o['screen']!r}")
    if o["planner"] not in PLANNERS:
        raise ValueError(f"planner: expected one of {PLANNERS}, got {o['planner']!r}")
    if o["screen"] == "wg" and (rr > 14 or cs):
        raise ValueError(
            f"screen: 'wg' needs r <= 14 and cert_seeds = 0, got r={rr}, cert_seeds={cs}"
        )
    if o["screen"] == "pair" and (rr > PAIR_MAX_R or cs):
        raise ValueError(
            f"screen: 'pair' needs r <= {PAIR_MAX_R} and cert_seeds = 0, got r={rr}, "
            f"cert_seeds={cs}"
        )
    return o


class _Timer:
    def __init__(self, on):
        self.on = on
        self.ms = {}
        self.cp = cupy_or_raise()
        self.last = None
        if on:
            self.last = self.cp.cuda.Event()
            self.last.record()

    def mark(self, name):
        if not self.on:
            return
        e = self.cp.cuda.Event()
        e.record()
        e.synchronize()
        self.ms[name] = self.ms.get(name, 0.0) + self.cp.cuda.get_elapsed_time(self.last, e)
        self.last = e


def dosa_topk(q, w, k_payload, k_scale, K, ks=None, ke=None, **options):
    """Exact Top-K of the canonical FP8 indexer with certificate screening.

    Args (DeepGEMM / SGLang layout; CuPy arrays or DLPack tensors, e.g. torch, no copies):
        q: e4m3 [Qn, H, 128] (uint8 bits or fp8 dtype); w: fp32 [Qn, H] with the query
        scales folded in; k_payload: e4m3 [N, 128]; k_scale: fp32 [N]; K ≤ 4096;
        ks, ke: int32 [Qn] visible ranges [ks, ke) (default: every key).
    Options: window, sinks, n_anchors (seeds, docs/method.md §2); seeds (explicit seed ids, any
        integer dtype [Qn, S], −1 padding, each id −1 or in [0, N); ids outside the query's
        visible range are ignored, repeats count once; they only raise τ); cert_seeds
        (0 = off; m ≤ 4096: after screening, score the m survivors of largest U, raise τ
        and drop survivors with U below it — docs/method.md §2's certificate-guided seeds;
        exact on the H200, slower than without at the benched shapes) with cert_cap
        (recorded survivors per query); r (retained heads, ≤ 30); buffer (compact records
        per query before an exact extension); mma_bits (accumulator bits of the MMA error
        model, plan.py); stream ("per_query", default, or "shared": the shared refinement
        stream of query groups, docs/method.md §9, refine_stream.py; exact on the H200, slower
        than per_query at the benched shapes); planner ("fused", default: one kernel per
        chunk, plan_fused.py, or "cupy": the batched CuPy planner plan.py, ~10× slower);
        screen ("fp64", default, or "fast32": an fp32 upward-rounded pre-test before the
        fp64 guard, proofs/fp32_pretest.py; survivors ⊆ the fp64 screen's; exact on the
        H200, not faster; or "pair": two queries per 16-row MMA tile, needs r ≤ 6,
        kernels.cu screen_pair; or "auto": "pair" with r ≤ 6 when ≥ 95 % of the queries
        have ≤ 6 positive heads, else "fp64" — ``auto_screen``);
        return_stats, timing, debug_bounds.
    Returns int64 [Qn, K] ids (score desc, id asc, −1 padding; the ``dosa_ref.topk_ids``
    contract), equal to ``dense_topk``; with return_stats=True, (ids, DosaGpuStats).
    """
    cp = cupy_or_raise()
    o, tm, st, (q, w, kp, ksc, K, ks, ke), empty = _start(q, w, k_payload, k_scale, K, ks, ke,
                                                         options)  # fmt: skip
    if empty is not None:
        return empty
    Qn, Hp, _ = q.shape
    N = kp.shape[0]
    mth = Hp // 16
    NW = (N + 31) // 32

    # Prepare: ρ per key (docs/method.md §8).
    rho = key_rho(kp)
    tm.mark("prepare")

    pool, poolmask, seed_rec, seed_cnt, xcnt, tau = _seed_stage(q, w, kp, ksc, K, ks, ke, o)
    tm.mark("seeds")

    # Plan (docs/method.md §3–§5, §8).
    o["screen"], r = auto_screen(o["screen"], int(o["r"]), int(o["cert_seeds"]), w, cp)
    st.screen = o["screen"]
    mts = 1 if r <= 14 else 2
    ns = min(o["p_sample"], int(pool.size))
    sample = pool[cp.linspace(0, pool.size - 1, ns).astype(cp.int64)] if ns else None
    planner = build_plans_fused if o["planner"] == "fused" else build_plans
    plan = planner(q, w, kp, sample, r, mts, o["mma_bits"])
    tm.mark("plan")

    # Screen (docs/method.md §8–§9).
    surv = cp.empty((Qn, NW), dtype=cp.uint32)
    Uout = cp.full((Qn, N), np.nan) if o["debug_bounds"] else None
    T = tile()
    grid = ((N + T - 1) // T, (Qn + QG - 1) // QG)
    cert = _CertBuffers(Qn, int(o["cert_cap"])) if o["cert_seeds"] else None
    rows, omega, name = plan.rows, plan.omega, f"screen{'_cert' if cert else ''}_mt{mts}"
    if o["screen"] == "pair":  # two queries per 16-row tile (r <= 6 checked in _opts)
        rows, omega = pair_plan(plan.rows, plan.omega, plan.valid, cp)
        grid, name = (grid[0], (rows.shape[0] + QG - 1) // QG), "screen_pair"
    launch, block, smem = (
        kernel(name, T * ROWB + T * 8, SCREENS[o["screen"]]),
        256,
        T * ROWB + T * 8,
    )
    if o["screen"] == "wg":  # Hopper wgmma screen: same arguments and values as screen_mt1
        launch, block, smem = sm90a.kernel("screen_wg_mt1"), sm90a.THREADS, sm90a.smem_bytes(T)
        grid = (grid[0], (Qn + sm90a.QG - 1) // sm90a.QG)
    launch(
        grid,
        (block,),
        (
            rows, omega, plan.sigma, plan.C, plan.eps_raw, np.float64(plan.eps_out),
            tau, kp, ksc, rho, ks, ke, np.int32(o["sinks"]), np.int32(o["window"]), poolmask,
            np.int32(Qn), np.int64(N), np.int32(sm90a.QG if o["screen"] == "wg" else QG), surv,
            Uout if Uout is not None else np.uint64(0),
        ) + (cert.args() if cert else ()),
        shared_mem=smem,
    )  # fmt: skip
    tm.mark("screen")
    if cert:
        # Certificate-guided seeds (docs/method.md §2): raise τ, drop survivors with U < τ.
        tau = _certificate_seeds(cert, q, w, kp, ksc, K, ks, ke, o, poolmask, seed_rec,
                                 seed_cnt, tau, surv, st)  # fmt: skip
        tm.mark("cert")

    # Refine (docs/method.md §9) with compact writeback; exact extension on overflow (§7 C.3):
    # per-query stream, or shared stream of query groups + per-query residuals (stream=).
    cap = int(o["buffer"])
    recs, shared = refine_stage(mth, q, w, kp, ksc, tau, ks, ke, N, surv, cap, o["stream"])
    tm.mark("refine")

    # Exact selection from seed records ∪ compact records (docs/method.md §7, §9).
    ids = _select(K, seed_rec, seed_cnt, recs)
    tm.mark("select")

    # Query-level recovery (docs/method.md §7 C.3): invalid scales or non-finite plans.
    bad = _invalid_scale_queries(ksc, ks, ke) | ~plan.valid
    n_bad = int(bad.sum())
    if n_bad:
        bq = cp.flatnonzero(bad)
        ids[bq] = _dense_topk_raw(q[bq], w[bq], kp, ksc, K, ks[bq], ke[bq])
    ids = ids.astype(cp.int64)  # public contract (docs/design.md); the kernels write int32
    tm.mark("recover")

    if o["return_stats"] or o["debug_bounds"]:
        vis = (ke - ks).astype(cp.int64)
        st.seeds = cp.asnumpy(seed_cnt).astype(np.int64)
        st.explicit_seeds = cp.asnumpy(xcnt).astype(np.int64)
        st.tau = cp.asnumpy(tau)
        st.screened = cp.asnumpy(vis) - st.seeds
        sv = popcount_rows(surv, cp)
        st.survivors = cp.asnumpy(sv)
        st.kept = cp.asnumpy(recs.cnt).astype(np.int64)
        st.overflowed = cp.asnumpy(recs.over)
        if shared is not None:
            g = cp.arange(Qn) // GROUP
            st.shared_keys = cp.asnumpy(popcount_rows(shared, cp)[g])
            st.shared_survivors = cp.asnumpy(popcount_rows(shared[g] & surv, cp))
        st.recovered = cp.asnumpy(bad)
        st.r = cp.asnumpy(plan.r)
        st.omitted_positive = cp.asnumpy(plan.omitted_positive)
        st.aggregated = cp.asnumpy(plan.aggregated)
        st.stage_ms = dict(tm.ms)
        st.bounds = Uout
        return ids, st
    return ids


def _start(q, w, k_payload, k_scale, K, ks, ke, options):
    """The common start of ``dosa_topk`` and ``fused_topk``: options, stage timer, stats,
    validated inputs with heads padded to 16·MT and explicit seeds on the device; ``empty``
    is the finished result (−1 ids) when there is no query or no key, else None."""
    cp = cupy_or_raise()
    o = _opts(options)
    tm = _Timer(o["timing"])
    q, w, kp, ksc, K, ks, ke = check_inputs(q, w, k_payload, k_scale, K, ks, ke)
    q, w = pad_heads(q, w)
    Qn, N = q.shape[0], kp.shape[0]
    o["seeds"] = _device_seeds(o["seeds"], Qn, N)
    st = DosaGpuStats()
    empty = None
    if Qn == 0 or N == 0:
        ids = cp.full((Qn, K), -1, dtype=cp.int64)
        empty = (ids, st) if o["return_stats"] else ids
    return o, tm, st, (q, w, kp, ksc, K, ks, ke), empty


def _seed_stage(q, w, kp, ksc, K, ks, ke, o):
    """Seeds (docs/method.md §2) scored by the canonical scorer and τ = K-th seed record.

    Returns (pool int32, poolmask uint32 [NW], seed_rec uint64 [Qn, scap], seed_cnt uint32
    [Qn], xcnt uint32 [Qn], tau fp32 [Qn]).  seed_rec holds the default seeds (excluded from
    screening, part of the final selection); explicit seeds (``o["seeds"]``, validated by
    ``check_seeds``) contribute only to τ, and xcnt counts their records.
    """
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    mth = Hp // 16
    N = kp.shape[0]
    NW = (N + 31) // 32
    # Seeds (docs/method.md §2): anchor pool = union of the exact Top-K of n_anchors queries.
    na = min(o["n_anchors"], Qn)
    if na > 0:
        anchors = cp.asarray(np.unique(np.linspace(0, Qn - 1, na).round().astype(np.int64)))
        aid = _dense_topk_raw(q[anchors], w[anchors], kp, ksc, K, ks[anchors], ke[anchors])
        pool = cp.unique(aid[aid >= 0]).astype(cp.int32)
    else:
        pool = cp.zeros(0, dtype=cp.int32)
    poolmask = cp.zeros(NW, dtype=cp.uint32)
    if pool.size:
        import cupyx

        cupyx.scatter_add(poolmask, pool >> 5, (cp.uint32(1) << (pool & 31).astype(cp.uint32)))
    pool_arg = pool if pool.size else cp.zeros(1, dtype=cp.int32)
    plo = cp.searchsorted(pool, ks).astype(cp.int32)
    phi = cp.searchsorted(pool, ke).astype(cp.int32)
    scap = o["sinks"] + o["window"] + int(pool.size)
    scap = max(scap, 1)
    seed_rec = cp.empty((Qn, scap), dtype=cp.uint64)
    seed_cnt = cp.zeros(Qn, dtype=cp.uint32)
    warps = 8
    gx = (scap + warps * 256 - 1) // (warps * 256)
    kernel(f"seed_score_mt{mth}")(
        (gx, Qn),
        (32 * warps,),
        (
            q, w, kp, ksc, ks, ke, np.int32(o["sinks"]), np.int32(o["window"]), pool_arg,
            plo, phi, seed_cnt, seed_rec, np.int64(scap),
        ),
    )  # fmt: skip
    # Explicit seeds (docs/method.md §2): distinct visible ids that are not default seeds, so
    # the union below has no key twice (a repeated key could lift τ above τ_K(Ω)).
    xcnt = cp.zeros(Qn, dtype=cp.uint32)
    xrec = None
    o["_xtable"] = None
    if o["seeds"] is not None:
        table = explicit_seed_table(o["seeds"], ks, ke, o["sinks"], o["window"], poolmask, cp)
        xrec, xcnt = _score_seed_ids(mth, q, w, kp, ksc, ks, ke, table)
        if xrec is not None:
            o["_xtable"] = table  # the certificate seeds are deduplicated against these
    tau = _tau_of_seeds(K, seed_rec, seed_cnt, xrec, xcnt)
    return pool, poolmask, seed_rec, seed_cnt, xcnt, tau


def _score_seed_ids(mth, q, w, kp, ksc, ks, ke, table):
    """Records of explicit / certificate seeds ``table`` int32 [Qn, S] (distinct, not default
    seeds, −1 padding) by the canonical scorer (``seed_ids`` kernel): (rec uint64 [Qn, S] or
    None when S = 0, count uint32 [Qn])."""
    cp = cupy_or_raise()
    Qn = q.shape[0]
    cnt = cp.zeros(Qn, dtype=cp.uint32)
    S = int(table.shape[1])
    if S == 0:
        return None, cnt
    table = cp.ascontiguousarray(table)
    rec = cp.empty((Qn, S), dtype=cp.uint64)
    warps = 8
    gx = (S + warps * 256 - 1) // (warps * 256)
    kernel(f"seed_ids_mt{mth}")(
        (gx, Qn), (32 * warps,), (q, w, kp, ksc, ks, ke, table, np.int64(S), cnt, rec)
    )
    return rec, cnt


def _tau_of_seeds(K, seed_rec, seed_cnt, xrec, xcnt):
    """τ = K-th record of default ∪ extra seed records (Prop. 4): fp32 [Qn], −inf when
    fewer than K.  The two lists must not share a key (docs/method.md §2)."""
    cp = cupy_or_raise()
    Qn = seed_rec.shape[0]
    xc = xcnt if xrec is not None else None
    _, kth = select_records(K, seed_rec, seed_cnt, xrec, xc, want_ids=False, want_kth=True)
    tau = cp.empty(Qn, dtype=cp.float32)
    kernel("tau_from_kth")(((Qn + 255) // 256,), (256,), (kth, np.int32(Qn), tau))
    return tau


class _CertBuffers:
    """(U, id) records of the survivors written by ``screen_cert_mt*`` (docs/method.md §2)."""

    def __init__(self, Qn: int, cap: int):
        cp = cupy_or_raise()
        self.cap = cap
        self.cnt = cp.zeros(Qn, dtype=cp.uint32)
        self.rec = cp.empty((Qn, cap), dtype=cp.uint64)

    def args(self):
        return (self.cnt, self.rec, np.int64(self.cap))


def _cert_clear(cert, tau, surv):
    """Clear the bitmask bit of every recorded survivor with U < τ (kernel
    ``cert_clear_below_tau``; reference ``dosa_ref.stages.cert_clear_below_tau``)."""
    Qn, NW = surv.shape
    gx = max(1, min(64, (cert.cap + 255) // 256))
    kernel("cert_clear_below_tau")(
        (gx, min(Qn, 65535)),
        (256,),
        (cert.rec, cert.cnt, np.int64(cert.cap), tau, np.int32(Qn), np.int64(NW), surv),
    )


def _certificate_seeds(cert, q, w, kp, ksc, K, ks, ke, o, poolmask, seed_rec, seed_cnt, tau,
                       surv, st):  # fmt: skip
    """Certificate-guided seeds on the GPU (docs/method.md §2; dosa_ref.select's "certificate"
    strategy): score the ``cert_seeds`` survivors of largest U exactly, τ' = K-th record of
    default ∪ explicit ∪ these seeds (≥ τ: a superset), then clear the survivor bit of every
    recorded key with U < τ' (``cert_clear_below_tau``).  Returns τ' fp32 [Qn].

    Exactness: the certificate seeds are survivors, hence visible, not default seeds, and
    distinct (one bitmask bit each); together with explicit seeds they are deduplicated by
    ``explicit_seed_table``, so no key is counted twice in τ'.  A cleared key has
    s ≤ U < τ' ≤ τ_K(Ω).  The seeds are not added to the final candidate set: like explicit
    seeds they only raise τ; a seed with s ≥ τ' has U ≥ τ', keeps its bit, and refinement
    re-scores it into the compact records.  Survivors whose record did not fit
    (count > cert_cap) keep their bit.
    """
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    mth = Hp // 16
    m = int(o["cert_seeds"])
    cid, _ = select_records(m, cert.rec, cert.cnt)  # largest (U, id) first, −1 padding
    table = cid
    if o.get("_xtable") is not None:
        both = cp.concatenate([o["_xtable"], cid], axis=1)
        table = explicit_seed_table(both, ks, ke, o["sinks"], o["window"], poolmask, cp)
    xrec, xcnt = _score_seed_ids(mth, q, w, kp, ksc, ks, ke, table)
    tau1 = _tau_of_seeds(K, seed_rec, seed_cnt, xrec, xcnt)
    _cert_clear(cert, tau1, surv)
    if o["return_stats"] or o["debug_bounds"]:
        st.cert_seeds = cp.asnumpy((cid >= 0).sum(axis=1)).astype(np.int64)
    return tau1


def check_seeds(seeds, Qn: int, N: int, xp=np):
    """Validate explicit seed ids (docs/method.md §2) → int32 [Qn, S] (xp array), −1 = padding.

    ``seeds``: an integer array [Qn, S] (xp array; ``dosa_topk`` first converts CuPy,
    DLPack or numpy input with ``as_device``).  Every entry must be −1 or a key id in
    [0, N); ids outside a query's visible range are legal (they are ignored later).
    ValueError naming ``seeds`` otherwise.
    """
    if seeds.dtype.kind not in "iu":
        raise ValueError(f"seeds: expected an integer array, got dtype {seeds.dtype}")
    if seeds.ndim != 2 or seeds.shape[0] != Qn:
        raise ValueError(f"seeds: expected shape [Qn={Qn}, S], got {tuple(seeds.shape)}")
    if seeds.size:
        # compare in the input dtype first: an uint64 id ≥ 2^63 would wrap to a negative
        # int64 (−1 would look like padding); after this check every id is < N < 2^31.
        if seeds.dtype.kind == "u":
            bad = bool(xp.any(seeds >= np.uint64(N))) if N else True
        else:
            a = seeds.astype(xp.int64)
            bad = bool(xp.any((a < -1) | (a >= N)))
        if bad:
            raise ValueError(f"seeds: ids must be -1 (padding) or lie in [0, N={N})")
    return seeds.astype(xp.int32)


def explicit_seed_table(seeds, ks, ke, sinks: int, window: int, poolmask, xp=np):
    """Explicit seeds that can add to τ: int32 [Qn, S'] (xp array), each row sorted,
    distinct, −1 padded at the end; S' = the largest row count (0 columns when none).

    Keeps id i of row t iff ks[t] ≤ i < ke[t] (visible) and i is not a default seed of
    query t — a sink (i < ks + min(sinks, ke − ks)), in the local window (i ≥ max(that,
    ke − window)), or in the anchor pool (bit i of ``poolmask`` uint32 [ceil(N/32)]) — the
    same predicate as the screen's and seed_score's; repeats are dropped.  Every key then
    appears at most once in default ∪ explicit seeds, as τ_K(S) ≤ τ_K(Ω) requires
    (docs/method.md §2).  seeds: validated ids [Qn, S] (``check_seeds``); ks, ke: int [Qn].
    """
    Qn = seeds.shape[0]
    a = seeds.astype(xp.int64)
    lo = ks.astype(xp.int64)[:, None]
    hi = ke.astype(xp.int64)[:, None]
    s_hi = lo + xp.minimum(int(sinks), hi - lo)
    loc_lo = xp.maximum(s_hi, hi - int(window))
    safe = xp.where((a >= 0) & (a < 32 * poolmask.shape[0]), a, 0)
    inpool = ((poolmask[safe >> 5].astype(xp.int64) >> (safe & 31)) & 1) != 0
    visible = (a >= lo) & (a < hi)
    default = (a < s_hi) | (a >= loc_lo) | inpool
    keep = visible & ~default
    big = np.iinfo(np.int64).max
    s = xp.sort(xp.where(keep, a, big), axis=1)
    dup = xp.zeros(s.shape, dtype=bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s = xp.sort(xp.where(dup, big, s), axis=1)  # distinct ids first, then padding
    width = int((s != big).sum(axis=1).max()) if Qn and s.shape[1] else 0
    s = s[:, :width]
    return xp.where(s == big, -1, s).astype(xp.int32)


def _device_seeds(seeds, Qn: int, N: int):
    """``seeds`` option → validated CuPy int32 [Qn, S] (or None)."""
    if seeds is None:
        return None
    cp = cupy_or_raise()
    return check_seeds(as_device(seeds, "seeds"), Qn, N, cp)


_refine = refine_per_query  # kernels.cu refine_mt* launcher (refine_stream.py)


def dense_scores_for_test(q, w, k_payload, k_scale, ks=None, ke=None):  # pragma: no cover
    """Canonical logits after the same validation/padding as dosa_topk (tests)."""
    q, w, kp, ksc, _, ks, ke = check_inputs(q, w, k_payload, k_scale, 1, ks, ke)
    q, w = pad_heads(q, w)
    return _dense_logits_raw(q, w, kp, ksc, ks, ke)


_ = (time, select_rows)


# Paired screen tile (kernels.cu screen_pair): row i of pair p ← row PAIR_ROWS[i][1] of
# query 2p + PAIR_ROWS[i][0], from mts = 1 plans (retained rows 0..5, aux rows 7 and 15).
PAIR_ROWS = (
    [(0, j) for j in range(6)]
    + [(1, 7), (0, 7)]
    + [(1, j) for j in range(6)]
    + [
        (1, 15),
        (0, 15),
    ]
)


PAIR_EMPTY = [6, 8, 9, 10, 11, 12, 13, 14]  # mts = 1 plan rows a plan with r ≤ 6 leaves empty


def pair_plan(rows, omega, valid, xp):
    """Plans of queries (2p, 2p+1) gathered into one 16-row tile per pair (screen_pair).

    rows uint8 [Qn, 16, 128], omega fp32 [Qn, 16] and valid bool [Qn] of an mts = 1 plan
    with r ≤ 6 → rows_p uint8 [P, 16, 128], omega_p fp32 [P, 16] (P = ⌈Qn/2⌉; an odd Qn's
    missing partner is a zero plan).  ω of the aux positions (6, 7, 14, 15) is 0: the
    kernel weighs them by −σ itself.  Invalid plans (recovered later, docs/method.md §7 C.3)
    become zero plans: they are the only plans whose rows can hold NaN codes, and a NaN
    row would erase its partner's terms in the kernel's fmaf(0, y, x).  A plan with a
    nonzero row outside slots 0..5 and the aux rows (r > 6) raises ValueError: the tile
    has no place for it.  xp: numpy or CuPy.
    """
    Qn = rows.shape[0]
    if rows.shape[1:] != (16, D) or omega.shape != (Qn, 16):
        raise ValueError(f"rows: expected an mts = 1 plan [Qn, 16, {D}], got {rows.shape}")
    ok = xp.asarray(valid, dtype=bool)
    rows = xp.where(ok[:, None, None], rows, 0).astype(xp.uint8)
    omega = xp.where(ok[:, None], omega, 0).astype(xp.float32)
    if bool(xp.any(rows[:, PAIR_EMPTY] != 0)) or bool(xp.any(omega[:, PAIR_EMPTY] != 0)):
        raise ValueError(f"rows: a plan retains more than {PAIR_MAX_R} heads (slots > 5 used)")
    P = (Qn + 1) // 2
    if Qn % 2:
        rows = xp.concatenate([rows, xp.zeros((1, 16, D), dtype=rows.dtype)])
        omega = xp.concatenate([omega, xp.zeros((1, 16), dtype=omega.dtype)])
    r2, o2 = rows.reshape(P, 2, 16, D), omega.reshape(P, 2, 16)
    who = np.array([w for w, _ in PAIR_ROWS])
    row = np.array([j for _, j in PAIR_ROWS])
    rows_p = xp.ascontiguousarray(r2[:, who, row])
    keep = xp.asarray(row < 6)
    omega_p = xp.ascontiguousarray(xp.where(keep[None, :], o2[:, who, row], 0).astype(xp.float32))
    return rows_p, omega_p


def auto_screen(screen: str, r: int, cert_seeds: int, w, xp) -> tuple[str, int]:
    """(screen kernel, r) for a chunk.  ``screen="auto"``: "pair" with r = min(r, 6) when
    certificate seeds are off and at least AUTO_PAIR_SHARE of the queries have at most
    PAIR_MAX_R positive weights (w fp32 [Qn, Hp]; one device reduction, one sync), else
    "fp64" with r.  Any other screen passes through.  Both choices are exact; this only
    picks the faster one by the rule of docs/records/notes.md "Paired screen"."""
    if screen != "auto":
        return screen, r
    Qn = w.shape[0]
    if cert_seeds or Qn == 0:
        return "fp64", r
    few = int(xp.sum(xp.sum(w > 0, axis=1) <= PAIR_MAX_R))
    if few >= AUTO_PAIR_SHARE * Qn:
        return "pair", min(r, PAIR_MAX_R)
    return "fp64", r


def _select(K, seed_rec, seed_cnt, recs):
    """Exact Top-K ids int32 [Qn, K] of seed records ∪ compact records (docs/method.md §7, §9);
    the overflowed rows are selected again from their complete lists (``recs.ext``)."""
    ids, _ = select_records(K, seed_rec, seed_cnt, recs.rec, recs.cnt)
    if recs.ext is not None:
        oq, rec2, cnt2 = recs.ext
        ids[oq], _ = select_records(K, seed_rec[oq], seed_cnt[oq], rec2, cnt2)
    return ids


def _invalid_scale_queries(ksc, ks, ke):
    """Queries that see a key with an invalid scale (α < 0, NaN, inf): bool [Qn]."""
    cp = cupy_or_raise()
    bad = ~((ksc >= 0) & cp.isfinite(ksc))
    pre = cp.concatenate([cp.zeros(1, dtype=cp.int64), cp.cumsum(bad.astype(cp.int64))])
    return (pre[ke.astype(cp.int64)] - pre[ks.astype(cp.int64)]) > 0


def _fused_pass(mth, q, w, kp, ksc, tau, ks, ke, o, poolmask, cap):
    cp = cupy_or_raise()
    Qn = q.shape[0]
    N = kp.shape[0]
    rec = cp.empty((Qn, cap), dtype=cp.uint64)
    cnt = cp.zeros(Qn, dtype=cp.uint32)
    T = tile()
    grid = ((N + T - 1) // T, (Qn + QG - 1) // QG)
    kernel(f"fused_mt{mth}", T * ROWB + T * 4)(
        grid,
        (256,),
        (
            q, w, kp, ksc, tau, ks, ke, np.int32(o["sinks"]), np.int32(o["window"]), poolmask,
            np.int32(Qn), np.int64(N), np.int32(QG), cnt, rec, np.int64(cap),
        ),
        shared_mem=T * ROWB + T * 4,
    )  # fmt: skip
    return rec, cnt


def fused_topk(q, w, k_payload, k_scale, K, ks=None, ke=None, **options):
    """The fused route (issue 5; what LiteTopK does): seeds → τ, then every visible key is
    scored with all heads by the canonical scorer and filtered online against τ (compact
    records, no dense logits), exact selection.  Same contract as ``dosa_topk`` (int64
    [Qn, K] ids); ids equal ``dense_topk``.  Options: window, sinks, n_anchors, seeds
    (explicit seed ids, as in ``dosa_topk``), buffer, return_stats, timing (cert_seeds and
    the plan options are accepted and ignored: the fused route has no screen)."""
    cp = cupy_or_raise()
    o, tm, st, (q, w, kp, ksc, K, ks, ke), empty = _start(q, w, k_payload, k_scale, K, ks, ke,
                                                         options)  # fmt: skip
    if empty is not None:
        return empty
    Qn, Hp, _ = q.shape
    mth = Hp // 16
    _, poolmask, seed_rec, seed_cnt, xcnt, tau = _seed_stage(q, w, kp, ksc, K, ks, ke, o)
    tm.mark("seeds")
    cap = int(o["buffer"])
    rec, cnt = _fused_pass(mth, q, w, kp, ksc, tau, ks, ke, o, poolmask, cap)
    recs = Records(rec, cnt, cnt > cap)
    if bool(recs.over.any()):
        # exact extension of the overflowed rows only (refine_stream.Records)
        oq = cp.flatnonzero(recs.over)
        cap2 = int(cnt[oq].max())
        rec2, cnt2 = _fused_pass(
            mth, q[oq], w[oq], kp, ksc, tau[oq], ks[oq], ke[oq], o, poolmask, cap2
        )
        recs.ext = (oq, rec2, cnt2)
    tm.mark("score+filter")
    ids = _select(K, seed_rec, seed_cnt, recs)
    tm.mark("select")
    bad = _invalid_scale_queries(ksc, ks, ke)
    if bool(bad.any()):
        bq = cp.flatnonzero(bad)
        ids[bq] = _dense_topk_raw(q[bq], w[bq], kp, ksc, K, ks[bq], ke[bq])
    ids = ids.astype(cp.int64)  # public contract (docs/design.md); the kernels write int32
    tm.mark("recover")
    if o["return_stats"]:
        st.seeds = cp.asnumpy(seed_cnt).astype(np.int64)
        st.explicit_seeds = cp.asnumpy(xcnt).astype(np.int64)
        st.tau = cp.asnumpy(tau)
        st.kept = cp.asnumpy(cnt).astype(np.int64)
        st.overflowed = cp.asnumpy(recs.over)
        st.recovered = cp.asnumpy(bad)
        st.stage_ms = dict(tm.ms)
        return ids, st
    return ids
