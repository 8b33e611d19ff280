"""Reference functions named after the GPU kernels (docs/design.md: "each kernel's reference
function by the same name in dosa_ref").  Each composes the reference pieces for one
stage of docs/method.md §9, on FP8 keys, so a stage of ``dosa_cupy`` can be checked alone:

  quantize_keys (prepare)  → ``dosa_ref.fp8.quantize_keys``
  key_rho (prepare)        → ρ_i with ρ_i√D ≥ ‖k̄_i‖, fp32 rounded up
  check_values (prepare)   → the input value checks as one flag word
  dense_logits             → original scores of every visible key (the dense route)
  seed_score               → exact seed scores and τ = τ_K(S) (Prop. 4)
  pool_ids, pool_mask      → the anchor pool: the sorted distinct ids of the anchors' Top-K,
                             and as a key bitmask
  seed_ranges              → each query's default seeds as index ranges: sinks, local
                             window, and the pool ids that are neither
  seed_ids                 → explicit seeds: exact scores of caller ids that are visible,
                             distinct and not default seeds; τ_K of the union (they only
                             raise τ: screened and refined like any other key)
  screen                   → survivor mask U^num ≥ τ (strict rejection U^num < τ)
  cert_clear_below_tau     → certificate-guided seeds (screen_cert_mt*): survivors that
                             remain once the m survivors of largest U^num, scored exactly,
                             raised τ (their bound below the new τ: dropped)
  refine                   → compact records (id, s) of survivors with s ≥ τ
  select                   → exact Top-K of seed records ∪ compact records (Theorem 1)

Scores here are the float64 reference scorer on the dequantized keys; the GPU's own
scorer differs in its low bits (its error model bounds the difference), so GPU tests
compare ids and bounds, not raw score bits, against these.
"""

from __future__ import annotations

import numpy as np

from .fp8 import dequantize, e4m3_values, key_rms, nan_codes, quantize_keys
from .numeric import FP8ScreenPlan, screen_bound
from .scorer import index_scores, score_keys, topk_of
from .seeds import explicit_seeds, kth_score

__all__ = [
    "check_values",
    "clamp_ranges",
    "dense_logits",
    "key_rho",
    "pool_ids",
    "pool_mask",
    "quantize_keys",
    "refine",
    "screen",
    "cert_clear_below_tau",
    "seed_ids",
    "seed_ranges",
    "seed_score",
    "select",
]


def key_rho(payload: np.ndarray) -> np.ndarray:
    """RMS summaries float32 [N] of e4m3 payloads uint8 [N, D] (§8; rounded up)."""
    return key_rms(payload)


def check_values(q, w, payload, ks, ke, N: int) -> int:
    """Flag word of the input value checks (bit 0: an e4m3 NaN code in q, 1: in payload,
    2: a non-finite w, 3: a ks entry outside [0, N], 4: a ke entry outside it, 5: some
    ks > ke).  q, payload: uint8 e4m3 codes (any shape); w: float32; ks, ke: integers [Qn]."""
    ks = np.asarray(ks).astype(np.int64)
    ke = np.asarray(ke).astype(np.int64)
    flags = (
        np.any(nan_codes(q)),
        np.any(nan_codes(payload)),
        not np.all(np.isfinite(np.asarray(w, np.float32))),
        np.any((ks < 0) | (ks > N)),
        np.any((ke < 0) | (ke > N)),
        np.any(ks > ke),
    )
    return sum(int(bool(f)) << i for i, f in enumerate(flags))


def clamp_ranges(ks, ke, N: int) -> tuple[np.ndarray, np.ndarray]:
    """The ranges the check kernel writes beside its flags (check_values_*): int32 [Qn]
    each, ks clamped into [0, N] and ke into [ks, N], so launches before the flags are
    read stay in bounds."""
    lo = np.clip(np.asarray(ks).astype(np.int64), 0, N)
    return lo.astype(np.int32), np.clip(np.asarray(ke).astype(np.int64), lo, N).astype(np.int32)


def dense_logits(q, w, payload, scale, ks=None, ke=None) -> np.ndarray:
    """float64 [Qn, N] original scores of the dequantized keys; −inf outside [ks, ke)."""
    return index_scores(q, w, dequantize(payload, scale), ks, ke)


def pool_ids(anchor_ids) -> np.ndarray:
    """The anchor pool (§2): sorted distinct ids int32 [P] of the anchors' Top-K ids (any
    shape, −1 padding)."""
    a = np.asarray(anchor_ids).ravel()
    return np.unique(a[a >= 0]).astype(np.int32)


