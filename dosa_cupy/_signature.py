"""The parameter lists of the CUDA kernels, read from their sources, and the check of a
launch's arguments against them.

CuPy packs a launch's argument tuple by the arguments' own types (an array: its device
pointer; a numpy scalar: its bytes), not by the kernel's parameters, so np.int64 where the
kernel takes ``int``, or a float64 array where it reads ``float*``, launches and computes
garbage.  ``signatures(spec)`` reads every ``extern "C" __global__`` kernel of a build from
its source as the compiler sees it: local includes inlined, conditionals evaluated and
macros expanded (object-like and function-like, ``#`` and ``##``) with the build's defines,
so the kernels that a macro instantiates (``SCREEN_INST(1)`` → ``screen_mt1``,
``screen_mt1_tie``, ...) and parameter lists assembled from macros are found as built.
``check_launch`` compares one launch's arguments with such a list; ``LaunchCheck`` does so
once per distinct tuple of argument types, for ``_build.Kernel``.

``read_source`` / ``params`` read the sources as written (function-like macros kept, so a
test can name a macro's definition, ``screen_mt##MTS``).  Pure Python: no CuPy import (the
CPU tests run the checks with numpy arrays standing in for CuPy's).
"""

from __future__ import annotations

import functools
import operator
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

CSRC = Path(__file__).resolve().parent / "csrc"

# C scalar type → numpy type (LP64: the device's long long is 64-bit)
SCALARS = {
    "int": np.int32, "int32_t": np.int32, "unsigned int": np.uint32, "unsigned": np.uint32,
    "uint32_t": np.uint32, "long long": np.int64, "long long int": np.int64,
    "int64_t": np.int64, "unsigned long long": np.uint64, "unsigned long long int": np.uint64,
    "uint64_t": np.uint64, "float": np.float32, "double": np.float64, "uint8_t": np.uint8,
    "unsigned char": np.uint8, "int8_t": np.int8, "uint16_t": np.uint16, "int16_t": np.int16,
}  # fmt: skip
# device types a kernel reads a byte array as, so that the host passes the bytes (a uint8
# array): vectors (check_values_*: the e4m3 payloads as 16-byte words) and structs
# (tma_probe: a tensor map in global memory)
BYTES = ("uint4", "dosa::TensorMap")
# structs passed by value, by size in bytes: the host passes a numpy structured scalar
# (np.void) of that size (dosa_cupy/tma.py TMAP_DTYPE for csrc/ptx_sm90a.cuh's TensorMap)
STRUCTS = {"dosa::TensorMap": 128}
# every parameter type: a scalar, a struct by value, or a pointer ("float*") to a scalar or
# to bytes
CTYPES = {
    **SCALARS, **{c: np.dtype((np.void, n)) for c, n in STRUCTS.items()},
    **{f"{c}*": t for c, t in SCALARS.items()}, **{f"{c}*": np.uint8 for c in BYTES},
}  # fmt: skip
_QUALIFIERS = frozenset(("const", "volatile", "__restrict__", "__restrict", "__grid_constant__"))


class Param(NamedTuple):
    """One kernel parameter: the numpy type its argument must have (the dtype of an array
    for a pointer, the scalar's type otherwise; for a struct by value the np.void dtype of
    its size), its name, and its C type without qualifiers ("const float* __restrict__" →
    "float*")."""

    dtype: type | np.dtype
    name: str
    ctype: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")


# ---------------------------------------------------------------------------------------
# Tokens and parameter lists
# ---------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"[A-Za-z_]\w*|\.?\d(?:[eEpP][+-]|[\w.])*"  # identifiers, preprocessing numbers
    r'|"(?:\\.|[^"\\\n])*"' r"|'(?:\\.|[^'\\\n])*'"  # string and character literals
    r"|##|\.\.\.|->|<<=|>>=|<<|>>|<=|>=|==|!=|&&|\|\||::|\+\+|--|\S"
)  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_]\w*")


def tokenize(text: str) -> list[str]:
    """The preprocessing tokens of ``text`` (comments must already be removed)."""
    return _TOKEN.findall(text)


