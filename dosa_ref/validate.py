"""Input validation shared by every public entry point (docs/design.md, "Public contract").

Bad input raises ``ValueError`` naming the argument; nothing is coerced silently into a
different problem.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_qwk", "check_qwk_shapes", "check_ranges", "check_K", "as_float_array"]


def as_float_array(x, name: str, ndim: int) -> np.ndarray:
    """Return ``x`` as a float32/float64 ndarray of rank ``ndim`` with finite entries."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise ValueError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    if a.dtype.kind in "iu":
        a = a.astype(np.float64)
    elif a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite values (nan or inf)")
    return a


def check_qwk(q, w, k) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate ``q`` [Qn, H, D], ``w`` [Qn, H], ``k`` [N, D]; return float64 copies."""
    q = as_float_array(q, "q", 3)
    w = as_float_array(w, "w", 2)
    k = as_float_array(k, "k", 2)
    check_qwk_shapes(q.shape, w.shape, k.shape)
    return (
        np.ascontiguousarray(q, dtype=np.float64),
        np.ascontiguousarray(w, dtype=np.float64),
        np.ascontiguousarray(k, dtype=np.float64),
    )


def check_qwk_shapes(q_shape, w_shape, k_shape, k_name: str = "k") -> None:
    """q [Qn, H, D] with H, D ≥ 1, w [Qn, H] and keys ``k_name`` [N, D] agree."""
    Qn, H, D = q_shape
    if H < 1:
        raise ValueError(f"q: need at least one head, got shape {tuple(q_shape)}")
    if D < 1:
        raise ValueError(f"q: need head dimension D >= 1, got shape {tuple(q_shape)}")
    if tuple(w_shape) != (Qn, H):
        raise ValueError(f"w: expected shape {(Qn, H)} to match q, got {tuple(w_shape)}")
    if k_shape[1] != D:
        raise ValueError(f"{k_name}: expected shape (N, {D}) to match q, got {tuple(k_shape)}")


def int_array(name: str, v, shape: tuple) -> np.ndarray:
    """``v`` as int64 of ``shape``: integer dtypes, or floats that are all finite integers;
    a ValueError naming ``name`` otherwise."""
    a = np.asarray(v)
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise ValueError(f"{name}: expected integer entries, got dtype {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {a.shape}")
    return a.astype(np.int64)


def check_ranges(ks, ke, Qn: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate visible ranges ``[ks[t], ke[t])``; defaults make every key visible."""
    out = []
    for name, v, default in (("ks", ks, 0), ("ke", ke, N)):
        if v is None:
            out.append(np.full(Qn, default, dtype=np.int64))
            continue
        a = int_array(name, v, (Qn,))
        if np.any(a < 0) or np.any(a > N):
            raise ValueError(f"{name}: entries must lie in [0, N={N}]")
        out.append(a)
    ks_a, ke_a = out
    if np.any(ks_a > ke_a):
        t = int(np.flatnonzero(ks_a > ke_a)[0])
        raise ValueError(f"ks: ks[{t}]={ks_a[t]} > ke[{t}]={ke_a[t]}")
    return ks_a, ke_a


def check_K(K) -> int:
    """Validate the selection size ``K >= 1``: a Python or numpy integer, or a 0-d integer
    array (e.g. ``np.asarray(8)``); a float, a bool or any other shape raises."""
    if isinstance(K, np.ndarray) and K.ndim == 0 and K.dtype.kind in "iu":
        K = K[()]
    if isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer)):
        raise ValueError(f"K: expected a positive integer, got {K!r}")
    if K < 1:
        raise ValueError(f"K: must be >= 1, got {K}")
    return int(K)
