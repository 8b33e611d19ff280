"""Floors, memory plan and time model of ``dosa bench`` (no GPU): what each route costs at
best on one H200, how many queries of a chunk each route can hold in memory at once, and a
rough wall-time model for splitting a sweep into parts."""

from __future__ import annotations

from .. import refine
from ..plan import row_tiles
from .timing import WARM

# H200 ceilings measured in docs/numerics.md ("Measured on an H200", 2026-11-30):
# fp8 GEMM (torch._scaled_mm, 8192³) 1455 TFLOP/s bounds any MMA pass; the device-to-device
# copy 4.24 TB/s bounds any pass that must write or read the fp32 logits.
FP8_PEAK = 1455e12  # FLOP/s
HBM = 4.24e12  # bytes/s
D = 128  # head dimension of the kernels
KEY_BYTES = D + 4  # e4m3 payload + fp32 scale per key
SCREEN_TILE = 16  # MMA rows per screening tile (r retained heads + 2 aux rows, pipeline.py)
GIB = 1 << 30

DEFAULT_LOGITS_GIB = 40.0

ROUTES = ("logits", "select", "torch_topk", "dense_route", "fused", "dosa")

# Time model for balancing parts and --dry-run only (not a measurement): each route as a
# multiple of its floor, from the v6 calibrated run (docs/records/benchmarks.md, Qn=4096,
# N=1M: logits
# 3.6-4.0×, own select 7×, torch.topk 13× the one-read floor, fused 4×, DoSA ≈ 4× the
# screen floor + 0.3 of the dense MMA floor), and host workload generation per key and per
# query·head (dosa_ref.workloads on the CPU: ~9 s per 1M keys, ~7 µs per query·head).
EST_X = {"logits": 4.0, "select": 7.0, "torch_topk": 13.0, "fused": 4.0, "screen": 4.0}
EST_REFINE = 0.3
EST_HOST_KEY_S = 9e-6
EST_HOST_QH_S = 7e-6
# build_plans keeps about this many float64 [Hp, D] temporaries per query alive at its peak
# (qf, qjs, d, the where/product temporaries; plan.py) — an estimate, not a bound.
PLAN_F64_TEMPS = 8


def causal_pairs(Qn: int, N: int) -> float:
    """Visible (query, key) pairs of a causal chunk: query t sees N − Qn + t + 1 keys."""
    return float(Qn) * (N - Qn) + Qn * (Qn + 1) / 2.0


def screen_rows(r: int) -> int:
    """MMA rows the screen runs per query: one 16-row tile for r ≤ 14, two beyond
    (``plan.row_tiles``: r retained rows + 2 aux rows per tile)."""
    return SCREEN_TILE * row_tiles(r)


def floors_ms(H, Qn, N, pairs=None, survival=None, r: int = 14) -> dict:
    """Physical floors (ms) of each route on one H200 (docs/numerics.md ceilings).

    logits: max(MMA 2·H·D·pairs / FP8_PEAK, write the logits + read the keys / HBM);
    own select and torch.topk: one read of the logits (Qn·N·4 / HBM);
    dense route: logits floor + one read of the logits;
    fused: the dense MMA floor (every visible pair scored with all heads, no logits);
    DoSA: the screen's MMA floor (2·16·D·pairs, one tile of screening rows) + survival × the
    dense MMA floor (refinement of survivors); only when ``survival`` is given.
    """
    pairs = causal_pairs(Qn, N) if pairs is None else float(pairs)

    def mma(rows):
        return 2.0 * rows * D * pairs / FP8_PEAK * 1e3

    logits_bytes = float(Qn) * N * 4
    logits = max(mma(H), (logits_bytes + N * KEY_BYTES) / HBM * 1e3)
    read = logits_bytes / HBM * 1e3
    out = {
        "logits_floor_ms": logits,
        "select_floor_ms": read,
        "torch_topk_floor_ms": read,
        "dense_route_floor_ms": logits + read,
        "fused_floor_ms": mma(H),
        "screen_floor_ms": mma(screen_rows(r)),
    }
    if survival is not None:
        out["dosa_floor_ms"] = out["screen_floor_ms"] + float(survival) * mma(H)
    return out


def largest_pow2_subchunk(Qn: int, bytes_per_query: float, budget: float) -> int:
    """Qn if Qn queries fit in ``budget`` bytes, else the largest power of two < Qn that
    fits, else 0 (one query does not fit)."""
    if Qn * bytes_per_query <= budget:
        return int(Qn)
    s = 1 << max(0, (int(Qn) - 1).bit_length() - 1)  # largest power of two < Qn (Qn ≥ 2)
    while s >= 1 and s * bytes_per_query > budget:
        s //= 2
    return int(s) if s >= 1 and s < Qn else 0


