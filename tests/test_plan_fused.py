"""The fused planner (dosa_cupy/plan.py build_plans_fused, csrc/plan.cu) against the specification,
``plan.build_plans`` (docs/method.md §3–§6, §8).

CPU part: ``build_plans_fused``'s host code runs with numpy standing in for CuPy and the
kernel replaced by ``emulate_plan_kernel`` — a per-query numpy loop that mirrors plan.cu
step by step, including its float64 operation order (lane partials of 4 dims, the xor
butterfly of ``warp_sum``, sequential loops) and its fp32 activation dots, so it is meant
to equal the kernel bit for bit (the GPU test ``test_fused_plan_equals_emulation`` checks
that on the H200).  Every launch is first checked against the kernel's C signature parsed
from plan.cu (count, dtypes, contiguity, grid/block/shared memory).

GPU part (marked ``gpu``, skipped without CuPy/GPU): kernel == emulation bitwise, fused vs
``plan.build_plans`` on the GPU, ``dosa_topk`` (whose plan stage is this planner) ids ==
``dense_topk``, the guard with ``debug_bounds``.  (Timing of both: ``dosa bench
--profile-plan``.)
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, params
from gpu_support import HAVE_GPU, cp, gpu, numpy_as_cupy

from dosa_cupy import plan as pf
from dosa_ref.fp8 import e4m3_bits, e4m3_values, key_rms
from dosa_ref.rounding import gamma_up

PLAN_CU = Path(pf.__file__).parent / "csrc" / "plan.cu"
MU = 2.0**-30

# ---------------------------------------------------------------------------------------
# The kernel's signature (parsed from plan.cu) and its numpy emulation.
# ---------------------------------------------------------------------------------------


def _signature():
    return params(PLAN_CU.read_text(), r"__global__ void BOUNDS NAME")  # PLAN_KERNEL


def test_signature_and_constants_match_source():
    sig = _signature()
    assert [n for _, n in sig][:4] == ["q", "w", "kp", "sample"] and len(sig) == 24
    assert [n for _, n in sig][-4:] == ["eps_base", "a_step", "a_epi", "eps_raw"]
    src = PLAN_CU.read_text()
    assert re.search(rf"#define PLAN_THREADS {pf.PLAN_THREADS}\b", src)
    assert re.search(rf"#define PLAN_KC {pf.PLAN_KC}\b", src)
    assert re.findall(r"PLAN_INST\((\d)\)", src) == ["1", "2", "3", "4"]
    assert "#include <cuda_fp8.h>" in src and "<stdint.h>" not in src  # NVRTC: no std headers


def _warp_sum(parts):
    """plan.cu warp_sum: xor butterfly over 32 lane partials (all lanes end equal)."""
    x = np.array(parts, dtype=np.float64)
    idx = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        x = x + x[idx ^ o]
    return float(x[0])


def _dot4(a, b):
    """plan.cu dot4: lane partials ((a0b0 + a1b1) + a2b2) + a3b3, then warp_sum."""
    p = a.reshape(32, 4) * b.reshape(32, 4)
    return _warp_sum(((p[:, 0] + p[:, 1]) + p[:, 2]) + p[:, 3])


def _block4_sum(x128):
    """Σ of 128 per-thread values: warp_sum per warp 0..3, then (r0 + r1) + (r2 + r3)."""
    r = [_warp_sum(x128[32 * i : 32 * i + 32]) for i in range(4)]
    return (r[0] + r[1]) + (r[2] + r[3])


def _f64(x):
    return np.float64(x)


def emulate_eps_raw(qb, w, eps_base, a_step, a_epi):
    """plan.cu's ε_raw: per head h the step exponents of its codes (plan.step_exponents),
    a_h = ((Σ_s 2^(eq_s))·a_step·a_epi)·(1 + MU), the terms |w_h|·a_h on lanes 4h of warp
    h / 8 (0 elsewhere), warp_sum per warp, the warps' sums in order, then
    eps_base + S·(1 + MU)."""
    Hp = qb.shape[0]
    e = pf.step_exponents(qb, np)  # [Hp, 4]
    p = np.where(e > pf.NO_EXPONENT, np.ldexp(1.0, e), 0.0).sum(axis=1)  # exact
    a = ((p * a_step) * a_epi) * (1 + MU)
    warps = pf.PLAN_THREADS // 32
    term = np.zeros(32 * warps)
    term[4 * np.arange(Hp)] = np.abs(w.astype(np.float64)) * a
    S = 0.0
    for i in range(warps):
        S = S + _warp_sum(term[32 * i : 32 * i + 32])
    return eps_base + S * (1 + MU)


def emulate_plan_query(qb, w, ksmp, r, mts, g_scr, g_ref, kcodes=None):
    """One block of plan_mt{Hp/16}: qb uint8 [Hp, 128], w fp32 [Hp], ksmp fp32 [ns, 128]
    (decoded sample keys); of plan_i8_mt{Hp/16} with ``kcodes`` (the sample keys' uint8 codes
    [ns, 128]: p_h from the activation images' exact dots).  Returns a dict of the kernel's
    per-query outputs (ε_raw: ``emulate_eps_raw``)."""
    Hp = qb.shape[0]
    qs = e4m3_values(qb).astype(np.float32)  # exact
    q64 = qs.astype(np.float64)
    wf = w.astype(np.float64)
    qn = np.array([np.sqrt(_dot4(q64[h], q64[h])) for h in range(Hp)])
    # activation frequencies: fp32 fmaf over d = 0..127 in order (products exact)
    ns = ksmp.shape[0]
    if ns and kcodes is not None:
        p = pf.activation_frequency_i8(qb[None], kcodes)[0]
    elif ns:
        acc = np.zeros((Hp, ns), dtype=np.float32)
        for d in range(128):
            acc = acc + qs[:, d, None] * ksmp[None, :, d]  # exact product, one fp32 rounding
        p = (acc > 0).sum(axis=1).astype(np.float64) / np.float64(ns)
    else:
        p = np.full(Hp, 0.5)
    # R: key = prim + sec/(1+sec), stable descending by (key, head index)
    npos, nneg = int((wf > 0).sum()), int((wf < 0).sum())
    few = npos <= r
    key = np.empty(Hp)
    for h in range(Hp):
        wh = wf[h]
        prio = (abs(wh) * qn[h]) * min(p[h], 1.0 - p[h])
        prim = 2.0 if wh > 0 else (1.0 if (wh < 0 and few) else 0.0)
        sec = (0.0 if few else wh * qn[h]) if wh > 0 else (prio if (wh < 0 and few) else 0.0)
        k = prim + sec / (1.0 + sec)
        key[h] = -1.0 if np.isnan(k) else k
    nR = min(npos + (nneg if few else 0), r)
    rank = np.array([int(np.sum((key > key[h]) | ((key == key[h]) & (np.arange(Hp) < h))))
                     for h in range(Hp)])  # fmt: skip
    order = np.empty(Hp, dtype=np.int64)
    order[rank] = np.arange(Hp)
    inR = rank < nR
    isP = (wf > 0) & ~inR
    isA = (wf < 0) & ~inR & (p >= 0.5)
    plist = np.flatnonzero(isP)
    # anchors (warp per h ∈ P)
    us = np.zeros((Hp, 128))
    beta, dn, qjs, use, jst = (np.zeros(Hp) for _ in range(5))
    for h in plist:
        best, bestG, jb = -1.0, 0.0, 0
        for j in range(Hp):
            ratio, Gp = -1.0, 0.0
            if inR[j] and qn[j] > 0:
                G = _dot4(q64[h], q64[j])
                Gp = G if G > 0 else 0.0
                ratio = Gp / qn[j]
            if j == 0 or ratio > best:
                best, bestG, jb = ratio, Gp, j
        u_ = best > 0
        qj = qn[jb]
        bt = bestG / (qj * qj) if u_ else 0.0
        dv = q64[h] - bt * q64[jb] if u_ else q64[h].copy()
        dn[h] = np.sqrt(_dot4(dv, dv))
        us[h] = wf[h] * dv
        beta[h], qjs[h], use[h], jst[h] = bt, qj, u_, jb
    fold = np.zeros(Hp)
    for j in range(Hp):
        f = 0.0
        for h in plist:
            if use[h] and jst[h] == j:
                f = f + wf[h] * beta[h]
        fold[j] = f
    wt = wf + fold
    # Gram term: warp w takes pairs w, w+8, …; ugram = Σ of the 8 warp parts in order
    nP = len(plist)
    pairs = [(a, b) for a in range(nP) for b in range(a, nP)]
    parts = [0.0] * 8
    for pi, (a, b) in enumerate(pairs):
        s = abs(_dot4(us[plist[a]], us[plist[b]]))
        parts[pi % 8] = parts[pi % 8] + (s if a == b else 2.0 * s)
    ugram = 0.0
    for x in parts:
        ugram = ugram + x
    col = np.zeros(128)
    for h in plist:
        col = col + us[h]
    usum = np.sqrt(_block4_sum(col * col))
    E_tri = mplan = 0.0
    for h in plist:
        E_tri = E_tri + wf[h] * dn[h]
        mplan = mplan + wf[h] * (qn[h] + beta[h] * qjs[h])
    E_joint = 0.5 * (usum + np.sqrt(ugram))
    E = min(E_tri, E_joint) * (1 + MU) + MU * mplan
    # aggregate, σ, aux rows
    aA, amag = np.zeros(128), np.zeros(128)
    for h in np.flatnonzero(isA):
        aA = aA + abs(wf[h]) * q64[h]
        amag = amag + abs(wf[h]) * np.abs(q64[h])
    amax = float(np.max(np.abs(aA)))
    m, e = np.frexp(amax / 448.0 if amax > 0 else 1.0)
    sig = float(np.ldexp(1.0, int(e) - 1 if m == 0.5 else int(e)))
    z = aA / sig
    v0 = e4m3_bits(z.astype(np.float32))
    r1 = z - e4m3_values(v0)
    v1 = e4m3_bits(r1.astype(np.float32))
    eA = (r1 - e4m3_values(v1)) * sig
    # rows and ω
    nrow, last = 16 * mts, 16 * (mts - 1)
    rows = np.zeros((nrow, 128), dtype=np.uint8)
    omega = np.zeros(nrow, dtype=np.float32)
    for row in range(nrow):
        if row == last + 7:
            rows[row] = v0
        elif row == last + 15:
            rows[row] = v1
        else:
            slot = row if row < last + 7 else row - 1
            if slot < nR:
                rows[row] = qb[order[slot]]
                omega[row] = np.float32(wt[order[slot]])
    # J and C
    J = np.zeros(128)
    for d in range(128):
        t1 = t2 = t3 = 0.0
        for h in range(Hp):
            aq = abs(q64[h, d])
            if inR[h]:
                omd = float(np.float32(wt[h]))
                dom = abs(wt[h] - omd) + MU * (abs(wf[h]) + fold[h])
                t1 = t1 + dom * aq
                t2 = t2 + abs(omd) * aq
            t3 = t3 + abs(wf[h]) * aq
        Jd = abs(eA[d]) + MU * amag[d]
        Jd = Jd + t1
        Jd = Jd + g_scr * (t2 + sig * (abs(e4m3_values(v0[d])) + abs(e4m3_values(v1[d]))))
        Jd = Jd + g_ref * t3
        J[d] = Jd
    Jn = np.sqrt(_block4_sum(J * J)) * (1 + MU)
    C = (np.sqrt(128.0) * (E + Jn)) * (1 + MU)
    with np.errstate(over="ignore"):
        ok = bool(np.isfinite(C) and np.isfinite(sig) and np.isfinite(np.float32(sig)))
    return dict(rows=rows, omega=omega, sigma=np.float32(sig), C=C, E=E, valid=ok,
                counts=(nR, nP, int(isA.sum())), inR=inR, inA=isA, w_fold=wt, a_A=aA)  # fmt: skip


def emulate_plan_kernel(q, w, kp, sample, ns, r, mts, g_scr, g_ref, rows, omega, sigma, C,
                        valid, counts, inR, inA, w_fold, a_A, E, eps_base, a_step, a_epi,
                        eps_raw, i8=False):  # fmt: skip
    """plan_mt* (plan_i8_mt* with ``i8``) over the grid (Qn blocks): writes the output arrays
    like the kernel."""
    ns = int(ns)
    ksmp = e4m3_values(kp[sample[:ns]]).astype(np.float32) if ns else np.zeros((0, 128), np.float32)
    kcodes = kp[sample[:ns]] if i8 else None
    for t in range(q.shape[0]):
        o = emulate_plan_query(q[t], w[t], ksmp, int(r), int(mts), float(g_scr), float(g_ref),
                               kcodes)  # fmt: skip
        rows[t], omega[t], sigma[t], C[t], E[t] = o["rows"], o["omega"], o["sigma"], o["C"], o["E"]
        valid[t], counts[t], inR[t], inA[t] = o["valid"], o["counts"], o["inR"], o["inA"]
        w_fold[t], a_A[t] = o["w_fold"], o["a_A"]
        eps_raw[t] = emulate_eps_raw(q[t], w[t], float(eps_base), float(a_step), float(a_epi))


def emulate_row_constants(rows, omega, sigma, Qn, nrow, a_step, lift, out):
    """csrc/plan.cu screen_row_constants_fresh in numpy, operation for operation: per row the
    steps' powers of two added in order and one product with a_step; |ω_j|·a_j summed by the
    warp's xor butterfly (lane 0's value); then σ·(a_{last+7} + a_{last+15}), lift, 1 + MU."""
    Qn, nrow = int(Qn), int(nrow)
    last = nrow - 16
    for t in range(Qn):
        a = np.zeros(32)
        for j in range(nrow):
            steps = 0.0
            for s in range(4):
                c = rows[t, j, 32 * s : 32 * (s + 1)].astype(np.int64)
                f = np.where((c & 0x7F) != 0, np.maximum((c >> 3) & 0xF, 1), 0)
                if f.max() > 0:
                    steps = steps + np.ldexp(1.0, int(f.max()) - 7)
            a[j] = steps * float(a_step)
        term = np.zeros(32)
        term[:nrow] = np.abs(omega[t].astype(np.float64)) * a[:nrow]
        for o in (16, 8, 4, 2, 1):
            term = term + term[np.arange(32) ^ o]
        tot = term[0] + float(sigma[t]) * (a[last + 7] + a[last + 15])
        out[t] = (tot * float(lift)) * (1 + MU)


class _FakePlanKernel:
    def __init__(self):
        self.sig = [t for t, _ in _signature()]
        self.rows_sig = [t for t, _ in params(PLAN_CU.read_text(), "screen_row_constants_fresh")]
        self.calls = []

    def get(self, name, smem):
        if name == "screen_row_constants_fresh":

            def rows_launch(grid, block, args, shared_mem=0):
                check_args(name, args, self.rows_sig)
                assert grid == (-(-int(args[3]) // pf.PLAN_WARPS),) and block == (pf.PLAN_THREADS,)
                self.calls.append(name)
                emulate_row_constants(*args)

            return rows_launch
        i8, mt = re.fullmatch(r"plan_(i8_)?mt(\d)", name).groups()
        i8, mt = bool(i8), int(mt)

        def launch(grid, block, args, shared_mem=0):
            check_args(name, args, self.sig)
            q = args[0]
            assert q.shape[1] == 16 * mt and grid == (q.shape[0],) and block == (pf.PLAN_THREADS,)
            assert shared_mem == smem == pf.plan_smem_bytes(16 * mt, i8)
            assert shared_mem + 12 * 1024 <= 227 * 1024  # + static smem (≤ 10.7 KB, ptxas)
            ns = int(args[4])
            assert ns <= args[3].size and np.all(
                (args[3][:ns] >= 0) & (args[3][:ns] < args[2].shape[0])
            )
            self.calls.append(name)
            emulate_plan_kernel(*args, i8=i8)

        return launch


@pytest.fixture
def fake_cupy(monkeypatch):
    shim = numpy_as_cupy()
    fk = _FakePlanKernel()
    monkeypatch.setattr(pf, "cupy_or_raise", lambda: shim)
    monkeypatch.setattr(pf, "_kernel", fk.get)
    return fk


# ---------------------------------------------------------------------------------------
# CPU: host code + emulated kernel vs plan.build_plans(xp=numpy)
# ---------------------------------------------------------------------------------------


def _workload(H, Qn=10, N=4096, seed=0, pos_frac=0.75):
    from dosa_ref.fp8 import quantize_keys as qk
    from dosa_ref.fp8 import quantize_queries as qq

    rs = np.random.default_rng(seed)
    topic = rs.standard_normal(128)
    lift = 0.6 * rs.random((Qn, H, 1)) ** 2  # heads from topic-aligned (p ≈ 1) to isotropic
    qf = rs.standard_normal((Qn, H, 128)) + lift * topic
    w = np.where(rs.random((Qn, H)) < pos_frac, 1.0, -1.0) * (0.2 + rs.random((Qn, H)))
    k = rs.standard_normal((N, 128)) + 0.5 * topic
    kp, ksc = qk(k)
    q, wq = qq(qf, w)
    Hp = -(-H // 16) * 16
    if Hp != H:  # pad_heads: zero rows, zero weights
        q = np.concatenate([q, np.zeros((Qn, Hp - H, 128), np.uint8)], axis=1)
        wq = np.concatenate([wq, np.zeros((Qn, Hp - H), np.float32)], axis=1)
    q[0, 1] = 0  # a zero-norm head (anchors with ‖q_j‖ = 0 are skipped)
    return q, wq, kp, ksc


def _priority_keys(q, w, kp, sample, r):
    """plan.build_plans' priority keys (plan._choose_R) with both fp32 dot orders: the
    einsum's (p_e) and the kernel's sequential one (p_s)."""
    qf = e4m3_values(q)
    qn = np.sqrt(np.sum(qf * qf, axis=2))
    wf = w.astype(np.float64)
    if sample is None:
        pe = ps = np.full(w.shape, 0.5)
    elif pf.ACTIVATION_I8:  # one exact p (the images' integer dots) on both sides
        pe = ps = pf.activation_frequency_i8(q, kp[sample])
    else:
        ks = e4m3_values(kp[sample]).astype(np.float32)
        pe = np.mean(np.einsum("thd,sd->ths", qf.astype(np.float32), ks) > 0, axis=2)
        acc = np.zeros((*w.shape, ks.shape[0]), dtype=np.float32)
        q32 = qf.astype(np.float32)
        for d in range(128):
            acc = acc + q32[:, :, d, None] * ks[None, None, :, d]
        ps = np.mean(acc > 0, axis=2)
    pos, neg = wf > 0, wf < 0
    few = pos.sum(axis=1, keepdims=True) <= r
    prio = np.abs(wf) * qn * np.minimum(pe, 1 - pe)
    prim = np.where(pos, 2.0, np.where(neg & few, 1.0, 0.0))
    sec = np.where(pos, np.where(few, 0.0, wf * qn), np.where(neg & few, prio, 0.0))
    return prim + sec / (1 + sec), np.minimum((prim > 0).sum(axis=1), r), pe, ps


def _compare(fu, ref, q, w, kp, sample, r, mts, min_same=0.6):
    """Fused plan vs CuPy/numpy plan: both break priority ties by head index (a stable
    sort), so wherever both fp32 dot orders give the same p, R and A are identical and every
    field equals the specification up to float64 summation order (rtol 1e-12 ≪ MU; ε_raw
    on every query: it does not depend on R)."""
    asn = (
        (lambda x: cp.asnumpy(x))
        if (cp is not None and not isinstance(fu.C, np.ndarray))
        else np.asarray
    )
    keys, nR, pe, ps = _priority_keys(q, w, kp, sample, min(r, 16 * mts - 2, q.shape[1]))
    f = {k: asn(getattr(fu, k)) for k in ("rows", "omega", "sigma", "C", "E", "valid", "r",
                                          "omitted_positive", "aggregated", "inR", "inA",
                                          "w_fold", "a_A", "eps_raw")}  # fmt: skip
    c = {k: asn(getattr(ref, k)) for k in f}
    assert np.allclose(f["eps_raw"], c["eps_raw"], rtol=1e-12, atol=0) and fu.eps_out == ref.eps_out
    assert f["valid"].all() and c["valid"].all()
    assert np.array_equal(f["r"], c["r"])  # |R| = min(#{prim > 0}, r) never depends on ties
    same = 0
    for t in range(q.shape[0]):
        if not np.array_equal(pe[t], ps[t]):  # p_h differs by 1/ns: another valid R
            continue
        same += 1
        n = int(nR[t])  # R = the first |R| heads of the stable sort by (key desc, index)
        assert np.array_equal(np.flatnonzero(f["inR"][t]),
                              np.sort(np.argsort(-keys[t], kind="stable")[:n])), t  # fmt: skip
        assert np.array_equal(f["inR"][t], c["inR"][t]), t
        assert np.array_equal(f["inA"][t], c["inA"][t]), t
        for k in ("omitted_positive", "aggregated"):
            assert f[k][t] == c[k][t], (k, t)
        assert np.allclose(f["w_fold"][t], c["w_fold"][t], rtol=1e-12, atol=0), t
        assert np.allclose(f["a_A"][t], c["a_A"][t], rtol=1e-12, atol=1e-300), t
        assert np.isclose(f["E"][t], c["E"][t], rtol=1e-12, atol=1e-300), t
        assert np.isclose(f["C"][t], c["C"][t], rtol=1e-12), t
        assert f["sigma"][t] == c["sigma"][t], t

        # rows/ω: equal as multisets of (row, ω) (tied keys may fill slots in another order)
        def canon(rows, om):
            return sorted((rw.tobytes(), float(o)) for rw, o in zip(rows, om, strict=True))

        last = 16 * (mts - 1)
        assert np.array_equal(
            f["rows"][t, [last + 7, last + 15]], c["rows"][t, [last + 7, last + 15]]
        )
        assert canon(f["rows"][t], f["omega"][t]) == canon(c["rows"][t], c["omega"][t]), t
    assert same >= min_same * q.shape[0], (same, q.shape[0])
    return same


def _guard_check(pl, q, w, kp, mts):
    """The fused plan's certificate dominates the float64 scores of every key (payload
    units, α = 1): Σ_h w_h[q_h·k]_+ ≤ Û + ρC + ε_raw (docs/method.md §8; Û in float64)."""
    kv = e4m3_values(kp)
    s = np.einsum("th,thn->tn", w.astype(np.float64), np.maximum(e4m3_values(q) @ kv.T, 0))
    X = np.einsum("tjd,nd->tjn", e4m3_values(np.asarray(pl.rows)), kv)
    last = 16 * (mts - 1)
    aux = X[:, last + 7] + X[:, last + 15]
    Uh = np.einsum("tj,tjn->tn", np.asarray(pl.omega, np.float64), np.maximum(X, 0))
    Uh -= np.asarray(pl.sigma, np.float64)[:, None] * np.maximum(aux, 0)
    rho = key_rms(kp).astype(np.float64)
    U = Uh + rho[None] * np.asarray(pl.C)[:, None] + np.asarray(pl.eps_raw)[:, None]
    assert np.all(s <= U)
    return float(np.min(U - s))


def _image_rows(seed, n=64):
    """e4m3 rows with every code and wide exponent spreads: random codes, rows of one
    exponent field, rows with one large code among small ones, NaN and zero codes."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
    rows[0] = np.arange(128, dtype=np.uint8)  # every nonnegative code (0x7f: NaN)
    rows[1] = np.arange(128, 256, dtype=np.uint8)
    rows[2] = 0
    rows[3, :] = 0x08 | rng.integers(0, 8, 128, dtype=np.uint8)  # field 1 only
    rows[4, :] = rng.integers(0, 8, 128, dtype=np.uint8)  # subnormals only
    rows[5, :] = 0x7F  # NaN only
    rows[6, :] = rng.integers(0, 0x18, 128, dtype=np.uint8)
    rows[6, 5] = 0x77  # one code of field 14
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_activation_image_is_the_row_scaled_and_truncated(seed):
    """``plan.activation_image_trunc`` (csrc/plan.cu activation_image_quarter): each
    coordinate is the code's value times 2^(13−F) truncated toward zero — |image| ≤
    |v|·2^(13−F) < |image| + 1, the same sign — F the row's largest exponent field of its
    nonzero finite codes; zero and NaN codes give 0; |image| ≤ 120, so a dot of two images
    is an exact int32 (128·120² < 2^31)."""
    rows = _image_rows(seed)
    img = pf.activation_image_trunc(rows)
    assert img.dtype == np.int8 and img.shape == rows.shape
    v = e4m3_values(rows)
    fin = np.isfinite(v) & (v != 0)
    field = np.maximum((rows.astype(np.int64) >> 3) & 15, 1)
    F = np.max(np.where(fin, field, 0), axis=1, keepdims=True)
    x = np.where(fin, v, 0.0) * np.exp2(13.0 - F)  # exact: a power-of-two scaling
    m = np.abs(img.astype(np.float64))
    assert np.all(m <= np.abs(x)) and np.all(np.abs(x) < m + 1)
    assert np.all((img == 0) | (np.sign(img) == np.sign(x)))
    assert np.all(img[~fin] == 0) and int(np.abs(img.astype(np.int64)).max()) <= 120
    assert np.all(np.abs(img[fin & (field == F)].astype(np.int64)) >= 8)  # the row's top


