"""Mutation testing of the soundness-critical code (``dosa mutate``; docs/mutation.md).

A mutant is one small edit of one target module (an operator swapped, a constant nudged,
a widening call removed, a re-assignment dropped ...).  Each mutant is written into a
private copy of the source tree (the working files are never touched) and a fast,
deterministic subset of the test suite runs against it (``-x``, hypothesis profile
``ci``, no cache, a per-mutant timeout).  A mutant is *killed* when that run fails,
*survives* when it passes, and *times out* when it exceeds the limit (counted as
detected).  Mutants listed in ``EQUIVALENT`` are semantically equivalent to the original
(the argument is stored with them) and are excluded from the score:

    score = (killed + timeouts) / (mutants run − equivalent)

Mutants are generated from Python's ``ast`` with byte-exact source positions, so every
mutant is a one-line (or one-statement) diff of the original file; the sample is a
deterministic function of ``--seed``.  Only the standard library (and pytest, run as a
subprocess) is used.

The modules, the tests run for each and the code that is out of scope live in
``TARGETS``; an integrator who moves code only edits that table (and ``EQUIVALENT``).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EQUIVALENT", "TARGETS", "Equivalent", "Mutant", "Target", "generate", "main"]


@dataclass(frozen=True)
class Target:
    """One module under mutation.

    path: file relative to the repository root; tests: test files run for its mutants
    (in this order, stopping at the first failure; missing files are ignored);
    skip: qualified names (``Class``, ``Class.method``, ``function``) whose bodies are
    not mutated (option parsing, statistics, serialisation: no bearing on soundness).
    """

    path: str
    tests: tuple[str, ...]
    skip: tuple[str, ...] = ()


_SELECT_TESTS = (
    "tests/test_mut_select.py",
    "tests/test_mut_stages.py",
    "tests/test_select.py",
    "tests/test_zero_plateau.py",
)
_NUM_TESTS = ("tests/test_mut_numeric.py", "tests/test_mut_stages.py", "tests/test_numeric.py")
_CERT_TESTS = ("tests/test_mut_certificate.py", "tests/test_certificate.py")
TARGETS: tuple[Target, ...] = (
    Target("dosa_ref/certificate.py", (*_CERT_TESTS, *_SELECT_TESTS)),
    Target("dosa_ref/plan.py", (*_CERT_TESTS, *_SELECT_TESTS), skip=("PlanOptions",)),
    Target("dosa_ref/seeds.py", _SELECT_TESTS),
    Target("dosa_ref/select.py", (*_SELECT_TESTS, "tests/test_numeric.py")),
    Target("dosa_ref/screen.py", (*_SELECT_TESTS, *_NUM_TESTS)),
    Target("dosa_ref/cost.py", _SELECT_TESTS),
    Target(
        "dosa_ref/pipeline.py",
        (*_SELECT_TESTS, *_NUM_TESTS),
        skip=("DosaStats", "FP8Stats", "DosaResult", "FP8Result", "topk_check", "_slack_sample"),
    ),
    Target(
        "dosa_ref/prepare.py",
        (*_SELECT_TESTS, "tests/test_numeric.py", "tests/test_validation.py"),
        skip=("Chunk",),
    ),
    Target("dosa_ref/refine.py", _SELECT_TESTS),
    Target(
        "dosa_ref/scorer.py",
        (
            "tests/test_mut_select.py",
            "tests/test_mut_stages.py",
            "tests/test_select.py",
            "tests/test_certificate.py",
        ),
    ),
    Target(
        "dosa_ref/fp8.py",
        (
            "tests/test_mut_fp8.py",
            "tests/test_mut_stages.py",
            "tests/test_fp8.py",
            "tests/test_numeric.py",
        ),
    ),
    Target("dosa_ref/rounding.py", _NUM_TESTS),
    Target(
        "dosa_ref/error_model.py",
        _NUM_TESTS,
        skip=(
            "ErrorModel.to_dict",
            "ErrorModel.to_json",
            "ErrorModel.from_dict",
            "Arithmetic.to_dict",
            "_model_fields",
            "simulate_dot",
            "_trunc_f32",
            "simulate_scorer",
        ),
    ),
    Target(
        "dosa_ref/numeric.py",
        _NUM_TESTS,
        skip=("FP8Bounds", "FP8ScreenPlan", "simulate_screen"),
    ),
    Target(
        "dosa_cupy/plan.py",
        (
            "tests/test_mut_gpu_plan.py",
            "tests/test_gpu.py",
            "tests/test_plan_fused.py",
            "tests/test_screen_pair.py",
        ),
        skip=("DevicePlan",),
    ),
)


@dataclass(frozen=True)
class Equivalent:
    """A mutant excluded from the score: module path, the original source line and the
    mutated line (both stripped; line numbers are not used, so edits elsewhere in the file
    keep the entry valid), ``kind`` and the argument.

    kind "identical": the mutant computes the same values on every input the code can
    receive.  kind "contract": the values may differ in the last bits, but the property
    every caller relies on (an outward bound, "any R is valid") provably or, where stated,
    demonstrably still holds; docs/mutation.md gives the evidence.
    """

    path: str
    before: str
    after: str
    why: str
    kind: str = "identical"


_NUM = "dosa_ref/numeric.py"
_ROUND = "dosa_ref/rounding.py"
_EMODEL = "dosa_ref/error_model.py"
_CPLAN = "dosa_cupy/plan.py"
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        _EMODEL,
        "eps = float(sub_up(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))",
        "eps = float(sub_down(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))",
        "(screen and scorer coefficients) the last subtraction rounded down instead of up, "
        "after two upward roundings of the "
        "factors: over 8 error models, D 1..512, H 1..128 and r 1..64 (48,724 cases) the "
        "screen and scorer coefficients still dominate margins.model_coefficients_exact "
        "(docs/records/mutation_contract_check.py)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "return 0.0",
        "return 1.0",
        "both `return 0.0` of _joint_up: with no omitted head (line 1) _positive_enclosure "
        "returns before calling it; with every u_h = 0 (line 2) the caller takes "
        "min(triangle, joint) and the triangle term is itself an upper bound of the exact "
        "allowance 0, so min(tri, 1.0) is still one",
        "contract",
    ),
    Equivalent(
        _NUM,
        "rad = np.maximum(sub_up(hi, m), sub_up(m, lo))",
        "rad = np.maximum(sub_up(hi, m), sub_down(m, lo))",
        "rad only needs to cover both half-widths; hi - m is still rounded up, and m - lo "
        "differs from it by at most the rounding of the midpoint m; 0 violations of "
        "E_plus >= exact allowance on 600 fixed plans (docs/records/mutation_contract_check.py)",
        "contract",
    ),
    Equivalent(
        _EMODEL,
        "g = INF if St >= 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "g = INF if St > 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "differs only when St = up(S * theta) is exactly 1.0; a search over kept_bits 1..39, "
        "k_step 1..299 and every step count S near 1/theta found no such case (up() always "
        "steps past the correctly rounded product), and St > 1 gives inf either way",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "return add_up(mul_up(p, add_up(1.0, 2.0 * g)), n * 2.0**-1073)",
        "return add_up(mul_up(p, add_down(1.0, 2.0 * g)), n * 2.0**-1073)",
        "the exact x satisfies x <= p / (1 - g); 1 + 2g leaves g - 2g^2 of slack, which covers "
        "the lost ulp for n >= 4; for n <= 3, 1 + 2g_n is (nearly) representable and "
        "down() gives 1 + (n - 1)2^-52, which with mul_up's own upward ulp still covers "
        "1 / (1 - g_n); 0 violations in 20,000 random dot products (n = 2..8) checked in "
        "rationals",
        "contract",
    ),
    Equivalent(
        _NUM,
        "z = y @ fplan.aux_scale.astype(np.float64)",
        "z = y @ (fplan.aux_scale)",
        "y is float64, so float64 @ float32 promotes to float64; float32 -> float64 is "
        "exact, and the product is the same float64 matmul",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "ratio = np.where(nR > 0, dots / np.where(nR > 0, nR, 1.0), 0.0)",
        "ratio = np.where(nR > 0, dots / np.where(nR >= 0, nR, 1.0), 0.0)",
        "the inner where only changes entries with nR == 0, which the outer where replaces "
        "by 0.0 (the division warning is silenced by the surrounding errstate)",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "if not (np.isfinite(b) and b >= np.finfo(np.float64).tiny):",
        "if not (np.isfinite(b) and b > np.finfo(np.float64).tiny):",
        "only beta == 2^-1022 exactly is no longer projected; Prop. 1 holds for any "
        "beta >= 0 including beta = 0 (no projection), so the plan stays valid "
        "(docs/method.md §3); only the allowance of that head can grow",
        "contract",
    ),
    Equivalent(
        "dosa_ref/screen.py",
        "ok = (hi <= 0.0) & (m <= 2.0**1000)",
        "ok = (hi < 0.0) & (m <= 2.0**1000)",
        "certifies fewer keys (those with hi == 0 exactly lose the plateau bound and keep "
        "their U): every key still has a valid bound and ids never change",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "return p, n, gamma_up(max(n, 1), 2.0**-53)",
        "return p, n, gamma_up(max(n, 2), 2.0**-53)",
        "gamma_2 >= gamma_1 and, for n = 0, p = 0: the matmul bounds only widen "
        "(matmul_abs_up rises, matmul_enclose's interval grows)",
        "contract",
    ),
    Equivalent(
        _CPLAN,
        "mth = Hp // 16",
        "mth = Hp / 16",
        "Hp is padded to a multiple of 16 (build_plans' contract: heads padded to 16*MT_H), "
        "so Hp / 16 is the same integer as a float, and mth only enters arithmetic "
        "(gamma(2 * mth + 5), the eps_raw count) where the float gives the same value",
    ),
    Equivalent(
        "dosa_ref/seeds.py",
        "if n <= m:",
        "if n < m:",
        "for n == m the other branch gives a + (arange(m) * n) // m = a + arange(m), the "
        "same int64 array",
    ),
    Equivalent(
        "dosa_ref/scorer.py",
        "logits = np.matmul(kp.reshape(-1, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]",
        "logits = np.matmul(kp.reshape(-2, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]",
        "NumPy 2.4 (the version in use) takes any negative entry of a reshape as the one "
        "inferred dimension, so -2 and -1 give the same shape",
    ),
    Equivalent(
        _NUM,
        "if e > 0:  # downscaling may round: widen",
        "if e >= 0:  # downscaling may round: widen",
        "at e = 0 the scaling is the identity; the mutant only adds one outward step "
        "(down(lo), up(hi)) to an enclosure that is already valid: E_g^+ can only grow",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "err = mul_up(mul_up(a, 1.0 + 2.0 * g), g)",
        "err = mul_up(mul_up(a, 1.0 + 4.0 * g), g)",
        "a larger error term: sum_up only rises and sum_down only falls, both stay bounds "
        "(the factor 1 + 2g already covers the rounding of the computed |sum|)",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "e = np.where(np.isfinite(mx) & (mx > 0), e, 0)",
        "e = np.where(np.isfinite(mx) & (mx > 0), e, 1)",
        "only rows whose maximum is 0 or not finite are affected: a zero row's tiny upper "
        "bound (up(0) squared and summed, about 2^-537) is doubled, still an upper bound of "
        "0; inf and NaN rows give inf and NaN either way",
        "contract",
    ),
    Equivalent(
        "dosa_ref/certificate.py",
        "cuts = zip(key[:-1], key[1:], strict=True)",
        "cuts = zip(key[:-1], key[1:], strict=False)",
        "key[:-1] and key[1:] always have the same length, so strict never fires",
    ),
    Equivalent(
        "dosa_ref/fp8.py",
        "s = (np.asarray(amax32, dtype=np.float32) / np.float32(E4M3_MAX)).astype(np.float32)",
        "s = (np.asarray(amax32, dtype=np.float32) / (E4M3_MAX)).astype(np.float32)",
        "448 is exact in fp32; a float32 array over a Python float divides in fp32 (NEP 50), "
        "and where NumPy promotes to float64 instead, fp32(fl64(a/b)) = fl32(a/b) for fp32 "
        "a, b (double rounding is innocuous for division since 53 >= 2*24 + 2)",
    ),
    Equivalent(
        _CPLAN,
        "sig = cp.ldexp(cp.ones(Qn), cp.where(m == 0.5, e - 1, e).astype(cp.int32))",
        "sig = cp.ldexp(cp.ones(Qn), (cp.where(m == 0.5, e - 1, e)))",
        "frexp returns int32 exponents in NumPy and CuPy, e - 1 and where keep int32: "
        "the cast is a no-op",
    ),
    Equivalent(
        _NUM,
        "smp = kbar[stride_sample(a, b, sample)] if b > a else kbar[:0]",
        "smp = kbar[stride_sample(a, b, sample)] if b >= a else kbar[:0]",
        "for b == a, stride_sample(a, a, m) is empty and kbar[empty] equals kbar[:0]",
    ),
    Equivalent(
        _NUM,
        "mx = float(np.max(np.maximum(np.abs(u_lo), np.abs(u_hi))))",
        "mx = float(np.max(np.maximum(np.abs(u_lo), (u_hi))))",
        "enclosures have u_lo <= u_hi, so a negative u_hi has |u_hi| <= |u_lo| and "
        "max(|u_lo|, u_hi) = max(|u_lo|, |u_hi|)",
    ),
    Equivalent(
        _ROUND,
        "mag = np.maximum(np.abs(lo), np.abs(hi))",
        "mag = np.maximum(np.abs(lo), (hi))",
        "intervals have lo <= hi, so a negative hi has |hi| <= |lo|: same maximum",
    ),
    Equivalent(
        _NUM,
        "and np.all(np.isfinite(omega))",
        "and np.any(np.isfinite(omega))",
        "a non-finite omega_j makes its row of M (|omega| @ |qhat|: inf, or NaN for a zero "
        "row), hence J_screen, J and C non-finite (eps_s > 0: the CPU float64 term is "
        "always added), so valid is already False",
    ),
    Equivalent(
        _NUM,
        "R=R.astype(np.int64),",
        "R=(R),",
        "plan.R is already int64 (build_plan: np.unique(np.asarray(R, dtype=np.int64)))",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "d_s = qs[P].copy()  # d̃_h, in units of 2^{e_h}",
        "d_s = (qs[P])  # d̃_h, in units of 2^{e_h}",
        "indexing with the integer array P already returns a new array",
    ),
    Equivalent(
        "dosa_ref/seeds.py",
        "if n <= 0 or Qn == 0:",
        "if n < 0 or Qn == 0:",
        "for n = 0, linspace(0, Qn - 1, 0) is empty, the loop adds nothing and the same "
        "empty int64 array is returned",
    ),
    Equivalent(
        _CPLAN,
        "key = prim + sec / (1.0 + sec)",
        "key = prim + sec / (2.0 + sec)",
        "x/(1+x) and x/(2+x) are both increasing maps of [0, inf) into [0, 1): the "
        "class-then-priority order, hence R, is the same except where rounding merges "
        "priorities above ~2^52 (both versions merge there); any R is valid "
        "(docs/method.md §3), so ids never change",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact",
        "ms = np.where(e > 1, up(ms), ms)  # downscaling may round; upscaling is exact",
        "e = 1 halves the row: exact except for elements below 2^-1021, whose squares "
        "underflow and are replaced by up(0) = 2^-1074 >= their exact square either way; the "
        "result stays an upper bound (0 violations on 2000 fixed plans, docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _EMODEL,
        "g = INF if St >= 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "g = INF if St >= 1.0 else float(div_up(St, sub_up(1.0, St)))",
        "one ulp less in the denominator's widening; S*theta already carries >= 3 upward "
        "ulps, and over W 8..24, k 8..64 and 43,444 step counts the mutant's gamma exceeds "
        "the exact S*theta/(1 - S*theta) by >= 6.6e-16 relative (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om < 0.0)",
        "only turns same from True to False (when omega == 0), selecting the other branch "
        "|c||q| + |omega||qhat|, an upper bound for any signs (triangle inequality); with "
        "omega = 0 both branches bound |c||q|",
        "contract",
    ),
    Equivalent(
        _NUM,
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "same = (c_lo > 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "only turns same from True to False (c_lo == 0), selecting the branch that is an "
        "upper bound for any signs (see the om < 0.0 entry)",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact",
        "ms = np.where(e > 0, down(ms), ms)  # downscaling may round; upscaling is exact",
        "halving rows with max >= 1 is exact in the normal range; the one-ulp inward step "
        "is absorbed by mul_up, sum_up, sqrt_up and the final up: 0 violations on 30,000 "
        "random vectors up to 2^900 checked in rationals (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "S = (sum_down(lo, axis=0), sum_up(hi, axis=0))",
        "S = (sum_up(lo, axis=0), sum_up(hi, axis=0))",
        "_joint_up works at a power-of-two scale near 1 where the lower end of the column "
        "sums loses <= gamma_n*sum|x|, less than the slack of the Gram part and of the "
        "final widenings; 0 violations on 2000 fixed plans (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "G = add_up(G, matmul_abs_up(am, rad.T))",
        "G = add_down(G, matmul_abs_up(am, rad.T))",
        "one of three widenings of the Gram enclosure (plus gamma_n of matmul_enclose) "
        "turned inward by one ulp; 0 violations on 2000 fixed plans (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "G = add_up(G, matmul_abs_up(rad, am.T))",
        "G = add_down(G, matmul_abs_up(rad, am.T))",
        "as the previous entry (the symmetric cross term)",
        "contract",
    ),
)


# --------------------------------------------------------------------------------------
# Mutant generation
# --------------------------------------------------------------------------------------


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
_AUG = {ast.Add: ("+=", "-="), ast.Sub: ("-=", "+="), ast.Mult: ("*=", "/="), ast.Div: ("/=", "*=")}
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
    stem = Path(target.path).stem
    if target.path.startswith("dosa_cupy/"):
        stem = "cupy_" + stem
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


def _match_equivalent(m: Mutant) -> Equivalent | None:
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

_COPY = ("dosa_ref", "dosa_cupy", "proofs", "tests", "docs", "pyproject.toml")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.so")


def _make_copy(root: Path, dest: Path):
    dest.mkdir(parents=True)
    for name in _COPY:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_IGNORE)
        elif src.exists():
            shutil.copy2(src, dest / name)


def _pytest(copy: Path, tests: list[str], timeout: float) -> tuple[str, str, float]:
    """Run the tests in ``copy``: ('passed' | 'failed' | 'timeout', first failure, s)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(copy),
        PYTHONDONTWRITEBYTECODE="1",
        HYPOTHESIS_PROFILE="ci",
        PYTHONHASHSEED="0",
    )
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:randomly", "--no-header", "-rfE", *tests]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", "", time.perf_counter() - t0
    dt = time.perf_counter() - t0
    text = out.decode(errors="replace")
    if proc.returncode == 0:
        return "passed", "", dt
    m = re.search(r"^(FAILED|ERROR) (\S+)", text, re.M)
    first = m.group(2) if m else text.strip().splitlines()[-1] if text.strip() else ""
    if proc.returncode != 1 and not m:  # usage error, nothing collected, crash
        return "error", f"pytest exit {proc.returncode}: {first}", dt
    return "failed", first, dt


