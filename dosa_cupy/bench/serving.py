"""``dosa bench --serving``: the serving API's calls in one run on the GPU (docs/serving.md
"Benchmark: dosa bench --serving").

    (a) small  small prefill chunks (Qn 1, 16, 64 × H) at N keys (default 128K): dosa_topk
               and dense_topk, each with check=True (default) and check=False; DoSA / dense
               for like-for-like check settings; the four calls timed in turn in every
               replay, SMALL_REPLAYS × --reps replays (host-bound calls of ~0.3 ms drift
               more between blocks of replays than they differ)
    (b) ragged a ragged batch of 8 requests (Σ N_b = N, a few hundred queries) in one
               ``serving.ragged_topk`` call against 8 separate ``dosa_topk`` calls
    (c) paged  ``serving.paged_prefill_topk`` (gather + ragged call) against the contiguous
               ``ragged_topk``, and with physical=True
    (d) decode eager DoSA decode, DoSA captured in a CUDA graph and replayed, the dense
               decode route (``bench.decode.bench_shape``, without peers)
    (e) graph  prefill chunks (Qn 1, 16, 64, 4096) captured in CUDA graphs
               (``capture.PrefillSelectorGPU``: route "auto", "auto" with route_per_step
               ("step"), "dosa", "dense"), each
               replay timed with its ``finish`` (one read, the flagged re-runs), against
               eager ``dosa_topk`` and ``dense_topk`` with check=False

CUDA events, warm-up, medians over replays of rotated input sets (``timing.median_ms``,
docs/benchmark_method.md); ids compared in every part.  Writes ``bench_serving.json`` and
``bench_serving.md`` under ``--out`` (default ``out/serving``) with date, commit
(``--commit`` > $DOSA_COMMIT > git) and device.

    dosa bench --serving [--parts small,ragged,paged,decode,graph] [--heads 32,64]
                         [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from dosa_ref.cmdline import CommandParser

from .report import cell, device_name, md_table, run_meta
from .timing import check_run_args, free, median_ms, median_ms_interleaved, no_gpu_exit

PARTS = ("small", "ragged", "paged", "decode", "graph")
SMALL_REPLAYS = 10  # part (a)'s replays per --reps: its calls take ~0.2-0.7 ms
SMALL_QN = (1, 16, 64)
GRAPH_QN = (1, 16, 64, 4096)
GRAPH_ROUTES = ("auto", "step", "dosa", "dense")
# each graph route's PrefillSelectorGPU options ("step": the route chosen in every replay)
GRAPH_OPTIONS = {"auto": {"route": "auto"}, "step": {"route": "auto", "route_per_step": True},
                 "dosa": {"route": "dosa"}, "dense": {"route": "dense"}}  # fmt: skip
# a ragged batch: 8 requests, Σ N_b = 131072 keys, Σ Qn_b = 360 queries (default --keys)
RAGGED_N = (4096, 8192, 12288, 16384, 20480, 24576, 16384, 28672)
RAGGED_QN = (16, 32, 48, 64, 8, 96, 40, 56)
DECODE_SHAPES = ((1, 131072), (8, 131072))  # (B, ctx), next_n = 1


def _ints(spec: str, name: str) -> list[int]:
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(x < 1 for x in out):
        raise ValueError(f"{name}: expected positive integers separated by commas, got {spec!r}")
    return out


def parse_args(argv) -> argparse.Namespace:
    """The mode's arguments, validated (ValueError naming the argument); no GPU needed."""
    ap = CommandParser(prog="dosa bench --serving", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    ap.add_argument("--heads", default="32,64", help="H values, e.g. 32,64")
    ap.add_argument("--keys", type=int, default=131072, help="N of (a); Σ N_b of (b), (c)")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--regime", default="calibrated", help="dosa_cupy.workload regime")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--rotate", type=int, default=2, help="input sets replayed in turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/serving", help="bench_serving.json / .md go here")
    ap.add_argument("--commit", default=None, help="commit recorded (default $DOSA_COMMIT)")
    a = ap.parse_args(argv)
    a.parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    bad = [p for p in a.parts if p not in PARTS]
    if bad or not a.parts:
        raise ValueError(f"parts: expected a comma list of {PARTS}, got {bad or a.parts}")
    a.heads = _ints(a.heads, "heads")
    if any(not 1 <= h <= 64 for h in a.heads):
        raise ValueError(f"heads: expected values in [1, 64], got {a.heads}")
    check_run_args(a.reps, a.rotate, a.K)
    if a.warm < 1:
        raise ValueError(f"warm: at least 1 warm-up call, got {a.warm}")
    short = a.keys < sum(RAGGED_QN) or any(
        n < q for n, q in zip(ragged_lengths(a.keys), RAGGED_QN, strict=True)
    )  # every ragged request needs at least as many keys as queries (causal chunks)
    if short or a.keys < max(SMALL_QN):
        raise ValueError(f"keys: too few for the ragged batch's requests, got {a.keys}")
    return a


