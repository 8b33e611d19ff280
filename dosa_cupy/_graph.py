"""An if/else node in a CUDA graph being captured (docs/method.md §9 "A route chosen inside a
graph"; capture.py).

CuPy captures streams into graphs but has no API for conditional nodes, and torch has none
either; the CUDA runtime's (12.8 and later: an if node with an else body) is called through
NVIDIA's ``cuda-bindings``, the ``gpu`` extra's second package.  The recipe:

1. ``condition(stream)``: a condition handle in the graph that ``stream`` is capturing into
   (value 0 at each launch until a kernel sets it);
2. a kernel captured on ``stream`` sets it from device values (``cudaGraphSetConditional``;
   csrc/route.cu route_pick);
3. ``if_else(stream, side, cond, then, otherwise)``: the node after the stream's last captured
   work, each body captured from ``side`` (a stream of the same device, not capturing), and
   the stream's capture continued after the node.

Without ``cuda-bindings`` 13 or a driver older than 12.8, ``available()`` is False and the
caller keeps a fixed choice.
"""

from __future__ import annotations

import functools

from ._build import cupy_or_raise

__all__ = ["available", "capturing", "condition", "if_else"]

MIN_DRIVER = 12080  # if nodes with an else body (cudaGraphNodeParams.conditional.size = 2)


@functools.cache
def _runtime():
    """cuda.bindings.runtime, or None when it is missing or older than 13 (the signatures
    with edge data that this module calls)."""
    try:
        import cuda.bindings
        from cuda.bindings import runtime as rt
    except ImportError:
        return None
    major = int(str(getattr(cuda.bindings, "__version__", "0")).split(".")[0] or 0)
    return rt if major >= 13 and hasattr(rt, "cudaGraphConditionalHandleCreate") else None


def available() -> bool:
    """Whether conditional nodes can be built here: ``cuda-bindings`` ≥ 13 importable and a
    driver of CUDA 12.8 or later."""
    return _runtime() is not None and cupy_or_raise().cuda.runtime.driverGetVersion() >= MIN_DRIVER


def capturing(stream) -> bool:
    """Whether ``stream`` (a CuPy stream, or an external one such as torch's) is capturing."""
    return bool(stream.is_capturing())


def _ok(ret, what: str):
    """The values of a cuda.bindings call after its error code; RuntimeError naming ``what``
    when the code is not cudaSuccess."""
    rt = _runtime()
    err, rest = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what}: {err!r}")
    return rest


def _capture_info(stream) -> tuple:
    """(graph, dependencies, their count) of ``stream``'s capture."""
    info = _ok(_runtime().cudaStreamGetCaptureInfo(stream.ptr), "cudaStreamGetCaptureInfo")
    return info[2], info[3], info[-1]


def condition(stream):
    """A new condition handle (value 0 at each launch of the graph) of the graph that
    ``stream`` is capturing into (``cudaGraphConditionalHandle``; ``int()`` of it is the
    integer a kernel takes)."""
    rt = _runtime()
    graph, _, _ = _capture_info(stream)
    (handle,) = _ok(rt.cudaGraphConditionalHandleCreate(graph, 0, 0), "condition handle")
    return handle


def if_else(stream, side, cond, then, otherwise=None) -> None:
    """Add an if/else node on ``cond`` after ``stream``'s captured work: ``then()``'s launches
    run where the condition is non-zero, ``otherwise()``'s where it is 0 (None: an if node
    without an else body).  Each body is captured from ``side`` (made current while its
    function runs); ``stream``'s capture goes on after the node."""
    rt = _runtime()
    graph, deps, n = _capture_info(stream)
    p = rt.cudaGraphNodeParams()
    p.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
    p.conditional.handle = cond
    p.conditional.type = rt.cudaGraphConditionalNodeType.cudaGraphCondTypeIf
    bodies = (then,) if otherwise is None else (then, otherwise)
    p.conditional.size = len(bodies)  # body 0 on a non-zero value, body 1 (if any) on 0
    (node,) = _ok(rt.cudaGraphAddNode(graph, deps, None, n, p), "conditional node")
    relaxed = rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
    for body, fn in zip(p.conditional.phGraph_out, bodies, strict=True):
        _ok(rt.cudaStreamBeginCaptureToGraph(side.ptr, body, None, None, 0, relaxed), "body")
        try:
            with side:
                fn()
        finally:
            _ok(rt.cudaStreamEndCapture(side.ptr), "body")
    flags = rt.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies
    _ok(rt.cudaStreamUpdateCaptureDependencies(stream.ptr, [node], None, 1, flags), "after node")
