"""Exact Top-K over a context whose keys are split into contiguous shards (docs/method.md
§12 "Sharded contexts"): each shard selects the Top-K of the keys it holds, and the Top-K
of the union of the shards' lists, under (score desc, global id asc), is the Top-K of the
whole context.  One process here (the shards in a loop); the distributed form hands each
rank its shard and exchanges the lists.

Why the merge is exact: a key in the context's Top-K has fewer than K keys before it in
(score desc, id asc) over the whole context, hence fewer than K before it in its own shard
(a shard's local ids are its global ids minus the shard's start, so the order inside a
shard is the global one), hence it is in its shard's Top-K; and the merge orders the union
by the same rule.  A key's score does not depend on which shard scores it
(``scorer.score_keys`` is a function of the query and that key alone).
"""

from __future__ import annotations

import numpy as np

from .decode import DecodeStats, DecodeStep, _check_ranges
from .scorer import score_keys, topk_of
from .validate import as_array, as_float_array, check_K, check_qwk, check_ranges

__all__ = [
    "distributed_decode_step",
    "distributed_topk",
    "sharded_decode_step",
    "shard_tau",
    "local_ranges",
    "merge_topk",
    "shard_list",
    "shard_seed_top",
    "shard_starts",
    "sharded_topk",
    "union_floor",
]


def shard_starts(N: int, shards: int | None = None, sizes=None) -> np.ndarray:
    """int64 [R + 1] boundaries of R contiguous shards of N keys: ``shards`` of (nearly)
    equal size, or the given ``sizes`` (≥ 0 each, summing to N; empty shards allowed)."""
    if (shards is None) == (sizes is None):
        raise ValueError("shards: give either shards or sizes")
    if sizes is None:
        if int(shards) < 1:
            raise ValueError(f"shards: expected ≥ 1, got {shards!r}")
        return np.linspace(0, N, int(shards) + 1).round().astype(np.int64)
    sz = as_array(sizes, "sizes").astype(np.int64)
    if sz.ndim != 1 or sz.size < 1 or (sz < 0).any() or int(sz.sum()) != N:
        raise ValueError(f"sizes: expected ≥ 0 entries summing to N={N}, got {sz.tolist()}")
    return np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)


def local_ranges(ks, ke, start: int, stop: int, xp=np) -> tuple[np.ndarray, np.ndarray]:
    """The visible ranges [ks, ke) int [Qn] restricted to the shard [start, stop), in the
    shard's local ids: int64 [Qn] each, empty (ks = ke) where a query sees no key of it.
    xp: numpy, or CuPy for device arrays (dosa_cupy.shards)."""
    lo = xp.clip(xp.asarray(ks, xp.int64), start, stop) - start
    hi = xp.clip(xp.asarray(ke, xp.int64), start, stop) - start
    return lo, xp.maximum(hi, lo)


def merge_topk(parts, K: int) -> np.ndarray:
    """The exact Top-K of the shards' lists: ``parts`` a sequence of (ids int64 [Qn, K_r],
    scores float64 [Qn, K_r]) with global ids, −1 where a row has fewer entries (its score
    ignored); returns ids int64 [Qn, K] under (score desc, id asc), −1 padding."""
    ids = np.concatenate([np.asarray(p[0], np.int64) for p in parts], axis=1)
    sc = np.concatenate([np.asarray(p[1], np.float64) for p in parts], axis=1)
    out = np.full((ids.shape[0], K), -1, dtype=np.int64)
    for t in range(ids.shape[0]):
        ok = ids[t] >= 0
        top, _ = topk_of(sc[t][ok], ids[t][ok], K)
        out[t, : top.size] = top
    return out


def _dosa_ids(*a, **o):
    from .pipeline import dosa_topk

    return dosa_topk(*a, **o).ids


def shard_seed_top(q, w, k_shard, K: int, ks, ke, start: int, **options) -> np.ndarray:
    """float64 [Qn, K]: per query, the K largest canonical scores of the shard's own seeds
    (``seeds.seed_set`` with the options' strategies), descending, −inf where it has fewer —
    scores of distinct visible keys of the context.  The shards' seeds are disjoint, so the
    K-th largest of the union of every shard's lists (``union_floor``) is the τ of distinct
    keys of the context: a lower bound on its K-th score, at least every shard's own τ (the
    list's last column), and the ``tau_floor`` every shard may screen against
    (docs/method.md §12)."""
    from .pipeline import DosaStats
    from .prepare import QueryContext, prepare_chunk
    from .seeds import seed_set

    lo, hi = local_ranges(ks, ke, start, start + k_shard.shape[0])
    c = prepare_chunk(q, w, k_shard, K, lo, hi, options)
    st = DosaStats(c.Qn)
    top = np.full((c.Qn, c.K), -np.inf)
    for t in range(c.Qn):
        if hi[t] > lo[t]:
            ctx = QueryContext(t, int(lo[t]), int(hi[t]), c.q[t], c.w[t], c, st)
            v = np.sort(seed_set(ctx).scores)[::-1][: c.K]
            top[t, : v.size] = v
    return top


