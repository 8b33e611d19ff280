"""The e4m3 wgmma accumulator probe (docs/numerics.md "The e4m3 wgmma accumulator").

``python3 -m dosa_cupy.bench.fp8_probe --out DIR`` (GPU): builds crafted operand cases
(``make_cases``), runs them through ``fp8_wgmma_probe`` (csrc/fp8_probe.cu) and writes
DIR/fp8_probe.npz (the cases and the raw fp32 results).  ``--scan FILE`` (CPU) tests the
accepted step model (``dosa_ref.mma_model.WGMMA_E4M3``) and its neighbours against a saved
run and prints, per model, the results it does not reproduce bit for bit.

The cases are built to expose the worst case, not to be typical (docs/error_model.md):
one large product beside many small ones just below a window of W bits, at every offset;
accumulators far larger and far smaller than the products; signs mixed (truncation toward
zero and toward −∞ differ only there); chained steps in permuted k order; operands swapped
(A·B against (B·A)ᵀ); one row and one column repeated everywhere (position independence).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from dosa_ref.fp8 import e4m3_bits, e4m3_values
from dosa_ref.mma_model import WGMMA_E4M3, StepModel, chain

FINITE = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)


def _pow2_codes(e: np.ndarray, sig: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """e4m3 codes of sign · sig · 2^e (sig ∈ {1, 1.125, …, 1.875}, e ∈ [−6, 8]; exact)."""
    v = np.where(sign < 0, -1.0, 1.0) * sig * np.ldexp(1.0, e)
    return e4m3_bits(v.astype(np.float32))


def _window_rows(rng, n: int, k: int = 128) -> np.ndarray:
    """[n, 64, k] codes: per row and per 32-dim chunk one large value and 1..31 small ones
    1..17 binades below it (random significands and signs), the rest zero."""
    out = np.zeros((n, 64, k), dtype=np.uint8)
    sigs = 1.0 + np.arange(8) / 8.0
    for i in range(n):
        for m in range(64):
            for ch in range(k // 32):
                eb = int(rng.integers(-1, 9))
                ns = int(rng.choice([1, 2, 3, 4, 7, 8, 15, 16, 31]))
                d = (
                    rng.integers(1, 18, size=ns)
                    if rng.random() < 0.5
                    else np.full(ns, rng.integers(1, 18))
                )
                es = np.maximum(eb - d, -6)
                pos = rng.permutation(32)[: ns + 1] + 32 * ch
                big = _pow2_codes(np.array([eb]), rng.choice(sigs, 1), rng.choice([-1, 1], 1))
                small = _pow2_codes(es, rng.choice(sigs, ns), rng.choice([-1, 1], ns))
                out[i, m, pos[0]] = big[0]
                out[i, m, pos[1:]] = small
    return out


def _b_patterns(rng, n: int, k: int = 128) -> np.ndarray:
    """[n, 64, k] codes: column 0 all +1, column 1 all −1, the others random signs times
    2^u (u ∈ [−2, 2]) — each column turns a window row into other crafted sums."""
    u = rng.integers(-2, 3, size=(n, 64, k))
    s = rng.choice([-1, 1], size=(n, 64, k))
    u[:, 0:2] = 0
    s[:, 0] = 1
    s[:, 1] = -1
    return _pow2_codes(u, np.ones((n, 64, k)), s)


def make_cases(seed: int = 0) -> dict:
    """The probe's cases (module doc): a, b uint8 [n, 64, 128], c0 float32 [n, 64, 64],
    order int32 [n, 4], steps int32 [n], family (str [n])."""
    rng = np.random.default_rng(seed)
    fam, A, B, C, O, S = [], [], [], [], [], []
    ident = np.arange(4, dtype=np.int32)

    def add(name, a, b, c0, order, steps):
        n = a.shape[0]
        fam.extend([name] * n)
        A.append(a), B.append(b), C.append(c0.astype(np.float32))
        O.append(np.broadcast_to(order, (n, 4)).astype(np.int32))
        S.append(np.broadcast_to(steps, (n,)).astype(np.int32))

    z = np.zeros((1, 64, 64))
    # every finite code against every finite code
    ua, ub = rng.choice(FINITE, (32, 64, 128)), rng.choice(FINITE, (32, 64, 128))
    add("uniform", ua, ub, np.repeat(z, 32, 0), ident, 4)
    add("swap", ub[:16], ua[:16], np.repeat(z, 16, 0), ident, 4)
    n = 32
    c0 = rng.choice([-1, 1], (n, 64, 64)) * (1 + rng.random((n, 64, 64))) * np.ldexp(
        1.0, rng.integers(-30, 31, (n, 64, 64)))  # fmt: skip
    perms = np.array([rng.permutation(4) for _ in range(n)])
    add("uniform_c", rng.choice(FINITE, (n, 64, 128)), rng.choice(FINITE, (n, 64, 128)), c0,
        perms, rng.integers(1, 5, n))  # fmt: skip
    # quantized gaussians, per-row amax scaling as the serving quantizers do
    g = rng.standard_normal((32, 64, 128))
    g = g / np.abs(g).max(axis=2, keepdims=True) * 448
    gb = rng.standard_normal((32, 64, 128))
    gb = gb / np.abs(gb).max(axis=2, keepdims=True) * 448
    add("gauss", e4m3_bits(g.astype(np.float32)), e4m3_bits(gb.astype(np.float32)),
        np.repeat(z, 32, 0), ident, 4)  # fmt: skip
    # one large product beside many small ones, single steps from 0 and chained steps
    w = _window_rows(rng, 96)
    bp = _b_patterns(rng, 96)
    add("window", w[:48], bp[:48], np.repeat(z, 48, 0), ident, 1)
    perms = np.array([rng.permutation(4) for _ in range(48)])
    add("window_chain", w[48:], bp[48:], np.repeat(z, 48, 0), perms, 4)
    # an accumulator 20 binades above to 20 below the step's largest product
    w2, bp2 = _window_rows(rng, 48), _b_patterns(rng, 48)
    va, vb = e4m3_values(w2), e4m3_values(bp2)
    pmax = np.abs(va[:, :, None, :32] * vb[:, None, :, :32]).max(axis=3)
    e = np.floor(np.log2(np.maximum(pmax, 2.0**-40))) + rng.integers(-20, 21, pmax.shape)
    c0 = (
        rng.choice([-1, 1], pmax.shape)
        * (1 + rng.integers(0, 2**23, pmax.shape) / 2**23)
        * np.ldexp(1.0, e.astype(int))
    )
    add("window_c", w2, bp2, c0, ident, 1)
    # position independence: one row of a and one row of b everywhere
    ra, rb = rng.choice(FINITE, (8, 1, 128)), rng.choice(FINITE, (8, 1, 128))
    add("const", np.repeat(ra, 64, 1), np.repeat(rb, 64, 1), np.repeat(z, 8, 0), ident, 4)
    return dict(a=np.concatenate(A), b=np.concatenate(B), c0=np.concatenate(C),
                order=np.concatenate(O), steps=np.concatenate(S), family=np.array(fam))  # fmt: skip


def run_gpu(cases: dict, columns: int = 64) -> np.ndarray:
    """fp32 [n, 64, 64]: the probe with ``columns`` MMA columns (64: ``fp8_wgmma_probe``;
    32, 16: ``fp8_wgmma_probe_n32`` / ``_n16``, which fill only the first ``columns``
    columns; the rest are NaN) on the cases, one block per case."""
    import cupy as cp

    from dosa_cupy._build import KernelSpec, kernel

    name = "fp8_wgmma_probe" if columns == 64 else f"fp8_wgmma_probe_n{columns}"
    f = kernel(name, 0, KernelSpec("fp8_probe.cu", (), sm90a=True))
    dev = {
        k: cp.asarray(np.ascontiguousarray(cases[k])) for k in ("a", "b", "c0", "order", "steps")
    }
    n = int(cases["a"].shape[0])
    d = cp.full((n, 64, 64), np.nan, dtype=cp.float32)
    f((n,), (128,), (dev["a"], dev["b"], dev["c0"], dev["order"], dev["steps"], d))
    return cp.asnumpy(d)


def tma_check() -> dict:
    """The bulk tensor copy of ``tma_probe`` (csrc/fp8_probe.cu) with the map passed by value
    and from global memory: bytes that differ from the 128-byte-swizzled layout of the rows
    (``sw128_offset``), per way of passing the map."""
    import cupy as cp

    from dosa_cupy._build import KernelSpec, kernel
    from dosa_cupy.tma import tensor_map_2d

    rng = np.random.default_rng(1)
    rows = 256 + 37  # the last box runs past the end: zeros
    keys = rng.integers(0, 256, (rows, 128), dtype=np.uint8)
    kd = cp.asarray(keys)
    tm = tensor_map_2d(kd, 64, 128)
    gmap = cp.asarray(np.frombuffer(tm.tobytes(), dtype=np.uint8))
    nb = -(-rows // 64)
    pad = np.zeros((nb * 64, 128), dtype=np.uint8)
    pad[:rows] = keys
    want = np.zeros((nb, 8192), dtype=np.uint8)
    for i in range(nb):
        for r in range(64):
            for j in range(8):
                o = r * 128 + ((j ^ (r & 7)) << 4)
                want[i, o : o + 16] = pad[64 * i + r, 16 * j : 16 * j + 16]
    f = kernel("tma_probe", 0, KernelSpec("fp8_probe.cu", (), sm90a=True))
    res = {}
    for mode in (0, 1):
        out = cp.zeros((nb, 8192), dtype=cp.uint8)
        f((nb,), (128,), (tm, gmap, np.int32(mode), out))
        res["by_value" if mode == 0 else "global"] = int((cp.asnumpy(out) != want).sum())
    return res


def mismatches(model: StepModel, cases: dict, d: np.ndarray, sel=None, batch: int = 8) -> int:
    """Results of the cases ``sel`` (indices; default all) that ``model`` does not reproduce
    bit for bit (as fp32 bits; −0 and +0 differ)."""
    idx = np.arange(cases["a"].shape[0]) if sel is None else np.asarray(sel)
    va, vb = e4m3_values(cases["a"]), e4m3_values(cases["b"])
    bad = 0
    for i in range(0, idx.size, batch):
        j = idx[i : i + batch]
        m = chain(model, cases["c0"][j], va[j], vb[j], cases["order"][j], cases["steps"][j],
                  cases["a"][j], cases["b"][j]).astype(np.float32)  # fmt: skip
        bad += int((m.view(np.uint32) != d[j].view(np.uint32)).sum())
    return bad


def neighbours(m: StepModel = WGMMA_E4M3) -> list:
    """The models one choice away from ``m``: W ± 1, result bits ± 1 (and fp32 RN write-back),
    the other alignments, roundings and groupings, c outside the window."""
    out = [replace(m, kept_bits=m.kept_bits + d) for d in (-1, 1)]
    out += [replace(m, result_bits=b) for b in (m.result_bits - 1, m.result_bits + 1, None)]
    out += [replace(m, align="value"), replace(m, align="value", kept_bits=m.kept_bits - 1)]
    out += [replace(m, rounding=r) for r in ("floor", "rn")]
    out += [replace(m, group=g) for g in (16, 8)] + [replace(m, c_window=False)]
    return out


def scan(cases: dict, d: np.ndarray, out=sys.stdout) -> dict:
    """Mismatches of ``WGMMA_E4M3`` per case family, then of each of its ``neighbours`` (a
    model is accepted only at 0 everywhere; every neighbour must be rejected).  Returns
    {model: mismatches}."""
    fam = cases["family"]
    per = {
        str(f): mismatches(WGMMA_E4M3, cases, d, np.nonzero(fam == f)[0])
        for f in dict.fromkeys(fam)
    }
    print(f"{sum(per.values()):9d}  {WGMMA_E4M3}  {per}", file=out)
    res = {WGMMA_E4M3: sum(per.values())}
    for m in neighbours():
        res[m] = mismatches(m, cases, d)
        print(f"{res[m]:9d}  {m}", file=out)
    return res


def structural(cases: dict, d: np.ndarray, narrow: dict | None = None) -> dict:
    """Model-free facts: swapped operands give the transpose; a repeated row and column give
    one value everywhere; ``narrow`` ({columns: d of run_gpu}): the MMA with fewer columns
    gives each of its columns the 64-column MMA's bits (fp32 bits)."""
    fam = cases["family"]
    u, s = np.nonzero(fam == "uniform")[0][:16], np.nonzero(fam == "swap")[0]
    swap_bad = int((d[u].transpose(0, 2, 1).view(np.uint32) != d[s].view(np.uint32)).sum())
    c = d[fam == "const"].view(np.uint32)
    const_bad = int((c != c[:, :1, :1]).sum())
    out = {"swap_mismatch": swap_bad, "const_mismatch": const_bad}
    for cols, dn in (narrow or {}).items():
        bad = dn[:, :, :cols].view(np.uint32) != d[:, :, :cols].view(np.uint32)
        out[f"n{cols}_mismatch"] = int(bad.sum())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fp8_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for fp8_probe.npz (runs the probe on the GPU)")
    ap.add_argument("--scan", help="a saved fp8_probe.npz to test the models against (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not a.out and not a.scan:
        ap.error("give --out (GPU run) or --scan (model test)")
    if a.out:
        cases = make_cases(a.seed)
        d = run_gpu(cases)
        narrow = {cols: run_gpu(cases, cols) for cols in (32, 16)}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(Path(a.out) / "fp8_probe.npz", d=d, **cases)
        print(f"{d.shape[0]} cases; {structural(cases, d, narrow)}")
        print(f"tma: {tma_check()}")
    if a.scan:
        z = np.load(a.scan)
        cases = {k: z[k] for k in ("a", "b", "c0", "order", "steps", "family")}
        print(structural(cases, z["d"]))
        scan(cases, z["d"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