def parse_params(tokens: list[str], where: str = "") -> tuple[Param, ...]:
    """The parameters of a parameter list given as its tokens (those between the
    parentheses); ``where`` names the function in errors."""
    out, cur, depth = [], [], 0
    for t in [*tokens, ","]:
        if t == "," and depth == 0:
            if cur and cur != ["void"]:
                out.append(_param(cur, where))
            cur = []
            continue
        depth += (t in "([<") - (t in ")]>")
        cur.append(t)
    return tuple(out)


def _param(words: list[str], where: str) -> Param:
    words = [w for w in words if w not in _QUALIFIERS]
    if len(words) < 2 or not _IDENT.fullmatch(words[-1]):
        raise ValueError(f"{where}: cannot read the parameter {' '.join(words)!r}")
    stars = words.count("*")
    ctype = " ".join(w for w in words[:-1] if w != "*").replace(" :: ", "::") + "*" * stars
    if ctype not in CTYPES:
        raise ValueError(
            f"{where}: parameter {words[-1]}: C type {ctype!r} has no numpy type "
            "(dosa_cupy._signature.CTYPES)"
        )
    return Param(CTYPES[ctype], words[-1], ctype)


# ---------------------------------------------------------------------------------------
# The sources as written (tests match a macro's definition text)
# ---------------------------------------------------------------------------------------


def expand_object_macros(src: str) -> str:
    """``src`` with every object-like macro (``#define NAME body``, no parameter list; line
    continuations joined) removed and its body written in at each later use, so that kernel
    parameter lists assembled from macros (screen.cu ``SCREEN_PARAMS_IN``) read as written
    out.  Function-like macros and every other directive are left as they are, and every
    ``#define`` counts whatever conditional it stands in (``preprocess`` evaluates them)."""
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
    m = re.search(pattern + r"\(\s*(.*?)\)\s*\{", src, re.S)
    if m is None:
        raise ValueError(f"no function matching {pattern!r} with a parameter list and a body")
    return [(p.dtype, p.name) for p in parse_params(tokenize(m.group(1)), pattern)]


def param_types(src: str, pattern: str) -> list[type]:
    """The numpy types of ``params(src, pattern)``."""
    return [t for t, _ in params(src, pattern)]


# ---------------------------------------------------------------------------------------
# The sources as compiled: a preprocessor for what a parameter list can depend on
# ---------------------------------------------------------------------------------------

_NOHIDE: frozenset = frozenset()
_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_DEFINE = re.compile(r"#\s*define\s+(\w+)(?:\(([^)]*)\))?(.*)", re.S)


class _Macro(NamedTuple):
    params: tuple[str, ...] | None  # None: object-like
    body: tuple[str, ...]
    variadic: bool = False


def _strip_comments(text: str) -> str:
    # a comment is one space (C's translation phase 3); literals are kept as they are
    return _COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), text)


