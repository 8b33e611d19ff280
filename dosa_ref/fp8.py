"""FP8 e4m3 storage of keys and queries (docs/method.md §8, docs/numerics.md).

Keys are stored as ``k_i = α_i k̄_i``: a per-token fp32 scale α_i > 0 and an e4m3 payload
k̄_i (uint8 bit patterns).  The conversion reproduces the serving stacks bit for bit:

    amax_i  = max(max_d |float32(k_i,d)|, 1e-4)                      (float32)
    α_i     = amax_i / 448                      scale_fmt="amax"   (DeepGEMM's tests)
            = 2^ceil(log2(amax_i / 448))        scale_fmt="ue8m0"  (DeepSeek's quantizer)
    k̄_i,d  = RNE_e4m3( clip(float32(k_i,d) / α_i, −448, 448) )     (float32 division)

which equals CUDA's saturating ``__nv_fp8_e4m3(float)`` conversion: ml_dtypes'
``float8_e4m3fn`` rounds to nearest even but does not saturate (465 → NaN), so we clip in
float32 first (docs/numerics.md).  Queries are quantized the same way per (token, head) and the
query scale is folded into the head weight, as the DeepSeek and SGLang indexers do; the
original scorer then runs on the e4m3 query values with the folded weights.

``dequantize`` is exact in float64 (an e4m3 value has 4 significant bits, an fp32 scale 24).
``key_rms`` gives the conservative RMS summary ρ_i with ρ_i·√D ≥ ‖k̄_i‖ (stored as fp32,
rounded up), the only per-key quantity the numerical certificate needs besides α_i.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "AMAX_MIN",
    "E4M3",
    "E4M3_MAX",
    "SCALE_FMTS",
    "dequantize",
    "e4m3_bits",
    "e4m3_values",
    "key_rms",
    "nan_codes",
    "quantize_keys",
    "quantize_queries",
    "quantize_rows",
    "scales_from_amax",
]

E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
AMAX_MIN = np.float32(1e-4)
SCALE_FMTS = ("amax", "ue8m0")

# e4m3 values of all 256 codes (NaN for 0x7F / 0xFF), float64, exact.
_E4M3_TABLE = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)


def e4m3_bits(x) -> np.ndarray:
    """Saturating round-to-nearest-even e4m3 bits (uint8) of float32 values ``x``.

    Equals CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`` for finite x:
    clip to [−448, 448] in float32, then ml_dtypes' RNE cast (|x| ≥ 464 saturates, ±0 keeps
    its sign, values below 2^-10 in magnitude round to ±0).  Finite input only.
    """
    x32 = np.asarray(x, dtype=np.float32)
    return np.clip(x32, np.float32(-E4M3_MAX), np.float32(E4M3_MAX)).astype(E4M3).view(np.uint8)


def e4m3_values(payload) -> np.ndarray:
    """Exact float64 values of e4m3 bit patterns (NaN for the NaN codes 0x7F / 0xFF)."""
    p = np.asarray(payload)
    if p.dtype != np.uint8:
        raise ValueError(f"payload: expected uint8 e4m3 bit patterns, got dtype {p.dtype}")
    return _E4M3_TABLE[p]


def nan_codes(payload) -> np.ndarray:
    """Boolean mask of NaN e4m3 codes (S.1111.111)."""
    return (np.asarray(payload) & 0x7F) == 0x7F


def _as_finite_float32(x, name: str, ndim: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise ValueError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite values (nan or inf)")
    with np.errstate(over="ignore"):
        a32 = a.astype(np.float32)
    if not np.all(np.isfinite(a32)):
        raise ValueError(f"{name}: values overflow float32")
    return a32


def scales_from_amax(amax32: np.ndarray, scale_fmt: str = "amax") -> np.ndarray:
    """fp32 scales from fp32 amax (already clamped): amax/448 or 2^ceil(log2(amax/448))."""
    if scale_fmt not in SCALE_FMTS:
        raise ValueError(f"scale_fmt: expected one of {SCALE_FMTS}, got {scale_fmt!r}")
    s = (np.asarray(amax32, dtype=np.float32) / np.float32(E4M3_MAX)).astype(np.float32)
    if scale_fmt == "amax":
        return s
    # Exact ceil(log2(s)) from the binary representation: s = m·2^e with m in [0.5, 1);
    # log2(s) is an integer exactly when m == 0.5 (then ceil(log2 s) = e − 1).
    m, e = np.frexp(s)
    e = np.where(m == 0.5, e - 1, e)
    return np.ldexp(np.float32(1.0), e).astype(np.float32)


def quantize_rows(x, scale_fmt: str = "amax", name: str = "x") -> tuple[np.ndarray, np.ndarray]:
    """Quantize the last axis of ``x`` [..., D]: (payload uint8 [..., D], scale fp32 [...])."""
    x32 = _as_finite_float32(x, name)
    if x32.ndim < 1 or x32.shape[-1] < 1:
        raise ValueError(f"{name}: expected shape [..., D] with D >= 1, got {x32.shape}")
    amax = np.maximum(np.max(np.abs(x32), axis=-1), AMAX_MIN).astype(np.float32)
    scale = scales_from_amax(amax, scale_fmt)
    y = (x32 / scale[..., None]).astype(np.float32)  # float32 division, RN
    return e4m3_bits(y), scale


def quantize_keys(k, scale_fmt: str = "amax") -> tuple[np.ndarray, np.ndarray]:
    """Per-token FP8 keys: (payload uint8 [N, D] e4m3 bits, scale float32 [N]).

    ``k`` [N, D] real (converted to float32 first, as the serving stacks do).  Non-finite
    input (or values that overflow float32) raises ValueError naming ``k``.
    """
    a = np.asarray(k)
    if a.ndim != 2:
        raise ValueError(f"k: expected 2 dimensions [N, D], got shape {a.shape}")
    return quantize_rows(a, scale_fmt, "k")


def quantize_queries(q, w, scale_fmt: str = "amax") -> tuple[np.ndarray, np.ndarray]:
    """Per-(token, head) FP8 queries with the scale folded into the head weight.

    Args:
        q: [Qn, H, D] real; w: [Qn, H] real head weights.
    Returns:
        (q_payload uint8 [Qn, H, D], w_folded float32 [Qn, H]) with
        ``w_folded = float32(w) · σ`` (float32 multiply) and σ the per-(token, head) scale.
        The scorer then uses ``e4m3_values(q_payload)`` as the query heads and
        ``w_folded`` as the weights (``s_i = Σ_h w_folded_h [q̂_h · k_i]_+``).
    """
    qa = np.asarray(q)
    if qa.ndim != 3:
        raise ValueError(f"q: expected 3 dimensions [Qn, H, D], got shape {qa.shape}")
    w32 = _as_finite_float32(w, "w", 2)
    if w32.shape != qa.shape[:2]:
        raise ValueError(f"w: expected shape {qa.shape[:2]} to match q, got {w32.shape}")
    payload, scale = quantize_rows(qa, scale_fmt, "q")
    return payload, (w32 * scale).astype(np.float32)


def dequantize(payload, scale) -> np.ndarray:
    """Exact float64 values ``scale[..., None] · e4m3(payload)`` ([..., D]).

    Exact: an e4m3 value times an fp32 scale has at most 28 significant bits and stays in
    float64's normal range.  NaN codes and non-finite scales propagate (callers validate).
    """
    vals = e4m3_values(payload)
    s = np.asarray(scale)
    if s.dtype.kind != "f":
        raise ValueError(f"scale: expected a float array, got dtype {s.dtype}")
    if s.shape != vals.shape[:-1]:
        raise ValueError(f"scale: expected shape {vals.shape[:-1]} to match payload, got {s.shape}")
    return vals * s.astype(np.float64)[..., None]


def key_rms(payload) -> np.ndarray:
    """Conservative RMS summaries ρ_i (float32 [N]) with ρ_i·√D ≥ ‖k̄_i‖ guaranteed.

    ‖k̄_i‖² is exact in float64 (e4m3 squares are multiples of 2^-18 below 2^17.7, so any
    summation order of D < 170,000 of them is exact); ρ = sqrt(‖k̄‖²/D) is then evaluated
    with every operation widened upward (np.nextafter) and rounded up to float32.  Rows
    with NaN codes get NaN (the certificate then refuses to prune them).
    """
    v = e4m3_values(payload)
    if v.ndim != 2:
        raise ValueError(f"payload: expected shape [N, D], got {v.shape}")
    D = v.shape[1]
    if D >= 170_000:
        raise ValueError(f"payload: D={D} too large for the exact squared-norm argument")
    n2 = np.sum(v * v, axis=1)  # exact
    with np.errstate(invalid="ignore"):
        r = np.nextafter(np.sqrt(np.nextafter(n2 / D, np.inf)), np.inf)
    r32 = r.astype(np.float32)
    with np.errstate(invalid="ignore"):
        low = r32.astype(np.float64) < r
    r32[low] = np.nextafter(r32[low], np.float32(np.inf))
    return r32