def memory_plan(
    H,
    Qn,
    N,
    K=2048,
    budget_gib=DEFAULT_LOGITS_GIB,
    buffer=65536,
    window=2048,
    sinks=16,
    n_anchors=4,
    rotate=2,
    device_gib=None,
    anchor_segments=1,
) -> dict:
    """Working set per query of each route and the query sub-chunk each one runs with.

    Returns {"subchunk": {route: queries}, "bytes_per_query": {...}, "inputs_gib",
    "notes": [why a route is sub-chunked], "skipped": reason or None}.  Routes: dense
    (fp32 logits row, N·4; torch.topk reads the same rows), dosa (survivor bitmask N/8,
    compact records buffer·8 and the FP8 refinement's spill buffer·12·refine.SPILL_RATIO
    (with ``refine.SPILL``),
    seed records (sinks + window + min(n_anchors·S·K, N))·8 with S = anchor_segments, plan
    temporaries), dosa_stats (dosa + the survivor popcount of return_stats: one uint8
    per bitmask byte, N/8 bytes; refine.popcount_rows), fused (records + seed
    records).  Not counted: the exact extension of an overflowing refine (sized by the
    largest count, unknown in advance) and query-level recovery (dense route over ≤ 8 GiB
    chunks) — both caught at run time.
    """
    budget = float(budget_gib) * GIB
    Hp = -(-int(H) // 16) * 16
    seed_rec = (sinks + window + min(n_anchors * anchor_segments * K, int(N))) * 8
    nw_bytes = -(-int(N) // 32) * 4
    plan_b = PLAN_F64_TEMPS * Hp * D * 8
    # the spill, where it is on: a uint64 record and an int32 row each
    recs = buffer * 8 + (int(buffer * refine.SPILL_RATIO * 12) if refine.SPILL else 0)
    bpq = {
        "dense": int(N) * 4,
        "dosa": nw_bytes + recs + seed_rec + plan_b,
        "dosa_stats": nw_bytes + nw_bytes + recs + seed_rec + plan_b,
        "fused": buffer * 8 + seed_rec,
    }
    # rotated input sets: e4m3 queries (+ padded copy), fp32 weights, keys, ranges
    inputs = rotate * (Qn * (Hp + H) * D + Qn * (Hp + H) * 4 + N * KEY_BYTES + Qn * 8)
    out = {
        "budget_gib": float(budget_gib),
        "bytes_per_query": bpq,
        "inputs_gib": inputs / GIB,
        "subchunk": {},
        "notes": [],
        "skipped": None,
    }
    for route, b in bpq.items():
        sub = largest_pow2_subchunk(int(Qn), b, budget)
        out["subchunk"][route] = sub
        if sub == 0:
            out["skipped"] = (
                f"{route}: one query needs {b / 2**20:.2f} MiB > budget {budget_gib:g} GiB"
            )
        elif sub < Qn:
            out["notes"].append(
                f"{route}: {Qn} queries × {b / 2**20:.2f} MiB = {Qn * b / GIB:.1f} GiB > "
                f"budget {budget_gib:g} GiB → {-(-Qn // sub)} sub-chunks of {sub} queries"
            )
    if out["skipped"] is None and device_gib is not None:
        peak = inputs + max(min(Qn, s) * bpq[k] for k, s in out["subchunk"].items())
        if peak > float(device_gib) * GIB:
            out["skipped"] = (
                f"inputs {inputs / GIB:.1f} GiB + largest route working set exceed the "
                f"device's {device_gib:.0f} GiB"
            )
    return out


def estimate_seconds(H, Qn, N, reps=10, rotate=2, r=14) -> float:
    """Rough wall time of one shape (EST_* model above); for part balancing and --dry-run."""
    f = floors_ms(H, Qn, N, r=r)
    mma_h = f["fused_floor_ms"]
    logits = EST_X["logits"] * f["logits_floor_ms"]
    select = EST_X["select"] * f["select_floor_ms"]
    torch_topk = EST_X["torch_topk"] * f["select_floor_ms"]
    fused = EST_X["fused"] * mma_h
    dosa = EST_X["screen"] * f["screen_floor_ms"] + EST_REFINE * mma_h
    per_replay = logits + select + torch_topk + (logits + select) + fused + dosa
    # timed replays + warm-ups, then one untimed pass of each for the ids and the stats
    gpu_ms = (reps + WARM + 1) * per_replay
    # rotated sets are generated in threads: two took ~1.5× one set on 2 CPU cores
    host = (1 + 0.5 * (rotate - 1)) * (EST_HOST_KEY_S * N + EST_HOST_QH_S * Qn * H)
    return gpu_ms / 1e3 + host


def x_floor(row) -> dict:
    """Measured time / floor per route (None where either is missing)."""
    fl = row_floors(row)
    out = {}
    for k in ROUTES:
        t, f = row.get(f"{k}_ms"), fl.get(f"{k}_floor_ms")
        out[k] = (t / f) if (t is not None and f) else None
    t, f = row.get("fp8_logits_ms"), fl.get("logits_floor_ms")  # the same work's floor
    out["fp8_logits"] = (t / f) if (t is not None and f) else None
    return out


def row_floors(row) -> dict:
    """Floors stored in the row, or computed from it (rows of older runs lack some)."""
    sv = row.get("survival_pooled", row.get("survival_mean"))
    fl = floors_ms(
        row["H"], row["Qn"], row["N"], row.get("visible_pairs"), sv, int(row.get("r", 14))
    )
    fl.update({k: v for k, v in row.items() if k.endswith("_floor_ms") and v is not None})
    return fl
