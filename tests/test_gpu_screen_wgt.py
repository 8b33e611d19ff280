"""The transposed Hopper screen (``screen="wgt"``, csrc/screen_wgt.cu; docs/method.md §8–§9):
keys as the wgmma M operand, the plan rows of a group of queries as N — 16 rows of 8 queries
(r ≤ 14, screen_wgt_rows16) or 8 rows of 16 queries (r ≤ 6, screen_wgt_rows8).  Its dots
are not the other screens' bits, so it is checked against what the method needs: DoSA's ids
equal the dense route's on every regime (plain and tie-aware kernels, both scorers, the
overflow extension), every bound is ≥ the canonical score, and — on synthetic operands
launched directly — every U^num lies within the plan's screening allowance of the exact Û,
Uout is written exactly on the visible keys, and the survivor words and tie counts are
exactly the keep rule applied to the kernel's own U^num.  GPU tests need compute capability
9.0 (sm_90a)."""

import re

import numpy as np
import pytest
from gpu_support import HAVE_GPU, cp, gpu, guard_violations, needs_sm90a

from dosa_cupy import _build, screen
from dosa_cupy.options import check_options
from dosa_cupy.plan import gamma, gamma_mma
from dosa_cupy.scorer import MMA_BITS

if HAVE_GPU:
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload


def test_wgt_option_validation():
    for r in (6, 14, 30):
        assert check_options({"screen": "wgt", "r": r})["screen"] == "wgt"
    with pytest.raises(ValueError, match="screen"):
        check_options({"screen": "wgt", "cert_seeds": 64})
    assert "wgt" in screen.SCREENS and screen.WGT_TILE % 128 == 0
    assert screen.WGT_QG % 16 == 0  # whole groups of every build
    assert [screen.wgt_rows(r) for r in (1, 6, 7, 14, 15, 30)] == [8, 8, 16, 16, 32, 32]


REGIMES = ["calibrated", "many_positive", "ties", "equal"]
R = [14, 6, 30]  # the 16-row, the 8-row and the 32-row build


def _args(regime, H, Qn=200, N=12000, K=256, seed=11):
    wl = make_gpu_workload(regime, Qn, N, H, seed=seed)
    return wl, (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


@pytest.mark.parametrize("scorer,seed", [("f16", 11), ("fp8", 5)])
@pytest.mark.parametrize("r", R)
@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("regime", REGIMES)
@needs_sm90a
@gpu
def test_wgt_ids_equal_dense(regime, H, r, scorer, seed):
    """ids == the scorer's dense ids bitwise with the tie-aware rule on and off and with a
    small record buffer (the overflow extension); with debug_bounds, U^num ≥ the canonical
    score of every visible key."""
    wl, a = _args(regime, H, seed=seed)
    dense = dosa_cupy.dense_topk(*a, scorer=scorer)
    for kw in ({"tie_reject": True}, {"tie_reject": False}, {"buffer": 16}):
        ids = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, scorer=scorer, **kw)
        assert cp.array_equal(ids, dense), (regime, H, r, scorer, kw)
    ids, st = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, scorer=scorer,
                                  debug_bounds=True, return_stats=True)  # fmt: skip
    assert cp.array_equal(ids, dense)
    lg = dosa_cupy.dense_logits(*a[:4], a[5], a[6], scorer=scorer)
    bad, slack = guard_violations(lg, cp.asarray(st.bounds))
    n = int(np.sum(st.survivors))
    print(f"\n[wgt] {regime} H={H} r={r} {scorer}: survivors {n}, min slack {slack:.3g}")
    assert bad == 0


@pytest.mark.parametrize("r", R)
@needs_sm90a
@gpu
def test_wgt_and_wg_agree_on_ids(r):
    """The same plan screened by "wg" and "wgt": the same ids and the same keys bounded
    (each bound's distance to the exact one is checked by the kernel test below)."""
    wl, a = _args("calibrated", 64, seed=3)
    kw = dict(route="dosa", r=r, debug_bounds=True, return_stats=True)
    ids, st = dosa_cupy.dosa_topk(*a, screen="wgt", **kw)
    ids1, st1 = dosa_cupy.dosa_topk(*a, screen="wg", **kw)
    assert cp.array_equal(ids, ids1)
    u, u1 = np.asarray(cp.asnumpy(st.bounds)), np.asarray(cp.asnumpy(st1.bounds))
    assert np.array_equal(np.isnan(u), np.isnan(u1))  # the same visible keys bounded


# ---- the kernel on synthetic operands: Uout, the allowance, the survivor words ----------

NO_KTH = 0x7FFFFFFF


def _codes(rs, shape, top=0x5F):
    """e4m3 codes of magnitude ≤ 2^(top>>3 − 7)·(1 + …), random signs, no NaN."""
    mag = rs.randint(0, top + 1, size=shape).astype(np.uint8)
    return (mag | (rs.randint(0, 2, size=shape).astype(np.uint8) << 7)).astype(np.uint8)


