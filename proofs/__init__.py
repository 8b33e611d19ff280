"""Executable proofs of DoSA's statements (docs/method.md; the paper's appendices A–B).

One module per statement.  Each module defines

    NAME, STATEMENT          identifiers for the table
    check(...) -> Result     exact verification on given inputs (rationals / exact surds)
    cases(rng) -> list[dict] adversarial inputs (a dict may name another checker of the
                             module under the key "_check")

``run_all`` audits every registered module on its generated cases; ``python -m proofs``
prints the table and exits non-zero on any violation.  To add a statement, write the
module and add its name to ``MODULES`` (one line).
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
import zlib

import numpy as np

from ._audit import Result

__all__ = ["MODULES", "Result", "load", "run_all", "run_module"]

MODULES = [
    "prop1_anchor_projection",
    "prop2_negative_aggregate",
    "prop3_joint_allowance",
    "grouped_allowance",
    "prop4_seed_threshold",
    "prop5_optimal_projection",
    "prop6_slack_decomposition",
    "certificate_bound",
    "theorem1_exact_topk",
    "b3_margin_identity",
    "numerical_dominance",
    "gpu_screen_epilogue",
    "zero_plateau",
    "gpu_zero_plateau",
    "score_envelope",
    "wgmma_fresh_step",
    "decode_rho",
]


def load(name: str):
    """Import a registered proof module by name."""
    return importlib.import_module(f"{__name__}.{name}")


def run_module(name: str, seed: int = 0) -> Result:
    """Run one module's ``check`` over its ``cases`` (seeded per module and ``seed``)."""
    mod = load(name)
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
    t0 = time.perf_counter()
    total = Result(name=name)
    for case in mod.cases(rng):
        case = dict(case)
        fn = getattr(mod, case.pop("_check", "check"))
        try:
            res = fn(**case)
        except Exception as exc:  # an audit reports, it does not crash
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            res = Result(name=name, cases=1, n_violations=1)
            res.violations.append(f"exception in {fn.__name__}: {tb} [{case.get('context', '')}]")
        total = total.merge(res)
    total.seconds = time.perf_counter() - t0
    return total


def run_all(seed: int = 0, progress: bool = False, modules=None) -> list[Result]:
    """Audit every registered module (or ``modules``); returns one Result per statement."""
    out = []
    for name in modules or MODULES:
        if progress:
            print(f"  {name} …", file=sys.stderr, flush=True)
        out.append(run_module(name, seed))
    return out
