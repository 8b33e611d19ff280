"""The fused route (what LiteTopK does): seeds → τ, then every visible non-seed key is
scored with all heads by the canonical scorer and filtered online against τ (fused.cu
fused_mt*, or for the FP8 scorer score_fp8.cu fused_fp8_h*: compact records, no dense
logits, no screen), exact selection.  Exact by Theorem 1 with U = +inf (docs/method.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._build import cupy_or_raise, kernel, tile
from .options import start
from .prepare import Batch
from .scorer import FP8_SPEC, QG, ROWB
from .seeds import Seeds, apply_tau_floor, launch_fp8_ranges, seed_stage
from .select import (
    RecordBuffer,
    extend_overflow,
    raised_tau,
    recover,
    recovery_queries,
    select_ids,
)

__all__ = ["FusedLaunch", "fused_topk"]

FUSED_THREADS = 256


@dataclass(frozen=True)
class FusedLaunch:
    """The fused route's kernel over batch ``b`` (fused_mt*, or fused_fp8_h* for the FP8
    scorer) with τ fp32 [Qn] and the default seeds' geometry ``seeds`` (default seeds are
    not scored again: they are selected from their own records)."""

    b: Batch
    tau: object
    seeds: Seeds

    def __call__(self, out: RecordBuffer) -> None:
        """Append the records s ≥ τ of every visible non-seed key to ``out`` (rows of b);
        arguments in the kernel's parameter order."""
        b = self.b
        if b.scorer == "fp8":  # score_fp8.cu: qb = 128 / H queries per block row, 64-key tiles
            self._fp8(out)
            return
        T = tile()
        grid = ((b.N + T - 1) // T, (b.Qn + QG - 1) // QG)
        smem = T * ROWB + T * 4
        kernel(f"fused_mt{b.mth}", smem)(
            grid,
            (FUSED_THREADS,),
            (b.q, b.w, b.kp, b.ksc, self.tau, b.ks, b.ke) + self.seeds.default_args()
            + (np.int32(b.Qn), np.int64(b.N), np.int32(QG)) + out.args(),
            shared_mem=smem,
        )  # fmt: skip

    def _fp8(self, out: RecordBuffer) -> None:
        """fused_fp8_h{H} over every key (seeds.launch_fp8_ranges: the grid and launches)."""
        b = self.b
        if b.Qn == 0 or b.N == 0:
            return
        sinks, window, poolmask = self.seeds.default_args()
        launch_fp8_ranges(
            kernel(f"fused_fp8_h{16 * b.mth}", 0, FP8_SPEC), b.Qn, 16 * b.mth, b.N,
            lambda a, z: (b.q[a:z], b.w[a:z], b.kp, b.ksc, np.int64(b.N), self.tau[a:z],
                          b.ks[a:z], b.ke[a:z], sinks, window, poolmask, np.int32(z - a),
                          out.cnt[a:z], out.rec[a:z], np.int64(out.cap)),
        )  # fmt: skip


def fused_topk(q, w, k_payload, k_scale, K, ks=None, ke=None, **options):
    """The fused route: same contract as ``dosa_topk`` (int64 [Qn, K] ids; ids equal
    ``dense_topk``).  Options: seeds, seed_ids, window, sinks, n_anchors (as in
    ``dosa_topk``), buffer, return_stats, timing (cert_seeds, the "certificate" strategy
    and the plan options are accepted and ignored: the fused route has no screen), scorer
    ("f16": fused.cu; "fp8": score_fp8.cu fused_fp8_h*, sm_90a), tau_floor (as in
    ``dosa_topk``)."""
    cp = cupy_or_raise()
    o, tm, st, b, empty = start(q, w, k_payload, k_scale, K, ks, ke, options)
    if empty is not None:
        return empty
    b.raise_if_bad()
    seeds = apply_tau_floor(seed_stage(b, o), o["tau_floor"])
    tm.mark("seeds")

    first = RecordBuffer(b.Qn, int(o["buffer"]))
    FusedLaunch(b, seeds.tau, seeds)(first)

    def rescore(oq, cap2, floor):  # the exact extension of the overflowed rows only
        out = RecordBuffer(int(oq.size), cap2)
        FusedLaunch(b.rows(oq), raised_tau(seeds.tau, oq, floor), seeds)(out)
        return out

    recs = extend_overflow(first, rescore, b.K)
    tm.mark("score+filter")
    ids, kth = select_ids(b.K, seeds.default, recs, want_kth=o["return_stats"])
    tm.mark("select")
    bad = recovery_queries(b)
    recover(b, ids, bad)
    ids = ids.astype(cp.int64)  # public contract (docs/design.md); the kernels write int32
    tm.mark("recover")
    if not o["return_stats"]:
        return ids
    st.fill_common(b, seeds, recs, kth, bad)
    vis = st.visible
    st.tau = cp.asnumpy(seeds.tau)
    st.refined = vis - (st.seeds - st.explicit_seeds)  # every visible non-default-seed key
    st.scored = st.seeds + st.refined * (1 + st.overflows) + vis * st.recovered
    st.dense[:] = True  # dense after seeding: no screen
    st.stage_ms = dict(tm.ms)
    return ids, st
