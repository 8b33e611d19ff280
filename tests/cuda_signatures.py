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


def expand_object_macros(src: str) -> str:
    """``src`` with every object-like macro (``#define NAME body``, no parameter list; line
    continuations joined) removed and its body written in at each later use, so that kernel
    parameter lists assembled from macros (screen.cu ``SCREEN_PARAMS_IN``) read as written
    out.  Function-like macros and every other directive are left as they are."""
    src = src.replace("\\\n", " ")
    defs = {}
    out = []
    for line in src.splitlines(keepends=True):
        m = re.match(r"^#define (\w+)(?:[ \t]+(.*?))?[ \t]*$", line.rstrip("\n"))
        if m and not re.match(r"^#define \w+\(", line):
            body = re.sub(r"/\*.*?\*/", " ", m.group(2) or "")
            defs[m.group(1)] = re.sub(r"//.*$", "", body).strip()  # the comment is not the body
            continue
        for name, body in defs.items():
            if name in line:
                line = re.sub(rf"\b{name}\b", lambda _m, b=body: b, line)
        out.append(line)
    return "".join(out)


def read_source(path: Path, _seen: set | None = None) -> str:
    """The text of ``path`` with every ``#include "name"`` of a file next to it replaced by
    that file's text (recursively, each file once: kernels.cu is a list of includes of its
    stage files), object-like macros expanded (``expand_object_macros``)."""
    seen = set() if _seen is None else _seen
    path = Path(path)
    seen.add(path.name)

    def inline(m):
        name = m.group(1)
        if name in seen or not (path.parent / name).exists():
            return "" if name in seen else m.group(0)
        return read_source(path.parent / name, seen)

    text = re.sub(r'^#include "([^"]+)"[^\n]*$', inline, path.read_text(), flags=re.M)
    return expand_object_macros(text) if _seen is None else text


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