class _Preprocessor:
    """One translation unit: ``#include "..."`` from the including file's folder, then from
    ``include_dirs`` (``<...>`` includes are skipped: no kernel of csrc/ is declared in a
    system header), ``#pragma once``, ``#if``/``#ifdef``/``#ifndef``/``#elif``/``#else``/
    ``#endif``, ``#define``/``#undef`` and macro expansion with hide sets (C11 6.10.3).  No
    compiler-predefined macro is defined, so a parameter list must not depend on one (the
    sources use them only inside function bodies)."""

    def __init__(self, include_dirs: tuple[Path, ...], defines: tuple[str, ...]):
        self.dirs = include_dirs
        self.macros: dict[str, _Macro] = {}
        for d in defines:
            name, eq, value = d.partition("=")
            self.macros[name] = _Macro(None, tuple(tokenize(value if eq else "1")))
        self.once: set[Path] = set()
        self.tokens: list[str] = []

    def run(self, path: Path) -> list[str]:
        self._file(Path(path).resolve())
        return self.tokens

    def _file(self, path: Path) -> None:
        if path in self.once:
            return
        text = _strip_comments(path.read_text().replace("\\\r\n", "").replace("\\\n", ""))
        cond: list[list[bool]] = []  # per open #if: [enclosing region active, branch taken]
        active, pending = True, []
        for line in text.split("\n"):
            s = line.lstrip()
            if not s.startswith("#"):
                if active:
                    pending.append(line)
                continue
            toks = tokenize(s[1:])
            d = toks[0] if toks else ""
            if d in ("if", "ifdef", "ifndef"):
                if not active:
                    val = False
                elif d == "if":
                    val = self._eval(toks[1:], path)
                else:
                    val = (toks[1] in self.macros) == (d == "ifdef")
                cond.append([active, val])
                active = val
            elif d == "elif":
                outer, taken = cond[-1]
                active = outer and not taken and self._eval(toks[1:], path)
                cond[-1][1] = taken or active
            elif d == "else":
                outer, taken = cond[-1]
                active, cond[-1][1] = outer and not taken, True
            elif d == "endif":
                active = cond.pop()[0]
            elif active and d in ("define", "undef", "include", "pragma"):
                self._flush(pending)
                if d == "define":
                    self._define(s, path)
                elif d == "undef":
                    self.macros.pop(toks[1], None)
                elif d == "include":
                    self._include(s, path)
                elif toks[1:2] == ["once"]:
                    self.once.add(path)
        if cond:
            raise ValueError(f"{path.name}: #if without #endif")
        self._flush(pending)

    def _flush(self, lines: list[str]) -> None:
        if lines:
            toks = [(t, _NOHIDE) for t in tokenize("\n".join(lines))]
            self.tokens.extend(t for t, _ in _expand(toks, self.macros))
            lines.clear()

    def _define(self, line: str, path: Path) -> None:
        m = _DEFINE.match(line)
        if m is None:
            raise ValueError(f"{path.name}: cannot read {line.strip()!r}")
        name, plist, body = m.group(1), m.group(2), tuple(tokenize(m.group(3)))
        if plist is None:
            self.macros[name] = _Macro(None, body)
            return
        ps = [p.strip() for p in plist.split(",") if p.strip()]
        variadic = bool(ps) and ps[-1] == "..."
        if variadic:
            ps[-1] = "__VA_ARGS__"
        self.macros[name] = _Macro(tuple(ps), body, variadic)

    def _include(self, line: str, path: Path) -> None:
        m = re.match(r'#\s*include\s*"([^"]+)"', line)
        if m is None:
            return  # <...>: a system or toolkit header
        for d in (path.parent, *self.dirs):
            if (d / m.group(1)).exists():
                self._file((d / m.group(1)).resolve())
                return
        raise ValueError(f"{path.name}: include {m.group(1)!r} not found")

    def _eval(self, toks: list[str], path: Path) -> bool:
        out, i = [], 0
        while i < len(toks):  # defined X, defined(X): before expansion
            if toks[i] == "defined":
                paren = toks[i + 1] == "("
                name = toks[i + 2] if paren else toks[i + 1]
                out.append("1" if name in self.macros else "0")
                i += 4 if paren else 2
            else:
                out.append(toks[i])
                i += 1
        expr = [t for t, _ in _expand([(t, _NOHIDE) for t in out], self.macros)]
        try:
            return _CondExpr(expr).value() != 0
        except (IndexError, ValueError) as e:
            raise ValueError(f"{path.name}: #if {' '.join(toks)}: {e}") from e


def _expand(tokens: list[tuple[str, frozenset]], macros: dict) -> list[tuple[str, frozenset]]:
    """``tokens`` (text, hide set) with every macro expanded and the result rescanned."""
    stack = tokens[::-1]  # the next token is stack[-1]
    out = []
    while stack:
        tok = stack.pop()
        text, hide = tok
        m = macros.get(text)
        if m is None or text in hide:
            out.append(tok)
            continue
        if m.params is None:
            stack.extend(_subst(text, m, [], hide | {text}, macros)[::-1])
            continue
        got = _arguments(stack) if stack and stack[-1][0] == "(" else None
        if got is None:  # a function-like macro's name without arguments
            out.append(tok)
            continue
        args, rhide = got
        stack.extend(_subst(text, m, args, (hide & rhide) | {text}, macros)[::-1])
    return [t for t in out if t[0]]  # drop placemarkers


