"""``dosa bench``: the dense route, torch.topk, the fused route and DoSA on the same inputs
in one run (issue 5).  CUDA events, warm-up, medians over ≥ 10 replays, inputs rotated
between replays, ids cross-checked on every shape (DoSA == fused == dense bitwise;
torch.topk tie-agnostic: the same K values in the same order), JSON + markdown + PNG.

    python -m dosa_cupy.bench --shapes 32x4096x131072,64x4096x131072 --out DIR
    python -m dosa_cupy.bench --sweep --part 0/4 --max-seconds 420 --out DIR
    python -m dosa_cupy.bench --sweep --part 0/4 --dry-run          (plan only, no GPU)
    python -m dosa_cupy.bench --merge A/bench.json B/bench.json --out DIR   (no GPU)
    python -m dosa_cupy.bench --decode --filter x1048576 --out DIR          (decode.py)

``python -m dosa_cupy.bench`` and ``dosa bench`` are the same command (``cli.main``).
Modules: ``cli`` (arguments, modes), ``shapes`` (shapes, sweep grid, parts, jobs),
``memplan`` (floors, memory plan, time model), ``timing`` (CUDA events, rotation),
``prefill`` (one shape, every route), ``peers`` (DeepGEMM / FlashInfer on the same inputs),
``report`` (bench.json, bench.md), ``plots`` (PNGs), ``decode`` (``--decode``), and the
tools ``profile_plan`` (``--profile-plan``), ``diag`` (``--diag``) and ``cases`` (``--case``:
small runs for compute-sanitizer and Nsight Compute).  Running it on the GPU machine:
docs/running_on_gpu.md.

Shapes are HxQnxN: a causal prefill chunk of the last Qn positions of an N-key context,
H heads, D = 128.  ``--regime`` takes a comma list (calibrated first by default).
``--inputs a.npz,b.safetensors,…`` runs workload files instead (``dosa_ref.workloads.
save_workload``: float q, w, k and ranges ks, ke, quantized on the GPU like the generated
regimes); files of one shape are that job's rotated input sets (the row's ``rotate``).

Sweep (``--sweep``, the issue's grid): N ∈ {128K, 256K, 512K, 768K, 1M} × Qn ∈ {4K, 8K,
16K, 32K} × H ∈ {32, 64}, only Qn ≤ N, most important first: Qn ascending, then N
descending, then H — so Qn=4096 at 1M (H=32, H=64) run first.  ``--filter`` keeps shapes
whose HxQnxN contains one of its comma-separated substrings.  ``--part I/P`` (0 ≤ I < P)
then cuts the filtered job list into P *contiguous* slices of about equal estimated time
(``estimate_seconds``; each job goes to the part holding the midpoint of its time in the
cumulative sum): part 0 holds the most important shapes, and each part is short enough for
one device call when P is chosen with ``--dry-run``.  ``--max-seconds S`` starts no new
shape once S seconds have passed since start-up; bench.json and bench.md are rewritten
after every finished shape, so a killed run keeps what it finished.

Memory: a route whose working set (``memory_plan``; dense logits Qn·N·4 bytes, DoSA bitmask
Qn·N/8 + records Qn·buffer·8 + seed records + plan temporaries, fused records) exceeds
``--logits-gib`` (default 40 GiB) runs over query sub-chunks of the largest power-of-two
size that fits, all sub-chunks between the same two events; rows record the sub-chunk
sizes, and ids are compared over the concatenated sub-chunks.  A shape that cannot fit is
skipped with a printed reason and a row {"skipped": reason}.

Floors (recorded per row, printed as "×floor" = measured time / floor): see ``floors_ms``.
Outputs in --out: bench.json, bench.md, and at most four PNGs (speedup.png heatmaps per H
like the paper's Fig. 4, survival.png per-query survival CDFs, stages.png DoSA time by
stage, floors.png time as a multiple of each route's floor).
"""

from .cli import main
from .memplan import (
    GIB,
    causal_pairs,
    estimate_seconds,
    floors_ms,
    largest_pow2_subchunk,
    memory_plan,
    row_floors,
    x_floor,
)
from .plots import plots
from .prefill import bench_shape
from .report import (
    ids_equal,
    load_rows,
    markdown,
    merge_rows,
    route_table,
    run_meta,
    write_outputs,
)
from .shapes import (
    CHUNKS,
    CONTEXTS,
    DOSA_STAGES,
    FUSED_STAGES,
    build_jobs,
    filter_shapes,
    input_groups,
    parse_part,
    parse_shapes,
    parse_variants,
    part_index,
    select_part,
    sweep_shapes,
)

__all__ = [
    "CHUNKS",
    "CONTEXTS",
    "DOSA_STAGES",
    "FUSED_STAGES",
    "GIB",
    "bench_shape",
    "build_jobs",
    "causal_pairs",
    "estimate_seconds",
    "filter_shapes",
    "floors_ms",
    "ids_equal",
    "input_groups",
    "largest_pow2_subchunk",
    "load_rows",
    "main",
    "markdown",
    "memory_plan",
    "merge_rows",
    "parse_part",
    "parse_shapes",
    "parse_variants",
    "part_index",
    "plots",
    "row_floors",
    "route_table",
    "run_meta",
    "select_part",
    "sweep_shapes",
    "write_outputs",
    "x_floor",
]