def test_activation_frequency_i8_counts_exact_image_dots():
    """p_h of ``ACTIVATION_I8`` = #{keys: image dot > 0} / ns with the dots in int64 (the
    einsum's int32 cannot overflow), 0 where the images' dot is 0; a head and a key of the
    same row have a positive dot unless the image is 0."""
    rows = _image_rows(3, 48)
    q = rows[:32].reshape(2, 16, 128)
    k = rows[16:48]
    p = pf.activation_frequency_i8(q, k)
    qi = pf.activation_image_trunc(q).astype(np.int64)
    ki = pf.activation_image_trunc(k).astype(np.int64)
    want = (np.einsum("thd,sd->ths", qi, ki) > 0).sum(axis=2) / np.float64(k.shape[0])
    assert p.dtype == np.float64 and np.array_equal(p, want)
    own = pf.activation_frequency_i8(rows[None, 16:32], rows[16:17])[0, 0]
    assert own == (1.0 if np.any(pf.activation_image_trunc(rows[16])) else 0.0)


CPU_CASES = [  # (H, r, mts, pos_frac, sample)
    (32, 14, 1, 0.75, True),
    (32, 30, 2, 0.75, True),
    (64, 14, 1, 0.75, True),
    (64, 30, 2, 0.4, True),
    (20, 14, 1, 0.75, True),
    (48, 30, 2, 1.0, False),
]


