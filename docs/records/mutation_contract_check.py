"""Search for inputs on which a 'contract-equivalent' mutant of dosa_ref/numeric.py breaks
its contract E_g^+ ≥ exact positive allowance (docs/mutation.md, "Contract-equivalent").

Each mutant (ids of ``dosa mutate --list``) is loaded as a separate module from its mutated
source; the fixed pseudo-random plans of tests/test_mut_numeric.py (heads at 2^-1070 …
2^300, nearly parallel heads, every allowance form) are built with it and E_plus is
compared with the exact allowance (mpmath, 120 digits).

Usage: PYTHONPATH=. python3 docs/records/mutation_contract_check.py [cases] [ids...]
"""

import sys
import types
from pathlib import Path

import mpmath
import numpy as np

from dosa_ref import mutate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_mut_numeric import _exact_allowances, _random_plan_cases  # noqa: E402

DEFAULT_IDS = [
    "numeric:706:swap-call:418",
    "numeric:713:swap-call:433",
    "numeric:714:swap-call:435",
    "numeric:717:swap-call:442",
    "numeric:734:swap-call:452",
    "numeric:248:constant:125",
    "numeric:696:remove-call:400",
]


def load(mid):
    t = next(t for t in mutate.TARGETS if t.path == "dosa_ref/numeric.py")
    m = next(m for m in mutate.generate(ROOT, t) if m.id == mid)
    name = "dosa_ref._mutant_" + mid.split(":")[-1]
    mod = types.ModuleType(name)
    mod.__package__ = "dosa_ref"
    sys.modules[name] = mod  # dataclasses look their module up
    src = m.apply((ROOT / t.path).read_bytes())
    exec(compile(src, "mutant", "exec"), mod.__dict__)
    return mod


def search(mod, cases):
    """Violations of E_plus ≥ exact allowance on the first ``cases`` fixed plans."""
    bad = 0
    for q, w, opt in _random_plan_cases(cases):
        plan = mod.default_plan(q, w, np.ones((2, q.shape[1])), 1, opt)
        fp = mod.build_fp8_plan(plan, q, w, mod.ErrorModel(), "base")
        gb = plan.allowance_groups()
        tri, joint = _exact_allowances(plan, q, w, gb)
        for g in range(gb.size - 1):
            want = tri[g] if opt.allowance == "triangle" else min(tri[g], joint[g])
            bad += mpmath.mpf(float(fp.E_plus[g])) < want
    return bad


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ids = sys.argv[2:] or DEFAULT_IDS
    import dosa_ref.numeric as orig

    print(f"original: {search(orig, n)} violations in {n} plans")
    for mid in ids:
        print(f"{mid}: {search(load(mid), n)} violations in {n} plans")