def _arguments(stack: list) -> tuple[list[list], frozenset] | None:
    """The arguments of the invocation whose "(" is ``stack[-1]`` (taken off the stack),
    and the hide set of its ")"; None (nothing taken) if the list does not close."""
    depth, args, cur = 0, [], []
    for i in range(len(stack) - 1, -1, -1):
        tok = stack[i]
        t = tok[0]
        if t == "(":
            depth += 1
            if depth == 1:
                continue
        elif t == ")":
            depth -= 1
            if depth == 0:
                args.append(cur)
                del stack[i:]
                return args, tok[1]
        elif t == "," and depth == 1:
            args.append(cur)
            cur = []
            continue
        cur.append(tok)
    return None


def _subst(name: str, m: _Macro, args: list[list], hs: frozenset, macros: dict) -> list:
    """The body of macro ``m`` with its parameters replaced by ``args`` (fully expanded,
    or as written next to ``#``/``##``), ``##`` pasted, hide set ``hs`` added."""
    ps = m.params or ()
    if m.params is not None:
        if m.variadic and len(args) >= len(ps) - 1:
            va = [tok for a in args[len(ps) - 1 :] for tok in (*a, (",", _NOHIDE))][:-1]
            args = [*args[: len(ps) - 1], va]
        elif not ps and args == [[]]:
            args = []
        if len(args) != len(ps):
            raise ValueError(f"macro {name}: {len(args)} arguments for {len(ps)} parameters")
    amap = dict(zip(ps, args, strict=True))
    body = m.body
    pieces: list = []  # token lists, and "##" between the operands of a paste
    i = 0
    while i < len(body):
        t = body[i]
        if t == "#" and m.params is not None and i + 1 < len(body) and body[i + 1] in amap:
            text = " ".join(tok[0] for tok in amap[body[i + 1]])
            pieces.append([('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"', _NOHIDE)])
            i += 2
            continue
        if t == "##":
            pieces.append("##")
        elif t in amap:
            pasted = (i > 0 and body[i - 1] == "##") or (i + 1 < len(body) and body[i + 1] == "##")
            a = amap[t]
            pieces.append((list(a) or [("", _NOHIDE)]) if pasted else _expand(list(a), macros))
        else:
            pieces.append([(t, _NOHIDE)])
        i += 1
    out: list = []
    j = 0
    while j < len(pieces):
        p = pieces[j]
        if p == "##":
            rhs = pieces[j + 1]
            lhs = out.pop()
            out.append((lhs[0] + rhs[0][0], _NOHIDE))
            out.extend(rhs[1:])
            j += 2
            continue
        out.extend(p)
        j += 1
    return [(t, h | hs) for t, h in out]


class _CondExpr:
    """The value of an ``#if`` expression (already macro-expanded): C's integer operators
    with C's precedence; an identifier left over is 0."""

    _BINARY = (
        ("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="),
        ("<<", ">>"), ("+", "-"), ("*", "/", "%"),
    )  # fmt: skip

    def __init__(self, toks: list[str]):
        self.toks, self.i = toks, 0

    def value(self) -> int:
        v = self._ternary()
        if self.i != len(self.toks):
            raise ValueError(f"unexpected {self.toks[self.i]!r}")
        return v

    def _peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _ternary(self) -> int:
        c = self._binary(0)
        if self._peek() != "?":
            return c
        self.i += 1
        a = self._ternary()
        if self._peek() != ":":
            raise ValueError("'?' without ':'")
        self.i += 1
        b = self._ternary()
        return a if c else b

    def _binary(self, level: int) -> int:
        if level == len(self._BINARY):
            return self._unary()
        v = self._binary(level + 1)
        while self._peek() in self._BINARY[level]:
            op = self.toks[self.i]
            self.i += 1
            w = self._binary(level + 1)
            v = _apply(op, v, w)
        return v

    def _unary(self) -> int:
        t = self._peek()
        if t in ("!", "~", "-", "+"):
            self.i += 1
            v = self._unary()
            return {"!": lambda x: int(not x), "~": lambda x: ~x, "-": lambda x: -x,
                    "+": lambda x: x}[t](v)  # fmt: skip
        self.i += 1
        if t == "(":
            v = self._ternary()
            if self._peek() != ")":
                raise ValueError("unbalanced '('")
            self.i += 1
            return v
        if t is None:
            raise ValueError("missing operand")
        if t in ("true", "false"):
            return int(t == "true")
        if _IDENT.fullmatch(t):
            return 0
        m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)[uUlL]*", t)
        if m is None:
            raise ValueError(f"not an integer: {t!r}")
        s = m.group(1)
        return int(s, 16) if s[:2] in ("0x", "0X") else int(s, 8) if s[0] == "0" else int(s)


