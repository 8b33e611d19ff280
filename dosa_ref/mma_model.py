"""Bit-level models of a tensor-core MMA step's sum (docs/numerics.md "The e4m3 wgmma
accumulator"): candidates that the H200 probe (``dosa_cupy.bench.fp8_probe``) accepts or
rejects by comparing every bit of the hardware's results on crafted operands.  The error
model the certificate uses (``numeric.Arithmetic``: a window of W kept bits per step) is the
worst case of the accepted model; this module only reproduces values.

One step adds k exact products ``p_t`` (e4m3 × e4m3 is exact in float64) to an fp32
accumulator c.  A ``StepModel``: align the terms to the leading exponent E of the largest
(``align="value"``: E = ⌊log2 max|term|⌋; ``align="exponent"``: E from the operands'
exponent fields, ea + eb for a product, whose leading bit may lie one above), keep each
term's bits down to 2^(E − W) (``rounding``: "trunc" toward zero, "floor" toward −∞, "rn" to
nearest even), add the kept parts exactly, truncate the sum toward zero to ``result_bits``
significant bits (None: no such step) and write it back to fp32 (``final``: "rn" or
"trunc").  ``c_window``: c takes part in the alignment (True) or the products are summed in
the window first and c added in fp32 after (False).
``group``: the k products enter in consecutive groups of ``group`` (one aligned sum each,
written back before the next), in k order.

Every computation is exact in float64: a kept term is a multiple of 2^(E − W) below
2^(E + 2), so a sum of at most 33 of them has fewer than W + 8 ≤ 53 significant bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fp8 import e4m3_bits, e4m3_values

__all__ = [
    "WGMMA_E4M3", "StepModel", "chain", "chained_dots", "deepgemm_scores", "e4m3_exponent",
    "f32_trunc", "fma_f32", "fp8_chained_scores", "fp8_fresh_scores", "fresh_dots", "step",
    "window_rows",
]  # fmt: skip

_ROUNDINGS = ("trunc", "floor", "rn")


@dataclass(frozen=True)
class StepModel:
    """A candidate model of one MMA step (module doc); ``kept_bits`` is W."""

    kept_bits: int
    rounding: str = "trunc"
    align: str = "value"
    c_window: bool = True
    group: int = 32
    final: str = "rn"
    result_bits: int | None = None

    def __post_init__(self):
        if not (1 <= int(self.kept_bits) <= 44):
            raise ValueError(f"kept_bits: expected 1..44, got {self.kept_bits!r}")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"rounding: expected one of {_ROUNDINGS}, got {self.rounding!r}")
        if self.align not in ("value", "exponent"):
            raise ValueError(f"align: expected 'value' or 'exponent', got {self.align!r}")
        if self.final not in ("rn", "trunc"):
            raise ValueError(f"final: expected 'rn' or 'trunc', got {self.final!r}")
        if self.result_bits is not None and not (1 <= int(self.result_bits) <= 24):
            raise ValueError(f"result_bits: expected None or 1..24, got {self.result_bits!r}")
        if self.group not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"group: expected a power of two up to 32, got {self.group!r}")


# The model the H200 probe accepts for wgmma.m64nNk32.f32.e4m3.e4m3, bit for bit on every
# crafted case (docs/numerics.md "The e4m3 wgmma accumulator").
WGMMA_E4M3 = StepModel(13, rounding="trunc", align="exponent", c_window=True, group=32,
                       final="rn", result_bits=14)  # fmt: skip


def e4m3_exponent(codes: np.ndarray) -> np.ndarray:
    """int64 exponent e of e4m3 codes (value = m·2^e, m ∈ [1, 2) for normals; the
    subnormals and zero get the smallest normal exponent −6)."""
    f = (np.asarray(codes, dtype=np.int64) >> 3) & 0xF
    return np.maximum(f, 1) - 7


def f32_trunc(x: np.ndarray) -> np.ndarray:
    """float64 values rounded toward zero to fp32 (as float64)."""
    x = np.asarray(x, dtype=np.float64)
    y = x.astype(np.float32).astype(np.float64)
    over = np.abs(y) > np.abs(x)
    y[over] = np.nextafter(y[over].astype(np.float32), np.float32(0)).astype(np.float64)
    return y


def _floor_log2(m: np.ndarray) -> np.ndarray:
    e = np.frexp(m)[1].astype(np.int64) - 1  # m = f·2^(e+1), f ∈ [0.5, 1)
    return np.where(m > 0, e, np.iinfo(np.int64).min // 4)


def _keep(t: np.ndarray, q: np.ndarray, rounding: str) -> np.ndarray:
    x = t / q  # exact: q is a power of two and t a float64 far from the range's ends
    if rounding == "trunc":
        x = np.trunc(x)
    elif rounding == "floor":
        x = np.floor(x)
    else:
        x = np.rint(x)
    return x * q


def _to_f32(s: np.ndarray, final: str, bits: int | None = None) -> np.ndarray:
    if bits is not None:  # toward zero to ``bits`` significant bits of the sum itself
        e = _floor_log2(np.abs(s))
        q = np.ldexp(1.0, np.clip(e - (bits - 1), -1070, 1000))
        s = np.where(s != 0, np.trunc(s / q) * q, s)
    return s.astype(np.float32).astype(np.float64) if final == "rn" else f32_trunc(s)


def step(model: StepModel, c, p, pe=None) -> np.ndarray:
    """One MMA step of ``model``: c float64 [...] (fp32 values), p float64 [..., k] exact
    products, pe int64 [..., k] their operands' exponent sums ea + eb (``align="exponent"``
    only).  Returns the fp32 results as float64 [...]."""
    c = np.asarray(c, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    k = p.shape[-1]
    if model.align == "exponent" and pe is None:
        raise ValueError("pe: the products' exponents are needed with align='exponent'")
    for a in range(0, k, model.group):
        sl = slice(a, min(k, a + model.group))
        c = _group(model, c, p[..., sl], None if pe is None else pe[..., sl])
    return c


def _group(model: StepModel, c, p, pe):
    W = int(model.kept_bits)
    terms = np.concatenate([c[..., None], p], axis=-1) if model.c_window else p
    if model.align == "value":
        E = _floor_log2(np.max(np.abs(terms), axis=-1))
    else:
        pz = np.where(p != 0, pe, np.iinfo(np.int64).min // 4)
        E = np.max(pz, axis=-1)
        if model.c_window:
            E = np.maximum(E, _floor_log2(np.abs(c)))
    q = np.ldexp(1.0, np.clip(E - W, -1070, 1000))[..., None]
    s = _keep(terms, q, model.rounding).sum(axis=-1)
    if model.c_window:
        return _to_f32(s, model.final, model.result_bits)
    t = _to_f32(s, model.final, model.result_bits).astype(np.float32) + c.astype(np.float32)
    return t.astype(np.float64)


def chain(model: StepModel, c0, a, b, order, steps, a_codes=None, b_codes=None) -> np.ndarray:
    """The accumulators after chained k32 steps, as ``fp8_wgmma_probe`` computes them
    (csrc/fp8_probe.cu): c0 float64 [n, M, N], a [n, M, 128] and b [n, N, 128] the operand
    values (float64), order int [n, 4], steps int [n]; a_codes / b_codes the e4m3 codes
    (``align="exponent"`` only).  Returns float64 [n, M, N]."""
    c = np.array(c0, dtype=np.float64)
    ea = eb = None
    if model.align == "exponent":
        ea, eb = e4m3_exponent(a_codes), e4m3_exponent(b_codes)
    for s in range(4):
        live = np.asarray(steps) > s
        if not live.any():
            break
        idx = np.nonzero(live)[0]
        ks = (32 * np.asarray(order)[idx, s])[:, None] + np.arange(32)[None, :]  # [m, 32]
        ai = np.take_along_axis(a[idx], ks[:, None, :], axis=2)  # [m, M, 32]
        bi = np.take_along_axis(b[idx], ks[:, None, :], axis=2)  # [m, N, 32]
        p = ai[:, :, None, :] * bi[:, None, :, :]  # [m, M, N, 32], exact
        pe = None
        if ea is not None:
            eai = np.take_along_axis(ea[idx], ks[:, None, :], axis=2)
            ebi = np.take_along_axis(eb[idx], ks[:, None, :], axis=2)
            pe = eai[:, :, None, :] + ebi[:, None, :, :]
        c[idx] = step(model, c[idx], p, pe)
    return c


def fma_f32(a, b, c) -> np.ndarray:
    """fp32 fused multiply-add ``fmaf(a, b, c)`` (one rounding to nearest even) of float32
    arrays, as float32.  a·b is exact in float64; TwoSum gives a·b + c = s + e exactly, and
    rounding s to fp32 is the correct rounding of s + e except where s is an fp32 midpoint,
    which e then decides."""
    a, b, c = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (a, b, c))
    ab = a * b
    s = ab + c
    bb = s - ab
    e = (ab - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    lo = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    hi = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    rd = r.astype(np.float64)
    mid_lo, mid_hi = s == (rd + lo) / 2, s == (rd + hi) / 2
    # s on a midpoint and rounded to r: the exact value lies on r's side unless e points away
    out = np.where(mid_lo & (e < 0), lo, np.where(mid_hi & (e > 0), hi, rd))
    return out.astype(np.float32)


def _step_dots(q_codes, k_codes, fresh: bool) -> np.ndarray:
    q = np.asarray(q_codes, dtype=np.uint8)
    k = np.asarray(k_codes, dtype=np.uint8)
    qv, kv = e4m3_values(q), e4m3_values(k)
    qe, ke = e4m3_exponent(q), e4m3_exponent(k)
    x = np.zeros((k.shape[0], q.shape[0]))
    for s in range(4):
        sl = slice(32 * s, 32 * s + 32)
        p = kv[:, None, sl] * qv[None, :, sl]  # [n, H, 32], exact
        pe = ke[:, None, sl] + qe[None, :, sl]
        if fresh:
            xs = step(WGMMA_E4M3, np.zeros(p.shape[:2]), p, pe).astype(np.float32)
            x = xs if s == 0 else (x.astype(np.float32) + xs).astype(np.float32)
        else:
            x = step(WGMMA_E4M3, x, p, pe)
    return np.asarray(x, dtype=np.float32)


def fresh_dots(q_codes, k_codes) -> np.ndarray:
    """float32 [n, H]: the fresh-step dots of csrc/scorer_fp8.cuh, bit for bit — q_codes
    uint8 [H, 128], k_codes uint8 [n, 128]; each k32 step from a fresh accumulator
    (``WGMMA_E4M3``), the four step results added in fp32 in k order."""
    return _step_dots(q_codes, k_codes, fresh=True)


def chained_dots(q_codes, k_codes) -> np.ndarray:
    """float32 [n, H]: the four k32 steps chained on the tensor core in k order (step s's
    accumulator is step s − 1's result, which takes part in the window: ``WGMMA_E4M3``'s
    c_window) — the dots of DeepGEMM's ``sm90_fp8_mqa_logits`` and of dense_fp8.cu's chained
    timing build."""
    return _step_dots(q_codes, k_codes, fresh=False)


def _project_tree(x, w, alpha) -> np.ndarray:
    """The project's head sum of dots x float32 [n, H] (scorer_fp8.cuh head_sums): per lane c
    of a quad two fmaf chains over columns 8j + 2c + e (the even column groups j of the
    query's columns and the odd ones, each in j order, e = 0, 1 inner), added even + odd,
    the quad's butterfly (lane ^ 1, then ^ 2), then one multiply by α."""
    H = x.shape[1]
    x = np.maximum(x, np.float32(0))
    w = np.asarray(w, dtype=np.float32)
    cols = 8 * np.arange(H // 8)  # a query's column groups
    part = []
    for c in range(4):
        chains = []
        for parity in (0, 1):
            acc = np.zeros(x.shape[0], dtype=np.float32)
            for j in cols[parity::2]:
                for e in (0, 1):
                    h = j + 2 * c + e
                    acc = fma_f32(np.full_like(acc, w[h]), x[:, h], acc)
            chains.append(acc)
        part.append((chains[0] + chains[1]).astype(np.float32))
    p01 = [(part[c] + part[c ^ 1]).astype(np.float32) for c in range(4)]
    tot = (p01[0] + p01[2]).astype(np.float32)
    return (tot * np.asarray(alpha, dtype=np.float32)).astype(np.float32)


def fp8_fresh_scores(q_codes, w, k_codes, alpha) -> np.ndarray:
    """The scores of csrc/dense_fp8.cu's fresh builds and csrc/score_fp8.cu, bit for bit:
    q_codes uint8 [H, 128] (H = 64 or 32 heads of one query), w float32 [H], k_codes uint8
    [n, 128], alpha float32 [n] → float32 [n]: ``fresh_dots``, then the project's head sum
    (``_project_tree``)."""
    return _project_tree(fresh_dots(q_codes, k_codes), w, alpha)


def fp8_chained_scores(q_codes, w, k_codes, alpha) -> np.ndarray:
    """The scores of dense_fp8.cu's chained timing build, bit for bit (as
    ``fp8_fresh_scores``, with ``chained_dots``)."""
    return _project_tree(chained_dots(q_codes, k_codes), w, alpha)


def deepgemm_scores(q_codes, w, k_codes, alpha, fused: bool = True) -> np.ndarray:
    """A model of DeepGEMM's fp8 indexer logits (``sm90_fp8_mqa_logits``, read at 54e2261):
    ``chained_dots``, then per lane c of a quad and per column parity e one chain over the
    query's column groups j in order of ``[x]_+ · w`` terms t_j, × α before the quad's
    butterfly (lane ^ 1, then ^ 2).  ``fused`` (what nvcc emits for ``sum = t_0; sum += t_j``):
    the first add contracts the *first* product, fmaf(x_0, w_0, round(t_1)), each later one
    fmaf(x_j, w_j, sum); else rounded products and rounded adds.  Same inputs and result as
    ``fp8_fresh_scores``; the fused form equals DeepGEMM's output bit for bit on the H200
    (tests/data/deepgemm_logits_54e2261.npz, docs/error_model.md "DeepGEMM's logits, bit for
    bit")."""
    x = np.maximum(chained_dots(q_codes, k_codes), np.float32(0))
    H = x.shape[1]
    w = np.asarray(w, dtype=np.float32)
    a = np.asarray(alpha, dtype=np.float32)

    def term(h):
        return (x[:, h] * w[h]).astype(np.float32)

    def fma_w(h, acc):
        return fma_f32(x[:, h], np.full_like(acc, w[h]), acc)

    part = []
    for c in range(4):
        sums = []
        for e in (0, 1):
            hs = [8 * j + 2 * c + e for j in range(H // 8)]
            if fused:
                acc = fma_w(hs[0], term(hs[1]))
                for h in hs[2:]:
                    acc = fma_w(h, acc)
            else:
                acc = term(hs[0])
                for h in hs[1:]:
                    acc = (acc + term(h)).astype(np.float32)
            sums.append(acc)
        part.append(((sums[0] + sums[1]).astype(np.float32) * a).astype(np.float32))
    p01 = [(part[c] + part[c ^ 1]).astype(np.float32) for c in range(4)]
    return (p01[0] + p01[2]).astype(np.float32)


def window_rows(rng, n: int) -> np.ndarray:
    """e4m3 codes [n, 128] crafted for the window's worst case: per 32-dim step one value
    ±448 and 31 small ones 2^-6 … 2^0 (random significands and signs), i.e. products 8–14
    binades below the step's largest, just below and above the 13-bit window."""
    v = np.ldexp(rng.choice([-1.0, 1.0], (n, 128)) * (1 + rng.integers(0, 8, (n, 128)) / 8),
                 rng.integers(-6, 1, (n, 128)))  # fmt: skip
    v[:, ::32] = 448.0 * rng.choice([-1.0, 1.0], (n, 4))
    return e4m3_bits(v.astype(np.float32))
