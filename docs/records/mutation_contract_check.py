"""Search for inputs on which a 'contract-equivalent' mutant of dosa_ref/numeric.py breaks
its contract E_g^+ ≥ exact positive allowance (docs/mutation.md, "Equivalent mutants"), and
sweeps for the mutants of rounding.py (norm_up) and error_model.py (the coefficients).

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

# ids of `dosa mutate --list` on the layout of dosa_ref after the restructure (norm_up
# in rounding.py, the coefficients in error_model.py); the first run of this script used
# the ids of the single numeric.py (docs/records/mutation_2026-12-01.md).
DEFAULT_IDS = [
    "numeric:249:swap-call:100",
    "numeric:256:swap-call:115",
    "numeric:257:swap-call:117",
    "numeric:260:swap-call:124",
    "numeric:277:swap-call:134",
    "numeric:239:remove-call:82",
]


def load(mid):
    path = f"dosa_ref/{mid.split(':')[0]}.py"
    t = next(t for t in mutate.TARGETS if t.path == path)
    m = next(m for m in mutate.generate(ROOT, t) if m.id == mid)
    name = "dosa_ref._mutant_" + mid.replace(":", "_").replace("-", "_")
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


def coefficient_sweep(mod):
    """Violations of dot_relative_error ≥ Sθ/(1 − Sθ) (exact θ) and of the screen and
    scorer coefficients ≥ margins.model_coefficients_exact, over W, k, step counts, D, H
    and r."""
    from fractions import Fraction as F

    from dosa_ref.margins import model_coefficients_exact

    bad = n = 0
    for W in range(8, 25):
        for k in (8, 16, 32, 64):
            a = mod.Arithmetic(kept_bits=W, k_step=k)
            th = (k + 1) * F(1, 2**W) * (1 + F(1, 2**23)) + F(1, 2**23)
            for S in [*range(1, 600), *range(600, 20000, 37)]:
                if S * th >= 1:
                    break
                n += 1
                bad += F(a.dot_relative_error(S * k)) < S * th / (1 - S * th)
    E = mod.ErrorModel
    models = [E.hopper_fp8(W) for W in (10, 13, 17, 20, 24)] + [E.ieee_fp32(), E.cpu_fp64()]
    for model in [*models, E.exact()]:
        for D in [*range(1, 40), 64, 100, 128, 256, 512]:
            for r in (1, 2, 3, 5, 8, 16, 31, 64):
                ex = model_coefficients_exact(model, D, 4, r)["screen"]
                n += 1
                got = model.screen_coefficients(D, r)
                bad += any(F(x) < y for x, y in zip(got, ex, strict=True))
            for H in (1, 2, 4, 8, 32, 64, 128):
                ex = model_coefficients_exact(model, D, H, 1)["scorer"]
                n += 1
                got = model.scorer_coefficients(D, H)
                bad += any(F(x) < y for x, y in zip(got, ex, strict=True))
    return bad, n


def norm_sweep(mod, cases=30000):
    """Violations of norm_up(m)² ≥ Σ m² (rationals) on random vectors up to 2^900."""
    from fractions import Fraction as F

    rs = np.random.default_rng(0)
    bad = 0
    for _ in range(cases):
        m = np.abs(rs.standard_normal(int(rs.integers(1, 6)))) * 2.0 ** float(rs.integers(0, 900))
        if rs.random() < 0.3:
            m[0] = np.ldexp(float(rs.integers(1, 2**20)), int(rs.integers(0, 500)))
        got = F(float(mod.norm_up(m)))
        bad += got * got < sum(F(float(x)) ** 2 for x in m)
    return bad, cases


SWEEPS = {
    "error_model:96:swap-call:73": coefficient_sweep,
    "error_model:217:swap-call:103": coefficient_sweep,
    "error_model:231:swap-call:128": coefficient_sweep,
    "rounding:168:constant:102": norm_sweep,
    "rounding:168:swap-call:103": norm_sweep,
}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ids = sys.argv[2:] or DEFAULT_IDS
    import dosa_ref.numeric as orig

    print(f"original: {search(orig, n)} violations in {n} plans")
    for mid in ids:
        print(f"{mid}: {search(load(mid), n)} violations in {n} plans")
    if len(sys.argv) <= 2:
        for mid, sweep in SWEEPS.items():
            print(f"{mid} ({sweep.__name__}): %d violations in %d cases" % sweep(load(mid)))