def _nrow(r_max: int) -> int:
    """Plan rows per query of plans that retain at most r_max heads: 16·mts."""
    return 32 if r_max > 14 else 16


def _operands(rs, Qn, N, r_max=14):
    """A plan of retained heads r ≤ r_max per query (slots row_slots(mts)[:r], the other slots
    zero rows with ω = 0, as plan.py leaves them), its aux rows, keys, spans, a pool."""
    from dosa_cupy.plan import row_slots
    from dosa_ref.fp8 import e4m3_values

    nrow = _nrow(r_max)
    rows = _codes(rs, (Qn, nrow, 128))
    r = rs.randint(1, r_max + 1, size=Qn)  # retained heads per query, slots row_slots[:r]
    slots = row_slots(nrow // 16)
    om = np.zeros((Qn, nrow), np.float32)
    for t in range(Qn):
        used = slots[: r[t]]
        om[t, used] = rs.uniform(-0.5, 1.0, size=used.size).astype(np.float32)
        unused = np.setdiff1d(slots, used)
        rows[t, unused] = 0
    sig = (2.0 ** rs.randint(-4, 0, size=Qn)).astype(np.float32)
    C = rs.uniform(0.0, 1e-2, size=Qn)
    er = rs.uniform(0.0, 1e-6, size=Qn)
    kp = _codes(rs, (N, 128))
    alpha = rs.uniform(0.5, 2.0, size=N).astype(np.float32)
    kv = e4m3_values(kp)
    rho = (np.sqrt((kv * kv).sum(1) / 128) * (1 + 1e-6)).astype(np.float32)
    ks = rs.randint(0, N, size=Qn).astype(np.int32)
    ke = np.minimum(N, ks + rs.randint(0, N, size=Qn)).astype(np.int32)
    ks[:3], ke[:3] = 0, N  # full spans
    ke[3] = ks[3]  # an empty one
    NW = (N + 31) // 32
    pool = np.zeros(NW, np.uint32)
    for i in rs.choice(N, size=N // 50, replace=False):
        pool[i >> 5] |= np.uint32(1 << (i & 31))
    return dict(rows=rows, om=om, sig=sig, C=C, er=er, kp=kp, alpha=alpha, rho=rho, ks=ks,
                ke=ke, pool=pool, r=r)  # fmt: skip


def _exact(op):
    """Û (float64, exact dots), its allowance A = Σ|ω||q||k| + σ(|v0| + |v1|)|k| per (t, i),
    the raw dots x and their magnitudes Σ_d|q_d||k_d| [Qn, 16·mts, N]; the aux rows are rows
    7 and 15 of the plan's last 16-row tile."""
    from dosa_ref.fp8 import e4m3_values

    q = e4m3_values(op["rows"])  # [Qn, 16·mts, 128]
    k = e4m3_values(op["kp"])  # [N, 128]
    x = np.einsum("tjd,nd->tjn", q, k)
    ax = np.einsum("tjd,nd->tjn", np.abs(q), np.abs(k))
    om = op["om"].astype(np.float64)
    sig = op["sig"].astype(np.float64)[:, None]
    a0, a1 = q.shape[1] - 9, q.shape[1] - 1
    uh = np.einsum("tj,tjn->tn", om, np.maximum(x, 0)) - sig * np.maximum(x[:, a0] + x[:, a1], 0)
    A = np.einsum("tj,tjn->tn", np.abs(om), ax) + sig * (ax[:, a0] + ax[:, a1])
    return uh, A, x, ax


def _launch(op, tau, eps_out, tie, kj=None, zrow=None, nrow=16, qg=screen.WGT_QG, ring=False,
            fp8=False, barrier=False, g32=False, pipe=False, uout=True):  # fmt: skip
    """One launch of screen_wgt_rows{nrow}[_tie] with ``qg`` queries per block row (the
    kernel takes any QG ≥ 1; a small one gives several block rows) — or, ``ring``, of the
    ring build: screen_wgt_image_rows{nrow}[_tie], then screen_wgt_ring_rows{nrow}[_tie]
    (QG a multiple of the build's 128 / nrow queries per group); ``fp8``: the FP8 build's
    pair, screen_wgt_fp8_image_rows{nrow} and screen_wgt_fp8_ring_rows{nrow} (plain rule);
    ``barrier``: the ring kernel's racecheck control (``..._ring_rows8_barrier``); ``g32``:
    the FP8 build's fp32 guard (``screen_wgt_fp8_ring_rows{nrow}_g32``); ``pipe``: its
    pipelined halves (``..._g32p``); ``uout`` False: no Uout (a null pointer, as the pipeline
    launches it; U comes back all NaN)."""
    g32 = g32 or pipe
    fp8 = fp8 or g32
    ring = ring or fp8 or barrier
    Qn, N = op["om"].shape[0], op["kp"].shape[0]
    NW = (N + 31) // 32
    d = {k: cp.asarray(v) for k, v in op.items() if k != "r"}
    surv = cp.full((Qn, NW), 0xDEADBEEF, dtype=cp.uint32)
    U = cp.full((Qn, N), np.nan)
    tcnt = cp.zeros(Qn, dtype=cp.uint32)
    args = (d["rows"], d["om"], d["sig"], d["C"], d["er"], np.float64(eps_out), cp.asarray(tau))
    if tie:
        args += (cp.asarray(kj), cp.asarray(zrow))
    args += (d["kp"], d["alpha"], d["rho"], d["ks"], d["ke"], np.int32(3), np.int32(17),
             d["pool"], np.int32(Qn), np.int64(N), np.int32(qg), surv,
             U if uout else np.uint64(0))  # fmt: skip
    if tie:
        args += (tcnt,)
    t = "_tie" if tie else ""
    T = screen.WGT_TILE
    grid = ((N + T - 1) // T, (Qn + qg - 1) // qg)
    if ring:
        groups, f = -(-Qn // (128 // nrow)), "_fp8" if fp8 else ""
        image = cp.full(groups * screen.wgt_image_bytes(nrow, fp8), 0xA5, dtype=cp.uint8)
        img = _build.kernel(f"screen_wgt{f}_image_rows{nrow}{t}", 0, screen.WGT_SPEC)
        img((groups,), (screen.WGT_THREADS,), args + (image,))
        name, smem = f"screen_wgt{f}_ring_rows{nrow}{t}", screen.wgt_ring_smem_bytes(nrow, fp8)
        name += "_barrier" if barrier else "_g32p" if pipe else "_g32" if g32 else ""
        args += (image,)
    else:
        name, smem = f"screen_wgt_rows{nrow}{t}", screen.wgt_smem_bytes(nrow)
    f = _build.kernel(name, smem, screen.WGT_SPEC)
    f(grid, (screen.WGT_THREADS,), args, shared_mem=smem)
    return cp.asnumpy(surv), cp.asnumpy(U), cp.asnumpy(tcnt)


def _spans(op, N):
    """visible [Qn, N] and candidate (visible, not a sink, not in the local window, not in
    the anchor pool) masks for sinks = 3, window = 17 (the launch's)."""
    i = np.arange(N)[None, :]
    ks, ke = op["ks"][:, None].astype(np.int64), op["ke"][:, None].astype(np.int64)
    vis = (i >= ks) & (i < ke)
    s_hi = ks + np.minimum(3, ke - ks)
    loc = np.maximum(s_hi, ke - 17)
    pool = ((op["pool"][i >> 5] >> (i & 31).astype(np.uint32)) & 1).astype(bool)
    return vis, vis & (i >= s_hi) & (i < loc) & ~pool


def _words(bits):
    Qn, N = bits.shape
    NW = (N + 31) // 32
    b = np.zeros((Qn, NW * 32), np.uint64)
    b[:, :N] = bits
    return (b.reshape(Qn, NW, 32) << np.arange(32, dtype=np.uint64)).sum(2).astype(np.uint32)


R_MAX = {32: 30, 16: 14, 8: 6}  # the retained heads of each build's plans


@pytest.mark.parametrize("ring", [False, True], ids=["default", "ring"])
@pytest.mark.parametrize("qg", [screen.WGT_QG, 48])  # one block row of queries, or five
@pytest.mark.parametrize("nrow", [32, 16, 8])
@pytest.mark.parametrize("seed", [0, 1])
@needs_sm90a
@gpu
def test_wgt_kernel_bounds_and_words(seed, nrow, qg, ring):
    """Plain kernel (default and ring build): Uout exactly on the visible keys, every U^num
    within the screening allowance (plan.py g_scr = γ_mma + γ_{2·mts+6}(1 + γ_mma)) of
    α(Û + ρC + ε_raw) + ε_out, and the survivor words exactly {candidates with U^num ≥ τ} —
    Qn and N not multiples of the query group, the block's queries or the key tile."""
    rs = np.random.RandomState(seed)
    Qn, N = 203, 1000 + 37 * seed
    op = _operands(rs, Qn, N, R_MAX[nrow])
    uh, A, _, _ = _exact(op)
    al, rho = op["alpha"].astype(np.float64)[None], op["rho"].astype(np.float64)[None]
    Uex = al * (uh + rho * op["C"][:, None] + op["er"][:, None])
    tau = np.quantile(Uex, 0.6, axis=1).astype(np.float32)
    tau[5] = -np.inf
    surv, U, _ = _launch(op, tau, 1e-7, False, nrow=nrow, qg=qg, ring=ring)
    vis, cand = _spans(op, N)
    assert np.array_equal(~np.isnan(U), vis), "Uout written exactly on the visible keys"
    mts = _nrow(R_MAX[nrow]) // 16
    g = gamma_mma(MMA_BITS) + gamma(2 * mts + 6) * (1 + gamma_mma(MMA_BITS))
    # the fp64 guard: at most 16 upward roundings (2^-52 each) of these magnitudes; ε_out =
    # 1e-7 (the launch's) is added to the bound
    slack = 16 * 2.0**-52 * (np.abs(Uex) + al * (rho * op["C"][:, None] + A) + 1e-7)
    lo, hi = Uex + 1e-7 - al * g * A - slack, Uex + 1e-7 + al * g * A + slack
    assert np.all((U >= lo) | ~vis) and np.all((U <= hi) | ~vis)
    keep = cand & ~(np.nan_to_num(U, nan=-np.inf) < tau[:, None].astype(np.float64))
    assert np.array_equal(surv, _words(keep))


@pytest.mark.parametrize("ring", [False, True], ids=["default", "ring"])
@pytest.mark.parametrize("nrow", [32, 16, 8])
@needs_sm90a
@gpu
def test_wgt_tie_kernel_words_and_counts(nrow, ring):
    """Tie-aware kernel: survivor words = the rule against (τ, kj) with min(U, 0) on
    certified plateau keys, applied to the kernel's U^num; tie counts = the keys the strict
    rule keeps and this one rejects (keys whose plateau test is within rounding of its
    threshold are left out of the comparison)."""
    rs = np.random.RandomState(7)
    Qn, N = 77, 900
    op = _operands(rs, Qn, N, R_MAX[nrow])
    uh, _, x, ax = _exact(op)
    al, rho = op["alpha"].astype(np.float64)[None], op["rho"].astype(np.float64)[None]
    Uex = al * (uh + rho * op["C"][:, None] + op["er"][:, None])
    tau = np.quantile(Uex, 0.5, axis=1).astype(np.float32)
    tau[::3] = 0.0  # the plateau's τ
    kj = np.where(rs.rand(Qn) < 0.5, rs.randint(0, N, size=Qn), NO_KTH).astype(np.int32)
    zrow = np.where(op["om"] > 0, np.float32(0.01), np.float32(-1.0)).astype(np.float32)
    zrow[1::4] = np.nan  # plateau off
    surv, U, tcnt = _launch(op, tau, 1e-7, True, kj, zrow, nrow, qg=32, ring=ring)
    vis, cand = _spans(op, N)
    assert np.array_equal(~np.isnan(U), vis)
    z = zrow.astype(np.float64)[:, :, None]
    zr = z * op["rho"].astype(np.float64)[None, None, :]  # exact: two fp32 factors
    margin = x + zr  # [Qn, 16, N]
    cond = (z > 0) & np.ones_like(margin, dtype=bool)
    zp = (~np.isnan(zrow[:, 0]) & (tau >= 0))[:, None]
    plat = zp & np.all(~cond | (margin <= 0), axis=1)
    # the kernel tests its own dots, within γ_mma·Σ|q||k| of x (taken twice, as the plateau's
    # coefficient does), in fp64 with upward rounding: with this margin's own rounding at most
    # 4 roundings of 2^-52 of |x̂| + |zρ| ≤ |x| + ax + |zρ|
    fp64 = 4 * 2.0**-52 * (np.abs(x) + ax + np.abs(zr))
    near = np.abs(margin) <= 2 * gamma_mma(MMA_BITS) * ax + fp64
    unsure = zp & np.any(cond & near, axis=1)
    Uk = np.nan_to_num(U, nan=-np.inf)
    t64 = tau[:, None].astype(np.float64)
    ids = np.arange(N)[None, :]
    plain = cand & ~(Uk < t64)
    Ue = np.where(plat, np.minimum(Uk, 0.0), Uk)
    below = (Ue < t64) | ((Ue == t64) & (ids > kj[:, None]))
    keep = plain & ~below
    got = np.zeros((Qn, N), bool)
    w = np.repeat(surv, 32, axis=1)[:, :N]
    got[:] = (w >> (np.arange(N) % 32).astype(np.uint32)) & 1
    ok = (got == keep) | unsure
    assert ok.all(), f"{int((~ok).sum())} survivor bits differ"
    sure = ~unsure.any(axis=1)
    assert np.array_equal(tcnt[sure], (plain & ~keep).sum(1)[sure])
    assert (plain & ~keep).sum() > 0, "the tie-aware rule rejected nothing: a weak test"


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("nrow", [32, 16, 8])
@needs_sm90a
@gpu
def test_wgt_ring_equals_default_bitwise(nrow, tie):
    """The ring build against the default on one launch whose blocks run many query groups
    (every slot of the ring refilled several times, the last block row partial): the same
    survivor words, U^num and tie counts, bit for bit — the same MMA operands in the same
    order, the same epilogue — repeated launches included (a race would move them)."""
    rs = np.random.RandomState(5 + nrow)
    Qn, N = 1000, 2100
    op = _operands(rs, Qn, N, R_MAX[nrow])
    # spans a caller with check=False may pass (the frames must agree there too): ks > ke,
    # ks < 0, ke > N, a span inside the last partial tile
    op["ks"][10:14] = [900, -5, 1500, 2050]
    op["ke"][10:14] = [400, 700, N + 90, 2099]
    tau = rs.uniform(-1.0, 1.0, size=Qn).astype(np.float32)
    kj = rs.randint(0, N, size=Qn).astype(np.int32) if tie else None
    zrow = np.where(op["om"] > 0, np.float32(0.01), np.float32(-1.0)) if tie else None
    ref = _launch(op, tau, 1e-7, tie, kj, zrow, nrow)
    for _ in range(3):
        got = _launch(op, tau, 1e-7, tie, kj, zrow, nrow, ring=True)
        for a, b in zip(ref, got, strict=True):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("r", R)
@needs_sm90a
@gpu
def test_wgt_ring_ids_equal_dense(monkeypatch, r):
    """The ring build through the pipeline (screen.WGT_RING): ids == the dense route's on two
    regimes, tie-aware rule on and off."""
    monkeypatch.setattr(screen, "WGT_RING", True)
    for regime in ("calibrated", "ties"):
        wl, a = _args(regime, 64, Qn=700, seed=13)
        dense = dosa_cupy.dense_topk(*a)
        for kw in ({"tie_reject": True}, {"tie_reject": False}):
            ids = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, **kw)
            assert cp.array_equal(ids, dense), (regime, r, kw)


# ---------------------------------------------------------------------------------------
# The FP8 build (screen.WGT_FP8; csrc/screen_wgt.cu "The FP8 build"): e4m3 operands, fresh
# k32 steps, plans that carry those dots' error model (plan.build_plans(screen="fp8_fresh")).

FP8_ROWS = [32, 16, 8]  # its builds


def _fp8_u_hat(op, nrow):
    """float32 [Qn, N]: Û of the FP8 build as the kernel computes it — the fresh-step dots of
    its list rows (``dosa_ref.mma_model.fresh_dots``, bit for bit the e4m3 wgmma's, k order),
    then screen_wgt.cu u_hat's order in fp32: RQ = 8 a product and five fmaf over rows 0..5,
    then fmaf(−σ, [y_7 + y_15]_+, ·); RQ = 16 and 32 chains of four over the retained list
    rows (RQ − 2 of them, the aux rows RQ − 9 and RQ − 1 left out), the aux fmaf on the last
    chain, then the pairwise tree (c_0 + c_1) + (c_2 + c_3), …"""
    from dosa_ref.mma_model import fma_f32, fresh_dots

    f32 = np.float32
    plan_rows = [0, 1, 2, 3, 4, 5, 7, 15] if nrow == 8 else list(range(nrow))
    aux = 6 if nrow == 8 else nrow - 9  # list position of the first aux row (its weight −σ)
    aux2 = 7 if nrow == 8 else nrow - 1

    def relu(v):
        return np.maximum(v, f32(0))

    Qn, N = op["om"].shape[0], op["kp"].shape[0]
    out = np.empty((Qn, N), np.float32)
    for t in range(Qn):
        y = fresh_dots(op["rows"][t, plan_rows], op["kp"])  # float32 [N, nrow]
        W = [f32(-op["sig"][t]) if i == aux else f32(0) if i == aux2 else f32(op["om"][t, pr])
             for i, pr in enumerate(plan_rows)]  # fmt: skip
        if nrow == 8:
            a = W[0] * relu(y[:, 0])
            for i in range(1, 6):
                a = fma_f32(W[i], relu(y[:, i]), a)
            out[t] = fma_f32(W[6], relu(y[:, 6] + y[:, 7]), a)
            continue
        rows = [k if k < aux else k + 1 for k in range(nrow - 2)]  # the retained list rows
        c = []
        for p in range(nrow // 4):
            chain = rows[4 * p : 4 * p + 4]
            a = W[chain[0]] * relu(y[:, chain[0]])
            for i in chain[1:]:
                a = fma_f32(W[i], relu(y[:, i]), a)
            c.append(a)
        c[-1] = fma_f32(W[aux], relu(y[:, aux] + y[:, aux2]), c[-1])
        st = 1
        while st < len(c):
            for p in range(0, len(c) - st, 2 * st):
                c[p] = c[p] + c[p + st]
            st *= 2
        out[t] = c[0]
    return out


def _fp8_allowance(op, nrow):
    """float64 [Qn, N]: what the FP8 build's Û may differ from the exact one by — the plan's
    g_scr·A (plan.dot_allowance("fp8_fresh")'s relative part lifted through Û's 2·mts + 6
    roundings) plus the per-row constants plan.screen_row_constants adds to ε_raw."""
    from dosa_cupy.plan import plan_constants, screen_row_constants

    _, A, _, _ = _exact(op)
    mts = op["rows"].shape[1] // 16
    g_scr, _, _ = plan_constants(16 * mts, mts, MMA_BITS, "f16", "fp8_fresh")  # plan.py's
    a = screen_row_constants(op["rows"], op["om"], op["sig"], mts, "fp8_fresh", MMA_BITS, np)
    return g_scr * A + a[:, None]


@pytest.mark.parametrize("nrow", FP8_ROWS)
def test_fp8_screen_model_within_its_allowance(nrow):
    """CPU: the FP8 build's Û as the host model computes it (``_fp8_u_hat``: the e4m3 wgmma's
    fresh steps bit for bit, the kernel's fp32 order) lies within the allowance the plan
    covers (``_fp8_allowance``) of the exact Û — the error model's statement for this
    epilogue on operands with every exponent of e4m3 codes up to 2^4 — and is not the exact
    value everywhere (the model rounds)."""
    rs = np.random.RandomState(40 + nrow)
    op = _operands(rs, 24, 300, R_MAX[nrow])
    uh, _, _, _ = _exact(op)
    got = _fp8_u_hat(op, nrow).astype(np.float64)
    err = np.abs(got - uh)
    assert np.all(err <= _fp8_allowance(op, nrow)), float(np.max(err - _fp8_allowance(op, nrow)))
    assert np.any(err > 0)


def _fp8_kernel_cases(test):
    """The FP8 kernel tests' cases (``_fp8_case``): two seeds, every FP8 row build, the
    default block row and one of 48 queries (several block rows); sm_90a and a GPU."""
    for mark in (gpu, needs_sm90a, pytest.mark.parametrize("seed", [0, 1]),
                 pytest.mark.parametrize("nrow", FP8_ROWS),
                 pytest.mark.parametrize("qg", [screen.WGT_QG, 48])):  # fmt: skip
        test = mark(test)
    return test


@_fp8_kernel_cases
def test_wgt_fp8_kernel_bounds_and_words(seed, nrow, qg):
    """The FP8 build on synthetic operands: Uout exactly on the visible keys; every U^num
    the fp64 guard of the host model's Û (``_fp8_u_hat``, the dots bit for bit) — within the
    guard's upward roundings, so any other dot or Û order shows —, and within the plan's
    FP8 allowance of the exact Û; the survivor words exactly {candidates with U^num ≥ τ};
    repeated launches bit for bit (a race would move them)."""
    op, N, (al, rho, C, er), Uex, tau = _fp8_case(np.random.RandomState(seed), seed, nrow)
    surv, U, _ = _launch(op, tau, 1e-7, False, nrow=nrow, qg=qg, fp8=True)
    vis, cand = _spans(op, N)
    assert np.array_equal(~np.isnan(U), vis), "Uout written exactly on the visible keys"
    model = _fp8_u_hat(op, nrow).astype(np.float64)
    Um = al * (model + rho * C + er) + 1e-7
    # five fp64 operations rounded up against five to nearest (each ≤ 1 ulp of a magnitude
    # ≤ M): far below one fp32 ulp of Û wherever Û is not negligible beside ρC + ε_raw
    M = al * (np.abs(model) + rho * C + er) + 1e-7
    assert np.all((np.abs(U - Um) <= 2.0**-48 * M) | ~vis), "U^num: the model's guard"
    slack = 16 * 2.0**-52 * (np.abs(Uex) + al * (rho * C + _fp8_allowance(op, nrow)) + 1e-7)
    lim = al * _fp8_allowance(op, nrow) + slack
    assert np.all((np.abs(U - Uex - 1e-7) <= lim) | ~vis), "U^num within the FP8 allowance"
    keep = cand & ~(np.nan_to_num(U, nan=-np.inf) < tau[:, None].astype(np.float64))
    assert np.array_equal(surv, _words(keep))
    _assert_repeats(surv, U, lambda: _launch(op, tau, 1e-7, False, nrow=nrow, qg=qg, fp8=True))


@_fp8_kernel_cases
def test_wgt_fp8_guard32_kernel_bit_for_bit(seed, nrow, qg):
    """The FP8 build's fp32 guard (screen.WGT_GUARD32; csrc/screen_wgt.cu "The fp32 guard"):
    U^num on every visible key bit for bit the host model's (``emulate.guard_bound_ru32`` of
    the fresh-step Û, ``_fp8_u_hat``: fp32 operations rounded up, subnormals kept), at least
    the fp64 guard's exact value α(Û + ρC + ε_raw) + ε_out; the survivor words exactly
    {candidates with U^num ≥ τ}, the FP8 build's words wherever the two guards agree on the
    side of τ; repeated launches bit for bit.  Tiny ε_out and τ near zero exercise the
    subnormal range."""
    from dosa_cupy.emulate import guard_bound_ru32

    op, N, (al, rho, C, er), _, tau = _fp8_case(np.random.RandomState(10 + seed), seed, nrow)
    tau[6] = np.float32(2.0**-140)
    eps_out = 2.0**-130
    surv, U, _ = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, g32=True)
    vis, cand = _spans(op, N)
    assert np.array_equal(~np.isnan(U), vis), "Uout written exactly on the visible keys"
    model = _fp8_u_hat(op, nrow)
    want = guard_bound_ru32(model, op["rho"][None], op["alpha"][None], C, er, eps_out)
    assert np.array_equal(U[vis].astype(np.float32).view(np.uint32), want[vis].view(np.uint32))
    # at least the exact α(Û + ρC + ε_raw) + ε_out, up to this float64 evaluation's own
    # roundings (four, each ≤ 2^-53 of a magnitude ≤ M)
    exact = al * (model.astype(np.float64) + rho * C + er) + eps_out
    M = al * (np.abs(model.astype(np.float64)) + rho * C + er) + eps_out
    assert np.all((U - exact >= -(2.0**-50) * M) | ~vis), "U32 ≥ the guard's exact value"
    keep = cand & ~(np.nan_to_num(U, nan=-np.inf) < tau[:, None].astype(np.float64))
    assert np.array_equal(surv, _words(keep))
    ref, U64, _ = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, fp8=True)
    same = ((U >= tau[:, None]) == (U64 >= tau[:, None])) | ~cand
    ref_keep = np.unpackbits(ref.view(np.uint8), axis=1, bitorder="little")[:, :N].astype(bool)
    assert np.array_equal(keep & same, ref_keep & same)
    _assert_repeats(surv, U, lambda: _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, g32=True))


@_fp8_kernel_cases
def test_wgt_fp8_guard32_words_without_uout(seed, nrow, qg):
    """The fp32 guard's kernel as the pipeline launches it, without Uout (a null pointer;
    csrc/screen_wgt.cu "The interleaved epilogue" stores U^num after the keep bits, where
    Uout is given): the survivor words bit for bit those of the launch with Uout, nothing
    written to U.  Tiny ε_out and τ near zero as in the fp32 guard's test."""
    op, N, _, _, tau = _fp8_case(np.random.RandomState(20 + seed), seed, nrow)
    tau[6] = np.float32(2.0**-140)
    eps_out = 2.0**-130
    ref = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, g32=True)
    bare, Unull, _ = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, g32=True, uout=False)
    assert np.array_equal(bare, ref[0]) and np.all(np.isnan(Unull)), "no Uout"