def _apply(op: str, a: int, b: int) -> int:
    if op in ("/", "%") and b == 0:
        raise ValueError("division by zero")
    return {
        "||": lambda: int(bool(a) or bool(b)), "&&": lambda: int(bool(a) and bool(b)),
        "|": lambda: a | b, "^": lambda: a ^ b, "&": lambda: a & b,
        "==": lambda: int(a == b), "!=": lambda: int(a != b), "<": lambda: int(a < b),
        ">": lambda: int(a > b), "<=": lambda: int(a <= b), ">=": lambda: int(a >= b),
        "<<": lambda: a << b, ">>": lambda: a >> b, "+": lambda: a + b, "-": lambda: a - b,
        "*": lambda: a * b, "/": lambda: int(a / b), "%": lambda: a - b * int(a / b),
    }[op]()  # fmt: skip


def preprocess(path: Path, defines: tuple[str, ...] = (), include_dirs: tuple = ()) -> list[str]:
    """The tokens of ``path`` as the compiler sees them with ``defines`` ("NAME=VALUE" or
    "NAME", as -D): includes inlined, conditionals evaluated, macros expanded."""
    dirs = tuple(Path(d) for d in include_dirs)
    return _Preprocessor(dirs, tuple(defines)).run(Path(path))


def kernels(tokens: list[str], where: str = "") -> dict[str, tuple[Param, ...]]:
    """Name → parameters of every ``extern "C" __global__`` function defined in ``tokens``
    (a translation unit, ``preprocess``); ``where`` names the source in errors."""
    out: dict[str, tuple[Param, ...]] = {}
    for i, t in enumerate(tokens):
        if t != "__global__" or tokens[max(0, i - 2) : i] != ["extern", '"C"']:
            continue
        j = i + 1
        while not (_IDENT.fullmatch(tokens[j]) and tokens[j + 1] == "("):
            j += 1
        while tokens[j] in ("__launch_bounds__", "__attribute__", "__maxnreg__"):
            j = _close(tokens, j + 1) + 1  # past its balanced (...)
            while not (_IDENT.fullmatch(tokens[j]) and tokens[j + 1] == "("):
                j += 1
        name, end = tokens[j], _close(tokens, j + 1)
        if tokens[end + 1] != "{":
            continue  # a declaration
        ps = parse_params(tokens[j + 2 : end], f"{where} {name}")
        if out.get(name, ps) != ps:
            raise ValueError(f"{where}: kernel {name} is defined twice, with different parameters")
        out[name] = ps
    return out


