"""The kernel builds under trial that a bench row can switch on (``--variant
NAME:...,builds=ring+refine_ws``; ``dosa bench --decode --scorer fp8tma``): module switches
of the library that select another build of a stage's kernel with the same ids, off by
default until a run on the GPU has timed them.  Not options of the library: a build that
wins becomes the stage's kernel and its switch goes away.

    ring        screen.WGT_RING       the transposed screen's ring build
    fp8screen   screen.WGT_FP8        its FP8 build (e4m3 wgmma; other bounds, fewer survivors)
    refine_ws   refine.REFINE_WS      refinement with a producer warpgroup
    decode_tma  decode_ops.DECODE_TMA the decode scan fed by the copy engine
"""

from __future__ import annotations

import contextlib
import importlib

# name → (module of dosa_cupy, its switch)
BUILDS = {
    "ring": ("screen", "WGT_RING"),
    "fp8screen": ("screen", "WGT_FP8"),
    "refine_ws": ("refine", "REFINE_WS"),
    "decode_tma": ("decode_ops", "DECODE_TMA"),
}


def parse_builds(spec) -> tuple[str, ...]:
    """``a+b`` → ("a", "b"); ValueError naming ``builds`` for an unknown name."""
    names = tuple(x for x in str(spec or "").split("+") if x)
    unknown = sorted(set(names) - set(BUILDS))
    if unknown:
        raise ValueError(f"builds: unknown {unknown}; known: {sorted(BUILDS)}")
    return names


@contextlib.contextmanager
def builds_on(names):
    """The switches of ``names`` (``BUILDS``) on for the block, then restored."""
    mods = [(importlib.import_module(f"dosa_cupy.{BUILDS[n][0]}"), BUILDS[n][1]) for n in names]
    was = [getattr(m, a) for m, a in mods]
    try:
        for m, a in mods:
            setattr(m, a, True)
        yield
    finally:
        for (m, a), v in zip(mods, was, strict=True):
            setattr(m, a, v)