@_fp8_kernel_cases
def test_wgt_fp8_pipe_kernel_equals_g32(seed, nrow, qg):
    """The pipelined halves (screen.WGT_PIPE; csrc/screen_wgt.cu "The pipelined halves"):
    U^num and the survivor words bit for bit the fp32 guard's kernel's, with Uout and without
    it; repeated launches bit for bit (a race between a half's adds and the other half's step
    would move them)."""
    op, N, _, _, tau = _fp8_case(np.random.RandomState(30 + seed), seed, nrow)
    tau[6] = np.float32(2.0**-140)
    eps_out = 2.0**-130
    ref = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, g32=True)
    surv, U, _ = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, pipe=True)
    assert np.array_equal(surv, ref[0]), "survivor words"
    assert np.array_equal(U.view(np.uint8), ref[1].view(np.uint8)), "U^num"
    bare, Unull, _ = _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, pipe=True, uout=False)
    assert np.array_equal(bare, ref[0]) and np.all(np.isnan(Unull)), "no Uout"
    _assert_repeats(surv, U, lambda: _launch(op, tau, eps_out, False, nrow=nrow, qg=qg, pipe=True))


def _fp8_case(rs, seed, nrow):
    """Synthetic operands of the FP8 build's kernel tests (203 queries, 1000 + 37·seed keys,
    the build's retained heads): (op, N, (α, ρ, C, ε_raw) broadcast as float64 rows and
    columns, the exact α(Û + ρC + ε_raw), τ float32 [Qn] at its 0.6 quantile per query,
    query 5's τ = −inf)."""
    Qn, N = 203, 1000 + 37 * seed
    op = _operands(rs, Qn, N, R_MAX[nrow])
    uh, _, _, _ = _exact(op)
    al, rho = op["alpha"].astype(np.float64)[None], op["rho"].astype(np.float64)[None]
    C, er = op["C"][:, None], op["er"][:, None]
    Uex = al * (uh + rho * C + er)
    tau = np.quantile(Uex, 0.6, axis=1).astype(np.float32)
    tau[5] = -np.inf
    return op, N, (al, rho, C, er), Uex, tau


