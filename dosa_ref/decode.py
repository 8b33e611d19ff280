"""Decoding with witnesses (docs/method.md §10): exact Top-K with compact writeback against a
threshold taken from the keys selected in recent steps.

Decode steps have few queries and little key reuse, so every visible key is still scored
with the full (original) scorer; what DoSA saves is the writeback and the selection.  Per
request the selector holds **witnesses**: the distinct keys selected in the last
``history`` steps.  At a step, for every query row (request ``b``, query ``j``):

1. W = witnesses of request ``b`` that are visible to the row, i.e. in ``[ks, ke)``;
2. score W with the canonical scorer ``score_keys``; τ = τ_K(W) (its K-th best score, or
   −inf when |W| < K);
3. score every visible key with the full scorer and **compact** only the records
   (id, score) with ``s ≥ τ`` (equality survives);
4. select exactly with ``topk_of`` over the compacted records (score desc, id asc; −1
   pads rows with fewer than K visible keys);

and after the step the request's selections (all ``next_n`` rows) are pushed into its
witness history; the witnesses are the distinct union of the last ``history`` pushes.

Exactness (Prop. 4 of docs/method.md §2, Theorem 1 of §7, applied as in §10).  Let Ω be the
keys visible to a row and s the canonical score.  W is a set of *distinct* keys of Ω
(step 1 removes keys outside the range; ``np.unique`` removes repeats), and each witness
score is the exact value s_i that the full scan produces for that key (``score_keys`` is
independent of which other keys are scored with it; checked below).  If |W| ≥ K then,
since W ⊆ Ω, the K-th largest score of W is at most the K-th largest of Ω:
τ = τ_K(W) ≤ τ_K(Ω); if |W| < K then τ = −inf.  Every key of TopK(Ω) has
s ≥ τ_K(Ω) ≥ τ, so the compacted set C = {i ∈ Ω : s_i ≥ τ} contains TopK(Ω), including
every key tied at the boundary score τ_K(Ω) (the comparison is not strict).  As C ⊆ Ω, the
first K elements of C under the total order (score desc, id asc) are the first K of Ω:
``topk_of(C)`` equals full-domain Top-K, tie order included.  Nothing in this argument
depends on *where* the witnesses came from — stale ones, keys selected for another
sequence, or keys that have since been overwritten are still distinct visible keys scored
exactly — so witness management changes only efficiency.  What it does need is
enforced per row: a witness outside ``[ks, ke)`` (e.g. after a sliding window moved ``ks``
forward) may score above τ_K(Ω), and a repeated witness would be counted twice; either
could raise τ above τ_K(Ω) and lose required ids (both are caught by the tests).

Layout follows DeepGEMM's paged MQA logits: ``q`` [B, next_n, H, D], ``w`` [B, next_n, H]
and a context length per request; query ``j`` of request ``b`` sits at position
``lengths[b] − next_n + j`` and sees keys ``[0, lengths[b] − next_n + j + 1)`` (query j
sees one more key than query j − 1; a negative position sees nothing, as in DeepGEMM's
mask ``k ≤ q_offset``).  General ranges ``ks``/``ke`` [B, next_n] are accepted too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .certificate import upper_bound
from .options import check_flag
from .plan import activation_frequency, build_plan
from .scorer import finite_envelope, key_amax, score_keys, topk_of
from .seeds import kth_score, stride_sample
from .validate import as_float_array, check_K, int_array

__all__ = ["DecodeSelector", "DecodeStats", "DecodeStep"]

PLAN_SAMPLE = 1024  # keys per row for the certificate plan's activation frequencies (§3)


@dataclass
class DecodeStats:
    """Per-row statistics of one decode step (arrays [B, next_n]).

    witnesses: visible witnesses scored for τ; tau: τ = τ_K(witnesses) (−inf when fewer
    than K); compacted: records written (visible keys with s ≥ τ); visible: |Ω|;
    tau_final: the K-th selected score τ_K(Ω) (−inf when fewer than K visible);
    scored: visible keys scored in full (|Ω| without the certificate screen, its survivors
    with it: ``DecodeSelector(screen_r=…)``).
    Invariants: compacted ≤ scored ≤ visible, compacted ≥ min(K, visible), tau ≤ tau_final.
    """

    witnesses: np.ndarray
    tau: np.ndarray
    compacted: np.ndarray
    visible: np.ndarray
    tau_final: np.ndarray
    scored: np.ndarray | None = None

    def __post_init__(self):
        if self.scored is None:  # a scan scores every visible key
            self.scored = np.array(self.visible, copy=True)

    @classmethod
    def empty(cls, B: int, n: int) -> DecodeStats:
        z = lambda: np.zeros((B, n), dtype=np.int64)
        return cls(z(), np.full((B, n), -np.inf), z(), z(), np.full((B, n), -np.inf), z())

    @property
    def survival(self) -> float:
        """Σ scored / Σ visible: the share of visible keys scored in full (1.0 without the
        certificate screen; nan for an empty step)."""
        n = int(self.visible.sum())
        return float(self.scored.sum()) / n if n else float("nan")

    @property
    def compaction(self) -> float:
        """Σ compacted / Σ visible (1.0 = nothing saved; nan for an empty step)."""
        n = int(self.visible.sum())
        return float(self.compacted.sum()) / n if n else float("nan")

    def totals(self) -> dict:
        return dict(
            rows=int(self.visible.size),
            witnesses=int(self.witnesses.sum()),
            compacted=int(self.compacted.sum()),
            visible=int(self.visible.sum()),
            scored=int(self.scored.sum()),
            compaction=self.compaction,
            survival=self.survival,
        )


@dataclass
class DecodeStep:
    """``ids`` int64 [B, next_n, K] (per row the ``topk_ids`` contract) and ``stats``."""

    ids: np.ndarray
    stats: DecodeStats


def _check_keys(k, B: int, D: int) -> tuple[list[np.ndarray], bool]:
    """``k`` [N, D] shared by all requests, or a list of B per-request arrays [N_b, D]."""
    if isinstance(k, (list, tuple)):
        if len(k) != B:
            raise ValueError(f"k: expected {B} per-request key arrays, got {len(k)}")
        keys = [as_float_array(kb, f"k[{b}]", 2) for b, kb in enumerate(k)]
        shared = False
    else:
        keys = [as_float_array(k, "k", 2)]
        shared = True
    for b, kb in enumerate(keys):
        if kb.shape[1] != D:
            name = "k" if shared else f"k[{b}]"
            raise ValueError(f"{name}: expected shape (N, {D}) to match q, got {kb.shape}")
    keys = [np.ascontiguousarray(kb, dtype=np.float64) for kb in keys]
    return (keys * B if shared else keys), shared


def _check_ranges(lengths, ks, ke, B: int, n: int, N: np.ndarray):
    """Visible ranges [B, n] from ``lengths`` (DeepGEMM rule) or ``ks``/``ke``."""
    if lengths is not None:
        if ke is not None:
            raise ValueError("ke: give lengths or ke, not both")
        L = int_array("lengths", lengths, (B,))
        if np.any(L < 0) or np.any(L > N):
            b = int(np.flatnonzero((L < 0) | (L > N))[0])
            raise ValueError(f"lengths: lengths[{b}]={L[b]} outside [0, N={N[b]}]")
        ke_a = np.maximum(0, L[:, None] - n + 1 + np.arange(n)[None, :])
    elif ke is not None:
        ke_a = int_array("ke", ke, (B, n))
    else:
        ke_a = np.repeat(N[:, None], n, axis=1)
    ks_a = np.zeros((B, n), dtype=np.int64) if ks is None else int_array("ks", ks, (B, n))
    for name, a in (("ks", ks_a), ("ke", ke_a)):
        bad = (a < 0) | (a > N[:, None])
        if np.any(bad):
            b, j = (int(x[0]) for x in np.nonzero(bad))
            raise ValueError(f"{name}: {name}[{b}, {j}]={a[b, j]} outside [0, N={N[b]}]")
    if np.any(ks_a > ke_a):
        b, j = (int(x[0]) for x in np.nonzero(ks_a > ke_a))
        raise ValueError(f"ks: ks[{b}, {j}]={ks_a[b, j]} > ke[{b}, {j}]={ke_a[b, j]}")
    return ks_a, ke_a


class DecodeSelector:
    """Exact decode-time Top-K with witness-threshold compaction (docs/method.md §10).

    Args:
        K: selection size (≥ 1).
        history: number of recent steps whose selections are kept as witnesses (≥ 0;
            default 2; 0 disables witnesses, so τ = −inf and everything is compacted).
        within_step: also use the selections of queries 0..j−1 of the same request and
            step as witnesses for query j (safe for the same reason; default off, since a
            kernel scores the next_n queries of a step together).
        screen_r: retained heads of the certificate screen (docs/method.md §10 "The
            certificate in decode"; 1 ≤ screen_r < H); 0 (default): every visible key is
            scored in full.  With r, a row with a threshold plans its r retained heads
            (activation frequencies from ``PLAN_SAMPLE`` evenly spaced visible keys),
            bounds every visible key by eq. (9) rounded up, and scores in full only the
            keys whose bound is at least τ — the same ids, fewer keys scored
            (``DecodeStats.scored``).

    State is per request slot ``b`` (the index along q's first axis).  A step with a
    larger B gives the new slots empty witnesses; ``reset()`` clears slots (efficiency
    only: stale witnesses are never wrong, see the module docstring).
    """

    def __init__(self, K: int, history: int = 2, within_step: bool = False, screen_r: int = 0):
        self.K = check_K(K)
        if isinstance(history, bool) or not isinstance(history, (int, np.integer)):
            raise ValueError(f"history: expected a nonnegative integer, got {history!r}")
        if history < 0:
            raise ValueError(f"history: must be >= 0, got {history}")
        check_flag("within_step", within_step)
        if isinstance(screen_r, bool) or not isinstance(screen_r, (int, np.integer)):
            raise ValueError(f"screen_r: expected a nonnegative integer, got {screen_r!r}")
        if screen_r < 0:
            raise ValueError(f"screen_r: must be >= 0, got {screen_r}")
        self.history = int(history)
        self.within_step = bool(within_step)
        self.screen_r = int(screen_r)
        self._hist: list[deque] = []

    # -- witness state -------------------------------------------------------------------

    def witnesses(self, b: int) -> np.ndarray:
        """Witness ids of request slot ``b``: sorted, distinct int64."""
        if b < 0 or b >= len(self._hist) or not self._hist[b]:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(list(self._hist[b])))

    def reset(self, b: int | None = None) -> None:
        """Forget the witnesses of slot ``b`` (all slots when ``b`` is None)."""
        if b is None:
            self._hist = []
        elif 0 <= b < len(self._hist):
            self._hist[b].clear()

    def _push(self, b: int, selected: np.ndarray) -> None:
        while len(self._hist) <= b:
            self._hist.append(deque(maxlen=max(self.history, 1)))
        if self.history > 0:
            self._hist[b].append(np.unique(selected[selected >= 0]))

    def push(self, ids) -> None:
        """Record a step's selections ids int [B, next_n, K] (−1 padding) as the witnesses of
        slots 0..B−1, as ``step`` does after selecting — for a step selected elsewhere
        (``dosa_ref.shards.sharded_decode_step``, the ranks of a sharded cache)."""
        ids = np.asarray(ids)
        if ids.ndim != 3:
            raise ValueError(f"ids: expected [B, next_n, K], got shape {ids.shape}")
        for b in range(ids.shape[0]):
            self._push(b, ids[b].ravel().astype(np.int64))

    def ranges(self, q, k, lengths=None, ks=None, ke=None):
        """The visible ranges ks, ke int64 [B, next_n] of a step (``step``'s rules) and the
        per-request key arrays: (keys list of B float64 [N_b, D], ks, ke)."""
        q = as_float_array(q, "q", 4)
        B, n, _, D = q.shape
        keys, _ = _check_keys(k, B, D)
        N = np.array([kb.shape[0] for kb in keys], dtype=np.int64)
        ks_a, ke_a = _check_ranges(lengths, ks, ke, B, n, N)
        return keys, ks_a, ke_a

    # -- one step ------------------------------------------------------------------------

    def step(self, q, w, k, lengths=None, *, ks=None, ke=None) -> DecodeStep:
        """Select the exact Top-K of every query row of one decode step.

        Args:
            q: [B, next_n, H, D] query heads (next_n ∈ {1, 2} in serving; any ≥ 1 works).
            w: [B, next_n, H] head weights (either sign).
            k: [N, D] keys shared by all requests (ids index k), or a list of B arrays
                [N_b, D], one per request (ids index that request's keys).
            lengths: int [B] context lengths (DeepGEMM rule: query j sees
                ``[0, lengths[b] − next_n + j + 1)``, clamped at 0).  Without lengths,
                ``ke`` [B, next_n] gives the range ends (default N / N_b).
            ks: int [B, next_n] range starts (default 0), e.g. a sliding window.
            ke: int [B, next_n] range ends (exclusive); not together with lengths.
        Returns:
            DecodeStep: ``ids`` int64 [B, next_n, K], per row equal to
            ``topk_ids(index_scores(q_row, w_row, keys, ks, ke), K)`` (score desc, id asc,
            −1 padding); ``stats`` per row (``DecodeStats``).
        """
        q = as_float_array(q, "q", 4)
        w = as_float_array(w, "w", 3)
        B, n, H, D = q.shape
        if n < 1:
            raise ValueError(f"q: need next_n >= 1, got shape {q.shape}")
        if H < 1:
            raise ValueError(f"q: need at least one head, got shape {q.shape}")
        if self.screen_r >= H:
            raise ValueError(f"screen_r: must be below the {H} heads of q, got {self.screen_r}")
        if D < 1:
            raise ValueError(f"q: need head dimension D >= 1, got shape {q.shape}")
        if w.shape != (B, n, H):
            raise ValueError(f"w: expected shape {(B, n, H)} to match q, got {w.shape}")
        keys, ks_a, ke_a = self.ranges(q, k, lengths, ks, ke)
        q = np.ascontiguousarray(q, dtype=np.float64)
        w = np.ascontiguousarray(w, dtype=np.float64)

        K = check_K(self.K, rows=B * n)  # the ids array's size, before it is allocated
        ids_out = np.full((B, n, K), -1, dtype=np.int64)
        st = DecodeStats.empty(B, n)
        for b in range(B):
            wit = self.witnesses(b)
            for j in range(n):
                if self.within_step and j > 0:
                    prev = ids_out[b, :j].ravel()
                    wit_j = np.union1d(wit, prev[prev >= 0])
                else:
                    wit_j = wit
                sel, sc = self._row(
                    q[b, j], w[b, j], keys[b], ks_a[b, j], ke_a[b, j], wit_j, st, b, j
                )
                ids_out[b, j, : sel.size] = sel
                if sel.size == K:
                    st.tau_final[b, j] = sc[-1]
        for b in range(B):
            self._push(b, ids_out[b].ravel())
        return DecodeStep(ids=ids_out, stats=st)

    def _row(self, q_t, w_t, kb, a, e, wit, st, b, j):
        a, e = int(a), int(e)
        K = self.K
        # 1–2: visible, distinct witnesses scored exactly; τ = τ_K(W) ≤ τ_K(Ω) (Prop. 4).
        W = wit[(wit >= a) & (wit < e)]
        s_W = score_keys(q_t, w_t, kb[W])
        tau = kth_score(s_W, K)
        # 3: full scoring of every visible key — or, with the certificate screen, of the
        # keys whose bound reaches τ — and compact writeback of s ≥ τ.
        vis = self._scored(q_t, w_t, kb, a, e, tau, W)
        s = score_keys(q_t, w_t, kb[vis])  # raises scorer.SCORE_OVERFLOW, as the brute force
        if not np.array_equal(s[np.searchsorted(vis, W)], s_W):
            # The proof needs the witness score to be the full scan's score of that key.
            raise RuntimeError("score_keys is not deterministic per key; τ would be unsafe")
        keep = s >= tau
        c_ids = vis[keep]
        c_s = s[keep]
        st.witnesses[b, j] = W.size
        st.tau[b, j] = tau
        st.compacted[b, j] = c_ids.size
        st.visible[b, j] = e - a
        st.scored[b, j] = vis.size
        # 4: exact selection over the compacted records (Theorem 1).
        return topk_of(c_s, c_ids, K)

    def _scored(self, q_t, w_t, kb, a: int, e: int, tau: float, W) -> np.ndarray:
        """The visible ids int64 (ascending) that the row scores in full: all of [a, e),
        or with ``screen_r`` those whose certificate U_i (eq. (9), rounded up: U_i ≥ the
        computed s_i, docs/method.md §6) is at least τ, plus the witnesses.  A key with
        U_i < τ has s_i < τ ≤ τ_K(Ω), so it holds no record at or above τ (Theorem 1).
        Witnesses stay (they may lie below τ, and step 3's check compares their scores).
        A row whose scores the finiteness envelope cannot prove is scored in full, so the
        step raises where the brute force raises (docs/method.md §1 "The scorer's domain")."""
        ids = np.arange(a, e, dtype=np.int64)
        if not self.screen_r or tau == -np.inf or e <= a:
            return ids
        k = kb[a:e]
        if not finite_envelope(q_t, w_t, key_amax(k)):
            return ids
        p = activation_frequency(q_t, k[stride_sample(0, e - a, PLAN_SAMPLE)])
        plan = build_plan(q_t, w_t, p, self.screen_r)
        U = upper_bound(plan, k, rounding="up", q_t=q_t, w_t=w_t)
        return np.union1d(ids[~(U < tau)], W)  # a NaN bound survives
