"""Fused planner: ``plan.build_plans`` as one CUDA kernel per chunk (docs/method.md §3–§6, §8).

``build_plans_fused(q, w, k_payload, sample_ids, r, mts, mma_bits)`` returns the same
``plan.DevicePlan`` fields as ``plan.build_plans`` (the specification): one block of 256
threads per query (``csrc/plan.cu``, kernels ``plan_mt1`` … ``plan_mt4`` for Hp = 16·MT
heads) decodes the query's e4m3 rows into shared memory once and computes norms,
activation frequencies, R, the anchor projection and folded weights, E, the negative
aggregate with its two e4m3 aux rows, the envelope J and C there, in float64 with the
same outward allowances.  Differences from ``plan.build_plans``, all legal (plan.cu header):
float64 reductions run in a different order (covered by MU = 2^-30, plan.py docstring);
ties of the R priority key are broken by head index (as plan._choose_R's stable sort);
p_h uses one fixed fp32 summation order.  Why: ``build_plans`` costs 7–9 ms at Qn = 4096 in ~100
CuPy launches and 37–74 ms at Qn = 32K in float64 [Qn, H, 128] temporaries (docs/records/notes.md);
the kernel reads q once and writes only the plan.

The pipeline's planner (``pipeline.plan_stage``; run records and timings:
docs/records/gpu_tests.md, docs/records/notes.md).  ``tests/test_plan_fused.py`` runs this
host code on the CPU against a numpy emulation of the kernel (``emulate_plan_kernel``) and
compares its plans with those of ``plan.build_plans``.
"""

from __future__ import annotations

import numpy as np

from ._build import KernelSpec, cupy_or_raise, module, raise_smem_limit
from .plan import TINY, DevicePlan, gamma, gamma_mma
from .prepare import D

__all__ = ["PLAN_THREADS", "build_plans_fused", "plan_constants", "plan_smem_bytes"]

PLAN = KernelSpec("plan.cu")
PLAN_THREADS = 256  # csrc/plan.cu PLAN_THREADS
PLAN_KC = 64  # csrc/plan.cu PLAN_KC (sample keys per chunk)


def _kernel(name: str, smem: int):
    """Kernel ``name`` of plan.cu with its dynamic shared-memory limit raised to ``smem``.

    Always (not only above 48 KB): plan.cu also has 7–11 KB of static shared memory, and
    the default limit is 48 KB for static + dynamic together — plan_mt2 asks for exactly
    48 KB of dynamic memory and would fail to launch otherwise."""
    f = module(PLAN).get_function(name)
    return raise_smem_limit(f, smem, PLAN, name)


def plan_smem_bytes(Hp: int) -> int:
    """Dynamic shared memory of plan_mt{Hp/16}: q as fp32 [Hp, 128] + max(u_h float64
    [Hp, 128], one chunk of sample keys fp32 [128, PLAN_KC])."""
    return Hp * D * 4 + max(Hp * D * 8, D * PLAN_KC * 4)


def plan_constants(Hp: int, mts: int, mma_bits: int):
    """(g_scr, g_ref, eps_raw) exactly as plan.build_plans computes them."""
    mth = Hp // 16
    gm = gamma_mma(mma_bits)
    g_scr = gm + gamma(2 * mts + 6) * (1 + gm)
    g_ref = gm + gamma(2 * mth + 5) * (1 + gm)
    return g_scr, g_ref, (2 * mth + 2 * mts + 16) * TINY


def build_plans_fused(q, w, k_payload, sample_ids, r, mts, mma_bits=17):
    """Batched plans for all queries, one fused kernel launch (same contract and fields as
    ``plan.build_plans``; q uint8 [Qn, Hp, 128] with Hp = 16·MT ≤ 64, w fp32 [Qn, Hp],
    k_payload uint8 [N, 128], sample_ids: device key ids in [0, N) or None, r ≤ 16·mts − 2).
    """
    cp = cupy_or_raise()
    Qn, Hp, _ = q.shape
    if Hp % 16 or not 16 <= Hp <= 64:
        raise ValueError(f"q: expected Hp = 16, 32, 48 or 64 padded heads, got {Hp}")
    if mts not in (1, 2):
        raise ValueError(f"mts: expected 1 or 2, got {mts!r}")
    nslot = 16 * mts - 2
    r = int(min(r, nslot, Hp))
    g_scr, g_ref, eps = plan_constants(Hp, mts, mma_bits)
    if sample_ids is not None and int(sample_ids.size) > 0:
        sample = cp.ascontiguousarray(sample_ids.astype(cp.int32))  # ids < N < 2^31
        ns = int(sample.size)
    else:
        sample = cp.zeros(1, dtype=cp.int32)
        ns = 0
    q = cp.ascontiguousarray(q)
    w = cp.ascontiguousarray(w.astype(cp.float32, copy=False))
    kp = cp.ascontiguousarray(k_payload)
    nrow = 16 * mts
    rows = cp.empty((Qn, nrow, D), dtype=cp.uint8)
    omega = cp.empty((Qn, nrow), dtype=cp.float32)
    sigma = cp.empty(Qn, dtype=cp.float32)
    C = cp.empty(Qn, dtype=cp.float64)
    valid = cp.empty(Qn, dtype=cp.uint8)
    counts = cp.empty((Qn, 3), dtype=cp.int32)
    inR = cp.empty((Qn, Hp), dtype=cp.uint8)
    inA = cp.empty((Qn, Hp), dtype=cp.uint8)
    w_fold = cp.empty((Qn, Hp), dtype=cp.float64)
    a_A = cp.empty((Qn, D), dtype=cp.float64)
    E = cp.empty(Qn, dtype=cp.float64)
    if Qn:
        smem = plan_smem_bytes(Hp)
        _kernel(f"plan_mt{Hp // 16}", smem)(
            (Qn,),
            (PLAN_THREADS,),
            (
                q, w, kp, sample, np.int32(ns), np.int32(r), np.int32(mts), np.float64(g_scr),
                np.float64(g_ref), rows, omega, sigma, C, valid, counts, inR, inA, w_fold, a_A, E,
            ),
            shared_mem=smem,
        )  # fmt: skip
    return DevicePlan(
        mts=mts,
        rows=rows,
        omega=omega,
        sigma=sigma,
        C=C,
        eps_raw=cp.full(Qn, eps),
        eps_out=TINY,
        valid=valid.view(cp.bool_),
        r=counts[:, 0],
        omitted_positive=counts[:, 1],
        aggregated=counts[:, 2],
        inR=inR.view(cp.bool_),
        inA=inA.view(cp.bool_),
        w_fold=w_fold,
        a_A=a_A,
        E=E,
    )