@pytest.mark.parametrize(
    "case", CPU_CASES, ids=[f"H{c[0]}-r{c[1]}-pos{c[3]}-s{int(c[4])}" for c in CPU_CASES]
)
@pytest.mark.parametrize("i8", [False, True], ids=["f32", "i8"])
def test_fused_host_code_with_emulated_kernel(fake_cupy, monkeypatch, case, i8):
    """Both activation passes (``plan.ACTIVATION_I8``): the kernel's launch and its emulated
    plan against the specification's, which computes the same p."""
    monkeypatch.setattr(pf, "ACTIVATION_I8", i8)
    H, r, mts, pos_frac, use_sample = case
    q, w, kp, _ = _workload(H, seed=H + r, pos_frac=pos_frac)
    sample = np.arange(0, kp.shape[0], 16) if use_sample else None
    fu = pf.build_plans_fused(q, w, kp, sample, r, mts)
    ref = pf.build_plans(q, w, kp, sample, r, mts, xp=np)
    assert fake_cupy.calls == [f"plan_{'i8_' if i8 else ''}mt{q.shape[1] // 16}"]
    assert fu.rows.shape == ref.rows.shape and fu.omega.dtype == np.float32
    assert fu.valid.dtype == np.bool_ and fu.inR.dtype == np.bool_
    same = _compare(fu, ref, q, w, kp, sample, r, mts)
    assert same == q.shape[0] or not i8  # one p: every query's R is the specification's
    _guard_check(fu, q, w, kp, mts)


