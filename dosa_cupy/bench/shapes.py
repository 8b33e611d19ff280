"""Shapes, sweep grid, parts, variants and the job list of ``dosa bench`` (no GPU).

Shapes are HxQnxN (H heads, a causal chunk of the last Qn positions of an N-key context);
the sweep grid is ordered most important first, and ``--part I/P`` cuts the job list into
P contiguous slices of about equal estimated time (``memplan.estimate_seconds``)."""

from __future__ import annotations

import re
from pathlib import Path

from .builds import parse_builds
from .memplan import estimate_seconds

# the stage names of the stage-split tables and plots (dosa_topk / fused_topk timing=True)
DOSA_STAGES = ("prepare", "seeds", "plan", "screen", "refine", "select", "recover")
FUSED_STAGES = ("seeds", "score+filter", "select", "recover")


def sort_key(r):
    """Order of result rows: regime, tile, H, Qn, N."""
    return (str(r.get("regime", "")), int(r.get("tile", 0)), r["H"], r["Qn"], r["N"])


CONTEXTS = (131072, 262144, 524288, 786432, 1048576)
CHUNKS = (4096, 8192, 16384, 32768)
HEADS = (32, 64)
DEFAULT_SHAPES = "32x4096x131072,64x4096x131072"


def shape_name(H: int, Qn: int, N: int) -> str:
    return f"{H}x{Qn}x{N}"


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """ "HxQnxN,..." → [(H, Qn, N)] (ValueError naming ``shapes`` on bad input)."""
    out = []
    for sh in spec.split(","):
        sh = sh.strip()
        if not sh:
            continue
        parts = sh.split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shapes: expected HxQnxN, got {sh!r}")
        H, Qn, N = (int(p) for p in parts)
        if not (1 <= H <= 64 and 1 <= Qn <= N):
            raise ValueError(f"shapes: need 1 <= H <= 64 and 1 <= Qn <= N, got {sh!r}")
        out.append((H, Qn, N))
    if not out:
        raise ValueError(f"shapes: no shape in {spec!r}")
    return out


def sweep_shapes() -> list[tuple[int, int, int]]:
    """The issue's grid, most important first: Qn ascending, N descending, H ascending."""
    grid = [(H, Qn, N) for H in HEADS for Qn in CHUNKS for N in CONTEXTS if Qn <= N]
    return sorted(grid, key=lambda s: (s[1], -s[2], s[0]))


def filter_match(name: str, filt: str | None) -> bool:
    """Whether a shape's ``name`` contains one of the comma-separated substrings of ``filt``
    (every name without a filter): ``--filter`` of the prefill and the decode bench."""
    keys = [f.strip() for f in (filt or "").split(",") if f.strip()]
    return not keys or any(k in name for k in keys)


def filter_shapes(shapes, filt: str | None):
    """Shapes whose HxQnxN contains one of the comma-separated substrings of ``filt``."""
    return [s for s in shapes if filter_match(shape_name(*s), filt)]


def parse_part(spec: str | None) -> tuple[int, int]:
    """ "I/P" → (I, P) with 0 ≤ I < P; None → (0, 1)."""
    if spec is None:
        return 0, 1
    parts = str(spec).split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"part: expected I/P with integers 0 <= I < P, got {spec!r}")
    i, p = int(parts[0]), int(parts[1])
    if not 0 <= i < p:
        raise ValueError(f"part: expected I/P with 0 <= I < P, got {spec!r}")
    return i, p


