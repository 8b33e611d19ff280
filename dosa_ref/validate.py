"""Input validation shared by every public entry point (docs/design.md, "Public contract").

Bad input raises ``ValueError`` naming the argument; nothing is coerced silently into a
different problem, and no numpy conversion error or ``MemoryError`` escapes for a bad
argument.  The rules, in one place:

- array arguments are converted by ``as_array``: ``None`` where an array is required, a
  ragged nested list or anything else numpy cannot turn into an array raises;
- real-valued arrays (q, w, k, scores) must have an integer or floating dtype: booleans,
  complex numbers, strings, bytes and object arrays raise (``as_float_array``);
- index arrays (ks, ke, lengths) must have an integer dtype: floats raise even when every
  entry is whole, as on the GPU, which takes int32 indices (``int_array``);
- ``K`` is an integer with ``1 <= K <= K_MAX`` and the ids array it asks for holds at most
  ``IDS_MAX`` entries, checked before it is allocated (``check_K``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "IDS_MAX",
    "K_MAX",
    "as_array",
    "as_float_array",
    "check_K",
    "check_int_dtype",
    "check_qwk",
    "check_qwk_shapes",
    "check_ranges",
    "check_scores",
    "int_array",
]

# The largest selection size.  Key ids are int32 on the GPU (dosa_cupy.prepare.MAX_KEYS)
# and ``ids_dtype="int32"`` is an output option there, so no call handles more than
# 2**31 - 1 keys: a larger K could only add -1 padding.
K_MAX = 2**31 - 1
# The most entries an ids array (int64 [Qn, K], or [B, next_n, K] for decode) may hold:
# 2**31 - 1 ids, 8 * (2**31 - 1) bytes (just under 16 GiB).  Checked before allocation, so
# an oversized K raises ValueError instead of MemoryError (or an out-of-memory kill).
IDS_MAX = 2**31 - 1


def as_array(x, name: str) -> np.ndarray:
    """``np.asarray(x)``, or a ValueError naming ``name`` when ``x`` is None, a ragged nested
    sequence, or anything else numpy cannot convert (its own error carries no name)."""
    if x is None:
        raise ValueError(f"{name}: missing (got None where an array is required)")
    try:
        return np.asarray(x)
    except (ValueError, TypeError, OverflowError) as e:
        # numpy's message (e.g. "setting an array element with a sequence ...
        # inhomogeneous shape") says what is wrong but not which argument
        raise ValueError(f"{name}: cannot be read as an array (ragged?): {e}") from e


def _real_dtype(a: np.ndarray, name: str) -> None:
    """Integer or floating dtype; bool (kind "b"), complex, str, bytes, object and numpy
    extension types raise: none of them is a real number numpy converts without a loss."""
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name}: expected a real numeric array, got dtype {a.dtype}")


def as_float_array(x, name: str, ndim: int) -> np.ndarray:
    """Return ``x`` as a float32/float64 ndarray of rank ``ndim`` with finite entries."""
    a = as_array(x, name)
    _real_dtype(a, name)
    if a.dtype.kind in "iu":
        a = a.astype(np.float64)
    elif a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite values (nan or inf)")
    return a


def check_scores(scores, name: str = "scores") -> np.ndarray:
    """``scores`` [Qn, N] as float64 for ``topk_ids``: real numeric dtype (as
    ``as_float_array``), ``-inf`` allowed (a key that is not visible), NaN and ``+inf``
    rejected (no place in the order score descending, id ascending)."""
    a = as_array(scores, name)
    _real_dtype(a, name)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected 2 dimensions, got shape {a.shape}")
    s = a.astype(np.float64)
    if np.any(np.isnan(s)) or np.any(s == np.inf):
        raise ValueError(f"{name}: contains nan or +inf")
    return s


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


def check_int_dtype(a, name: str) -> None:
    """``a.dtype`` (a numpy, CuPy or any array with a numpy dtype) is an integer dtype; a
    ValueError naming ``name`` otherwise, with the same words on both packages."""
    if a.dtype.kind not in "iu":
        raise ValueError(
            f"{name}: expected integers (an integer dtype; floats are refused, even whole "
            f"ones), got dtype {a.dtype}"
        )


def int_array(name: str, v, shape: tuple) -> np.ndarray:
    """``v`` as int64 of ``shape``; a ValueError naming ``name`` otherwise.

    Integer dtypes only (numpy integer arrays, Python ints, lists of ints): a float array
    is refused even when every entry is whole, so that 2.0 and 1.5 get the same answer and
    the reference takes what the GPU package takes (dosa_cupy validates integer dtypes).
    Booleans are refused too (True is not an index).  uint64 entries above the int64 range
    raise rather than wrap to negative values that would be reported as such.
    """
    a = as_array(v, name)
    check_int_dtype(a, name)
    if a.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {a.shape}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: entries too large for int64, max {int(a.max())}")
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


_K_MAX_WHY = "2**31 - 1, the int32 range of key ids; a larger K could only add -1 padding"


def check_K(K, rows: int | None = None, *, max_K: int = K_MAX, why: str = _K_MAX_WHY) -> int:
    """Validate the selection size; return it as an int.

    ``K`` is a Python or numpy integer, or a 0-d integer array (e.g. ``np.asarray(8)``); a
    float, a bool or any other shape raises.  ``1 <= K <= max_K``: ``K_MAX = 2**31 - 1`` by
    default (``why`` says why in the message; the GPU selection kernel passes its own
    limit, 4096).  K larger than the number of visible keys is valid: the ids are padded
    with -1 (``topk_ids``' contract).

    ``rows``: the number of rows of the ids array the caller is about to allocate (Qn, or
    B * next_n for decode); then ``rows * K <= IDS_MAX`` (2**31 - 1 ids, just under 16 GiB
    of int64) is required as well, so that an oversized request raises a ValueError naming
    K and the size in bytes before anything is allocated.
    """
    if isinstance(K, np.ndarray) and K.ndim == 0 and K.dtype.kind in "iu":
        K = K[()]
    if isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer)):
        raise ValueError(f"K: expected a positive integer, got {K!r}")
    K = int(K)
    if K < 1:
        raise ValueError(f"K: must be >= 1, got {K}")
    if K > max_K:
        raise ValueError(f"K: at most {max_K} ({why}), got {K}")
    if rows is not None and int(rows) * K > IDS_MAX:
        n = int(rows) * K
        raise ValueError(
            f"K: the ids array of {int(rows)} rows x K={K} would hold {n} int64 ids "
            f"({8 * n} bytes); at most {IDS_MAX} ids ({8 * IDS_MAX} bytes) are allowed"
        )
    return K