def _close(tokens: list[str], i: int) -> int:
    """The index of the ")" closing the "(" at ``tokens[i]``."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += (tokens[j] == "(") - (tokens[j] == ")")
        if depth == 0:
            return j
    raise ValueError("unbalanced parentheses")


@functools.cache
def source_kernels(source: str, defines: tuple[str, ...] = (), csrc: Path = CSRC) -> dict:
    """Name → parameters of the kernels of ``csrc/source`` built with ``defines`` (cached:
    one read per build)."""
    return kernels(preprocess(Path(csrc) / source, defines, (csrc,)), source)


def signatures(spec, csrc: Path = CSRC) -> dict[str, tuple[Param, ...]]:
    """Name → parameters of every kernel of the build ``spec`` (a ``_build.KernelSpec``:
    its ``source`` under ``csrc`` and its ``defines``)."""
    return source_kernels(spec.source, tuple(spec.defines), Path(csrc))


# ---------------------------------------------------------------------------------------
# The launch check
# ---------------------------------------------------------------------------------------


def _what(a) -> str:
    t = type(a)
    pkg = t.__module__.split(".")[0]
    name = t.__name__ if pkg == "builtins" else f"{pkg}.{t.__name__}"
    if isinstance(a, np.void):
        return f"{name} of {a.dtype.itemsize} bytes"
    if not isinstance(a, np.generic) and all(hasattr(a, k) for k in ("dtype", "shape", "flags")):
        layout = "" if a.flags.c_contiguous else f", not C-contiguous (strides {a.strides})"
        return f"{name} of dtype {a.dtype} and shape {tuple(a.shape)}{layout}"
    return name


def _mismatch(p: Param, a, ndarray_types: tuple) -> str | None:
    """Why argument ``a`` does not fit parameter ``p`` (None: it does)."""
    if p.pointer:
        want = f"a C-contiguous array of dtype {np.dtype(p.dtype).name}"
        if isinstance(a, ndarray_types):
            ok = a.dtype == p.dtype and a.flags.c_contiguous
        else:
            ok = type(a) is np.uint64  # a device address as a number: np.uint64(0) is NULL
        return None if ok else f"expected {want} (or np.uint64 for a null pointer)"
    if isinstance(p.dtype, np.dtype):  # a struct by value
        if isinstance(a, np.void) and a.dtype.itemsize == p.dtype.itemsize:
            return None
        return f"expected a numpy.void scalar of {p.dtype.itemsize} bytes"
    if type(a) is p.dtype:
        return None
    return f"expected a numpy.{p.dtype.__name__} scalar"


def check_launch(kernel: str, params, args, ndarray_types: tuple) -> None:
    """TypeError unless ``args`` fit ``params`` (kernel ``kernel``'s parameters): one
    argument per parameter; for a pointer, an array of one of ``ndarray_types`` (the real
    path: cupy.ndarray) with exactly the pointee's dtype and C-contiguous, or np.uint64 (a
    raw address; 0 is a null pointer); for a scalar, a numpy scalar of exactly its type
    (np.int32 for int, np.int64 for long long, np.float32 for float, np.float64 for
    double, np.uint32 / np.uint64 for the unsigned ones)."""
    params = tuple(params)
    if len(args) != len(params):
        i = min(len(args), len(params))
        which = (
            f"argument {i} ({params[i].ctype} {params[i].name}) is missing"
            if len(args) < len(params)
            else f"argument {i} ({_what(args[i])}) has no parameter"
        )
        raise TypeError(
            f"{kernel}: {len(args)} arguments for {len(params)} parameters: {which} "
            f"(parameters: {', '.join(p.name for p in params)})"
        )
    for i, (p, a) in enumerate(zip(params, args, strict=True)):
        why = _mismatch(p, a, ndarray_types)
        if why is not None:
            raise TypeError(f"{kernel}: argument {i} ({p.ctype} {p.name}): {why}, got {_what(a)}")


def _array_key(ndarray_types: tuple):
    """(dtype, C-contiguity) of an array, read cheaply: CuPy's ndarray keeps its contiguity
    as ``_c_contiguous`` (its ``flags`` builds an object per read, four times the cost)."""
    if all(hasattr(t, "_c_contiguous") for t in ndarray_types):
        return operator.attrgetter("dtype", "_c_contiguous")
    return lambda a: (a.dtype, a.flags.c_contiguous)


class LaunchCheck:
    """``check_launch`` of one kernel, run once per distinct tuple of argument types (type;
    for an array its dtype and contiguity; for a struct its size) and remembered: a launch
    costs a key tuple and a set lookup (about 2.5 us for the screen's 20 arguments on the
    H200's host), with no device synchronization (a captured CUDA graph launches through
    it)."""

    __slots__ = ("kernel", "params", "ndarray_types", "_array_key", "_seen")

    def __init__(self, kernel: str, params, ndarray_types: tuple):
        self.kernel, self.params = kernel, tuple(params)
        self.ndarray_types = tuple(ndarray_types)
        self._array_key = _array_key(self.ndarray_types)
        self._seen: set = set()

    def __call__(self, args) -> None:
        nd, ak, void = self.ndarray_types, self._array_key, np.void
        key = tuple([
            ak(a) if isinstance(a, nd) else a.dtype if type(a) is void else type(a)
            for a in args
        ])  # fmt: skip
        if key not in self._seen:
            check_launch(self.kernel, self.params, args, nd)
            self._seen.add(key)