def run(
    root: Path, mutants: list[Mutant], jobs: int, timeout: float, tests=None, log=print
) -> dict:
    """Run every non-equivalent mutant (``tests``: optional test paths replacing every
    target's own list); returns the baseline seconds per module."""
    targets = {t.path: t for t in TARGETS}
    if tests:
        targets = {p: Target(p, tuple(tests), t.skip) for p, t in targets.items()}
    tmp = Path(tempfile.mkdtemp(prefix="dosa-mutate-"))
    try:
        copies = []
        for i in range(jobs):
            _make_copy(root, tmp / f"w{i}")
            copies.append(tmp / f"w{i}")
        originals = {m.path: (root / m.path).read_bytes() for m in mutants}
        # Baseline: every test set must pass on the unmutated copy.
        base = {}
        for path in sorted(originals):
            tests = _tests_for(copies[0], targets[path])
            status, first, dt = _pytest(copies[0], tests, timeout * 4)
            if status != "passed":
                raise RuntimeError(f"tests for {path} do not pass unmutated: {first}")
            base[path] = dt
            log(f"baseline {path}: {len(tests)} test files pass in {dt:.1f} s")
        todo = [m for m in mutants if m.equivalent is None]
        for m in mutants:
            if m.equivalent is not None:
                m.status = "equivalent"
        lock = threading.Lock()
        free = list(copies)
        done = [0]

        def one(m: Mutant):
            with lock:
                copy = free.pop()
            try:
                f = copy / m.path
                f.write_bytes(m.apply(originals[m.path]))
                try:
                    limit = max(timeout, 3 * base[m.path])
                    status, first, dt = _pytest(copy, _tests_for(copy, targets[m.path]), limit)
                finally:
                    f.write_bytes(originals[m.path])
                m.status = {"passed": "survived", "failed": "killed"}.get(status, status)
                m.detail, m.seconds = first, dt
                with lock:
                    done[0] += 1
                    log(f"[{done[0]}/{len(todo)}] {m.status:8s} {m.id} ({dt:.1f} s) {first}")
            finally:
                with lock:
                    free.append(copy)

        with ThreadPoolExecutor(max_workers=jobs) as ex:
            list(ex.map(one, todo))
        return base
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tests_for(root: Path, target: Target) -> list[str]:
    return [t for t in target.tests if (root / t).exists()]


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def score(mutants: list[Mutant]) -> tuple[int, int, int, int, float]:
    """(killed, timeouts, survived, equivalent, score) over the mutants that were run."""
    k = sum(m.status == "killed" for m in mutants)
    t = sum(m.status == "timeout" for m in mutants)
    s = sum(m.status == "survived" for m in mutants)
    e = sum(m.status == "equivalent" for m in mutants)
    n = k + t + s
    return k, t, s, e, (k + t) / n if n else float("nan")


