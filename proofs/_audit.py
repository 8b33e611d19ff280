"""Result objects and the recorder every ``check`` uses.

A ``Result`` is what a check returns (one case) and what ``run_all`` returns per statement
(all cases merged): name, number of cases, the worst margin (bound − quantity, which must
be ≥ 0; ``None`` when the statement has no numeric margin), whether a tightness witness
attained its bound exactly (``None`` when the statement claims no tightness), and the
violations found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ._exact import Surd, to_float

__all__ = ["Audit", "Result"]

MAX_MESSAGES = 20


@dataclass
class Result:
    name: str
    cases: int = 0
    worst_margin: float | None = None
    tight_attained: bool | None = None
    violations: list[str] = field(default_factory=list)
    checks: int = 0
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    n_violations: int = 0
    maxima: dict = field(default_factory=dict)  # informational statistics (max over cases)
    counts: dict = field(default_factory=dict)  # informational counters (summed)

    @property
    def ok(self) -> bool:
        return self.n_violations == 0 and not self.violations

    def merge(self, o: Result) -> Result:
        """Combine two results of the same statement."""
        if self.worst_margin is None:
            wm = o.worst_margin
        elif o.worst_margin is None:
            wm = self.worst_margin
        else:
            wm = min(self.worst_margin, o.worst_margin)
        if self.tight_attained is None and o.tight_attained is None:
            ta = None
        else:
            ta = bool(self.tight_attained) or bool(o.tight_attained)
        notes = list(self.notes)
        for n in o.notes:
            if n not in notes and len(notes) < MAX_MESSAGES:
                notes.append(n)
        maxima = dict(self.maxima)
        for k, v in o.maxima.items():
            maxima[k] = max(maxima.get(k, v), v)
        counts = dict(self.counts)
        for k, v in o.counts.items():
            counts[k] = counts.get(k, 0) + v
        return Result(
            name=self.name,
            cases=self.cases + o.cases,
            worst_margin=wm,
            tight_attained=ta,
            violations=(self.violations + o.violations)[:MAX_MESSAGES],
            checks=self.checks + o.checks,
            notes=notes,
            seconds=self.seconds + o.seconds,
            n_violations=self.n_violations + o.n_violations,
            maxima=maxima,
            counts=counts,
        )


class Audit:
    """Records exact comparisons for one case and produces its ``Result``.

    Every comparison is decided exactly: rationals directly, ``Surd`` values through
    ``Surd.sign`` (outward-rounded enclosures + exact zero test).
    """

    def __init__(self, name: str, tightness: bool, context: str = ""):
        self.r = Result(name=name, cases=1, tight_attained=False if tightness else None)
        self.context = context

    # recording
    def _violate(self, msg: str):
        self.r.n_violations += 1
        if len(self.r.violations) < MAX_MESSAGES:
            where = f" [{self.context}]" if self.context else ""
            self.r.violations.append(msg + where)

    def _margin_value(self, m) -> tuple[int, float]:
        if isinstance(m, Surd):
            return m.sign(), float(m)
        m = Fraction(m)
        return (m > 0) - (m < 0), to_float(m)

    def ge(self, bound, quantity, what: str) -> int:
        """Claim ``bound ≥ quantity``; records margin = bound − quantity. Returns its sign."""
        return self.margin(Surd.of(bound) - quantity, what)

    def margin(self, m, what: str) -> int:
        """Claim ``m ≥ 0`` for a margin m (Fraction or Surd)."""
        self.r.checks += 1
        s, v = self._margin_value(m)
        if self.r.worst_margin is None or v < self.r.worst_margin:
            self.r.worst_margin = v
        if s < 0:
            self._violate(f"{what}: margin {v:.6g} < 0")
        return s

    def eq(self, a, b, what: str) -> bool:
        """Claim ``a == b`` exactly (an identity; its margin 0 is recorded)."""
        self.r.checks += 1
        d = Surd.of(a) - b
        s = d.sign()
        if s != 0:
            self._violate(f"{what}: identity off by {float(d):.6g}")
            return False
        if self.r.worst_margin is None or self.r.worst_margin > 0:
            self.r.worst_margin = 0.0
        return True

    def claim(self, ok: bool, what: str) -> bool:
        """A boolean claim (set equality, order, precondition)."""
        self.r.checks += 1
        if not ok:
            self._violate(what)
        return bool(ok)

    def tight(self, attained: bool):
        """A tightness witness was evaluated; ``attained`` = its bound held with equality."""
        if attained:
            self.r.tight_attained = True

    def track(self, name: str, value: float):
        """Informational: keep the maximum of ``value`` under ``name`` and count events."""
        self.r.maxima[name] = max(self.r.maxima.get(name, value), value)
        self.r.counts[name] = self.r.counts.get(name, 0) + 1

    def note(self, text: str):
        if text not in self.r.notes and len(self.r.notes) < MAX_MESSAGES:
            self.r.notes.append(text)

    def result(self) -> Result:
        return self.r
