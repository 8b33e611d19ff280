"""Shared GPU-test support: CuPy detection and the ``gpu`` decorator (marked ``gpu`` and
skipped with a reason on machines without CuPy or an NVIDIA GPU)."""

import types

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # pragma: no cover - CPU machines
    cp = None
    HAVE_GPU = False


def gpu(f):
    """GPU test: marked ``gpu`` and skipped with a reason without CuPy / a GPU."""
    f = pytest.mark.skipif(not HAVE_GPU, reason="needs CuPy and an NVIDIA GPU")(f)
    return pytest.mark.gpu(f)


def guard_violations(logits, bounds):
    """(number of visible (query, key) with s > U^num, min(U^num − s) over them): the
    guard check of docs/method.md §8 on dense logits fp32 [Qn, N] and ``debug_bounds`` U fp64
    [Qn, N] (NaN where not visible)."""
    s = logits.astype(cp.float64)
    vis = ~cp.isnan(bounds)
    slack = cp.where(vis, bounds - s, cp.inf)
    return int(cp.sum(vis & (s > bounds))), float(slack.min())


def numpy_as_cupy():
    """numpy standing in for CuPy in CPU tests of host code (every numpy name, and
    ``asnumpy``), to put in place of a module's ``cupy_or_raise``."""
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.asnumpy = np.asarray
    return shim
