"""Host-side mirrors of the device conventions (no GPU needed): e4m3 decoding, the monotone
score code and record order of the selection kernel (docs/method.md §9), used by tests and by
the planner.  Quantization itself is ``dosa_ref.fp8.quantize_keys`` (the GPU kernel is
tested bit-for-bit against it).
"""

from __future__ import annotations

import numpy as np

from dosa_ref.fp8 import E4M3, e4m3_bits, e4m3_values
from dosa_ref.rounding import f32_add_ru, f32_mul_ru, f32_up

__all__ = [
    "E4M3",
    "e4m3_bits",
    "e4m3_sq_units",
    "decode_key_rho",
    "decode_screen_keep",
    "decode_survival",
    "e4m3_values",
    "block_kth_record",
    "guard_bound_ru32",
    "make_records",
    "record_order",
    "record_score",
    "score_code",
    "screen_survival",
    "wide_floor",
]


def e4m3_sq_units(codes) -> np.ndarray:
    """uint64: the square of each e4m3 code's value in units of 2^-18, the host mirror of
    prepare.cu ``e4m3_sq_units`` (a NaN code as the value (8 + 7)·2^5, as the kernels'
    ``e4m3_value`` decodes it; docs/method.md §8 "ρ from integer squares")."""
    b = np.asarray(codes, dtype=np.uint64)
    e, m = (b >> np.uint64(3)) & np.uint64(15), b & np.uint64(7)
    shift = np.where(e > 0, np.uint64(2) * e - np.uint64(2), np.uint64(0))  # 2e − 2, normals
    return np.where(e > 0, (np.uint64(8) + m) ** np.uint64(2) << shift, m * m).astype(np.uint64)


def score_code(s: np.ndarray) -> np.ndarray:
    """Monotone uint32 code of float32 scores (−0 → +0, NaN → 0): mirrors common.cuh."""
    f = np.asarray(s, dtype=np.float32).copy()
    f[f == 0] = 0.0
    b = f.view(np.uint32)
    code = np.where(b & np.uint32(0x80000000), ~b, b | np.uint32(0x80000000)).astype(np.uint32)
    code[np.isnan(f)] = 0
    return code


def guard_bound_ru32(uh, rho, alpha, C, eps_raw, eps_out) -> np.ndarray:
    """float32 U^num of the FP8 screen's fp32 guard (csrc/epilogue.cuh guard_bound_ru32,
    bit for bit): RU(RU(α · RU(RU(Û + RU(ρ · C32)) + er32)) + eo32) in float32, every step
    rounded toward +inf with subnormals kept, C32, er32, eo32 = C, ε_raw, ε_out (float64)
    rounded up to float32.  uh, rho, alpha float32 arrays (broadcast); C, eps_raw float64."""
    c32, er32, eo32 = f32_up(C), f32_up(eps_raw), f32_up(eps_out)
    u = f32_add_ru(f32_add_ru(uh, f32_mul_ru(rho, c32)), er32)
    return f32_add_ru(f32_mul_ru(alpha, u), eo32)


def make_records(scores, ids) -> np.ndarray:
    """uint64 records (code << 32 | ~id) of float32 scores and int ids ≥ 0: the host mirror of
    record.cuh make_record (the larger record is the earlier in (score desc, id asc))."""
    low = ~np.asarray(ids).astype(np.uint32)
    return (score_code(scores).astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)


def record_score(rec: np.ndarray) -> np.ndarray:
    """fp32 score of uint64 records (code << 32 | ~id), −inf for the empty record 0: the
    host mirror of select.cu tau_from_kth (common.cuh code_score)."""
    rec = np.asarray(rec, dtype=np.uint64)
    c = (rec >> np.uint64(32)).astype(np.uint32)
    b = np.where(c & np.uint32(0x80000000), c & np.uint32(0x7FFFFFFF), ~c).astype(np.uint32)
    return np.where(rec == 0, np.float32(-np.inf), b.view(np.float32))


