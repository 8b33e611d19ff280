"""Shared GPU-test support: CuPy detection and the ``gpu`` decorator (marked ``gpu`` and
skipped with a reason on machines without CuPy or an NVIDIA GPU)."""

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