@pytest.mark.parametrize("H,r,mts", [(32, 14, 1), (64, 30, 2)])
def test_fused_planner_covers_the_fp8_scorer(fake_cupy, H, r, mts):
    """With ``scorer="fp8_fresh"`` (the native FP8 scorer's allowance, docs/error_model.md)
    the fused planner's plan equals the specification's, ε_raw included bitwise (the
    per-query part from the e4m3 codes), and the per-dim allowances are refused."""
    q, w, kp, _ = _workload(H, seed=H + 7)
    sample = np.arange(0, kp.shape[0], 16)
    fu = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, "fp8_fresh")
    ref = pf.build_plans(q, w, kp, sample, r, mts, xp=np, scorer="fp8_fresh")
    _compare(fu, ref, q, w, kp, sample, r, mts)
    f16 = pf.build_plans(q, w, kp, sample, r, mts, xp=np)
    assert np.all(np.asarray(fu.eps_raw) > np.asarray(f16.eps_raw))  # the window term
    assert not np.array_equal(np.asarray(fu.C), np.asarray(f16.C))  # another g_ref
    with pytest.raises(ValueError, match="scorer"):
        pf.build_plans_fused(q, w, kp, sample, r, mts, 17, "fp8_k64")


@pytest.mark.parametrize("scorer", ["f16", "fp8_fresh"])
@pytest.mark.parametrize("H,r,mts", [(32, 14, 1), (64, 14, 1), (64, 30, 2)])
def test_fused_planner_covers_the_fp8_screen(fake_cupy, monkeypatch, H, r, mts, scorer):
    """With ``screen="fp8_fresh"`` (the FP8 build of "wgt", docs/error_model.md "An FP8
    screen") the fused planner's plan equals the specification's, ε_raw bitwise with the
    screen's per-row constants by the array path (``ROW_CONSTANTS_KERNEL`` off; the kernel:
    test_row_constants_kernel_host_code); it is the f16-screen plan with another g_scr in C
    and those constants on ε_raw (the rows, weights and σ unchanged); per-dim screen
    allowances are refused."""
    monkeypatch.setattr(pf, "ROW_CONSTANTS_KERNEL", False)
    q, w, kp, _ = _workload(H, seed=H + 11)
    sample = np.arange(0, kp.shape[0], 16)
    fu = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, scorer, "fp8_fresh")
    ref = pf.build_plans(q, w, kp, sample, r, mts, xp=np, scorer=scorer, screen="fp8_fresh")
    assert fu.screen == ref.screen == "fp8_fresh"
    _compare(fu, ref, q, w, kp, sample, r, mts)
    f16 = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, scorer)
    for k in ("rows", "omega", "sigma", "valid"):
        assert np.array_equal(np.asarray(getattr(fu, k)), np.asarray(getattr(f16, k))), k
    extra = pf.screen_row_constants(fu.rows, fu.omega, fu.sigma, mts, "fp8_fresh", 17, np)
    assert np.array_equal(np.asarray(fu.eps_raw), np.asarray(f16.eps_raw) + extra)
    assert np.all(extra[np.asarray(fu.r) > 0] > 0)  # a retained row carries its constant
    assert not np.array_equal(np.asarray(fu.C), np.asarray(f16.C))  # another g_scr
    with pytest.raises(ValueError, match="screen"):
        pf.build_plans_fused(q, w, kp, sample, r, mts, 17, scorer, "fp8_k64")