def union_floor(tops, K: int) -> np.ndarray:
    """float64 [Qn]: the K-th largest of the union of the shards' ``shard_seed_top`` lists
    (each [Qn, K_r]; −inf padding counts as no seed), −inf where the union has fewer."""
    a = np.concatenate([np.asarray(t, np.float64) for t in tops], axis=1)
    if a.shape[1] < K:
        return np.full(a.shape[0], -np.inf)
    return np.partition(a, a.shape[1] - K, axis=1)[:, a.shape[1] - K]


def shard_tau(q, w, k_shard, K: int, ks, ke, start: int, **options) -> np.ndarray:
    """float64 [Qn]: per query, τ of the shard's own seeds (the K-th largest canonical score
    among them, −inf with fewer than K): the last column of ``shard_seed_top``."""
    return shard_seed_top(q, w, k_shard, K, ks, ke, start, **options)[:, -1]


def shard_list(q, w, k_shard, K: int, ks, ke, start: int, select=None, **options):
    """One shard's list for ``merge_topk``: (global ids int64 [Qn, K], canonical scores
    float64 [Qn, K]; −1 / −inf padding) of the Top-K of the keys k_shard [n, D] with global
    ids [start, start + n), for the global visible ranges ks, ke int [Qn].  ``select(q, w,
    k_shard, K, ks_local, ke_local, **options)`` returns local ids [Qn, K] (default:
    ``dosa_topk(...).ids``).  q, w, k_shard float64 (``check_qwk``)."""
    select = _dosa_ids if select is None else select
    lo, hi = local_ranges(ks, ke, start, start + k_shard.shape[0])
    local = np.asarray(select(q, w, k_shard, K, lo, hi, **options), np.int64)
    ids = np.where(local >= 0, local + start, -1)
    sc = np.full(ids.shape, -np.inf)
    for t in range(q.shape[0]):
        sel = ids[t] >= 0
        if sel.any():
            sc[t, sel] = score_keys(q[t], w[t], k_shard[ids[t][sel] - start])
    return ids, sc


def sharded_topk(q, w, k, K, ks=None, ke=None, *, starts=None, select=None, **options):
    """Top-K ids int64 [Qn, K] of q [Qn, H, D], w [Qn, H] over keys k [N, D] held in the
    shards ``starts`` (int [R + 1], ``shard_starts``; default 2 equal shards), each shard
    selected by ``select(q, w, k_shard, K, ks_local, ke_local, **options, tau_floor=τ)``
    returning ids [Qn, K] in local ids (default: ``dosa_topk(...).ids``), τ the largest of
    the shards' ``shard_tau``, then merged exactly with the canonical scores of the selected
    keys.  Equal to ``topk_ids(index_scores(q, w, k, ks, ke), K)``.  A reference: each
    shard's seeds are scored twice (once for ``shard_tau``, once inside ``select``)."""
    q, w, k = check_qwk(q, w, k)
    Qn, N = q.shape[0], k.shape[0]
    K = check_K(K, rows=Qn)
    ks, ke = check_ranges(ks, ke, Qn, N)
    starts = shard_starts(N, 2) if starts is None else as_array(starts, "starts").astype(np.int64)
    if starts.ndim != 1 or starts[0] != 0 or starts[-1] != N or (np.diff(starts) < 0).any():
        raise ValueError(f"starts: expected 0 ≤ … ≤ N={N}, nondecreasing, got {starts.tolist()}")
    bounds = list(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True))
    # the K-th of the union of the shards' seed scores (docs/method.md §12)
    floor = union_floor([shard_seed_top(q, w, k[s0:s1], K, ks, ke, s0, **options)
                         for s0, s1 in bounds], K)  # fmt: skip
    opts = dict(options, tau_floor=floor)
    return merge_topk([shard_list(q, w, k[s0:s1], K, ks, ke, s0, select, **opts)
                       for s0, s1 in bounds], K)  # fmt: skip


