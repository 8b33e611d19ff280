"""Single-point mutants of a target module from its ``ast`` (byte-exact positions, so each
mutant is a one-line diff) and the seeded sample of them (docs/mutation.md)."""

from __future__ import annotations

import ast
import difflib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from .targets import EQUIVALENT, Equivalent, Target


@dataclass
class Mutant:
    """One single-point edit: bytes [start, end) of ``path`` replaced by ``new``."""

    path: str
    kind: str
    line: int
    start: int
    end: int
    new: bytes
    scope: str
    id: str = ""
    before: str = ""
    after: str = ""
    status: str = "pending"
    detail: str = ""
    seconds: float = 0.0
    equivalent: Equivalent | None = field(default=None, repr=False)

    def apply(self, src: bytes) -> bytes:
        return src[: self.start] + self.new + src[self.end :]

    def diff(self, src: bytes) -> str:
        a = src.decode().splitlines(keepends=True)
        b = self.apply(src).decode().splitlines(keepends=True)
        d = difflib.unified_diff(a, b, f"a/{self.path}", f"b/{self.path}", n=1)
        return "".join(d)


_BINOP = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Pow: ("**", "*"),
    ast.MatMult: ("@", "*"),
}
_CMP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
}
# augmented assignments: the same swaps as _BINOP for + - * /
_AUG = {
    op: (a + "=", b + "=")
    for op, (a, b) in _BINOP.items()
    if op in (ast.Add, ast.Sub, ast.Mult, ast.Div)
}
_SWAP_NAMES = {
    "min": "max",
    "max": "min",
    "minimum": "maximum",
    "maximum": "minimum",
    "floor": "ceil",
    "ceil": "floor",
    "any": "all",
    "all": "any",
    "argmax": "argmin",
    "argmin": "argmax",
    "up": "down",
    "down": "up",
    "add_up": "add_down",
    "add_down": "add_up",
    "sub_up": "sub_down",
    "sub_down": "sub_up",
    "mul_up": "mul_down",
    "mul_down": "mul_up",
    "sum_up": "sum_down",
    "sum_down": "sum_up",
}
# Calls whose removal keeps the program well-typed: f(x, ...) -> x (outward widening,
# absolute values, float32 rounding of a value, contiguity).
_UNWRAP = {"nextafter", "up", "down", "abs", "f32_up", "float32", "ascontiguousarray"}
_UNWRAP_METHODS = {"astype", "copy"}


def _qualname(stack: list[str]) -> str:
    return ".".join(stack)


