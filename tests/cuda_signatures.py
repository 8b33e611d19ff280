"""Shared CPU-test support: .cu sources with their local includes inlined, kernel parameter
lists parsed from them, and the check that a host launch passes arguments of exactly those
types (count, dtypes — int vs long long, float vs double — and C-contiguous arrays), as the
kernels' numpy emulations in the CPU tests do before they run."""

import re
from pathlib import Path

import numpy as np

CTYPES = {
    "uint8_t*": np.uint8, "float*": np.float32, "double*": np.float64, "int*": np.int32,
    "unsigned int*": np.uint32, "uint32_t*": np.uint32, "unsigned long long*": np.uint64,
    "int": np.int32, "long long": np.int64, "double": np.float64,
}  # fmt: skip


TOGGLE = "DOSA_TIE_RULE"  # the one build switch whose blocks change kernel signatures


def select_build(src: str, tie: bool = False) -> str:
    """``src`` with the blocks of ``#ifdef`` / ``#ifndef DOSA_TIE_RULE`` (and their
    ``#else`` / ``#endif /* DOSA_TIE_RULE */``) resolved for the plain (``tie=False``) or
    the tie-aware build; every other directive is left as it is."""
    out, keep = [], None
    for line in src.splitlines(keepends=True):
        t = line.strip()
        if t in (f"#ifdef {TOGGLE}", f"#ifndef {TOGGLE}"):
            keep = tie if t.startswith("#ifdef") else not tie
        elif t == f"#else /* {TOGGLE} */" and keep is not None:
            keep = not keep
        elif t == f"#endif /* {TOGGLE} */" and keep is not None:
            keep = None
        elif keep is None or keep:
            out.append(line)
    text = "".join(out)
    # the build's parameter macros (#define DOSA_TIE_IN ..., screen.cu), expanded in place
    defs = dict(re.findall(r"^#define (DOSA_TIE_\w+)[ \t]*(.*)$", text, flags=re.M))
    text = re.sub(r"^#define DOSA_TIE_\w+.*\n?", "", text, flags=re.M)
    for name, body in defs.items():
        text = re.sub(rf"\b{name}\b", body, text)
    return text


def read_source(path: Path, _seen: set | None = None, tie: bool = False) -> str:
    """The text of ``path`` with every ``#include "name"`` of a file next to it replaced by
    that file's text (recursively, each file once: kernels.cu is a list of includes of its
    stage files)."""
    seen = set() if _seen is None else _seen
    path = Path(path)
    seen.add(path.name)

    def inline(m):
        name = m.group(1)
        if name in seen or not (path.parent / name).exists():
            return "" if name in seen else m.group(0)
        return read_source(path.parent / name, seen, tie)

    text = re.sub(r'^#include "([^"]+)"[^\n]*$', inline, path.read_text(), flags=re.M)
    return select_build(text, tie)


def params(src: str, pattern: str) -> list[tuple[type, str]]:
    """(numpy type, name) of each parameter of the first function whose name matches the
    regex ``pattern`` and is followed by its parameter list and a body (macro line
    continuations joined)."""
    src = src.replace("\\\n", " ")
    text = re.search(pattern + r"\(\s*(.*?)\)\s*\{", src, re.S).group(1)
    out = []
    for p in text.split(","):
        words = p.replace("const", "").replace("__restrict__", "").split()
        out.append((CTYPES[" ".join(words[:-1]).replace(" *", "*")], words[-1]))
    return out


def param_types(src: str, pattern: str) -> list[type]:
    """The numpy types of ``params(src, pattern)``."""
    return [t for t, _ in params(src, pattern)]


def check_args(name: str, args, types) -> None:
    """A launch of kernel ``name`` passes one argument per parameter, of its type;
    arrays are C-contiguous."""
    assert len(args) == len(types), (name, len(args), len(types))
    for i, (a, t) in enumerate(zip(args, types, strict=True)):
        assert np.asarray(a).dtype == t, (name, i, np.asarray(a).dtype, t)
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous, (name, i)