@pytest.mark.parametrize("H,r,mts", [(32, 14, 1), (64, 14, 1), (64, 30, 2)])
def test_row_constants_kernel_host_code(fake_cupy, monkeypatch, H, r, mts):
    """``plan.ROW_CONSTANTS_KERNEL``: the FP8 screen's per-row constants by
    screen_row_constants_fresh (emulated operation for operation, its launch checked against
    the kernel's C signature) instead of the array operations: the plan's other fields the
    same bitwise, ε_raw the f16-screen plan's plus the kernel's constants, and each constant
    the specification's up to the order of the sum over the query's 16·mts rows — at least
    the exact sum lifted by 1 + γ_{2·mts+6} (what the bound needs; the MU on top covers any
    order), and within 2·γ_{16·mts+2} of fp64 of the array path's value (the same products,
    two orders of one sum of nonnegative terms, then the same three roundings)."""
    from fractions import Fraction

    q, w, kp, _ = _workload(H, seed=H + 23)
    sample = np.arange(0, kp.shape[0], 16)
    ref = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, "f16", "fp8_fresh")
    f16 = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, "f16", "f16")
    monkeypatch.setattr(pf, "ROW_CONSTANTS_KERNEL", True)
    got = pf.build_plans_fused(q, w, kp, sample, r, mts, 17, "f16", "fp8_fresh")
    plan_kernel = f"plan_{'i8_' if pf.ACTIVATION_I8 else ''}mt{q.shape[1] // 16}"
    assert fake_cupy.calls[-2:] == [plan_kernel, "screen_row_constants_fresh"]
    for k in ("rows", "omega", "sigma", "valid", "C"):
        assert np.array_equal(np.asarray(getattr(got, k)), np.asarray(getattr(ref, k))), k
    out = pf._row_constants_kernel(got.rows, got.omega, got.sigma, mts, pf.cupy_or_raise())
    assert np.array_equal(np.asarray(got.eps_raw), np.asarray(f16.eps_raw) + out)
    monkeypatch.setattr(pf, "ROW_CONSTANTS_KERNEL", False)
    spec = pf.screen_row_constants(got.rows, got.omega, got.sigma, mts, "fp8_fresh", 17, np)
    n = 16 * mts
    assert np.all(np.abs(out - spec) <= 2 * gamma_up(n + 2, 2.0**-53) * spec)
    _, a_scr = pf.dot_allowance("fp8_fresh", np.asarray(got.rows), 17, np)
    last = n - 16
    for t in range(q.shape[0]):
        ex = sum(Fraction(abs(float(o))) * Fraction(float(a))
                 for o, a in zip(got.omega[t], a_scr[t], strict=True))  # fmt: skip
        aux = Fraction(float(a_scr[t, last + 7])) + Fraction(float(a_scr[t, last + 15]))
        lifted = (ex + Fraction(float(got.sigma[t])) * aux) * Fraction(pf.row_lift(mts))
        assert Fraction(float(out[t])) >= lifted and Fraction(float(spec[t])) >= lifted, t
    assert np.all(out[np.asarray(got.r) > 0] > 0)