def _assert_repeats(surv, U, launch):
    """Two more ``launch()``es give the words and U^num bit for bit (a race would move them)."""
    for _ in range(2):
        again = launch()
        assert np.array_equal(surv, again[0]) and np.array_equal(
            U.view(np.uint8), again[1].view(np.uint8)
        )


@pytest.mark.parametrize("r", [6, 14, 30])
@needs_sm90a
@gpu
@pytest.mark.parametrize(
    "g32,pipe", [(True, False), (True, True), (False, False)], ids=["g32", "g32p", "f64"]
)
def test_wgt_fp8_guard32_ids_equal_dense(monkeypatch, r, g32, pipe):
    """Either guard of the FP8 build through the pipeline (screen.WGT_GUARD32, the fp32 one
    by default; ``g32p``: with its pipelined halves, screen.WGT_PIPE, the default): ids ==
    the dense route's on the calibrated and h64 regimes, and the kernel of that build ran."""
    monkeypatch.setattr(screen, "WGT_GUARD32", g32)
    monkeypatch.setattr(screen, "WGT_PIPE", pipe)
    names = []
    real = screen.kernel
    monkeypatch.setattr(screen, "kernel", lambda n, *a, **k: names.append(n) or real(n, *a, **k))
    for regime in ("calibrated", "h64"):
        wl, a = _args(regime, 64, Qn=700, seed=17)
        ids = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, tie_reject=False,
                                  scorer="fp8")  # fmt: skip
        assert cp.array_equal(ids, dosa_cupy.dense_topk(*a, scorer="fp8")), (regime, r)
    ring = [n for n in names if "_fp8_ring_" in n]
    end = "_g32p" if pipe else "_g32" if g32 else ""
    assert ring and all(re.fullmatch(rf"screen_wgt_fp8_ring_rows\d+{end}", n) for n in ring), names