def distributed_topk(q, w, k_shard, K, ks, ke, start: int, group=None, select=None, **options):
    """``sharded_topk`` over ``torch.distributed``: every rank of ``group`` (default: the
    world) passes the replicated chunk q [Qn, H, D], w [Qn, H] with its global ranges ks,
    ke int [Qn], and its shard k_shard [n, D] whose first key has global id ``start``; each
    rank scores its seeds (``shard_seed_top``), one ``all_gather`` of their K largest scores
    per query ([Qn, K] float64) hands every rank the K-th of the union (``union_floor``),
    each rank selects its shard's list against it
    (``shard_list`` with ``tau_floor``), the lists are exchanged by one ``all_gather`` of
    fixed-size tensors (ids int64 and scores float64, [Qn, K] per rank: sizes that do not
    depend on the data), and every rank returns the merged ids int64 [Qn, K].  Gloo on the
    CPU."""

    q, w, k_shard = check_qwk(q, w, k_shard)
    K = check_K(K, rows=q.shape[0])
    ks, ke = (np.asarray(x, np.int64) for x in (ks, ke))
    if ks.shape != (q.shape[0],) or ke.shape != ks.shape or (ks < 0).any() or (ke < ks).any():
        raise ValueError("ks: expected 0 ≤ ks ≤ ke, one range per query")
    if int(start) < 0:
        raise ValueError(f"start: expected ≥ 0, got {start!r}")
    top = shard_seed_top(q, w, k_shard, K, ks, ke, int(start), **options)
    opts = dict(options, tau_floor=union_floor(_all_gather(top, group), K))
    ids, sc = shard_list(q, w, k_shard, K, ks, ke, int(start), select, **opts)
    return merge_topk(list(zip(_all_gather(ids, group), _all_gather(sc, group), strict=True)), K)


def _all_gather(a: np.ndarray, group) -> list:
    """Every rank's array ``a`` (one shape and dtype on every rank) by one ``all_gather``:
    a list in rank order."""
    import torch
    import torch.distributed as dist

    local = torch.from_numpy(np.ascontiguousarray(a))
    bufs = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(bufs, local, group=group)
    return [b.numpy() for b in bufs]


# --------------------------------------------------------------------------------------
# Decode over a sharded cache (docs/method.md §12 "Sharded contexts", §10)
# --------------------------------------------------------------------------------------


def _decode_shard(sel, q, w, keys, offset: int, ks, ke, s0: int, s1: int, tau=None):
    """One shard's part of a decode step: the keys [s0, s1) of every request's cache, where
    keys[b] holds request b's keys with global ids [offset, offset + len(keys[b])).
    Without ``tau``: float64 [B, n, K] the K largest canonical scores of the shard's
    visible witnesses, descending (−inf padding), and the witness counts.  With ``tau`` (the
    K-th of the union of the shards' lists): the shard's list (global ids int64 [B, n, K],
    scores float64 [B, n, K]; −1 / −inf padding) of its keys with s ≥ τ, and the records
    compacted."""

    def span(b, j):
        end = offset + keys[b].shape[0]
        return max(int(ks[b, j]), s0, offset), min(int(ke[b, j]), s1, end)

    B, n = ks.shape
    K = sel.K
    if tau is None:
        out, cnt = np.full((B, n, K), -np.inf), np.zeros((B, n), np.int64)
        for b in range(B):
            wit = sel.witnesses(b)
            for j in range(n):
                a, e = span(b, j)
                W = wit[(wit >= a) & (wit < e)]
                v = np.sort(score_keys(q[b, j], w[b, j], keys[b][W - offset]))[::-1][:K]
                out[b, j, : v.size] = v
                cnt[b, j] = W.size
        return out, cnt
    ids = np.full((B, n, K), -1, np.int64)
    sc = np.full((B, n, K), -np.inf)
    comp = np.zeros((B, n), np.int64)
    for b in range(B):
        for j in range(n):
            a, e = span(b, j)
            if e <= a:
                continue
            s = score_keys(q[b, j], w[b, j], keys[b][a - offset : e - offset])
            keep = s >= tau[b, j]
            top, ts = topk_of(s[keep], a + np.flatnonzero(keep).astype(np.int64), K)
            ids[b, j, : top.size], sc[b, j, : top.size] = top, ts
            comp[b, j] = int(keep.sum())
    return ids, sc, comp


def _merge_rows(parts, K: int) -> np.ndarray:
    """``merge_topk`` over rows [B, n]: parts of (ids [B, n, K_r], scores [B, n, K_r])."""
    B, n = parts[0][0].shape[:2]
    flat = [(i.reshape(B * n, -1), c.reshape(B * n, -1)) for i, c in parts]
    return merge_topk(flat, K).reshape(B, n, K)