@pytest.mark.parametrize("H,r,mts", [(32, 14, 1), (64, 30, 2)])
def test_fused_host_code_calibrated_ties(fake_cupy, H, r, mts):
    """The calibrated regime has few positive heads, so many negative heads share the
    priority key 1.0 (p_h ∈ {0, 1} on the sample) and the |R| boundary falls inside a tie
    on every query: both planners break it by head index, so the plans still agree."""
    from dosa_ref.fp8 import quantize_keys as qk
    from dosa_ref.fp8 import quantize_queries as qq
    from dosa_ref.workloads import make_workload

    wl = make_workload("calibrated", 24, 8192, H=H, seed=31)
    kp, _ = qk(wl.k)
    q, w = qq(wl.q, wl.w)
    sample = np.arange(0, 8192, 32)
    fu = pf.build_plans_fused(q, w, kp, sample, r, mts)
    ref = pf.build_plans(q, w, kp, sample, r, mts, xp=np)
    keys, nR, _, _ = _priority_keys(q, w, kp, sample, r)
    ties = sum(
        np.sort(k)[::-1][n - 1] == np.sort(k)[::-1][n] for k, n in zip(keys, nR, strict=True)
    )
    assert ties == len(keys)  # the case this test exists for
    assert _compare(fu, ref, q, w, kp, sample, r, mts, min_same=0.9) >= 0.9 * len(keys)
    _guard_check(fu, q, w, kp, mts)


