"""``python -m proofs``: audit every statement on seeded adversarial inputs, print a table,
exit 1 on any violation (2 on bad arguments)."""

from __future__ import annotations

import sys
import time

from dosa_ref.cmdline import CommandParser

from . import MODULES, load, run_all
from ._gen import KNOWN_ISSUE_TAG


def _fmt_margin(m) -> str:
    return "n/a" if m is None else f"{m:.3g}"


def _fmt_tight(t) -> str:
    return "—" if t is None else ("yes" if t else "NO")


def table(results) -> str:
    head = ("statement", "cases", "checks", "worst margin", "tight", "violations", "s")
    rows = [
        (
            r.name,
            str(r.cases),
            str(r.checks),
            _fmt_margin(r.worst_margin),
            _fmt_tight(r.tight_attained),
            str(r.n_violations),
            f"{r.seconds:.1f}",
        )
        for r in results
    ]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    line = lambda x: "  ".join(
        c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(x)
    )
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *map(line, rows)])


def main(argv=None, prog: str = "python -m proofs") -> int:
    ap = CommandParser(prog=prog, description=__doc__)
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated cases")
    ap.add_argument("--only", nargs="+", choices=MODULES, help="audit only these statements")
    ap.add_argument("-v", "--verbose", action="store_true", help="statements, notes, statistics")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = run_all(seed=args.seed, progress=not args.quiet, modules=args.only)
    elapsed = time.perf_counter() - t0
    print(table(results))
    print(f"total {elapsed:.1f} s, seed {args.seed}")
    bad = [r for r in results if not r.ok]
    for r in results:
        if args.verbose:
            print(f"\n{r.name}: {load(r.name).STATEMENT}")
            for n in r.notes:
                print(f"  note: {n}")
            for k, v in r.maxima.items():
                print(f"  stat: {k}: max {v:.3g} over {r.counts.get(k, 0)} events")
        if not r.ok:
            print(f"\n{r.name}: {r.n_violations} violation(s), first ones:")
            for v in r.violations[:8]:
                print(f"  - {v}")
    if any(KNOWN_ISSUE_TAG in v for r in bad for v in r.violations):
        print(f"\n({KNOWN_ISSUE_TAG}: see proofs/README.md, 'mixed-magnitude heads')")
    print("\nOK: no violations" if not bad else f"\nFAIL: violations in {len(bad)} statement(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
