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

from .generate import Mutant, generate, sample
from .runner import main, report, run, score, select_targets, tests_for
from .targets import EQUIVALENT, TARGETS, Equivalent, Target

__all__ = [
    "EQUIVALENT",
    "TARGETS",
    "Equivalent",
    "Mutant",
    "Target",
    "generate",
    "main",
    "report",
    "run",
    "sample",
    "score",
    "select_targets",
    "tests_for",
]