def test_fused_empty_and_bad_shapes(fake_cupy):
    q, w, kp, _ = _workload(32, Qn=2)
    pl = pf.build_plans_fused(q[:0], w[:0], kp, None, 14, 1)
    assert pl.rows.shape == (0, 16, 128) and fake_cupy.calls == []
    with pytest.raises(ValueError, match="Hp"):
        pf.build_plans_fused(q[:, :20], w[:, :20], kp, None, 14, 1)


def test_emulation_matches_spec_on_ties(fake_cupy):
    """All-equal weights and identical heads (every key tied): any R is valid; the fused
    plan still dominates the scores, and |R|, σ, C agree with plan.build_plans'."""
    q, w, kp, _ = _workload(32, Qn=3, seed=5)
    q[:, :] = q[:, :1]
    w[:] = 0.5
    fu = pf.build_plans_fused(q, w, kp, np.arange(0, 4096, 32), 14, 1)
    ref = pf.build_plans(q, w, kp, np.arange(0, 4096, 32), 14, 1, xp=np)
    assert np.array_equal(fu.r, ref.r) and np.array_equal(fu.sigma, ref.sigma)
    assert np.allclose(fu.C, ref.C, rtol=1e-12)
    _guard_check(fu, q, w, kp, 1)


def test_plan_stage_runs_the_fused_planner(monkeypatch):
    """plan.plan_stage hands the batch, p_sample evenly spaced pool keys, r, the row
    tiles (1 for r ≤ 14, else 2), the screen's accumulator bits, the allowance of the
    batch's canonical scorer and the screen's dot arithmetic (its ``screen``, "f16" unless
    named) to build_plans_fused."""
    from types import SimpleNamespace

    from dosa_cupy.scorer import MMA_BITS

    calls = []
    monkeypatch.setattr(pf, "cupy_or_raise", lambda: np)
    monkeypatch.setattr(pf, "build_plans_fused", lambda *a: calls.append(a) or "plan")
    pool = np.arange(0, 3000, 3, dtype=np.int32)
    for scorer, allowance in (("f16", "f16"), ("fp8", "fp8_fresh")):
        b = SimpleNamespace(q="q", w="w", kp="kp", scorer=scorer)
        for r, mts in ((14, 1), (15, 2), (30, 2)):
            for screen in ("f16", "fp8_fresh", None):
                calls.clear()
                kw = {} if screen is None else {"screen": screen}
                assert pf.plan_stage(b, pool, r, {"p_sample": 16}, **kw) == "plan"
                (args,) = calls
                want = (r, mts, MMA_BITS, allowance, screen or "f16")
                assert args[:3] == ("q", "w", "kp") and args[4:] == want
        assert np.array_equal(args[3], pool[np.linspace(0, pool.size - 1, 16).astype(np.int64)])


# ---------------------------------------------------------------------------------------
# GPU (H200): run with  python3 -m pytest -q -s tests/test_plan_fused.py
# ---------------------------------------------------------------------------------------

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