def ragged_lengths(total: int) -> list[int]:
    """The 8 requests' key counts, RAGGED_N scaled to sum to ``total`` (each ≥ its Qn)."""
    n = [max(q, int(x * total // sum(RAGGED_N))) for x, q in zip(RAGGED_N, RAGGED_QN, strict=True)]
    n[-1] += total - sum(n)
    return n


# ---------------------------------------------------------------------------------------
# (a) small prefill chunks
# ---------------------------------------------------------------------------------------


def _chunk_sets(a, H, Qn) -> list:
    """``a.rotate`` input sets of one prefill chunk (Qn queries, ``a.keys`` keys)."""
    from dosa_cupy.workload import make_gpu_workload

    return [make_gpu_workload(a.regime, Qn, a.keys, H, seed=a.seed + i) for i in range(a.rotate)]


def _chunk_args(s, K) -> tuple:
    """A set's positional arguments of ``dosa_topk`` / ``dense_topk``."""
    return (s["q"], s["w"], s["k_payload"], s["k_scale"], K, s["ks"], s["ke"])


def _done(cp, row: dict, log) -> dict:
    """Log a finished row (without its per-replay lists) and free the pool."""
    log(json.dumps({k: v for k, v in row.items() if not k.endswith("_all")}))
    free(cp)
    return row


def _small(cp, a, H, Qn, log) -> dict:
    import dosa_cupy

    sets = _chunk_sets(a, H, Qn)

    def args(s):
        return _chunk_args(s, a.K)

    routes = {
        "dosa": lambda s: dosa_cupy.dosa_topk(*args(s)),
        "dosa_nocheck": lambda s: dosa_cupy.dosa_topk(*args(s), check=False),
        "dense": lambda s: dosa_cupy.dense_topk(*args(s)),
        "dense_nocheck": lambda s: dosa_cupy.dense_topk(*args(s), check=False),
    }
    row = dict(H=H, Qn=Qn, N=a.keys, K=a.K, regime=a.regime, replays=SMALL_REPLAYS * a.reps)
    timed = median_ms_interleaved(cp, routes, row["replays"], a.warm, sets)
    for name, (ms, all_ms) in timed.items():
        row[f"{name}_ms"], row[f"{name}_ms_all"] = ms, all_ms
    want = [routes["dense"](s) for s in sets]  # every other route against it, once per set
    row["ids_equal"] = all(
        bool(cp.array_equal(routes[r](s), d)) for s, d in zip(sets, want, strict=True)
        for r in routes if r != "dense"
    )  # fmt: skip
    row["dosa_over_dense"] = row["dosa_ms"] / row["dense_ms"]
    row["dosa_over_dense_nocheck"] = row["dosa_nocheck_ms"] / row["dense_nocheck_ms"]
    del sets
    return _done(cp, row, log)


# ---------------------------------------------------------------------------------------
# (b) ragged batch, (c) paged prefill
# ---------------------------------------------------------------------------------------


def _ragged_set(cp, a, H, seed) -> dict:
    """One input set of the ragged batch: the 8 requests' workloads concatenated, their
    offsets, and a paged cache of the same keys behind a shuffled block table."""
    from dosa_cupy.decode import PAGE
    from dosa_cupy.serving import page_rows
    from dosa_cupy.workload import make_gpu_workload

    nk = ragged_lengths(a.keys)
    parts = [make_gpu_workload(a.regime, m, n, H, seed=seed + 101 * b)
             for b, (m, n) in enumerate(zip(RAGGED_QN, nk, strict=True))]  # fmt: skip
    s = {k: cp.concatenate([p[k] for p in parts]) for k in ("q", "w", "k_payload", "k_scale")}
    s["parts"] = [{k: p[k] for k in ("q", "w", "k_payload", "k_scale", "ks", "ke")} for p in parts]
    s["cu_q"] = cp.asarray(np.concatenate([[0], np.cumsum(RAGGED_QN)]).astype(np.int32))
    cu_k = np.concatenate([[0], np.cumsum(nk)]).astype(np.int64)
    s["cu_k"] = cp.asarray(cu_k.astype(np.int32))
    # paged cache (docs/serving.md "Paged prefill"): blocks of each request in a shuffled
    # order, the keys written to their physical rows
    nblk = [-(-n // PAGE) for n in nk]
    mb, nb = max(nblk), sum(nblk) + 1
    perm = np.random.default_rng(seed).permutation(nb)
    bt = np.zeros((len(nk), mb), np.int32)
    at = 0
    for b, c in enumerate(nblk):
        bt[b, :c] = perm[at : at + c]
        at += c
    s["bt"] = cp.asarray(bt)
    s["lengths"] = cp.asarray(np.asarray(nk, np.int32))
    req = cp.asarray(np.repeat(np.arange(len(nk)), nk))
    pos = cp.arange(int(cu_k[-1]), dtype=cp.int64) - cp.asarray(cu_k)[req]
    rows = page_rows(s["bt"], req, pos[:, None], cp)[:, 0]
    kv = cp.zeros((nb * PAGE, 128), dtype=cp.uint8)
    sc = cp.ones(nb * PAGE, dtype=cp.float32)
    kv[rows], sc[rows] = s["k_payload"], s["k_scale"]
    s["kv"], s["kv_scale"] = kv.reshape(nb, PAGE, 128), sc.reshape(nb, PAGE)
    return s


def _ragged_calls(a):
    """The timed calls of (b) and (c) on one input set."""
    import dosa_cupy
    from dosa_cupy.serving import paged_prefill_topk, ragged_topk

    def ragged(s):
        return ragged_topk(s["q"], s["w"], s["k_payload"], s["k_scale"], a.K, s["cu_q"], s["cu_k"])

    def separate(s):
        return [dosa_cupy.dosa_topk(p["q"], p["w"], p["k_payload"], p["k_scale"], a.K,
                                    p["ks"], p["ke"]) for p in s["parts"]]  # fmt: skip

    def paged(s, physical=False):
        return paged_prefill_topk(s["q"], s["w"], s["kv"], s["kv_scale"], s["bt"],
                                  s["lengths"], s["cu_q"], a.K, physical=physical)  # fmt: skip

    return ragged, separate, paged


def _ragged_rows(cp, a, H, log) -> tuple[dict | None, dict | None]:
    """(b) and (c), each only when asked for (``a.parts``): the ragged call is timed once
    (it is (b)'s one call and (c)'s contiguous baseline) and its ids computed once per set."""
    sets = [_ragged_set(cp, a, H, a.seed + 7 * i) for i in range(a.rotate)]
    ragged, separate, paged = _ragged_calls(a)
    base = dict(H=H, B=len(RAGGED_QN), queries=sum(RAGGED_QN), keys=a.keys, K=a.K,
                regime=a.regime, qn=list(RAGGED_QN), nk=ragged_lengths(a.keys))  # fmt: skip
    ragged_ms = median_ms(cp, ragged, a.reps, a.warm, sets)
    want = [ragged(s) for s in sets]
    rb = rc = None
    if "ragged" in a.parts:
        rb = dict(base)
        rb["ragged_ms"], rb["ragged_ms_all"] = ragged_ms
        rb["separate_ms"], rb["separate_ms_all"] = median_ms(cp, separate, a.reps, a.warm, sets)
        rb["separate_over_ragged"] = rb["separate_ms"] / rb["ragged_ms"]
        rb["ids_equal"] = all(
            bool(cp.array_equal(d, cp.concatenate(separate(s))))
            for s, d in zip(sets, want, strict=True)
        )
    if "paged" in a.parts:
        rc = dict(base)
        rc["paged_ms"], rc["paged_ms_all"] = median_ms(cp, paged, a.reps, a.warm, sets)
        rc["contiguous_ms"], rc["contiguous_ms_all"] = ragged_ms

        def phys(s):
            return paged(s, True)

        rc["physical_ms"], rc["physical_ms_all"] = median_ms(cp, phys, a.reps, a.warm, sets)
        rc["paged_over_contiguous"] = rc["paged_ms"] / rc["contiguous_ms"]
        rc["ids_equal"] = all(
            bool(cp.array_equal(paged(s), d)) for s, d in zip(sets, want, strict=True)
        )
        rc["physical_ids_equal"] = all(
            _rows_hold_keys(cp, s, phys(s), d) for s, d in zip(sets, want, strict=True)
        )
    for r in (rb, rc):
        if r is not None:
            log(json.dumps({k: v for k, v in r.items() if not k.endswith("_all")}))
    del sets
    free(cp)
    return rb, rc


def _rows_hold_keys(cp, s, phys, want) -> bool:
    """The physical rows ``phys`` hold the keys the logical ids ``want`` name (the same
    payload in the paged cache as in the request's contiguous keys), −1 where ``want`` is."""
    req = cp.asarray(np.repeat(np.arange(len(RAGGED_QN)), RAGGED_QN))  # each query's request
    ok = want >= 0
    if not bool(cp.array_equal(phys < 0, ~ok)):
        return False
    flat = s["kv"].reshape(-1, 128)
    start = s["cu_k"][:-1].astype(cp.int64)[req][:, None]
    logical = s["k_payload"][cp.where(ok, want + start, 0)]
    return bool(cp.all(cp.where(ok[..., None], flat[cp.where(ok, phys, 0)] == logical, True)))


# ---------------------------------------------------------------------------------------
# (d) decode
# ---------------------------------------------------------------------------------------


def _decode(cp, a, H, log) -> list[dict]:
    """``bench.decode.bench_shape`` (eager DoSA, dense decode, DoSA captured in a CUDA graph
    and replayed) at DECODE_SHAPES, next_n = 1, without peers."""
    from .decode import bench_shape

    rows = []
    for B, ctx in DECODE_SHAPES:
        r = bench_shape(H, B, ctx, 1, a.K, a.reps, a.warm, 2, None, a.seed, log, None)
        rows.append({k: v for k, v in r.items() if k in DECODE_KEYS})
        free(cp)
    return rows


DECODE_KEYS = ("H", "B", "ctx", "next_n", "K", "dosa_ms", "dense_ms", "dosa_graph_ms",
               "ids_equal", "dosa_graph_ids_equal", "key_floor_ms", "dosa_ms_all",
               "dense_ms_all", "dosa_graph_ms_all")  # fmt: skip


# ---------------------------------------------------------------------------------------
# (e) captured prefill
# ---------------------------------------------------------------------------------------


def _graph(cp, a, H, Qn, log) -> dict:
    """Prefill steps captured in CUDA graphs (one graph per input set and route; the sets
    share a selector, so its graphs share one arena and replay in stream order), each
    timed as replay + ``finish``; eager ``dosa_topk`` / ``dense_topk`` (check=False) on
    the same sets."""
    import dosa_cupy
    from dosa_cupy.capture import PrefillSelectorGPU

    names = ("q", "w", "k_payload", "k_scale", "ks", "ke")
    sets = _chunk_sets(a, H, Qn)
    row = dict(H=H, Qn=Qn, N=a.keys, K=a.K, regime=a.regime)
    want = [dosa_cupy.dense_topk(*_chunk_args(s, a.K)) for s in sets]
    eq = True
    stream = cp.cuda.Stream(non_blocking=True)
    for route in GRAPH_ROUTES:
        sel = PrefillSelectorGPU(a.K, check=False, **GRAPH_OPTIONS[route])
        for s in sets:
            x, out = [s[k] for k in names], cp.empty((Qn, a.K), dtype=cp.int64)
            with stream:
                sel.step(*x, out=out).finish()  # the shape's first step (eager), then the
                sel.step(*x, out=out).finish()  # arena's; neither is in the graph
                stream.begin_capture()
                h = sel.step(*x, out=out)
                s[route] = (stream.end_capture(), h)
            stream.synchronize()

        def replay(s, route=route):
            g, h = s[route]
            g.launch()
            h.finish()

        row[f"{route}_graph_ms"], row[f"{route}_graph_ms_all"] = median_ms(
            cp, replay, a.reps, a.warm, sets
        )
        row[f"{route}_route"] = next(iter(sel._shapes.values())).route
        taken = set()
        for s, d in zip(sets, want, strict=True):
            replay(s)
            eq = eq and bool(cp.array_equal(s[route][1].ids, d))
            taken.add(s[route][1].route)  # the replay's own choice where it chooses per step
        row[f"{route}_taken"] = sorted(taken)
        del sel
        for s in sets:
            s.pop(route)

    def eager(fn):
        return lambda s: fn(*_chunk_args(s, a.K), check=False)

    for name, fn in (("dosa", dosa_cupy.dosa_topk), ("dense", dosa_cupy.dense_topk)):
        row[f"{name}_eager_ms"], row[f"{name}_eager_ms_all"] = median_ms(
            cp, eager(fn), a.reps, a.warm, sets
        )
    row["ids_equal"] = eq
    row["auto_graph_over_dense_graph"] = row["auto_graph_ms"] / row["dense_graph_ms"]
    row["auto_graph_over_dense_eager"] = row["auto_graph_ms"] / row["dense_eager_ms"]
    del sets
    return _done(cp, row, log)


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def _ms(key):
    return lambda r: cell(r[key], "{:.3f}")


def _x(key):
    return lambda r: f"{cell(r[key])}×"


def _v(key, fmt="{}"):
    return lambda r: fmt.format(r[key])


_REQ = [("H", _v("H")), ("B", _v("B")), ("queries", _v("queries")), ("keys", _v("keys", "{:,}"))]
TABLES = {  # part → (title, columns)
    "small": ("(a) Small prefill chunks", [
        ("H", _v("H")), ("Qn", _v("Qn")), ("N", _v("N", "{:,}")),
        ("replays", lambda r: cell(r.get("replays"), "{}")), ("DoSA ms", _ms("dosa_ms")),
        ("DoSA check=False ms", _ms("dosa_nocheck_ms")), ("dense ms", _ms("dense_ms")),
        ("dense check=False ms", _ms("dense_nocheck_ms")), ("DoSA / dense", _x("dosa_over_dense")),
        ("DoSA / dense (check=False)", _x("dosa_over_dense_nocheck")),
        ("ids equal", _v("ids_equal"))]),
    "ragged": ("(b) Ragged batch: one call vs separate calls", [
        *_REQ, ("ragged ms", _ms("ragged_ms")), ("8 calls ms", _ms("separate_ms")),
        ("8 calls / ragged", _x("separate_over_ragged")), ("ids equal", _v("ids_equal"))]),
    "paged": ("(c) Paged prefill vs contiguous", [
        *_REQ, ("paged ms", _ms("paged_ms")), ("paged physical ms", _ms("physical_ms")),
        ("contiguous ms", _ms("contiguous_ms")),
        ("paged / contiguous", _x("paged_over_contiguous")), ("ids equal", _v("ids_equal")),
        ("physical ids equal", _v("physical_ids_equal"))]),
    "decode": ("(d) Decode: captured replay vs eager vs dense (next_n = 1)", [
        ("H", _v("H")), ("B", _v("B")), ("ctx", _v("ctx", "{:,}")),
        ("DoSA graph ms", _ms("dosa_graph_ms")), ("DoSA eager ms", _ms("dosa_ms")),
        ("dense ms", _ms("dense_ms")), ("ids equal", _v("ids_equal")),
        ("graph ids equal", _v("dosa_graph_ids_equal"))]),
    "graph": ("(e) Prefill captured in CUDA graphs: replay + finish vs eager (check=False)", [
        ("H", _v("H")), ("Qn", _v("Qn")), ("N", _v("N", "{:,}")),
        ("auto route", _v("auto_route")), ("auto graph ms", _ms("auto_graph_ms")),
        ("per-step graph ms", lambda r: cell(r.get("step_graph_ms"), "{:.3f}")),
        ("per-step replays took", lambda r: ", ".join(r.get("step_taken", [])) or "-"),
        ("dosa graph ms", _ms("dosa_graph_ms")), ("dense graph ms", _ms("dense_graph_ms")),
        ("DoSA eager ms", _ms("dosa_eager_ms")), ("dense eager ms", _ms("dense_eager_ms")),
        ("auto graph / dense graph", _x("auto_graph_over_dense_graph")),
        ("auto graph / dense eager", _x("auto_graph_over_dense_eager")),
        ("ids equal", _v("ids_equal"))]),
}  # fmt: skip


def markdown(res: dict) -> str:
    """The tables of a run (parts not run are left out)."""
    m = res["meta"]
    head = (f"# dosa bench --serving\n\n{m['date_utc']}, commit {m['commit']}, "
            f"{res.get('device') or 'unknown device'}\n")  # fmt: skip
    return head + "".join(
        md_table(f"\n## {t}\n\n", cols, res.get(p)) for p, (t, cols) in TABLES.items()
    )


def all_equal(res: dict) -> bool:
    """Every part's ids equal (the run's exit status)."""
    rows = [r for p in PARTS for r in res.get(p) or []]
    keys = ("ids_equal", "physical_ids_equal", "dosa_graph_ids_equal")
    return all(r.get(k) is not False for r in rows for k in keys)


def _write(out, res) -> None:
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    (p / "bench_serving.json").write_text(json.dumps(res, indent=1))
    (p / "bench_serving.md").write_text(markdown(res))


def main(argv=None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    rc = no_gpu_exit("dosa bench --serving")
    if rc is not None:
        return rc
    import cupy as cp

    def log(s):
        print(s, flush=True)

    res = {"meta": run_meta(a.commit), "args": dict(vars(a))}
    res["device"] = device_name(cp)
    for p in PARTS:
        res[p] = []
    t0 = time.time()
    for H in a.heads:
        if "small" in a.parts:
            res["small"] += [_small(cp, a, H, Qn, log) for Qn in SMALL_QN]
            _write(a.out, res)  # after every part: a run cut short keeps what finished
        if "ragged" in a.parts or "paged" in a.parts:
            rb, rc_ = _ragged_rows(cp, a, H, log)
            res["ragged"] += [rb] if rb is not None else []
            res["paged"] += [rc_] if rc_ is not None else []
            _write(a.out, res)
        if "decode" in a.parts:
            res["decode"] += _decode(cp, a, H, log)
            _write(a.out, res)
        if "graph" in a.parts:
            res["graph"] += [_graph(cp, a, H, Qn, log) for Qn in GRAPH_QN if Qn <= a.keys]
            _write(a.out, res)
        log(f"# H={H} done ({time.time() - t0:.0f} s)")
    res["ids_equal"] = all_equal(res)
    _write(a.out, res)
    md = markdown(res)
    print(md)
    print(f"# wrote {Path(a.out) / 'bench_serving.json'}, {Path(a.out) / 'bench_serving.md'}")
    return 0 if res["ids_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
