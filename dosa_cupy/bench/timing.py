"""CUDA-event timing of ``dosa bench``: warm-ups, medians over replays with rotated input
sets, query sub-chunks, releasing cached memory between routes, and the GPU check."""

from __future__ import annotations

import statistics
import sys

WARM = 2


def median_ms(cp, fn, reps, warm=WARM, rotate=None):
    """(median ms, all ms) of ``fn(input set)``: ``warm`` untimed calls, then ``reps``
    calls between CUDA events, call i on set i mod len(rotate) (None without sets)."""
    return median_ms_interleaved(cp, {"fn": fn}, reps, warm, rotate)["fn"]


def median_ms_interleaved(cp, fns: dict, reps, warm=WARM, rotate=None) -> dict:
    """``median_ms`` of several calls timed in turn: replay i times every call of ``fns``
    (name → fn(input set)) once before replay i + 1 starts, so that slow drifts of the host
    or the GPU clock fall on every call alike (the fair comparison of host-bound calls,
    docs/benchmark_method.md).  The calls of a replay start at call i mod len(fns), and
    the k-th timed call overall takes input set k mod len(rotate): no call reads the set
    the call before it just read (with two or more sets), and none is always first.
    Returns name → (median ms, all ms)."""
    names = list(fns)
    m = len(names)

    def arg(k):
        return rotate[k % len(rotate)] if rotate else None

    for i in range(warm):
        for j, name in enumerate(names):
            fns[name](arg(i * m + j))
    ts = {name: [] for name in names}
    for i in range(reps):
        for j in range(m):
            name = names[(i + j) % m]
            a, b = cp.cuda.Event(), cp.cuda.Event()
            x = arg(i * m + j)
            a.record()
            fns[name](x)
            b.record()
            b.synchronize()
            ts[name].append(cp.cuda.get_elapsed_time(a, b))
    return {name: (statistics.median(v), v) for name, v in ts.items()}


def check_run_args(reps: int, rotate: int, K: int) -> None:
    """The timing arguments every bench mode shares: ValueError naming the argument for
    fewer than 10 replays, no input set, or K outside the selection kernel's [1, 4096]."""
    if reps < 10:
        raise ValueError(f"reps: at least 10 replays, got {reps}")
    if rotate < 1:
        raise ValueError(f"rotate: expected at least 1 input set, got {rotate}")
    if not 1 <= K <= 4096:
        raise ValueError(f"K: expected an integer in [1, 4096], got {K}")


def spans(Qn, sub):
    return [(a, min(Qn, a + sub)) for a in range(0, Qn, max(1, sub))]


def slices(s, sub):
    """Query sub-chunks of an input set (contiguous views along the query axis)."""
    return [
        dict(s, **{k: s[k][a:b] for k in ("q", "w", "qp", "wp", "ks", "ke")})
        for a, b in spans(s["q"].shape[0], sub)
    ]


def free(cp):
    """Give cached blocks back between routes: the next route allocates other sizes, and
    torch's allocator draws on the same device memory."""
    cp.get_default_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")  # only if the bench imported it (None: blocked import)
    if torch is not None:
        torch.cuda.empty_cache()


GPU_HINT = "pip install 'dosa[gpu]' (CuPy) and run on a machine with an NVIDIA GPU"


def gpu_missing() -> str | None:
    """Why this process cannot time GPU routes, in one line (None when it can): CuPy is not
    importable, or it finds no usable CUDA device."""
    try:
        import cupy as cp

        cp.cuda.Device().mem_info  # noqa: B018 - the first call that needs a device
    except Exception as e:
        what = "CuPy is not importable" if isinstance(e, ImportError) else "no usable CUDA GPU"
        return f"{what} ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return None


def no_gpu_exit(prog: str) -> int | None:
    """2 after a one-line message on stderr when there is no GPU to run on, else None."""
    why = gpu_missing()
    if why is None:
        return None
    print(f"{prog}: {why}; {GPU_HINT}", file=sys.stderr)
    return 2


def is_oom(e) -> bool:
    return "OutOfMemory" in type(e).__name__ or "out of memory" in str(e).lower()
