"""Shared CPU-test support: .cu sources with their local includes inlined, kernel parameter
lists parsed from them, and the check that a host launch passes arguments of exactly those
types (count, dtypes — int vs long long, float vs double — and C-contiguous arrays), as the
kernels' numpy emulations in the CPU tests do before they run.

The parsing is the package's (``dosa_cupy._signature``, which the launches themselves are
checked with); ``check_args`` runs that launch check too, on the kernel's parameter list as
built, so each emulation's argument tuples test it as well."""

import numpy as np

from dosa_cupy._build import KernelSpec, main_spec
from dosa_cupy._signature import (  # noqa: F401  (the tests' names)
    CTYPES,
    check_launch,
    expand_object_macros,
    param_types,
    params,
    read_source,
    signatures,
)

# the builds whose kernels the emulated launches name (decode_ops.DECODE, plan.PLAN, the FP8
# scorer's stage and decode kernels: scorer.FP8_SPEC)
BUILDS = (
    KernelSpec("decode.cu"),
    KernelSpec("plan.cu"),
    KernelSpec("score_fp8.cu", (), sm90a=True),
)


def built_params(name: str):
    """The parameters of kernel ``name`` as built (kernels.cu at the current tile, then
    decode.cu, plan.cu), or None where no build defines it."""
    for spec in (main_spec(), *BUILDS):
        sig = signatures(spec)
        if name in sig:
            return sig[name]
    return None


def check_args(name: str, args, types) -> None:
    """A launch of kernel ``name`` passes one argument per parameter, of its type (or, for a
    pointer, np.uint64(0): the null pointer of an optional buffer, dense._NULL); arrays are
    C-contiguous; and the package's launch check (numpy arrays standing in for CuPy's)
    accepts the same arguments."""
    assert len(args) == len(types), (name, len(args), len(types))
    ps = built_params(name)
    assert ps is not None, f"{name}: no build defines this kernel"
    for i, (a, t) in enumerate(zip(args, types, strict=True)):
        if ps[i].pointer and type(a) is np.uint64:
            assert int(a) == 0, (name, i, "a raw address other than the null pointer")
            continue
        assert np.asarray(a).dtype == t, (name, i, np.asarray(a).dtype, t)
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous, (name, i)
    assert [p.dtype for p in ps] == list(types), (name, "signature differs from the build's")
    check_launch(name, ps, args, (np.ndarray,))
