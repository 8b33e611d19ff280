"""SASS digests of every kernel build, without a GPU: the check that a restructuring of
``csrc/`` changed no instruction of any kernel (docs/design.md "Kernel sources").

Each build (a source, a target, the defines of one variant) is compiled to a cubin with the
machine's ``nvcc`` and disassembled with ``cuobjdump -sass``; a kernel's digest is the
SHA-256 of its instructions and their encodings.  Equal digests before and after a change
mean equal machine code, hence equal values and ids on every input.  ``--compiler nvrtc``
compiles with libnvrtc (the CUDA wheel ``nvidia-cuda-nvrtc`` or the toolkit's) and the
options the library's builds use — CuPy's for the portable modules (``CUPY_NVRTC``, as
CuPy 14.2 passes them on the H200: docs/records/gpu_tests.md, a26d777) and
``_build.SM90A_NVRTC`` for the Hopper one — so its digests are those of the code that runs,
up to NVRTC's version; the default ``nvcc`` stands in with the same flags.  What is
compared is one compiler's output before and after.

    git archive OLD dosa_cupy/csrc | tar -x -C /tmp/old
    python -m dosa_cupy.sass --csrc /tmp/old/dosa_cupy/csrc --out before.json
    python -m dosa_cupy.sass --out after.json       # the working tree
    python -m dosa_cupy.sass --compare before.json after.json

``cuobjdump`` comes with the CUDA toolkit or the PyPI package ``nvidia-cuda-cuobjdump``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dosa_ref.cmdline import CommandParser

__all__ = [
    "BUILDS",
    "CUPY_NVRTC",
    "Build",
    "compare",
    "compare_code",
    "digests",
    "main",
    "nvrtc_compile",
    "nvrtc_library",
]

CSRC = Path(__file__).resolve().parent / "csrc"
_SM90 = ("-arch=sm_90",)
_SM90A = ("-gencode=arch=compute_90a,code=sm_90a",)


@dataclass(frozen=True)
class Build:
    """One compilation: ``source`` (a file of csrc/), nvcc target flags, ``defines``."""

    source: str
    target: tuple[str, ...]
    defines: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        arch = "sm_90a" if self.target == _SM90A else "sm_90"
        return " ".join((self.source, arch, *self.defines))


def _variants(source: str, target, axes: list[tuple[str, ...]]) -> list[Build]:
    """Every combination of one define (or none: "") from each axis."""
    out = [()]
    for axis in axes:
        out = [d + ((v,) if v else ()) for d in out for v in axis]
    return [Build(source, target, d) for d in out]


TILES = ("DOSA_TILE_N=128", "DOSA_TILE_N=256")
BUILDS = (
    # kernels.cu: the NVRTC module (tile, unroll)
    *_variants("kernels.cu", _SM90, [TILES, ("", "DOSA_SCREEN_UNROLL=1")]),
    # the Hopper screen (sm90a.py): tile, plan width
    *_variants("screen_sm90a.cu", _SM90A, [TILES, ("", "DOSA_WG_MTS=2")]),
    # the other modules (decode.cu, plan.cu, the FP8 scorer's: a KernelSpec each): each on
    # its own, the sm_90a ones (code under __CUDA_ARCH_FEAT_SM90_ALL, empty for sm_90) for
    # sm_90a
    *(Build(p.name, _SM90A if "__CUDA_ARCH_FEAT_SM90_ALL" in p.read_text() else _SM90)
      for p in sorted(CSRC.glob("*.cu")) if p.name not in (
        "kernels.cu", "screen_sm90a.cu", "prepare.cu", "dense.cu", "fused.cu", "seeds.cu",
        "screen.cu", "refine.cu", "select.cu", "e4m3_round.cu", "seed_ids.cu")),
)  # fmt: skip

_FUNC = re.compile(r"^\s*Function : (\S+)\s*$")
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*$")


def _tool(name: str) -> str:
    from ._build import nvcc  # the project's one nvcc lookup ($DOSA_NVCC, PATH, $CUDA_HOME)

    found = nvcc() if name == "nvcc" else shutil.which(name)
    if found:
        return found
    if name == "cuobjdump":  # the PyPI package nvidia-cuda-cuobjdump
        try:
            import nvidia

            for root in nvidia.__path__:
                for p in Path(root).glob("*/bin/cuobjdump"):
                    return str(p)
        except ImportError:
            pass
    raise ValueError(f"{name}: not found (the CUDA toolkit, or pip install nvidia-cuda-cuobjdump)")


def _sass_functions(text: str) -> dict[str, str]:
    """``cuobjdump -sass`` output → {kernel: SHA-256 of its instruction lines}."""
    out, name, lines = {}, None, []

    def close():
        if name is not None:
            out[name] = hashlib.sha256("\n".join(lines).encode()).hexdigest()

    for raw in text.splitlines():
        m = _FUNC.match(raw)
        if m:
            close()
            name, lines = m.group(1), []
        elif name is not None:
            # whitespace collapsed: cuobjdump pads its columns to the widest line of the dump
            ins = _INSN.match(raw)
            if ins:
                lines.append(" ".join(ins.group(1).split()))
            elif raw.strip().startswith("/* 0x"):  # the second encoding word of a line
                lines.append(raw.strip())
    close()
    return out


# CuPy 14.2's own NVRTC options beside the caller's (its include folders aside): a cubin
# for the device's architecture, flush-to-zero, unannotated functions on the device.
CUPY_NVRTC = ("-ftz=true", "-arch=sm_90", "--device-as-default-execution-space")


def nvrtc_library():
    """libnvrtc as a ctypes library (the CUDA wheel's ``nvidia/cu13``, else the system's),
    or None.  Its builtins library beside it is loaded first (global symbols), since the
    wheel's folder is not on the loader's path."""
    import ctypes
    import ctypes.util

    names = [ctypes.util.find_library("nvrtc")]
    for p in sys.path:
        for lib in Path(p).glob("nvidia/cu1*/lib/libnvrtc.so*"):
            for b in lib.parent.glob("libnvrtc-builtins.so*"):
                try:
                    ctypes.CDLL(str(b), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
            names.append(str(lib))
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def nvrtc_include_dirs() -> list[str]:
    """CUDA headers for cuda_fp8.h (NVRTC has no default include path)."""
    dirs = [str(p.parent) for p in Path("/usr/local").glob("cuda*/include/cuda_fp8.h")]
    for p in sys.path:
        dirs += [str(x.parent) for x in Path(p).glob("nvidia/cu1*/include/cuda_fp8.h")]
    return dirs


def nvrtc_compile(lib, src: Path, options, get: str = "CUBIN") -> tuple[bytes, str]:
    """(the ``get`` output — "CUBIN" or "PTX" — and the program log) of ``src`` compiled by
    the ctypes libnvrtc ``lib`` with ``options``; RuntimeError with the log on failure."""
    import ctypes

    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.read_bytes(), src.name.encode(), 0,
                              None, None) != 0:  # fmt: skip
        raise RuntimeError(f"{src.name}: nvrtcCreateProgram failed")
    try:
        opts = [o.encode() for o in options] + [f"-I{d}".encode() for d in nvrtc_include_dirs()]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise RuntimeError(f"{src.name}: NVRTC failed\n{log.value.decode()[-2000:]}")
        getattr(lib, f"nvrtcGet{get}Size")(prog, ctypes.byref(n))
        out = ctypes.create_string_buffer(n.value)
        getattr(lib, f"nvrtcGet{get}")(prog, out)
        return out.raw, log.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _compile(b: Build, compiler, cubin: Path, csrc: Path) -> None:
    """``b`` to ``cubin`` with nvcc (``compiler`` its path) or NVRTC (a ctypes library)."""
    ours = ("-std=c++17", f"-I{csrc}", *(f"-D{d}" for d in b.defines))
    if isinstance(compiler, str):
        cmd = [compiler, "-cubin", *b.target, "-ftz=true", *ours, "-o", str(cubin),
               str(csrc / b.source)]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{b.name}: nvcc failed\n{res.stderr[-2000:]}")
        return
    from ._build import SM90A_NVRTC

    extra = SM90A_NVRTC if b.target == _SM90A else CUPY_NVRTC
    cubin.write_bytes(nvrtc_compile(compiler, csrc / b.source, ours + extra)[0])


def _digest_one(b: Build, compiler, cuobjdump: str, tmp: Path, csrc: Path) -> tuple[str, dict]:
    cubin = tmp / (hashlib.sha256(b.name.encode()).hexdigest()[:16] + ".cubin")
    _compile(b, compiler, cubin, csrc)
    # cuobjdump runs nvdisasm, which the PyPI packages put beside it
    env = dict(os.environ, PATH=f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    if sass.returncode != 0:
        raise RuntimeError(f"{b.name}: cuobjdump failed\n{sass.stderr[-2000:]}")
    return b.name, _sass_functions(sass.stdout)


def digests(builds=BUILDS, jobs: int | None = None, csrc: Path = CSRC,
            compiler: str = "nvcc") -> dict[str, dict[str, str]]:  # fmt: skip
    """{build name: {kernel: digest}} for ``builds`` of the sources in ``csrc`` (default:
    this package's; another commit's ``dosa_cupy/csrc`` from ``git archive``), compiled
    ``jobs`` at a time by ``compiler`` ("nvcc" or "nvrtc")."""
    if compiler == "nvrtc":
        comp = nvrtc_library()
        if comp is None:
            raise ValueError("compiler: libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    elif compiler == "nvcc":
        comp = _tool("nvcc")
    else:
        raise ValueError(f"compiler: expected nvcc or nvrtc, got {compiler!r}")
    cuobjdump = _tool("cuobjdump")
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(jobs or os.cpu_count()) as ex:
        res = ex.map(lambda b: _digest_one(b, comp, cuobjdump, Path(d), Path(csrc)), builds)
        return dict(sorted(res))


def compare(a: dict, b: dict) -> list[str]:
    """The differences of two digest tables, one line each (empty: the same code)."""
    lines = []
    for build in sorted(set(a) | set(b)):
        ka, kb = a.get(build), b.get(build)
        if ka is None or kb is None:
            lines.append(f"{build}: only in {'the second' if ka is None else 'the first'}")
            continue
        for k in sorted(set(ka) | set(kb)):
            if ka.get(k) != kb.get(k):
                what = "missing" if k not in kb else "added" if k not in ka else "changed"
                lines.append(f"{build}: {k} {what}")
    return lines


def compare_code(a: dict, b: dict) -> list[str]:
    """The machine code of two digest tables compared by content, not by name: one line per
    digest found in only one of them, naming every (build, kernel) that holds it (empty:
    every kernel of either has its exact instructions in the other).  For restructurings
    that rename kernels or move a variant from a define into a template parameter."""

    def where(t):
        out: dict[str, list[str]] = {}
        for build, ks in t.items():
            for k, d in ks.items():
                out.setdefault(d, []).append(f"{build}: {k}")
        return out

    wa, wb = where(a), where(b)
    lines = [f"only in the first: {', '.join(sorted(wa[d]))}" for d in sorted(set(wa) - set(wb))]
    lines += [f"only in the second: {', '.join(sorted(wb[d]))}" for d in sorted(set(wb) - set(wa))]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = CommandParser(prog="python -m dosa_cupy.sass", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the digests (JSON) here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two digest files")
    ap.add_argument(
        "--by-code", action="store_true", help="with --compare: match kernels by their code"
    )
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc runs (default: cores)")
    ap.add_argument("--csrc", type=Path, default=CSRC, help="the kernel sources (default: ours)")
    ap.add_argument(
        "--compiler", choices=("nvcc", "nvrtc"), default="nvcc", help="the compiler (nvcc)"
    )
    a = ap.parse_args(argv)
    if a.compare:
        tabs = [json.loads(p.read_text()) for p in a.compare]
        diff = (compare_code if a.by_code else compare)(*tabs)
        n = sum(len(v) for v in tabs[0].values())
        print("\n".join(diff) if diff else f"identical: {len(tabs[0])} builds, {n} kernels")
        return 1 if diff else 0
    if a.out is None:
        ap.error("--out: give a file to write the digests to (or --compare A B)")
    table = digests(jobs=a.jobs, csrc=a.csrc, compiler=a.compiler)
    a.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} builds, {sum(len(v) for v in table.values())} kernels → {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
