"""The one build path of the CUDA kernels: a ``KernelSpec`` (a source of ``csrc/``, its
defines, its target) → a module, compiled by NVRTC and cached by the text of every source.

* The portable modules (``kernels.cu``, ``decode.cu``, ``plan.cu``) go through CuPy's NVRTC
  build (``cupy.RawModule(code=..., backend="nvrtc")``), which compiles for the device's own
  architecture (sm_90 on the H200) and appends ``-ftz=true`` (docs/numerics.md): every
  guard computation that must round upward is therefore done in fp64 with ``__d*_ru``
  intrinsics (docs/method.md §8).
* The Hopper module (``screen_sm90a.cu``: warpgroup MMA needs the arch-specific target
  sm_90a, which CuPy's build does not ask for) is compiled by NVRTC here, with CuPy's
  options plus ``--gpu-architecture=sm_90a``, to a cubin cached under $DOSA_CACHE (default:
  the temp directory) and loaded with ``cupy.RawModule(path=...)``.  Where the installed
  NVRTC cannot build it, the machine's nvcc does (``DOSA_NVCC``, PATH, $CUDA_HOME/bin), with
  the same flags.  No CUDA toolkit is needed beside the NVRTC that CuPy loads.

Every launch is checked against the kernel's C parameter list, read from the spec's sources
with its defines (``_signature``): CuPy packs arguments by their own types, so a wrong count,
np.int64 for ``int`` or a float64 array for ``float*`` would launch and compute garbage; a
mismatch raises TypeError instead, checked once per distinct tuple of argument types.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ._signature import LaunchCheck, signatures

CSRC = Path(__file__).resolve().parent / "csrc"
OPTIONS = ("-std=c++17", f"-I{CSRC}")
UNROLL = 2  # screen batches per loop trip (screen.cu DOSA_SCREEN_UNROLL; v8: 2 beat 1 by 8 %)


@dataclass(frozen=True)
class KernelSpec:
    """One build: ``source`` (a file of csrc/), ``defines`` ("NAME=VALUE"), ``sm90a`` (the
    file needs the sm_90a target: warpgroup MMA)."""

    source: str
    defines: tuple[str, ...] = ()
    sm90a: bool = False

    def options(self) -> tuple[str, ...]:
        """The compiler options of this build (CuPy adds the target and ``-ftz=true``)."""
        return OPTIONS + tuple(f"-D{d}" for d in self.defines)


def main_spec(tile_n: int | None = None) -> KernelSpec:
    """The build of kernels.cu (every stage's kernels) for ``tile_n`` keys per tile
    (default: the current ``tile()``)."""
    t = tile() if tile_n is None else int(tile_n)
    return KernelSpec("kernels.cu", (f"DOSA_TILE_N={t}", f"DOSA_SCREEN_UNROLL={UNROLL}"))


def kernel_sources() -> list[Path]:
    """Every CUDA source (.cu, .cuh) under ``CSRC``, sorted: what the builds below read.

    ``CSRC`` is found next to this file, so an installed package reads its own copy; the
    wheel must therefore carry all of them (pyproject package-data; tests/test_wheel.py).
    """
    return sorted(p for p in CSRC.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh"))


def cupy_or_raise():
    try:
        import cupy
    except Exception as e:  # pragma: no cover - exercised only without CuPy
        raise RuntimeError(f"dosa_cupy needs CuPy and an NVIDIA GPU: {e}") from e
    return cupy


_CONSTS: dict = {}


def read_back_async(x):
    """(numpy array, event) of the device array ``x``: copied on the current stream into
    page-locked host memory, which holds x's values once the event has completed — a
    read-back that waits for the work queued before it, not for what is queued after (the
    route stage's read-backs, screen.tie_prefetch)."""
    cp = cupy_or_raise()
    import cupyx  # with CuPy

    host = cupyx.empty_pinned(x.shape, dtype=x.dtype)
    cp.asnumpy(x, out=host, blocking=False)
    ready = cp.cuda.Event()
    ready.record()
    return host, ready


def device_const(xp, name: str, make):
    """``xp.asarray(make())`` copied to the current device once and kept (per device and
    ``name``): an index or lookup table used by host code on every call.  A copy from
    pageable host memory waits for the stream's queued work, so a table copied per call costs
    a synchronization; a captured step (capture.py) may not copy from the host at all.  With
    numpy (the CPU tests) it is ``make()`` as an array."""
    if not hasattr(xp, "cuda"):
        return xp.asarray(make())
    key = (xp.cuda.Device().id, name)
    if key not in _CONSTS:
        _CONSTS[key] = xp.asarray(make())
    return _CONSTS[key]


def num_sms() -> int:
    """Streaming multiprocessors of the current device (cached per device): the grid of the
    persistent kernels."""
    cp = cupy_or_raise()
    dev = cp.cuda.Device()
    if dev.id not in _SMS:
        _SMS[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _SMS[dev.id]


_SMS: dict = {}


def device_name() -> str:
    """The current device's name (cached per device): the cost model's pick
    (``cost.model_for``)."""
    cp = cupy_or_raise()
    dev = cp.cuda.Device().id
    if dev not in _NAMES:
        name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
        _NAMES[dev] = name.decode() if isinstance(name, bytes) else str(name)
    return _NAMES[dev]


_NAMES: dict = {}

TILES = (128, 256)
_state = {"tile": 256}  # 256: +8–12 % over 128 (docs/records/notes.md v6); set_tile


def tile() -> int:
    """Keys per block tile of the tiled kernels (dense logits, fused, screen)."""
    return _state["tile"]


def set_tile(n: int) -> None:
    """Choose the key-tile size (128: 41 KB shared memory per block; 256 (default): 82 KB,
    with the dynamic shared-memory opt-in).  Scores do not depend on it (a key's score is a
    function of that key alone)."""
    if n not in TILES:
        raise ValueError(f"tile: expected one of {TILES}, got {n!r}")
    _state["tile"] = int(n)


def source_text(path: Path) -> str:
    """The text of a .cu file plus a comment holding the hash of every file in csrc/: CuPy's
    kernel cache is keyed by the code string and the options only, so without it an edited
    included stage file (screen.cu, common.cuh, ...) would reuse a stale cached build."""
    return Path(path).read_text() + f"\n// csrc sha256 {_csrc_hash()}\n"


def _csrc_hash() -> str:
    h = hashlib.sha256()
    for f in sorted(CSRC.glob("*.cu*")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class Kernel:
    """A loaded kernel (``raw``: CuPy's RawKernel) whose launches are checked by ``check``
    (a ``_signature.LaunchCheck`` of its parameter list) before they reach CuPy.  Every
    other attribute (``max_dynamic_shared_size_bytes``, ``attributes``, ``num_regs``, ...)
    is the RawKernel's, read and written through."""

    __slots__ = ("_raw", "_check")

    def __init__(self, raw, check):
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_check", check)

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        """Launch as CuPy's RawKernel does, on ``stream`` (default: the current stream)."""
        self._check(args)
        if stream is None:
            return self._raw(grid, block, args, shared_mem=shared_mem)
        with stream:
            return self._raw(grid, block, args, shared_mem=shared_mem)

    def __getattr__(self, name):
        if name in Kernel.__slots__:  # not yet set (copy, pickle): not the RawKernel's
            raise AttributeError(name)
        return getattr(self._raw, name)

    def __setattr__(self, name, value):
        setattr(self._raw, name, value)

    def __repr__(self) -> str:
        return f"Kernel({self._check.kernel!r})"


class Module:
    """A loaded module (``raw``: CuPy's RawModule) of build ``spec`` whose kernels are
    ``Kernel``s; every other attribute is the RawModule's."""

    __slots__ = ("raw", "spec")

    def __init__(self, raw, spec: KernelSpec):
        self.raw, self.spec = raw, spec

    def get_function(self, name: str) -> Kernel:
        check = launch_check(self.spec, name)  # before CuPy: a missing kernel is named here
        return Kernel(self.raw.get_function(name), check)

    def __getattr__(self, name):
        if name in Module.__slots__:
            raise AttributeError(name)
        return getattr(self.raw, name)


@functools.cache
def launch_check(spec: KernelSpec, name: str) -> LaunchCheck:
    """The argument check of kernel ``name`` of ``spec`` (one per kernel and build, so its
    memory of checked argument types lasts the process; made on the kernel's first use in
    the process, which ``first_uses`` counts)."""
    _FIRST_USES[0] += 1
    sig = signatures(spec, CSRC)
    if name not in sig:
        raise LookupError(
            f'{spec.source} (defines {list(spec.defines)}) defines no extern "C" __global__ '
            f"kernel {name!r}; it defines {sorted(sig)}"
        )
    return LaunchCheck(name, sig[name], (cupy_or_raise().ndarray,))


_FIRST_USES = [0]


def first_uses() -> int:
    """Kernels used for the first time in this process so far (each build and name once): a
    span of device work during which it grew may hold a build or a module load, so a
    measurement of that span is not the work's time (pipeline.py, the memo's prefix)."""
    return _FIRST_USES[0]


@functools.cache
def module(spec: KernelSpec) -> Module:
    """The loaded module of ``spec`` (built on first use, one per spec)."""
    cp = cupy_or_raise()
    if not spec.sm90a:
        raw = cp.RawModule(
            code=source_text(CSRC / spec.source), options=spec.options(), backend="nvrtc"
        )
    else:
        raw = cp.RawModule(path=str(sm90a_cubin(spec)))
    return Module(raw, spec)


# The Kernels that ``kernel`` handed out, by name and build: a launch looks its kernel up
# again on every call, and CuPy's RawModule makes a new RawKernel (and asks the driver for the
# function) on every get_function — host time in front of every launch of a call
# (docs/records/benchmarks.md "a prefill call's host and GPU timelines").  A RawKernel
# resolves the current device at each launch, so one entry serves every device.  Bench build
# kernellookup looks each launch's kernel up again.
KERNEL_CACHE = True
_KERNELS: dict = {}


def kernel(name: str, smem: int = 0, spec: KernelSpec | None = None) -> Kernel:
    """Kernel ``name`` of ``spec``'s module (default: ``main_spec()``, kernels.cu at the
    current tile size), its dynamic shared-memory limit raised to ``smem`` when a launch
    needs more than 48 KB; its launches are checked against its parameter list.  Made once
    per name and build (``_KERNELS``)."""
    key = (name, _state["tile"], UNROLL) if spec is None else (name, spec)
    f = _KERNELS.get(key) if KERNEL_CACHE else None
    if f is None:
        f = module(main_spec() if spec is None else spec).get_function(name)
        _KERNELS[key] = f
    if smem > 48 * 1024:
        raise_smem_limit(f, smem, *key)
    return f


def nvcc() -> str | None:
    """The nvcc of the fallback build: $DOSA_NVCC, then PATH, then $CUDA_HOME/bin."""
    for cand in (
        os.environ.get("DOSA_NVCC"),
        shutil.which("nvcc"),
        str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"),
    ):
        if cand and Path(cand).exists():
            return cand
    return None


def nvcc_command(spec: KernelSpec, out: Path) -> list[str]:
    """The nvcc command that builds ``spec`` as an sm_90a cubin with the NVRTC build's
    flags (``-ftz=true``, C++17, the include directory, the defines)."""
    return [
        nvcc() or "nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-ftz=true",
        *spec.options(), "-o", str(out), str(CSRC / spec.source),
    ]  # fmt: skip


SM90A_NVRTC = ("--gpu-architecture=sm_90a", "-ftz=true")  # beside spec.options()


def _nvrtc_cubin(spec: KernelSpec) -> bytes:
    """``spec`` compiled by NVRTC (the library CuPy loads) for sm_90a; raises on failure."""
    from cupy.cuda import compiler

    nv = compiler.nvrtc
    src = (CSRC / spec.source).read_text()
    prog = nv.createProgram(src, spec.source, (), ())
    try:
        try:
            nv.compileProgram(prog, spec.options() + SM90A_NVRTC)
        except Exception as e:
            raise RuntimeError(f"NVRTC: {nv.getProgramLog(prog)}") from e
        return bytes(nv.getCUBIN(prog))
    finally:
        nv.destroyProgram(prog)


def sm90a_cubin(spec: KernelSpec) -> Path:
    """The sm_90a cubin of ``spec``, built on first use (NVRTC, else nvcc) and cached under
    $DOSA_CACHE (default: the temp directory) by the hash of the sources and the flags."""
    h = hashlib.sha256((_csrc_hash() + " ".join(spec.options() + SM90A_NVRTC)).encode())
    cache = Path(os.environ.get("DOSA_CACHE", Path(tempfile.gettempdir()) / "dosa-cubin"))
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{Path(spec.source).stem}_{h.hexdigest()[:20]}.cubin"
    if out.exists():
        return out
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_bytes(_nvrtc_cubin(spec))
    except Exception as e:  # an NVRTC without sm_90a: the machine's nvcc, same flags
        if nvcc() is None:
            raise RuntimeError(f"{spec.source}: NVRTC failed and no nvcc was found: {e}") from e
        res = subprocess.run(nvcc_command(spec, tmp), capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{spec.source}: NVRTC ({e}) and nvcc failed:\n{res.stderr}") from e
    tmp.replace(out)
    return out


def raise_smem_limit(f, smem: int, *key):
    """Raise kernel ``f``'s dynamic shared-memory limit to at least ``smem`` bytes (the
    attribute belongs to the loaded function, i.e. to each device's copy, named by the
    device and ``key``; the default limit of 48 KB counts static and dynamic shared memory
    together).  The limit only ever grows: one value per function serves every launch of
    it, so a smaller request never lowers what a larger launch of the same function needs."""
    k = (cupy_or_raise().cuda.Device().id, *key)
    if _opted.get(k, 0) < smem:
        f.max_dynamic_shared_size_bytes = int(smem)  # RawKernel → cuFuncSetAttribute
        _opted[k] = int(smem)
    return f


_opted: dict = {}