def sharded_decode_step(sel, q, w, k, lengths=None, *, ks=None, ke=None, starts=None):
    """One decode step (``decode.DecodeSelector.step``'s contract and ids) over caches whose
    keys are split into the shards ``starts`` (int [R + 1], global ids; default 2 equal
    shards of the longest cache; a request's cache ends at its own length): each shard
    scores its visible witnesses, the K-th largest of the union of the shards' K largest is
    every shard's compaction threshold — the shards' witnesses are disjoint, so the union is
    a distinct visible witness set, whose K-th score is at most the context's (docs/method.md
    §10, Prop. 4): the single cache's τ — each shard compacts its keys with s ≥ τ and
    selects their Top-K, and the lists are merged exactly (score desc, id asc).  The merged
    selections become ``sel``'s witnesses.  Returns ``decode.DecodeStep`` (stats: τ of the
    union, witnesses and compacted summed over the shards)."""
    q = as_float_array(q, "q", 4)
    w = as_float_array(w, "w", 3)
    if w.shape != q.shape[:3]:
        raise ValueError(f"w: expected shape {q.shape[:3]} to match q, got {w.shape}")
    keys, ks_a, ke_a = sel.ranges(q, k, lengths, ks, ke)
    N = max(kb.shape[0] for kb in keys)
    starts = shard_starts(N, 2) if starts is None else as_array(starts, "starts").astype(np.int64)
    if starts.ndim != 1 or starts[0] != 0 or starts[-1] < N or (np.diff(starts) < 0).any():
        raise ValueError(f"starts: expected 0 ≤ … nondecreasing, last ≥ {N}, got {starts.tolist()}")
    bounds = list(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True))
    B, n = ks_a.shape
    st = DecodeStats.empty(B, n)
    tops = []
    for s0, s1 in bounds:  # the all-gather of the distributed form
        t, c = _decode_shard(sel, q, w, keys, 0, ks_a, ke_a, s0, s1)
        tops.append(t.reshape(B * n, -1))
        st.witnesses += c
    tau = union_floor(tops, sel.K).reshape(B, n)
    parts = []
    for s0, s1 in bounds:
        ids, sc, comp = _decode_shard(sel, q, w, keys, 0, ks_a, ke_a, s0, s1, tau)
        parts.append((ids, sc))
        st.compacted += comp
    out = _merge_rows(parts, sel.K)
    st.tau, st.visible = tau, ke_a - ks_a
    sel.push(out)
    return DecodeStep(ids=out, stats=st)


def distributed_decode_step(sel, q, w, k_shard, start: int, lengths=None, *, ks=None, ke=None,
                            group=None) -> np.ndarray:  # fmt: skip
    """``sharded_decode_step`` over ``torch.distributed``: every rank of ``group`` passes the
    replicated step (q [B, next_n, H, D], w, the global ranges or lengths) and its shard
    ``k_shard`` — a list of B arrays, request b's keys with global ids [start, start +
    len(k_shard[b])) — and its own ``sel`` (a ``DecodeSelector``; every rank pushes the
    same merged selections, so the ranks' witnesses stay equal).  One ``all_gather`` of the
    K largest witness scores [B, next_n, K] (τ: the K-th of their union) and one of
    fixed-size lists ([B, next_n, K] ids and scores); returns the merged ids int64 [B,
    next_n, K] on every rank.  Gloo on the CPU."""
    q = as_float_array(q, "q", 4)
    w = as_float_array(w, "w", 3)
    B, n, _, D = q.shape
    if not isinstance(k_shard, (list, tuple)) or len(k_shard) != B:
        raise ValueError(f"k_shard: expected a list of {B} per-request key arrays")
    if int(start) < 0:
        raise ValueError(f"start: expected ≥ 0, got {start!r}")
    s0 = int(start)
    keys = [as_float_array(kb, f"k_shard[{b}]", 2) for b, kb in enumerate(k_shard)]
    if any(kb.shape[1] != D for kb in keys):
        raise ValueError(f"k_shard: expected arrays [n_b, {D}] to match q")
    if ke is None and lengths is None:
        raise ValueError("ke: the global range ends (or lengths) are needed on a shard")
    # the global ranges, checked as DecodeSelector.step checks them (a shard does not know
    # the caches' global lengths: no upper bound)
    ks_g, ke_g = _check_ranges(lengths, ks, ke, B, n, np.full(B, np.iinfo(np.int64).max))
    s1 = s0 + max([kb.shape[0] for kb in keys] + [0])
    top = _decode_shard(sel, q, w, keys, s0, ks_g, ke_g, s0, s1)[0].reshape(B * n, -1)
    tau = union_floor(_all_gather(top, group), sel.K).reshape(B, n)
    ids, sc, _ = _decode_shard(sel, q, w, keys, s0, ks_g, ke_g, s0, s1, tau)
    merged = _merge_rows(list(zip(_all_gather(ids, group), _all_gather(sc, group),
                                  strict=True)), sel.K)  # fmt: skip
    sel.push(merged)
    return merged