def wide_floor(kept: np.ndarray, K: int) -> float:
    """The captured floor of ``select.FLOOR_WIDE`` on one overflowed row's kept records
    (uint64, the whole buffer): the lower edge of the K-th largest record's 22-bit score-code
    bucket as a score — the host mirror of select.cu floor_wide_hist, select_wide_cut and
    floor_of_cut; −inf where at most K records were kept (the cut takes such a row whole) or
    where the edge lies below every finite score's code."""
    c = np.sort(np.asarray(kept, dtype=np.uint64) >> np.uint64(32))[::-1]
    if c.size <= K:
        return float("-inf")
    f = record_score(np.array([(int(c[K - 1]) & 0xFFFFFC00) << 32], dtype=np.uint64))[0]
    return float("-inf") if np.isnan(f) else float(f)


KTH_WIDTHS = (11, 11, 10, 11, 11, 10)  # select_block.cuh: the digits, from the top


def block_kth_record(rec, k: int) -> tuple[int, int]:
    """The k-th largest (1 ≤ k ≤ len) of uint64 records by select_block.cuh's procedure, step
    for step: digits of KTH_WIDTHS from the top, each pass counting the next digit of the
    records that share the bits found so far, the digit of rank k taken and k lowered by the
    count above it, and a last pass fetching the one record left with the found bits where a
    digit's bin holds one.  Returns (the record, the passes over ``rec`` it read) — the record
    equals ``np.sort(rec)[-k]`` (tests/test_decode_witness_kth.py holds it to that)."""
    rec = np.asarray(rec, dtype=np.uint64).ravel()
    if not 1 <= k <= rec.size:
        raise ValueError(f"k: expected 1 <= k <= {rec.size}, got {k}")
    prefix, fixed, passes = 0, 0, 0
    for w in KTH_WIDTHS:
        shift = 64 - fixed - w
        top = rec >> np.uint64(64 - fixed) if fixed else np.zeros_like(rec)
        sel = rec[top == np.uint64(prefix >> (64 - fixed) if fixed else 0)]
        hist = np.bincount(((sel >> np.uint64(shift)) & np.uint64((1 << w) - 1)).astype(np.int64),
                           minlength=1 << w)  # fmt: skip
        passes += 1
        above = np.concatenate([np.cumsum(hist[::-1])[::-1][1:], [0]])  # #(digit > b)
        b = int(np.flatnonzero((above < k) & (k <= above + hist))[-1])
        prefix |= b << shift
        fixed += w
        k -= int(above[b])
        if fixed == 64:
            return prefix, passes
        if hist[b] == 1:
            passes += 1
            return int(rec[(rec >> np.uint64(shift)) == np.uint64(prefix >> shift)][0]), passes
    raise AssertionError("not reached: the sixth digit fixes all 64 bits")


def record_order(scores: np.ndarray, ids: np.ndarray, K: int) -> np.ndarray:
    """The first K ids under (score desc, id asc) by the device's code order."""
    code = score_code(scores).astype(np.int64)
    order = np.lexsort((ids, -code))
    return ids[order[:K]]


