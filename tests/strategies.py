"""Hypothesis strategies for indexer problems (small shapes, adversarial values) and fixed
problems shared by several test files."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

# Per-array magnitude: integer-valued (massive ties), unit, huge, tiny.  Products stay
# finite (|x| ≤ 1e100) and can underflow (|x| ≥ 1e-160), both on purpose.
SCALES = (None, 1.0, 1e-3, 1e3, 1e100, 1e-160)


@st.composite
def arrays(draw, shape, scale=None):
    """float64 array of ``shape``; ``scale`` None means small integers (ties)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(("normal", "sparse", "zeros", "const")))
    if scale is None:
        a = rng.integers(-3, 4, size=shape).astype(np.float64)
    else:
        a = rng.standard_normal(shape) * scale
    if kind == "sparse":
        a = a * (rng.random(shape) < 0.3)
    elif kind == "zeros":
        a = np.zeros(shape)
    elif kind == "const" and a.size:
        a = np.full(shape, a.flat[0])
    return a


@st.composite
def problems(draw, max_q=3, max_h=6, max_d=6, max_n=120, max_k=40):
    """(q [Qn,H,D], w [Qn,H], k [N,D], K, ks, ke) with adversarial values and ranges."""
    Qn = draw(st.integers(1, max_q))
    H = draw(st.integers(1, max_h))
    D = draw(st.integers(1, max_d))
    N = draw(st.integers(0, max_n))
    K = draw(st.integers(1, max_k))
    scale_q = draw(st.sampled_from(SCALES))
    scale_k = draw(st.sampled_from(SCALES[:4]))
    q = draw(arrays((Qn, H, D), scale_q))
    k = draw(arrays((N, D), scale_k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    wmode = draw(st.sampled_from(("mixed", "neg", "pos", "int", "zero_some")))
    w = rng.standard_normal((Qn, H))
    if wmode == "neg":
        w = -np.abs(w)
    elif wmode == "pos":
        w = np.abs(w)
    elif wmode == "int":
        w = rng.integers(-2, 3, size=(Qn, H)).astype(np.float64)
    elif wmode == "zero_some":
        w = w * (rng.random((Qn, H)) < 0.5)
    else:
        # Mostly negative, a few positive heads (DSA-like).
        w = -np.abs(w) * np.where(rng.random((Qn, H)) < 0.2, -1.0, 1.0)
    rmode = draw(st.sampled_from(("all", "causal", "random")))
    if rmode == "all":
        ks, ke = np.zeros(Qn, np.int64), np.full(Qn, N, np.int64)
    elif rmode == "causal":
        ke = np.clip(N - Qn + 1 + np.arange(Qn), 0, N).astype(np.int64)
        ks = np.zeros(Qn, np.int64)
    else:
        a = rng.integers(0, N + 1, size=Qn)
        b = rng.integers(0, N + 1, size=Qn)
        ks, ke = np.minimum(a, b).astype(np.int64), np.maximum(a, b).astype(np.int64)
    return q, w, k, K, ks, ke


def repick_problem(seed: int):
    """One query (H = 8, D = 16, 600 keys, 3 positive heads) whose certificate seeds raise τ
    enough for r = "auto" to be chosen again: (q [1, 8, 16], w [1, 8], k [600, 16])."""
    rng = np.random.default_rng(seed)
    H, D, N = 8, 16, 600
    base = rng.standard_normal(D)
    q = 0.5 * base + rng.standard_normal((1, H, D))
    w = -np.abs(rng.standard_normal((1, H)))
    w[:, :3] *= -1
    k = rng.standard_normal((N, D)) + base
    return q, w, k


def selection_options(window: int, n_anchors: int, cert_seeds: int, **more):
    """``dosa_topk`` options for property tests: every seed strategy, windows, sinks,
    anchors and certificate seeds up to the given sizes, r, the dense fallback and tiny
    buffers (overflow), plus ``more`` (name → strategy)."""
    seeds = ("local", "anchor", "certificate", "local+anchor", "local+anchor+certificate")
    return st.fixed_dictionaries(
        {
            "seeds": st.sampled_from(seeds),
            "window": st.integers(0, window),
            "sinks": st.integers(0, 4),
            "n_anchors": st.integers(0, n_anchors),
            "cert_seeds": st.integers(0, cert_seeds),
            "r": st.one_of(st.just("auto"), st.integers(1, 7)),
            "auto_dense": st.booleans(),
            "buffer": st.integers(1, 80),
            **more,
        }
    )
