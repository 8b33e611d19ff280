"""Prepare (the first stage of docs/method.md §9): validated inputs of one chunk, its options,
seed sources and shared key summaries (``Chunk``), the per-query view the later stages
receive (``QueryContext``), and FP8 keys for the numerical certificate (``FP8Keys``:
payload values k̄, scales α, RMS summaries ρ; docs/method.md §8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .certificate import KeySummary
from .fp8 import dequantize, e4m3_values, key_rms, nan_codes
from .options import SelectOptions, check_seed_ids
from .scorer import key_amax
from .seeds import anchor_pool, anchor_queries
from .validate import as_array, as_float_array, check_K, check_qwk, check_qwk_shapes, check_ranges

__all__ = ["Chunk", "FP8Keys", "QueryContext", "check_fp8_inputs", "prepare_chunk", "prepare_fp8"]


@dataclass
class Chunk:
    """One call's validated inputs and everything shared by its queries.

    q float64 [Qn, H, D], w float64 [Qn, H], k float64 [N, D] (for FP8 keys: the exact
    dequantized keys, the reference scorer's input), ks / ke int64 [Qn], K ≥ 1; ``opt``
    with ``window`` / ``cert_seeds`` resolved for K; ``strategies``; explicit ``seed_ids``
    int64 [Qn, S] or None; the anchor ``pool`` int64 (sorted) and ``anchor_scored``, the
    key scorings the anchor queries cost; ``k_amax`` = max |k_ij|, the input of the
    scorer's finiteness envelope (``scorer.finite_envelope``); ``tau_floor`` float64 [Qn]
    or None (``SelectOptions.tau_floor``).
    """

    q: np.ndarray
    w: np.ndarray
    k: np.ndarray
    ks: np.ndarray
    ke: np.ndarray
    K: int
    opt: SelectOptions
    strategies: tuple[str, ...]
    seed_ids: np.ndarray | None
    pool: np.ndarray
    anchor_scored: int
    window: int
    cert_seeds: int
    k_amax: float = 0.0
    tau_floor: np.ndarray | None = None  # float64 [Qn]: SelectOptions.tau_floor, checked
    _ksum: KeySummary | None = field(default=None, repr=False)

    @property
    def Qn(self) -> int:
        return int(self.q.shape[0])

    @property
    def H(self) -> int:
        return int(self.q.shape[1])

    def ksum(self) -> KeySummary:
        """Key summaries for the float64 certificate, built on first use."""
        if self._ksum is None:
            self._ksum = KeySummary(self.k)
        return self._ksum


@dataclass
class QueryContext:
    """One query of a chunk: index ``t``, visible range [a, b), heads ``q_t`` float64
    [H, D] and weights ``w_t`` float64 [H], the ``chunk`` and the stats ``st`` to fill."""

    t: int
    a: int
    b: int
    q_t: np.ndarray
    w_t: np.ndarray
    chunk: Chunk
    st: object

    @property
    def visible(self) -> int:
        return self.b - self.a


def prepare_chunk(q, w, k, K, ks, ke, options: dict) -> Chunk:
    """Validate float keys ``k`` [N, D] and the options; pick seed sources (``Chunk``)."""
    q, w, k = check_qwk(q, w, k)
    return _chunk(q, w, k, K, ks, ke, options)


def _chunk(q, w, k, K, ks, ke, options: dict) -> Chunk:
    Qn = q.shape[0]
    K = check_K(K, rows=Qn)
    ks, ke = check_ranges(ks, ke, Qn, k.shape[0])
    opt = SelectOptions.from_kwargs(options)
    strategies = opt.strategies()
    seed_ids = None
    if "explicit" in strategies:
        seed_ids = check_seed_ids(opt.seed_ids, Qn, k.shape[0])
    tau_floor = None
    if opt.tau_floor is not None:
        tau_floor = as_array(opt.tau_floor, "tau_floor").astype(np.float64)
        if tau_floor.shape != (Qn,) or np.isnan(tau_floor).any() or (tau_floor == np.inf).any():
            raise ValueError(f"tau_floor: expected a float [Qn={Qn}] below +inf, no NaN")
    pool, anchor_scored = np.zeros(0, dtype=np.int64), 0
    if "anchor" in strategies:
        pool = anchor_pool(q, w, k, ks, ke, K, opt.n_anchors, opt.anchor_segments)
        anchors = anchor_queries(Qn, opt.n_anchors)
        anchor_scored = int(np.sum(ke[anchors] - ks[anchors]))
    return Chunk(
        q=q,
        w=w,
        k=k,
        ks=ks,
        ke=ke,
        K=K,
        opt=opt,
        strategies=strategies,
        seed_ids=seed_ids,
        pool=pool,
        anchor_scored=anchor_scored,
        window=opt.window_for(K),
        cert_seeds=opt.cert_seeds_for(K),
        k_amax=key_amax(k),
        tau_floor=tau_floor,
    )


@dataclass
class FP8Keys:
    """FP8 keys k_i = α_i k̄_i: ``payload`` uint8 e4m3 [N, D], ``scale`` float32 [N],
    ``kbar`` float64 [N, D] (payload values), ``rho`` float32 [N] (RMS summaries, ρ√D ≥
    ‖k̄‖, rounded up)."""

    payload: np.ndarray
    scale: np.ndarray
    kbar: np.ndarray
    rho: np.ndarray


def check_fp8_inputs(q, w, payload, scale, strict: bool):
    """Validate q [Qn, H, D], w [Qn, H], payload uint8 [N, D], scale float [N]: float64 q
    and w, the payload, float32 scales.  ``strict`` rejects NaN payload codes and
    non-finite scales (the reference scorer is undefined there)."""
    q = as_float_array(q, "q", 3)
    w = as_float_array(w, "w", 2)
    p = as_array(payload, "payload")
    if p.dtype != np.uint8 or p.ndim != 2:
        raise ValueError(f"payload: expected uint8 e4m3 bits [N, D], got {p.dtype} {p.shape}")
    s = as_array(scale, "scale")
    if s.dtype.kind != "f" or s.shape != (p.shape[0],):
        raise ValueError(f"scale: expected float [N={p.shape[0]}], got {s.dtype} {s.shape}")
    check_qwk_shapes(q.shape, w.shape, p.shape, "payload")
    if strict:
        if np.any(nan_codes(p)):
            raise ValueError("payload: contains e4m3 NaN codes (0x7F/0xFF)")
        if not np.all(np.isfinite(s)):
            raise ValueError("scale: contains non-finite values (nan or inf)")
    return (
        np.ascontiguousarray(q, dtype=np.float64),
        np.ascontiguousarray(w, dtype=np.float64),
        p,
        s.astype(np.float32),
    )


def prepare_fp8(q, w, payload, scale, K, ks, ke, options: dict) -> tuple[Chunk, FP8Keys]:
    """Validate FP8 inputs (strictly) and prepare the chunk on the dequantized keys."""
    q, w, payload, scale = check_fp8_inputs(q, w, payload, scale, strict=True)
    keys = FP8Keys(payload, scale, e4m3_values(payload), key_rms(payload))
    return _chunk(q, w, dequantize(payload, scale), K, ks, ke, options), keys