def _padded_heads(q, w):
    """(q uint8 [Qn, Hp, D], w fp32 [Qn, Hp]) with the heads padded by zeros to Hp = a multiple
    of 16, as the kernels take them (exact +0 terms)."""
    q = np.asarray(q, dtype=np.uint8)
    w = np.asarray(w, dtype=np.float32)
    Qn, H, D = q.shape
    Hp = -(-H // 16) * 16
    if Hp != H:
        q = np.concatenate([q, np.zeros((Qn, Hp - H, D), np.uint8)], axis=1)
        w = np.concatenate([w, np.zeros((Qn, Hp - H), np.float32)], axis=1)
    return q, w


def _u_num(pl, kv, alpha, rho, mts: int) -> np.ndarray:
    """float64 [Qn, n]: U^num = α(Û + ρC + ε_raw) + ε_out of the plans ``pl`` (``plan.
    build_plans``, mts row tiles) for keys of e4m3 values kv float64 [n, 128], scales alpha
    and RMS summaries rho float64 [n]; Û in float64 (docs/method.md §8)."""
    X = np.einsum("tjd,nd->tjn", e4m3_values(pl.rows), kv)
    last = 16 * (mts - 1)
    aux = X[:, last + 7] + X[:, last + 15]
    Uh = np.einsum("tj,tjn->tn", pl.omega.astype(np.float64), np.maximum(X, 0))
    Uh -= pl.sigma.astype(np.float64)[:, None] * np.maximum(aux, 0)
    return alpha[None] * (Uh + rho[None] * pl.C[:, None] + pl.eps_raw[:, None]) + pl.eps_out


def screen_survival(q, w, k_payload, k_scale, K, ks, ke, *, r=14, mma_bits=17, window=2048,
                    sinks=16, n_anchors=4, p_sample=256, scorer="f16", screen="f16",
                    tau_floor=None, anchor_segments=1, rows=None):  # fmt: skip
    """CPU emulation of the GPU screen (docs/method.md §2, §8) for small problems.

    Same seeds (sinks + local window + anchor pool), τ, batched plan (``plan.build_plans``
    with numpy, the specification of the pipeline's fused planner) and U^num =
    α(Û + ρC + ε_raw) + ε_out as the GPU pipeline; Û and the scores are evaluated in
    float64 from the e4m3 values instead of the tensor cores, so this predicts survival
    (not bits); ``scorer`` and ``screen`` name the canonical scorer's and the screen's
    arithmetic whose allowances the bound carries (``plan.build_plans``); ``tau_floor``
    (float [Qn]) raises τ where it is above, as ``dosa_topk(tau_floor=)``;
    ``anchor_segments`` S: the pool holds each anchor's Top-K within each of S segments of
    the keys (``dosa_ref.seeds.anchor_segments_of``; S = 1: its Top-K); ``rows`` (int [n]): the
    queries screened (default all; the anchors are the chunk's whatever rows are screened,
    and τ, the plan and the survival are those of ``rows``, tau_floor [n]).  Returns
    dict(survival, survivors, screened, violations, tau, seed_top): violations
    counts visible (query, key) with float64 score > U^num (must be 0); seed_top float64
    [n, K] each query's K largest seed scores (−inf padding; its last column is τ).
    Arrays: q uint8 [Qn, H, 128], w fp32 [Qn, H], k_payload uint8 [N, 128], k_scale fp32 [N].
    """
    from dosa_ref.fp8 import key_rms
    from dosa_ref.seeds import anchor_segments_of

    from .plan import build_plans, row_tiles

    q, w = _padded_heads(q, w)
    Qn = q.shape[0]
    kp = np.asarray(k_payload, dtype=np.uint8)
    N = kp.shape[0]
    alpha = np.asarray(k_scale, dtype=np.float64)
    ks, ke = np.asarray(ks, dtype=np.int64), np.asarray(ke, dtype=np.int64)
    kv = e4m3_values(kp)

    def scores(t):  # float64 [len(t), N] of the queries t, −inf where not visible
        qv = e4m3_values(q[t])
        s = np.einsum("th,thn->tn", w[t].astype(np.float64), np.maximum(qv @ kv.T, 0)) * alpha
        ids = np.arange(N)
        return s, (ids[None] >= ks[t][:, None]) & (ids[None] < ke[t][:, None])

    na = min(n_anchors, Qn)
    anchors = np.unique(np.linspace(0, Qn - 1, na).round().astype(np.int64)) if na else []
    cuts = anchor_segments_of(N, anchor_segments)
    pool = []
    if len(anchors):
        sa, va = scores(anchors)
        sa = np.where(va, sa, -np.inf)
        pool = [a + np.argsort(-sa[i, a:b], kind="stable")[: min(K, int(va[i, a:b].sum()))]
                for i in range(len(anchors))
                for a, b in zip(cuts[:-1], cuts[1:], strict=True)]  # fmt: skip
    pool = np.unique(np.concatenate(pool)) if len(pool) else np.zeros(0, np.int64)
    rows = np.arange(Qn) if rows is None else np.asarray(rows, dtype=np.int64)
    q, w, ks, ke = q[rows], w[rows], ks[rows], ke[rows]
    Qn = rows.size
    s, vis = scores(np.arange(Qn))
    sm = np.where(vis, s, -np.inf)
    seed = np.zeros((Qn, N), dtype=bool)
    seed[:, pool] = True
    for t in range(Qn):
        seed[t, ks[t] : min(ke[t], ks[t] + sinks)] = True
        seed[t, max(ks[t], ke[t] - window) : ke[t]] = True
    seed &= vis
    top = np.full((Qn, K), -np.inf)  # each query's K largest seed scores, descending
    for t in range(Qn):
        v = np.sort(sm[t][seed[t]])[::-1][:K]
        top[t, : v.size] = v
    tau = top[:, K - 1]
    if tau_floor is not None:
        tau = np.maximum(tau, np.asarray(tau_floor, dtype=np.float64))
    mts = row_tiles(r)
    ns = min(p_sample, pool.size)
    sample = pool[np.linspace(0, pool.size - 1, ns).astype(np.int64)] if ns else None
    pl = build_plans(q, w, kp, sample, r, mts, mma_bits, xp=np, scorer=scorer, screen=screen)
    U = _u_num(pl, kv, alpha, key_rms(kp).astype(np.float64), mts)
    screened = vis & ~seed
    surv = screened & ~(U < tau[:, None])
    return dict(
        survival=float(surv.sum() / max(1, screened.sum())),
        survivors=int(surv.sum()),
        screened=int(screened.sum()),
        violations=int(((s > U) & vis).sum()),
        tau=tau,
        seed_top=top,
    )


def decode_survival(q, w, k_payload, k_scale, ke, tau, *, r=14, p_sample=1024, scorer="fp8_fresh",
                    screen="fp8_fresh") -> dict:  # fmt: skip
    """CPU emulation of a certificate screen in decode (docs/method.md §10 "The certificate
    in decode") for the rows of one request: each row's plan (``plan.build_plans`` with
    numpy, r retained heads, activation frequencies from ``p_sample`` keys evenly spaced
    over the request's visible keys; ``scorer`` / ``screen`` the arithmetic whose
    allowances the bound carries, as in ``screen_survival``) and U^num = α(Û + ρC + ε_raw)
    + ε_out against the row's threshold score; Û and the scores in float64 from the e4m3
    values, so this predicts survival (not bits).  q uint8 [n, H, 128], w fp32 [n, H],
    k_payload uint8 [N, 128] and k_scale fp32 [N] the request's keys in logical order, ke
    int [n] the rows' visible ends, tau float [n] their thresholds (−inf: no threshold,
    every visible key survives).  Returns dict(survival float [n] (survivors / visible),
    survivors int [n], visible int [n], violations: visible (row, key) pairs with score >
    U^num, must be 0)."""
    from dosa_ref.fp8 import key_rms

    from .plan import build_plans, row_tiles

    q, w = _padded_heads(q, w)
    n = q.shape[0]
    kp = np.asarray(k_payload, dtype=np.uint8)
    alpha = np.asarray(k_scale, dtype=np.float64)
    ke = np.asarray(ke, dtype=np.int64)
    tau = np.asarray(tau, dtype=np.float64)
    rho = key_rms(kp).astype(np.float64)
    mts = row_tiles(r)
    out = dict(survival=np.zeros(n), survivors=np.zeros(n, np.int64), visible=ke.copy(),
               violations=0)  # fmt: skip
    for j in range(n):
        e = int(ke[j])
        kv = e4m3_values(kp[:e])
        sample = np.linspace(0, e - 1, min(p_sample, e)).astype(np.int64) if e else None
        pl = build_plans(q[j : j + 1], w[j : j + 1], kp[:e], sample, r, mts, xp=np,
                         scorer=scorer, screen=screen)  # fmt: skip
        U = _u_num(pl, kv, alpha[:e], rho[:e], mts)[0]
        s = (w[j].astype(np.float64) @ np.maximum(e4m3_values(q[j]) @ kv.T, 0)) * alpha[:e]
        out["violations"] += int((s > U).sum())
        keep = ~(U < tau[j])
        out["survivors"][j] = int(keep.sum())
        out["survival"][j] = keep.sum() / e if e else 0.0
    return out


def sharded_survival(q, w, k_payload, k_scale, K, ks, ke, starts, **kw) -> list[dict]:
    """``screen_survival`` of each shard [starts[i], starts[i+1]) of the keys (docs/method.md
    §12 "Sharded contexts"): its seeds, τ and screen on its own keys (the context's ranges
    clipped to it), once with its own τ and once with the shards' largest.  Returns one dict
    per non-empty shard: shard, keys, screened, survivors_own, survivors_shared (the shards'
    largest τ), survivors_union (the K-th largest of the union of the shards' seed scores:
    distinct keys of the context, so also a lower bound on its K-th score, and at least the
    largest τ), raised (queries whose τ the largest raised), violations (the three screens;
    must be 0)."""
    from dosa_ref.shards import local_ranges, union_floor

    starts = [int(x) for x in starts]
    parts, own = [], []
    for i, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        if b > a:
            lo, hi = local_ranges(ks, ke, a, b)
            parts.append((i, a, b, lo, hi))
            own.append(screen_survival(q, w, k_payload[a:b], k_scale[a:b], K, lo, hi, **kw))
    floor = np.max([o["tau"] for o in own], axis=0)
    # the K-th of the union of the shards' seed scores (distinct keys): also a lower bound
    union = union_floor([o["seed_top"] for o in own], K)
    out = []
    for (i, a, b, lo, hi), o in zip(parts, own, strict=True):
        args = (q, w, k_payload[a:b], k_scale[a:b], K, lo, hi)
        sh = screen_survival(*args, tau_floor=floor, **kw)
        un = screen_survival(*args, tau_floor=union, **kw)
        out.append(dict(
            shard=i, keys=b - a, screened=o["screened"], survivors_own=o["survivors"],
            survivors_shared=sh["survivors"], survivors_union=un["survivors"],
            raised=int((floor > o["tau"]).sum()),
            violations=o["violations"] + sh["violations"] + un["violations"],
        ))  # fmt: skip
    return out


# key_rho_bound's lift (csrc/score_fp8.cu kRhoLift): RU32(1 / (2·(1 − 2^-11)^7))
RHO_LIFT = np.float32(float.fromhex("0x1.00e072p-1"))


def _f16_fma_sq(t, acc):
    """fma.rn.f16x2 of t·t + acc per f16 lane: t = an e4m3 value · 2^-3 and acc f16 values,
    all multiples of 2^-24 below 2^16, so t² + acc is exact in float64 and rounds once."""
    return (t * t + acc.astype(np.float64)).astype(np.float16)


def f32_sqrt_ru(x) -> np.ndarray:
    """PTX sqrt.rp.f32 (subnormals kept): the least float32 r with r² ≥ x (x float32 ≥ 0;
    NaN stays NaN).  r² of a float32 is exact in float64."""
    from dosa_ref.rounding import f32_up

    x64 = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = f32_up(np.sqrt(x64))
        r = np.where(r.astype(np.float64) ** 2 < x64, np.nextafter(r, np.float32(np.inf)), r)
        lo = np.nextafter(r, np.float32(0))
        r = np.where((lo >= 0) & (lo.astype(np.float64) ** 2 >= x64), lo, r)
    return np.asarray(r, dtype=np.float32)


def decode_key_rho(codes) -> np.ndarray:
    """float32 [n]: ρ of the decode screen (csrc/score_fp8.cu key_rho_bound), bit for bit, of
    keys codes uint8 [n, 128]: per half of the dims (a lane), four f16 chains (word m of each
    16-byte chunk, its two code pairs in turn, the chunks in order) of fma(t, t, acc) with t =
    value · 2^-3, each f16 pair's halves summed in fp32 rounded up, the four sums as ((0 + 1) +
    (2 + 3)), the halves' sums added, times RHO_LIFT and the square root, all rounded up."""
    from dosa_ref.rounding import f32_add_ru, f32_mul_ru

    k = np.asarray(codes, dtype=np.uint8)
    v = e4m3_values(k) / 8.0  # exact
    half_sums = []
    for half in range(2):
        sums = []
        for m in range(4):
            lo = np.zeros(k.shape[0], np.float16)
            hi = np.zeros(k.shape[0], np.float16)
            for i in range(4):
                for p in range(2):
                    d = 64 * half + 16 * i + 4 * m + 2 * p  # the pair's low code
                    lo = _f16_fma_sq(v[:, d], lo)
                    hi = _f16_fma_sq(v[:, d + 1], hi)
            sums.append(f32_add_ru(lo.astype(np.float32), hi.astype(np.float32)))
        half_sums.append(f32_add_ru(f32_add_ru(sums[0], sums[1]), f32_add_ru(sums[2], sums[3])))
    t = f32_add_ru(half_sums[0], half_sums[1])
    return f32_sqrt_ru(f32_mul_ru(t, RHO_LIFT))


def decode_screen_keep(rows, omega, sigma, C, eps_raw, eps_out, valid, thr, kv, alpha, ke):
    """bool [n]: the keys a request's rows keep in the decode screen (csrc/score_fp8.cu
    decode_screen_tma), bit for bit, from its QPT rows' plans — rows uint8 [QPT, RQ, 128], omega
    fp32 [QPT, RQ], sigma fp32 [QPT], C and eps_raw float64 [QPT], eps_out float, valid bool
    [QPT] (``plan.build_plans_fused``'s fields, or ``build_plans``') — their threshold records
    thr uint64 [QPT] and visible ends ke int [QPT], for the request's keys kv uint8 [n, 128]
    (logical order) with scales alpha fp32 [n]: the fresh-step dots (``mma_model.fresh_dots``),
    per lane qd of a quad one fmaf chain over its plan rows 8j + 2qd + e in order, then
    fmaf(−σ or 0, [x_{RQ−9} + x_{RQ−1}]_+, ·) (−σ in lane 3), the quad's sums (c0 + c1) + (c2 +
    c3), ``guard_bound_ru32`` with ``decode_key_rho``, kept unless U < τ (τ = −inf for a
    record 0, a NaN score or an invalid plan) within each row's visible end; a key is kept if
    some row keeps it."""
    from dosa_ref.mma_model import fma_f32, fresh_dots

    rows = np.asarray(rows, np.uint8)
    QPT, RQ = rows.shape[:2]
    kv = np.asarray(kv, np.uint8)
    n = kv.shape[0]
    alpha = np.asarray(alpha, np.float32)
    rho = decode_key_rho(kv)
    ids = np.arange(n)
    keep = np.zeros(n, dtype=bool)
    for u in range(QPT):
        x = fresh_dots(rows[u], kv)  # float32 [n, RQ]
        y = np.maximum(x, np.float32(0))
        om = np.asarray(omega[u], np.float32)
        c = []
        for qd in range(4):
            cols = [8 * j + 2 * qd + e for j in range(RQ // 8) for e in (0, 1)]
            a = (y[:, cols[0]] * om[cols[0]]).astype(np.float32)
            for col in cols[1:]:
                a = fma_f32(np.full(n, om[col], np.float32), y[:, col], a)
            sneg = -np.float32(sigma[u]) if qd == 3 else np.float32(0)
            aux = np.maximum((x[:, 8 * (RQ // 8 - 2) + 2 * qd + 1]
                              + x[:, 8 * (RQ // 8 - 1) + 2 * qd + 1]).astype(np.float32),
                             np.float32(0))  # fmt: skip
            c.append(fma_f32(np.full(n, sneg, np.float32), aux, a))
        c01, c23 = (c[0] + c[1]).astype(np.float32), (c[2] + c[3]).astype(np.float32)
        uh = (c01 + c23).astype(np.float32)
        U = guard_bound_ru32(uh, rho, alpha, C[u], eps_raw[u], eps_out)
        tau = record_score(np.array([thr[u]], np.uint64))[0]
        if not bool(valid[u]) or np.isnan(tau):
            tau = np.float32(-np.inf)
        keep |= (ids < int(ke[u])) & ~(U < tau)
    return keep