@pytest.mark.parametrize("fp8", [False, True], ids=["f16", "fp8"])
@needs_sm90a
@gpu
def test_wgt_ring_barrier_control(fp8):
    """The ring kernels' slot protocol (the last reader's acq_rel count, then its refill)
    against the control that refills after a block barrier: the same words and Uout bit for
    bit over many refills (a block row of 384 queries in 24 groups through 3 slots).  Run
    under racecheck (docs/records/gpu_tests.md): a hazard the control also shows is not the
    count's; one only the ring kernel shows is."""
    rs = np.random.RandomState(7)
    Qn, N = 384, 1500
    op = _operands(rs, Qn, N, R_MAX[8])
    uh, _, _, _ = _exact(op)
    Uex = op["alpha"].astype(np.float64)[None] * uh
    tau = np.quantile(Uex, 0.5, axis=1).astype(np.float32)
    ring = _launch(op, tau, 1e-7, False, nrow=8, ring=True, fp8=fp8)
    ctl = _launch(op, tau, 1e-7, False, nrow=8, ring=True, fp8=fp8, barrier=True)
    assert np.array_equal(ring[0], ctl[0]), "survivor words"
    assert np.array_equal(ring[1].view(np.uint8), ctl[1].view(np.uint8)), "Uout"


@pytest.mark.parametrize("r", R)
@pytest.mark.parametrize("scorer", ["fp8", "f16"])
@needs_sm90a
@gpu
def test_wgt_fp8_ids_equal_dense(monkeypatch, r, scorer):
    """The FP8 build through the pipeline (screen.WGT_FP8): ids == the dense route's on every
    regime of the wgt tests, tie-aware rule on (its chunks at τ = 0 take the f16 kernels) and
    off, a small record buffer (the overflow extension); the FP8 kernels ran (the launches'
    names); with debug_bounds every U^num ≥ the canonical score, and fewer or as many
    survivors as the f16 build's on calibrated."""
    monkeypatch.setattr(screen, "WGT_FP8", True)
    names, of = [], screen.ScreenLaunch.of

    def spy(cls, *a, **k):
        launch = of(*a, **k)
        names.append(launch.name)
        return launch

    monkeypatch.setattr(screen.ScreenLaunch, "of", classmethod(spy))
    for regime in REGIMES:
        wl, a = _args(regime, 64, Qn=700, seed=17)
        dense = dosa_cupy.dense_topk(*a, scorer=scorer)
        for kw in ({"tie_reject": True}, {"tie_reject": False}, {"buffer": 16}):
            ids = dosa_cupy.dosa_topk(*a, route="dosa", screen="wgt", r=r, scorer=scorer, **kw)
            assert cp.array_equal(ids, dense), (regime, r, scorer, kw)
        plain = dict(route="dosa", screen="wgt", r=r, scorer=scorer, tie_reject=False)
        ids, st = dosa_cupy.dosa_topk(*a, debug_bounds=True, return_stats=True, **plain)
        assert cp.array_equal(ids, dense)
        lg = dosa_cupy.dense_logits(*a[:4], a[5], a[6], scorer=scorer)
        bad, slack = guard_violations(lg, cp.asarray(st.bounds))
        assert bad == 0, (regime, r, scorer)
        g = ("_g32p" if screen.WGT_PIPE else "_g32") if screen.WGT_GUARD32 else ""
        assert names[-1] == f"screen_wgt_fp8_ring_rows{screen.wgt_rows(r)}{g}", names[-1]
        if regime == "calibrated":
            monkeypatch.setattr(screen, "WGT_FP8", False)
            _, st16 = dosa_cupy.dosa_topk(*a, return_stats=True, **plain)
            monkeypatch.setattr(screen, "WGT_FP8", True)
            n8, n16 = int(np.sum(st.survivors)), int(np.sum(st16.survivors))
            print(f"\n[wgt fp8] calibrated r={r} {scorer}: survivors {n8} (f16 build {n16})")
            assert n8 <= n16 * 1.02  # the emulated table: fewer (docs/error_model.md)