class _Collector(ast.NodeVisitor):
    def __init__(self, path: str, src: bytes, skip: tuple[str, ...]):
        self.path, self.src, self.skip = path, src, skip
        self.starts = [0]
        for line in src.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.stack: list[str] = []
        self.in_func = 0
        self.out: list[Mutant] = []
        self.assigned: list[set[str]] = []

    # positions -------------------------------------------------------------------
    def off(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(
            node.end_lineno, node.end_col_offset
        )

    def add(self, kind: str, node, start: int, end: int, new: str):
        self.out.append(
            Mutant(self.path, kind, node.lineno, start, end, new.encode(), _qualname(self.stack))
        )

    def skipped(self) -> bool:
        q = _qualname(self.stack)
        return any(q == s or q.startswith(s + ".") for s in self.skip)

    # structure -------------------------------------------------------------------
    def _body(self, node, is_func: bool):
        self.stack.append(node.name)
        if self.skipped():
            self.stack.pop()
            return
        self.in_func += is_func
        if is_func:
            self.assigned.append({a.arg for a in node.args.args + node.args.kwonlyargs})
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # docstring
        for stmt in body:
            self.visit(stmt)
        if is_func:
            self.assigned.pop()
        self.in_func -= is_func
        self.stack.pop()

    def visit_FunctionDef(self, node):  # decorators, annotations and defaults: not mutated
        self._body(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._body(node, False)

    def visit_Module(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
            if any(isinstance(t, ast.Name) and t.id.startswith("__") for t in targets):
                continue
            self.visit(stmt)

    def visit_Raise(self, node):  # messages of errors: not mutated
        self._stmt_delete(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)

    def visit_With(self, node):
        for item in node.items:  # np.errstate(...) etc.: warnings only
            if not (
                isinstance(item.context_expr, ast.Call)
                and _call_name(item.context_expr) == "errstate"
            ):
                self.visit(item.context_expr)
        for stmt in node.body:
            self.visit(stmt)

    def visit_JoinedStr(self, node):  # f-strings: messages
        return

    # statements ------------------------------------------------------------------
    def _stmt_delete(self, node):
        if not self.in_func:
            return
        a, b = self.span(node)
        self.add("delete-statement", node, a, b, "pass")

    def visit_Assign(self, node):
        if self.in_func and self.assigned:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            rebinding = names and all(n in self.assigned[-1] for n in names)
            if rebinding or any(
                isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets
            ):
                self._stmt_delete(node)
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self.assigned[-1].add(n.id)
        self.visit(node.value)
        for t in node.targets:
            if not isinstance(t, (ast.Name, ast.Tuple)):
                self.visit(t)

    def visit_AugAssign(self, node):
        self._stmt_delete(node)
        if type(node.op) in _AUG:
            a = self.span(node.target)[1]
            b = self.span(node.value)[0]
            self._token(node, "augassign", a, b, *_AUG[type(node.op)])
        self.visit(node.value)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call):
            self._stmt_delete(node)
        self.visit(node.value)

    def visit_Continue(self, node):
        self._stmt_delete(node)

    def visit_For(self, node):
        if self.in_func and self.assigned:
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    self.assigned[-1].add(n.id)
        self.generic_visit(node)

    def visit_If(self, node):
        if self.in_func:
            a, b = self.span(node.test)
            self.add("negate-condition", node.test, a, b, f"not ({self._text(a, b)})")
        self.generic_visit(node)

    def visit_IfExp(self, node):
        a, b = self.span(node.test)
        self.add("negate-condition", node.test, a, b, f"not ({self._text(a, b)})")
        self.generic_visit(node)

    # expressions -----------------------------------------------------------------
    def _text(self, a: int, b: int) -> str:
        return self.src[a:b].decode()

    def _token(self, node, kind: str, a: int, b: int, old: str, new: str):
        """Replace operator ``old`` found in the gap src[a:b] by ``new``."""
        gap = self._text(a, b)
        m = re.search(r"(?<![<>=!*/])" + re.escape(old) + r"(?![=*/])", gap.split("#")[0])
        if m is None:
            return
        ga = a + len(gap[: m.start()].encode())
        self.add(kind, node, ga, ga + len(old.encode()), new)

    def visit_BinOp(self, node):
        if type(node.op) in _BINOP:
            self._token(
                node, "binop", self.span(node.left)[1], self.span(node.right)[0],
                *_BINOP[type(node.op)],
            )  # fmt: skip
        self.generic_visit(node)

    def visit_Compare(self, node):
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            if type(op) in _CMP:
                self._token(node, "compare", self.span(left)[1], self.span(right)[0],
                            *_CMP[type(op)])  # fmt: skip
            left = right
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in zip(node.values[:-1], node.values[1:], strict=True):
            a, b = self.span(left)[1], self.span(right)[0]
            gap = self._text(a, b)
            m = re.search(rf"\b{old}\b", gap)
            if m:
                ga = a + len(gap[: m.start()].encode())
                self.add("boolop", node, ga, ga + len(old), new)
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, (ast.USub, ast.Not)):
            a, b = self.span(node)
            oa, ob = self.span(node.operand)
            self.add("drop-unary", node, a, b, f"({self._text(oa, ob)})")
        self.generic_visit(node)

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            new = repr(not v)
        elif isinstance(v, int):
            new = repr(v + 1)
        elif isinstance(v, float):
            new = repr(v * 2.0) if v != 0.0 else "1.0"
        else:
            return
        a, b = self.span(node)
        self.add("constant", node, a, b, new)

    def visit_Call(self, node):
        name = _call_name(node)
        f = node.func
        if name in _SWAP_NAMES:
            a, b = self.span(f)
            self.add("swap-call", node, b - len(name), b, _SWAP_NAMES[name])
        if (
            name in _UNWRAP
            and node.args
            and not node.keywords
            and isinstance(f, ast.Name | ast.Attribute)
        ):
            if name == "float32" and len(node.args) != 1:
                pass
            else:
                a, b = self.span(node)
                xa, xb = self.span(node.args[0])
                self.add("remove-call", node, a, b, f"({self._text(xa, xb)})")
        if name in _UNWRAP_METHODS and isinstance(f, ast.Attribute):
            a, b = self.span(node)
            xa, xb = self.span(f.value)
            self.add("remove-call", node, a, b, f"({self._text(xa, xb)})")
        if name == "errstate":
            return
        self.generic_visit(node)


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _line_of(src: bytes, pos: int) -> str:
    a = src.rfind(b"\n", 0, pos) + 1
    b = src.find(b"\n", pos)
    return src[a : b if b >= 0 else len(src)].decode().strip()


def generate(root: Path, target: Target) -> list[Mutant]:
    """Every mutant of ``target`` (deterministic order), each compiled once to reject
    edits that are not valid Python; ``id`` = module stem, line, kind and index."""
    src = (root / target.path).read_bytes()
    col = _Collector(target.path, src, target.skip)
    col.visit(ast.parse(src))
    seen, out = set(), []
    stem = target.id_stem
    for m in sorted(col.out, key=lambda m: (m.start, m.end, m.kind, m.new)):
        key = (m.start, m.end, m.new)
        if key in seen or src[m.start : m.end] == m.new:
            continue
        seen.add(key)
        new_src = m.apply(src)
        try:
            compile(new_src, target.path, "exec")
        except SyntaxError:
            continue
        m.before = _line_of(src, m.start)
        m.after = _line_of(new_src, m.start)
        m.id = f"{stem}:{m.line}:{m.kind}:{len(out)}"
        out.append(m)
    return out


def match_equivalent(m: Mutant) -> Equivalent | None:
    for e in EQUIVALENT:
        if e.path == m.path and e.before == m.before and e.after == m.after:
            return e
    return None


def sample(mutants: dict[str, list[Mutant]], n: int, seed: int, floor: int = 3) -> list[Mutant]:
    """Deterministic sample of ``n`` mutants: at least ``floor`` per module, the rest
    proportional to each module's share (a seeded shuffle of the whole pool)."""
    rng = random.Random(seed)
    pools = {p: rng.sample(ms, len(ms)) for p, ms in sorted(mutants.items())}
    picked = {p: pool[:floor] for p, pool in pools.items()}
    rest = [m for p, pool in pools.items() for m in pool[floor:]]
    rng.shuffle(rest)
    need = max(0, n - sum(len(v) for v in picked.values()))
    out = [m for v in picked.values() for m in v] + rest[:need]
    out = out[:n] if n < len(out) else out
    return sorted(out, key=lambda m: (m.path, m.start, m.id))


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------