def _need(regime):
    if regime not in ("gaussian", "structured", "ties", "equal", "adversarial"):
        pytest.importorskip("dosa_ref.workloads", reason="dosa_ref.workloads not available")


GPU_CASES = [(H, r, m, g) for H in (32, 64) for r, m in ((14, 1), (30, 2))
             for g in ("structured", "calibrated")]  # fmt: skip


# (canonical scorer, screen dots): the f16 pipeline, the FP8 scorer with the f16 screens and
# with the FP8 build of "wgt"
ARITHS = [("f16", "f16"), ("fp8_fresh", "f16"), ("fp8_fresh", "fp8_fresh")]


@pytest.mark.parametrize("i8", [False, True], ids=["f32", "i8"])
@pytest.mark.parametrize("scorer,screen", ARITHS)
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"H{c[0]}-r{c[1]}-{c[3]}" for c in GPU_CASES])
@gpu
def test_fused_plan_equals_emulation_and_spec(monkeypatch, case, scorer, screen, i8):
    """On the H200: the kernel equals its numpy emulation bit for bit (every field, ε_raw
    with the scorer's per-head constant included — and, for the FP8 screen, the per-row
    constants ``screen_row_constants`` adds on the device and on the host alike), and
    plan.build_plans (CuPy) up to summation order / tie breaking (_compare) — on both
    activation passes (``plan.ACTIVATION_I8``; with it, R equals the specification's on
    every query)."""
    monkeypatch.setattr(pf, "ACTIVATION_I8", i8)
    H, r, mts, regime = case
    _need(regime)
    wl = make_gpu_workload(regime, 24, 8192, H, seed=31)
    sample = cp.arange(0, 8192, 32)
    fu = pf.build_plans_fused(wl["q"], wl["w"], wl["k_payload"], sample, r, mts, 17, scorer,
                              screen)  # fmt: skip
    ref = pf.build_plans(wl["q"], wl["w"], wl["k_payload"], sample, r, mts, scorer=scorer,
                         screen=screen)  # fmt: skip
    assert fu.screen == ref.screen == screen
    q, w, kp = (cp.asnumpy(wl[k]) for k in ("q", "w", "k_payload"))
    s = cp.asnumpy(sample).astype(np.int32)
    Qn, Hp = w.shape
    em = {k: np.empty(cp.asnumpy(getattr(fu, k)).shape, cp.asnumpy(getattr(fu, k)).dtype)
          for k in ("rows", "omega", "sigma", "C", "inR", "inA", "w_fold", "a_A", "E",
                    "eps_raw")}  # fmt: skip
    valid, counts = np.empty(Qn, np.uint8), np.empty((Qn, 3), np.int32)
    inR, inA = np.empty((Qn, Hp), np.uint8), np.empty((Qn, Hp), np.uint8)
    g_scr, g_ref, eps = pf.plan_constants(Hp, mts, 17, scorer, screen)
    rr = min(r, 16 * mts - 2, Hp)
    emulate_plan_kernel(q, w, kp, s, s.size, rr, mts, g_scr, g_ref, em["rows"], em["omega"],
                        em["sigma"], em["C"], valid, counts, inR, inA, em["w_fold"], em["a_A"],
                        em["E"], eps, *pf.allowance_factors(scorer, Hp // 16),
                        em["eps_raw"], i8=i8)  # fmt: skip
    if screen != "f16" and pf.ROW_CONSTANTS_KERNEL:  # the kernel's operations, in numpy
        rc = np.empty(Qn)
        emulate_row_constants(em["rows"], em["omega"], em["sigma"].astype(np.float64), Qn,
                              16 * mts, pf.A_STEP, pf.row_lift(mts), rc)  # fmt: skip
        em["eps_raw"] += rc
    elif screen != "f16":  # the array path on the device: CuPy's sums, not numpy's order
        dev = (cp.asarray(em[k]) for k in ("rows", "omega", "sigma"))
        em["eps_raw"] += cp.asnumpy(pf.screen_row_constants(*dev, mts, screen, 17, cp))
    em["inR"], em["inA"] = inR.view(bool), inA.view(bool)
    diff = [k for k in em if not np.array_equal(cp.asnumpy(getattr(fu, k)), em[k], equal_nan=True)]
    assert not diff, f"kernel differs from its emulation in {diff}"
    assert np.array_equal(cp.asnumpy(fu.r), counts[:, 0])
    same = _compare(fu, ref, q, w, kp, s, r, mts, min_same=1.0 if i8 else 0.5)
    print(f"\n[plan-fused] {regime} H={H} r={r}: spec-identical R on {same}/{Qn} queries")


FUSED_CASES = [("structured", 32, 14), ("structured", 64, 30), ("calibrated", 32, 14),
               ("calibrated", 64, 30), ("gaussian", 64, 14), ("ties", 32, 14)]  # fmt: skip


@pytest.mark.parametrize("i8", [False, True], ids=["f32", "i8"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=[f"{c[0]}-H{c[1]}-r{c[2]}" for c in FUSED_CASES])
@gpu
def test_dosa_fused_planner_equals_dense(monkeypatch, case, i8):
    monkeypatch.setattr(pf, "ACTIVATION_I8", i8)
    regime, H, r = case
    _need(regime)
    wl = make_gpu_workload(regime, 256, 32768, H, seed=13)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 1024, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    ids, st = dosa_cupy.dosa_topk(*args, r=r, return_stats=True)
    sv = float(np.mean(st.survivors / np.maximum(st.screened, 1)))
    print(f"\n[dosa fused-plan] {regime} H={H} r={r}: survival {sv:.4f}")
    assert cp.array_equal(ids, dense)
    assert not st.recovered.any()