def _strict(mutants: list[Mutant]) -> float:
    k, t, s, _, _ = score(mutants)
    c = sum(m.status == "equivalent" and m.equivalent.kind == "contract" for m in mutants)
    n = k + t + s + c
    return (k + t) / n if n else float("nan")


def report(root: Path, mutants: list[Mutant], args, base: dict, seconds: float) -> str:
    k, t, s, e, sc = score(mutants)
    srcs = {m.path: (root / m.path).read_bytes() for m in mutants}
    lines = [
        "# Mutation run",
        "",
        f"seed {args.seed}, {len(mutants)} mutants, {args.jobs} jobs, "
        f"timeout {args.timeout:.0f} s, wall {seconds / 60:.1f} min",
        "",
        f"**score {100 * sc:.1f} %** = (killed {k} + timeouts {t}) / "
        f"(run {k + t + s}); survived {s}; equivalent (excluded) {e}; "
        f"tool errors (excluded, listed below) {sum(m.status == 'error' for m in mutants)}",
        "",
        f"strict score (contract-equivalent mutants counted as survivors): "
        f"{100 * _strict(mutants):.1f} %",
        "",
        "| module | mutants | killed | timeout | survived | equivalent | tests (baseline s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in sorted(srcs):
        ms = [m for m in mutants if m.path == p]
        c = {
            x: sum(m.status == x for m in ms)
            for x in ("killed", "timeout", "survived", "equivalent")
        }
        lines.append(
            f"| {p} | {len(ms)} | {c['killed']} | {c['timeout']} | {c['survived']} | "
            f"{c['equivalent']} | {base.get(p, float('nan')):.1f} |"
        )
    lines += ["", "## Survivors", ""]
    surv = [m for m in mutants if m.status == "survived"]
    if not surv:
        lines.append("none")
    for m in surv:
        lines += [
            f"### {m.id} ({m.scope})",
            "",
            "```diff",
            m.diff(srcs[m.path]).rstrip(),
            "```",
            "",
        ]
    for m in mutants:
        if m.status == "error":
            lines.append(f"- tool error {m.id}: {m.detail}")
    lines += ["", "## Equivalent (excluded)", ""]
    for m in mutants:
        if m.status == "equivalent":
            e_ = m.equivalent
            lines.append(f"- {m.id} ({e_.kind}): `{m.before}` → `{m.after}` — {e_.why}")
    lines += [
        "",
        "## Killed / timed out",
        "",
        "| mutant | edit | first failing test |",
        "|---|---|---|",
    ]
    for m in mutants:
        if m.status in ("killed", "timeout"):
            edit = f"`{m.after}`".replace("|", "\\|")
            lines.append(f"| {m.id} | {edit} | {m.detail or m.status} |".replace("\n", " "))
    return "\n".join(lines) + "\n"


def _select_targets(spec: str | None) -> list[Target]:
    if not spec:
        return list(TARGETS)
    out = []
    for name in spec.split(","):
        name = name.strip()
        hits = [
            t
            for t in TARGETS
            if name in (t.path, Path(t.path).stem, t.path.replace("/", ".")[:-3])
            or (name == "cupy_plan" and t.path == "dosa_cupy/plan.py")
        ]
        if not hits:
            raise ValueError(f"modules: unknown module {name!r}; expected some of "
                             f"{[t.path for t in TARGETS]}")  # fmt: skip
        out += [h for h in hits if h not in out]
    return out


def main(argv: list[str]) -> int:
    """``dosa mutate``: generate, run and report mutants (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="dosa mutate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", help="comma list (path, stem or cupy_plan); default all")
    ap.add_argument("--max-mutants", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", help="write the markdown report here")
    ap.add_argument("--list", action="store_true", help="list the sampled mutants, run nothing")
    ap.add_argument("--all", action="store_true", help="every mutant (ignores --max-mutants)")
    ap.add_argument("--ids", help="comma list of mutant ids to run (from --list)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant (min)")
    ap.add_argument("--min-score", type=float, help="exit 1 when the score (0..1) is lower")
    ap.add_argument("--root", default=None, help="repository root (default: this checkout)")
    ap.add_argument("--tests", help="comma list of test paths run for every module (override)")
    a = ap.parse_args(argv)
    if a.max_mutants < 1 or a.jobs < 1:
        raise ValueError("max-mutants, jobs: expected positive integers")
    root = Path(a.root) if a.root else Path(__file__).resolve().parents[1]
    pools = {t.path: generate(root, t) for t in _select_targets(a.modules)}
    if a.ids:
        want = set(a.ids.split(","))
        chosen = [m for ms in pools.values() for m in ms if m.id in want]
        if len(chosen) != len(want):
            missing = want - {m.id for m in chosen}
            raise ValueError(f"ids: unknown mutant ids {sorted(missing)}")
    elif a.all:
        chosen = [m for ms in pools.values() for m in ms]
    else:
        chosen = sample(pools, a.max_mutants, a.seed)
    for m in chosen:
        m.equivalent = _match_equivalent(m)
    if a.list:
        total = sum(len(v) for v in pools.values())
        print(f"{len(chosen)} of {total} mutants (seed {a.seed})")
        for m in chosen:
            tag = "  [equivalent]" if m.equivalent else ""
            print(f"{m.id}\t{m.scope}\t{m.before}  ->  {m.after}{tag}")
        return 0
    t0 = time.perf_counter()
    base = run(root, chosen, a.jobs, a.timeout, a.tests.split(",") if a.tests else None)
    text = report(root, chosen, a, base, time.perf_counter() - t0)
    k, t, s, e, sc = score(chosen)
    print(f"score {100 * sc:.1f} % (killed {k}, timeouts {t}, survived {s}, equivalent {e})")
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(text)
        print(f"report: {a.report}")
    else:
        print(text)
    if a.min_score is not None and not (sc >= a.min_score):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