def pool_mask(pool, NW: int) -> np.ndarray:
    """The pool as a key bitmask uint32 [NW] (bit i of word i // 32: key i in the pool;
    kernel ``pool_mark``)."""
    pool = np.asarray(pool, dtype=np.int64)
    mask = np.zeros(NW, dtype=np.uint32)
    np.bitwise_or.at(mask, pool >> 5, np.left_shift(1, pool & 31).astype(np.uint32))
    return mask


def seed_ranges(pool, ks, ke, sinks: int, window: int) -> np.ndarray:
    """The default seeds of each query as index ranges, int32 [6, Qn] (§2): the sinks
    [ks, ks + ns) and the local window [loc_lo, ke) of the keys (ns = min(sinks, ke − ks),
    loc_lo = max(ks + ns, ke − window)), and [rg4, rg5) of the sorted ``pool``'s indices:
    its ids in [ks + ns, loc_lo), the visible pool ids that are neither sinks nor local."""
    pool = np.asarray(pool)
    ks = np.asarray(ks).astype(np.int64)
    ke = np.asarray(ke).astype(np.int64)
    s_hi = ks + np.minimum(int(sinks), ke - ks)
    loc_lo = np.maximum(s_hi, ke - int(window))
    p = [np.searchsorted(pool, x) for x in (s_hi, loc_lo)]
    return np.stack([ks, s_hi, loc_lo, ke, *p]).astype(np.int32)


def seed_score(q_t, w_t, k, seed_ids, K: int) -> tuple[np.ndarray, float]:
    """Exact scores float64 [|S|] of distinct visible seeds ``seed_ids`` and τ_K(S)."""
    s = score_keys(np.asarray(q_t, np.float64), np.asarray(w_t, np.float64), k[seed_ids])
    return s, kth_score(s, K)


def seed_ids(
    q_t, w_t, k, ids_t, ks_t: int, ke_t: int, default_ids, default_scores, K: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Explicit seeds of one query (kernel ``seed_ids``; docs/method.md §2, Prop. 4).

    ``ids_t``: caller key ids (−1 pads; ids outside [ks_t, ke_t) are ignored);
    ``default_ids`` / ``default_scores``: the default seeds already scored.  Returns the
    explicit ids kept (int64, sorted: visible, distinct, not default seeds — a key counted
    twice could lift τ above τ_K(Ω)), their exact scores float64, and τ_K(default ∪ kept).
    The kept ids are not seeds of Algorithm 1 step 4: they stay in V and are refined.
    """
    x = np.setdiff1d(explicit_seeds(ids_t, ks_t, ke_t), np.asarray(default_ids, np.int64))
    s = score_keys(np.asarray(q_t, np.float64), np.asarray(w_t, np.float64), k[x])
    return x, s, kth_score(np.concatenate([np.asarray(default_scores, np.float64), s]), K)


def screen(fplan: FP8ScreenPlan, payload, scale, rho, tau: float) -> np.ndarray:
    """bool [n]: key survives screening (U^num ≥ τ; equality survives)."""
    return screen_bound(fplan, e4m3_values(payload), scale, rho) >= tau


def cert_clear_below_tau(survivor_ids, bounds, tau: float) -> np.ndarray:
    """Survivors kept after certificate-guided seeds raised τ (kernel
    ``cert_clear_below_tau``; docs/method.md §2): ids int64 of ``survivor_ids`` whose bound
    ``bounds`` (U^num, rounded up) is not below τ.  A dropped key has s ≤ U^num < τ ≤ τ_K(Ω)
    (strict rejection, as in ``screen``); NaN bounds are kept."""
    ids = np.asarray(survivor_ids, dtype=np.int64)
    return ids[~(np.asarray(bounds, np.float64) < tau)]


def refine(q_t, w_t, k, survivor_ids, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Score survivors with the original scorer; keep records with s ≥ τ (ids, scores)."""
    ids = np.asarray(survivor_ids, dtype=np.int64)
    s = score_keys(np.asarray(q_t, np.float64), np.asarray(w_t, np.float64), k[ids])
    keep = s >= tau
    return ids[keep], s[keep]


def select(seed_ids, seed_scores, rec_ids, rec_scores, K: int) -> np.ndarray:
    """int64 [K]: exact Top-K (score desc, id asc) of seed ∪ records, −1 padded."""
    ids = np.concatenate([np.asarray(seed_ids, np.int64), np.asarray(rec_ids, np.int64)])
    sc = np.concatenate([np.asarray(seed_scores, np.float64), np.asarray(rec_scores)])
    top, _ = topk_of(sc, ids, K)
    out = np.full(K, -1, dtype=np.int64)
    out[: top.size] = top
    return out