def part_index(costs, parts: int) -> list[int]:
    """Contiguous, time-balanced split: item j goes to the part holding the midpoint of its
    cost in the cumulative sum (non-decreasing in j, so each part is a contiguous slice)."""
    total = float(sum(costs))
    if total <= 0:
        return [min(parts - 1, j * parts // max(1, len(costs))) for j in range(len(costs))]
    out, cum = [], 0.0
    for c in costs:
        out.append(min(parts - 1, int(parts * (cum + 0.5 * c) / total)))
        cum += c
    return out


def select_part(items, part: int, parts: int, cost) -> list:
    """The items of part ``part`` of ``parts`` (``part_index`` over ``cost(item)``)."""
    idx = part_index([cost(x) for x in items], parts)
    return [x for x, k in zip(items, idx, strict=True) if k == part]


def parse_variants(specs) -> dict[str, dict]:
    """``--variant NAME:key=value[,key=value]`` (repeatable) → {NAME: DoSA options}.

    Each variant is one more DoSA route timed in the same run on the same inputs (e.g.
    ``cert:cert_seeds=2048``); values are ints where they parse as ints, else strings.
    ValueError naming ``--variant`` for a malformed spec, a repeated name or an unknown
    kernel build (``builds=``, builds.py) — before any GPU work, not when the row runs.
    """
    out: dict[str, dict] = {}
    for spec in specs or ():
        name, sep, body = spec.partition(":")
        if not sep or not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"--variant: expected NAME:key=value[,key=value], got {spec!r}")
        if name in out:
            raise ValueError(f"--variant: the name {name!r} is given twice")
        opts = {}
        for kv in filter(None, body.split(",")):
            k, eq, v = kv.partition("=")
            if not eq or not k:
                raise ValueError(f"--variant: expected key=value in {spec!r}, got {kv!r}")
            if v in ("True", "False"):  # tie_reject=False and the other switches
                opts[k] = v == "True"
            else:
                opts[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
        try:
            parse_builds(opts.get("builds", ""))
        except ValueError as e:
            raise ValueError(f"--variant: {name!r}: {e}") from None
        out[name] = opts
    return out


def build_jobs(a) -> list[tuple[str, int, tuple[int, int, int]]]:
    """(regime, tile, shape) in run order: regimes as given, shapes in importance order,
    tiles innermost; then ``--filter`` and ``--part``."""
    from dosa_cupy._build import TILES

    if a.sweep and a.shapes is not None:
        raise ValueError("shapes: --sweep runs the issue's grid; give --sweep or --shapes")
    if getattr(a, "inputs", None):
        return _file_jobs(a)
    shapes = sweep_shapes() if a.sweep else parse_shapes(a.shapes or DEFAULT_SHAPES)
    shapes = filter_shapes(shapes, a.filter)
    try:
        tiles = [int(x) for x in str(a.tile).split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}") from e
    if not tiles or any(t not in TILES for t in tiles):
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}")
    regimes = [x.strip() for x in str(a.regime).split(",") if x.strip()]
    if not regimes:
        raise ValueError(f"regime: expected a regime name, got {a.regime!r}")
    jobs = [(g, t, s) for g in regimes for s in shapes for t in tiles]
    i, p = parse_part(a.part)
    return select_part(
        jobs, i, p, lambda j: estimate_seconds(*j[2], reps=a.reps, rotate=a.rotate, r=a.r)
    )


def input_groups(paths) -> dict[str, list[str]]:
    """``--inputs`` files grouped by shape: {"file:<stem>[+n]": [paths]} in the given order;
    the files of one group are the rotated input sets of one job (same H, Qn, N)."""
    from dosa_cupy.workload import inputs_shape

    by_shape: dict[tuple[int, int, int], list[str]] = {}
    for p in paths:
        by_shape.setdefault(inputs_shape(p), []).append(p)
    out = {}
    for shape, fs in by_shape.items():
        extra = f"+{len(fs) - 1}" if len(fs) > 1 else ""
        # the shape in the label keeps groups apart whose first files share a stem
        out[f"file:{Path(fs[0]).stem}{extra}@{shape_name(*shape)}"] = fs
    return out


def _file_jobs(a):
    """Jobs of ``--inputs``: one per shape group, regime label ``file:…`` (a.input_groups)."""
    from dosa_cupy._build import TILES

    if a.sweep or a.shapes is not None:
        raise ValueError("inputs: the shapes come from the files; drop --sweep / --shapes")
    if a.part is not None or a.filter:
        raise ValueError("inputs: --part / --filter select generated shapes; list the files")
    paths = [x.strip() for x in str(a.inputs).split(",") if x.strip()]
    if not paths:
        raise ValueError(
            f"inputs: expected a comma list of .npz / .safetensors files, got {a.inputs!r}"
        )
    a.input_groups = input_groups(paths)
    tiles = [int(x) for x in str(a.tile).split(",") if x.strip()]
    if not tiles or any(t not in TILES for t in tiles):
        raise ValueError(f"tile: expected a comma list of {TILES}, got {a.tile!r}")
    from dosa_cupy.workload import inputs_shape

    return [(g, t, inputs_shape(fs[0])) for g, fs in a.input_groups.items() for t in tiles]


def rotate_of(a, regime) -> int:
    """Rotated input sets of a job: the group's files for ``--inputs``, else --rotate."""
    groups = getattr(a, "input_groups", None) or {}
    return len(groups[regime]) if regime in groups else a.rotate
