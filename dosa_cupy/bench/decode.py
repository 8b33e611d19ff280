"""``dosa bench --decode``: the dense decode route (paged logits + exact selection) and the
fused DoSA decode (witness τ, compact writeback, exact selection) in one run (issue 6).

Paged FP8 cache (64-token blocks, shuffled block table), B requests of context ``ctx``
(minus a few tokens, growing by next_n per step), H heads, K = 2048.  Each replay is a new
decode step of a query walk (rotated inputs: q_t = 0.9·q_{t−1} + noise around a topic, so
the previous steps' selections are useful witnesses, as in serving).  CUDA events,
warm-up steps, medians over ≥ 10 replays, same-run ratio dense / DoSA, ids of every timed
step cross-checked (DoSA == dense bitwise), JSON + markdown output, shape filter.

    python -m dosa_cupy.bench --decode --shapes 32x1x131072,64x64x1048576 --out DIR
    dosa bench --decode --filter x1048576            (shape = HxBxCTX)

Default shapes: H ∈ {32, 64} × B ∈ {1, 8, 64} × ctx ∈ {128K, 256K, 512K, 1M}.
``--regime trained`` (or ``synthetic,trained``): the trained regime's decode walks instead
(``trained_walk``: held-out text through the shipped indexers, docs/workloads.md; H 32 / 64,
every key encoded, so B·ctx ≤ 2^24 tokens).
Measured on the H200: docs/records/benchmarks.md ("Decode", "Decode grid").

Beside each time, the key-read floor (``key_floor_ms``: every request's visible keys read
once, 132 bytes each, at the H200's 4.24 TB/s) and time / floor.  Peers (``--peers``, on by
default; decode_peers.py): DeepGEMM's paged logits alone and + torch.topk, and torch.topk
vs the project's selection on the project's own decode logits, on the same steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from dosa_ref.cmdline import CommandParser

from .memplan import HBM, KEY_BYTES
from .report import md_table
from .shapes import filter_match

CTXS = (131072, 262144, 524288, 1048576)
DEFAULT_SHAPES = ",".join(f"{H}x{B}x{c}" for H in (32, 64) for B in (1, 8, 64) for c in CTXS)
CHUNK = 1 << 22  # tokens generated per chunk (float32 chunk: 2 GiB)


def parse_shapes(spec: str, filt: str | None = None) -> list[tuple[int, int, int]]:
    """ "HxBxCTX,..." → [(H, B, ctx)], keeping shapes whose text contains one of the
    comma-separated substrings of ``filt`` (``shapes.filter_match``, as the prefill bench)."""
    out = []
    for sh in spec.split(","):
        sh = sh.strip()
        if not sh or not filter_match(sh, filt):
            continue
        parts = sh.split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shapes: expected HxBxCTX, got {sh!r}")
        H, B, ctx = (int(p) for p in parts)
        if not (1 <= H <= 64 and B >= 1 and ctx >= 64):
            raise ValueError(f"shapes: need 1 <= H <= 64, B >= 1, CTX >= 64, got {sh!r}")
        out.append((H, B, ctx))
    return out


def make_cache(cp, B, ctx, seed):
    """Paged cache of B·ceil(ctx/64) blocks (+1 spare), structured keys quantized on the GPU."""
    from dosa_cupy.prepare import quantize_keys

    rs = cp.random.RandomState(seed)
    mb = -(-ctx // 64)
    nb = B * mb + 1
    rows = nb * 64
    topics = rs.standard_normal((8, 128), dtype=cp.float32)
    topics /= cp.linalg.norm(topics, axis=1, keepdims=True)
    kv = cp.empty((rows, 128), dtype=cp.uint8)
    sc = cp.empty(rows, dtype=cp.float32)
    for a in range(0, rows, CHUNK):
        m = min(CHUNK, rows - a)
        kf = rs.standard_normal((m, 128), dtype=cp.float32)
        load = rs.exponential(1.0, (m, 8)).astype(cp.float32) ** 2
        load *= (rs.random_sample((m, 8)) < 0.3).astype(cp.float32)
        kf += 1.5 * load @ topics
        p, s, _ = quantize_keys(kf)
        kv[a : a + m], sc[a : a + m] = p, s
        del kf, load, p, s
    bt = rs.permutation(nb)[: B * mb].reshape(B, mb).astype(cp.int32)
    return kv.reshape(nb, 64, 128), sc.reshape(nb, 64), bt, topics


def query_walk(cp, B, n, H, steps, topics, seed):
    """Per step (q e4m3 [B, n, H, 128], w fp32 [B, n, H]): a drifting walk per request."""
    from dosa_cupy.workload import quantize_queries

    rs = cp.random.RandomState(seed + 1)
    topic = topics[rs.randint(0, topics.shape[0], B)]  # [B, 128]
    qf = 2.0 * topic[:, None, None, :] + rs.standard_normal((B, n, H, 128), dtype=cp.float32)
    w0 = rs.standard_normal((B, n, H), dtype=cp.float32)
    w0[..., : 3 * H // 4] = cp.abs(w0[..., : 3 * H // 4])
    out = []
    for _ in range(steps):
        qf = 0.9 * qf + 0.35 * rs.standard_normal(qf.shape, dtype=cp.float32)
        qp, wq = quantize_queries(qf.reshape(B * n, H, 128), w0.reshape(B * n, H))
        out.append((qp.reshape(B, n, H, 128), wq.reshape(B, n, H)))
    return out


TRAINED_MAX_TOKENS = 1 << 24  # B·ctx encoded per trained shape (~16M tokens)


def paged_walk(xp, keys, qs, ws, lengths, seed):
    """A decode walk in the bench's paged layout from per-request keys: ``keys`` a list of B
    float arrays [ctx, 128] (request b's every key, in position order), ``qs`` float [steps,
    B, n, H, 128] and ``ws`` [steps, B, n, H] the walk's queries and weights, ``lengths`` int
    [steps, B].  Keys and queries are quantized as serving stacks do (per-token e4m3,
    the query scale folded into w; ``dosa_ref.fp8`` on the host, its bit-identical GPU twin
    on the device); request b's position t sits in row t % 64 of block bt[b, t // 64] of a
    cache of B·⌈ctx / 64⌉ + 1 blocks in a shuffled order.  Returns (kv uint8 [nb, 64, 128],
    sc fp32 [nb, 64], bt int32 [B, mb], walk: a list of (q e4m3 [B, n, H, 128], w fp32
    [B, n, H]) per step, lengths: a list of int32 [B] per step)."""
    if xp is np:
        from dosa_ref.fp8 import quantize_keys as qk
        from dosa_ref.fp8 import quantize_queries as qq
    else:
        from dosa_cupy.prepare import quantize_keys as qk
        from dosa_cupy.workload import quantize_queries as qq
    from dosa_cupy.decode_ops import PAGE, physical_rows

    B = len(keys)
    ctx = int(keys[0].shape[0])
    if any(int(k.shape[0]) != ctx for k in keys):
        raise ValueError("keys: every request needs the same number of keys")
    mb = -(-ctx // PAGE)
    nb = B * mb + 1
    kv = xp.zeros((nb * PAGE, 128), dtype=xp.uint8)
    sc = xp.zeros(nb * PAGE, dtype=xp.float32)
    bt = np.random.default_rng(seed).permutation(nb)[: B * mb].reshape(B, mb).astype(np.int32)
    rows = physical_rows(bt, np.broadcast_to(np.arange(ctx), (B, ctx)))
    for b in range(B):
        p, s_ = qk(keys[b])[:2]
        r = xp.asarray(rows[b])
        kv[r], sc[r] = p, s_
    steps, _, n, H, _ = qs.shape
    walk = []
    for i in range(steps):
        qp, wq = qq(qs[i].reshape(B * n, H, 128), ws[i].reshape(B * n, H))
        walk.append((qp.reshape(B, n, H, 128), wq.reshape(B, n, H)))
    lens = [xp.asarray(np.asarray(lengths[i]).astype(np.int32)) for i in range(steps)]
    return kv.reshape(nb, PAGE, 128), sc.reshape(nb, PAGE), xp.asarray(bt), walk, lens


def trained_walk(xp, B, ctx, n, H, steps, seed):
    """The trained regime's decode walk (``dosa_ref.trained.make_trained_decode``: held-out
    text through the shipped indexer of H heads) in the bench's paged layout
    (``paged_walk``): each request holds ``ctx`` keys, the walk's last step sees all of
    them.  ``B·ctx`` is capped at ``TRAINED_MAX_TOKENS`` (every key is encoded)."""
    from dosa_ref.trained import make_trained_decode

    if B * ctx > TRAINED_MAX_TOKENS:
        raise ValueError(f"shapes: the trained regime encodes B·ctx tokens, at most "
                         f"{TRAINED_MAX_TOKENS}; got {B}·{ctx}")  # fmt: skip
    if ctx - n * steps < 1:
        raise ValueError(f"shapes: ctx {ctx} leaves no context before {steps} steps of {n}")
    d = make_trained_decode(B, ctx - n * steps, steps, next_n=n, H=H, seed=seed, xp=xp)
    lengths = d["lengths"].get() if hasattr(d["lengths"], "get") else d["lengths"]
    return paged_walk(xp, d["k"], d["q"], d["w"], lengths, seed)


def key_floor_ms(visible, bw=HBM, key_bytes=KEY_BYTES) -> float:
    """The key-read floor of one decode step in ms: ``visible`` int [B] (each request's
    visible keys, its context length) read once per request (not per query row),
    ``key_bytes`` (128 e4m3 + a fp32 scale) each, at ``bw`` bytes/s."""
    return float(np.sum(np.asarray(visible, dtype=np.int64))) * key_bytes / bw * 1e3


def x_floors(res: dict, floor: float) -> dict:
    """Time / floor of the dense route, DoSA, DeepGEMM logits and DeepGEMM + topk (None
    where a route did not run or the floor is 0)."""
    keys = {"dense": "dense_ms", "dosa": "dosa_ms", "dg_logits": "dg_logits_ms",
            "dg_topk": "dg_topk_ms", "dosa_graph": "dosa_graph_ms",
            "dg_graph": "dg_graph_ms", "dosa_b2b": "dosa_b2b_ms",
            "dg_b2b": "dg_b2b_ms", "dg_select_b2b": "dg_select_b2b_ms"}  # fmt: skip
    return {k: (res[v] / floor if res.get(v) is not None and floor else None)
            for k, v in keys.items()}  # fmt: skip


B2B_ROUNDS = 5  # sequences of back-to-back replays (``back_to_back``)


def back_to_back(cp, graphs, rebuild, rounds: int = B2B_ROUNDS) -> list[float]:
    """ms per step of ``graphs`` (callables, one per timed step: its captured graph — the
    step's input copies, the step, a copy of its output) launched back to back with CUDA
    events around the whole sequence, one value per round (``rebuild()``, untimed, restores
    the state before the first step).  The host's launches run ahead of the GPU, as in a
    serving stack whose decode step is one captured graph, so a value is the steps' device
    time and the gaps between graphs, without the host's time to launch each one (which a
    synchronized replay, ``timed``, includes)."""
    ts = []
    for _ in range(rounds):
        rebuild()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for g in graphs:
            g()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) / len(graphs))
    return ts


def timed(cp, fn, idx):
    """CUDA-event ms of ``fn(i)`` for each step ``i`` of ``idx`` (synchronised after each):
    (times, outputs)."""
    ts, outs = [], []
    for i in idx:
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        r = fn(i)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
        outs.append(r)
    return ts, outs


def bench_shape(H, B, ctx, n, K, reps, warm, history, buffer, seed, log, peers=None,
                regime="synthetic", scorer="f16"):  # fmt: skip
    """One decode shape: the project's routes on the canonical ``scorer`` ("f16" or "fp8",
    dosa_cupy/scorer.py), then the peers (``decode_peers.discover()``; None: none run) on the
    same steps; returns the JSON row.  ``regime``: "synthetic" (a drifting query walk over
    topic-structured keys) or "trained" (``trained_walk``)."""
    import cupy as cp

    from dosa_cupy.decode import DecodeSelectorGPU, dense_decode_topk

    from . import decode_peers

    t0 = time.time()
    steps = warm + reps
    if regime == "trained":
        kv, sc, bt, walk, lengths = trained_walk(cp, B, ctx, n, H, steps, seed)
    else:
        kv, sc, bt, topics = make_cache(cp, B, ctx, seed)
        walk = query_walk(cp, B, n, H, steps, topics, seed)
        rs = np.random.default_rng(seed)
        L0 = np.maximum(0, ctx - n * steps - rs.integers(0, 64, B))
        lengths = [cp.asarray((L0 + n * (i + 1)).astype(np.int32)) for i in range(steps)]
    cp.cuda.Device().synchronize()
    gen_s = time.time() - t0

    def args(i):
        return (*walk[i], kv, sc, bt, lengths[i])

    # full validation once (NaN codes, block table), then the timed calls skip value scans
    dense_decode_topk(*args(0), K, check_values=True, scorer=scorer)
    sel = DecodeSelectorGPU(K, history=history, buffer=buffer, scorer=scorer)  # API defaults

    def tm(fn, idx):
        return timed(cp, fn, idx)

    def dosa(i):
        return sel.step(*args(i), return_stats=False).ids

    def dense(i):
        return dense_decode_topk(*args(i), K, scorer=scorer)

    tm(dosa, range(warm))  # warm-up: builds the witnesses of the walk
    tm(dense, range(warm))
    idx = range(warm, steps)
    over = 0
    ts_dosa, ids_dosa = [], []
    for i in idx:  # DoSA in walk order (witnesses from the previous step)
        t, o = tm(dosa, [i])
        ts_dosa += t
        ids_dosa += o
        over += sel.last_overflow
    ts_dense, ids_dense = tm(dense, idx)
    equal = all(bool(cp.array_equal(a, b)) for a, b in zip(ids_dosa, ids_dense, strict=True))
    # one more step (untimed) for the compaction statistics
    last = sel.step(*args(steps - 1), return_stats=True).stats
    vis = float(B * n * np.mean(cp.asnumpy(lengths[warm])))
    res = dict(
        regime=regime, scorer=scorer, H=H, B=B, ctx=ctx, next_n=n, K=K, reps=reps, warm=warm,
        history=history,
        buffer=sel.buffer, visible_keys=vis,
        dense_ms=statistics.median(ts_dense), dosa_ms=statistics.median(ts_dosa),
        dense_ms_all=ts_dense, dosa_ms_all=ts_dosa,
        step_ratio_median=statistics.median(a / b for a, b in zip(ts_dense, ts_dosa, strict=True)),
        overflow_steps=int(over), compaction=last.compaction,
        survival=getattr(last, "survival", None),  # the keys scored in full (the screen's)
        witnesses_mean=float(last.witnesses.mean()), ids_equal=equal, gen_s=gen_s,
    )  # fmt: skip
    res.update(_dosa_graph(cp, sel_args=(K, history, buffer, scorer), c=dict(
        walk=walk, lengths=lengths, kv=kv, sc=sc, bt=bt, B=B, n=n, K=K, warm=warm, idx=idx,
        dense_ids=dict(zip(idx, ids_dense, strict=True))), tm=tm))  # fmt: skip
    res["speedup"] = res["dense_ms"] / res["dosa_ms"]
    res["dense_keys_per_s"] = vis / (res["dense_ms"] * 1e-3)
    dense_ids = dict(zip(idx, ids_dense, strict=True))
    peer_ctx = dict(cp=cp, B=B, n=n, H=H, K=K, warm=warm, idx=idx, walk=walk, lengths=lengths,
                    kv=kv, sc=sc, bt=bt, dense_ids=dense_ids,
                    back_to_back=lambda gs, rebuild: back_to_back(cp, gs, rebuild))  # fmt: skip
    res.update(decode_peers.run(peers, peer_ctx, tm, log))
    res["key_floor_ms"] = statistics.median(key_floor_ms(cp.asnumpy(lengths[i])) for i in idx)
    res["x_floor"] = x_floors(res, res["key_floor_ms"])
    log(json.dumps({k: v for k, v in res.items() if not k.endswith("_all")}))
    return res


def capture(cp, fn):
    """``fn``'s kernels captured once in a CUDA graph (a CuPy stream capture); returns the
    graph's launch on the current stream."""
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        stream.begin_capture()
        fn()
        graph = stream.end_capture()
    return graph.launch


def _dosa_graph(cp, sel_args, c, tm) -> dict:
    """The DoSA step captured once in a CUDA graph (``check_layout=False``, default buffer,
    ``out=``; docs/method.md §10) and replayed per step after copying the step's q, w and
    lengths into the captured arrays (copies timed): dosa_graph_ms (+ ``_all``),
    dosa_graph_ids_equal (== the dense ids at every timed step).  Then one graph per timed
    step (its input copies, the step, a copy of the ids) replayed back to back
    (``back_to_back``): dosa_b2b_ms (+ ``_all``: per round), dosa_b2b_ids_equal.  Not run
    with a buffer."""
    from dosa_cupy.decode import DecodeSelectorGPU

    K, history, buffer, scorer = sel_args
    if buffer is not None:
        return dict.fromkeys(("dosa_graph_ms", "dosa_graph_ids_equal", "dosa_b2b_ms",
                              "dosa_b2b_ids_equal"))  # fmt: skip
    sel = DecodeSelectorGPU(K, history=history, check_layout=False, scorer=scorer)
    (q0, w0), L0 = c["walk"][0], c["lengths"][0]
    st = [q0.copy(), w0.copy(), L0.copy()]
    out = cp.empty((c["B"], c["n"], K), dtype=cp.int64)

    def put(i):
        (q, w), L = c["walk"][i], c["lengths"][i]
        st[0][...], st[1][...], st[2][...] = q, w, L

    def step():
        sel.step(st[0], st[1], c["kv"], c["sc"], c["bt"], st[2], return_stats=False, out=out)

    def rebuild():  # eager steps: the same witnesses as the eager route
        for i in range(c["warm"]):
            put(i)
            step()

    rebuild()
    launch = capture(cp, step)
    ts, equal = [], True
    for i in c["idx"]:
        (t,), _ = tm(lambda j: (put(j), launch()), [i])
        ts.append(t)
        equal = equal and bool(cp.array_equal(out, c["dense_ids"][i]))
    outs = {i: cp.empty(out.shape, dtype=out.dtype) for i in c["idx"]}

    def whole(i):  # step i with its input copies and a copy of its ids, captured

        def body():
            put(i)
            step()
            outs[i][...] = out

        return capture(cp, body)

    b2b = back_to_back(cp, [whole(i) for i in c["idx"]], rebuild)
    return {
        "dosa_graph_ms": statistics.median(ts), "dosa_graph_ms_all": ts,
        "dosa_graph_ids_equal": equal,
        "dosa_b2b_ms": statistics.median(b2b), "dosa_b2b_ms_all": b2b,
        "dosa_b2b_ids_equal": all(bool(cp.array_equal(outs[i], c["dense_ids"][i]))
                                  for i in c["idx"]),
    }  # fmt: skip


def _cell(v, fmt="{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def _xf(key):
    """A column of a row's time over its floor (``x_floors``)."""
    return lambda r: _cell((r.get("x_floor") or {}).get(key), "{:.2f}×")


# the step's shape, first columns of the graph and peer tables
_STEP_COLS = [
    ("H", lambda r: str(r["H"])), ("B", lambda r: str(r["B"])),
    ("ctx", lambda r: f"{r['ctx']:,}"), ("next_n", lambda r: str(r["next_n"])),
    ("scorer", lambda r: r.get("scorer", "f16")),  # rows of older runs: f16
]  # fmt: skip


def markdown(rows) -> str:
    """The decode table (the key-read floor and time / floor after the original columns)
    and, for rows with peer fields, the peers table and the reasons peers did not run."""
    head = (
        "| regime | H | B | ctx | next_n | scorer | dense ms | DoSA ms | speedup | step ratio "
        "| compaction | scored | overflow steps | ids equal | key floor ms | dense ×floor "
        "| DoSA ×floor |\n|" + "---|" * 17 + "\n"
    )
    body = "".join(
        f"| {r.get('regime', 'synthetic')} | {r['H']} | {r['B']} | {r['ctx']:,} "
        f"| {r['next_n']} | {r.get('scorer', 'f16')} | {r['dense_ms']:.3f} "
        f"| {r['dosa_ms']:.3f} | {r['speedup']:.2f}× | {r['step_ratio_median']:.2f}× "
        f"| {r['compaction']:.4f} | {_cell(r.get('survival'), '{:.4f}')} "
        f"| {r['overflow_steps']} | {r['ids_equal']} "
        f"| {_cell(r.get('key_floor_ms'), '{:.4f}')} "
        f"| {_cell((r.get('x_floor') or {}).get('dense'), '{:.2f}×')} "
        f"| {_cell((r.get('x_floor') or {}).get('dosa'), '{:.2f}×')} |\n"
        for r in rows
    )
    return head + body + peers_markdown(rows) + graph_markdown(rows)


def graph_markdown(rows) -> str:
    """Both steps as a serving stack runs them: captured once in a CUDA graph, replayed per
    step (input copies included); "" when no row has a graph time."""

    def ratio(a, b):
        def cell(r):
            x, y = r.get(a), r.get(b)
            return _cell(y / x if x and y is not None else None, "{:.2f}×")

        return cell

    cols = [
        *_STEP_COLS,
        ("DoSA graph ms", lambda r: _cell(r.get("dosa_graph_ms"))), ("×floor", _xf("dosa_graph")),
        ("DG+topk graph ms", lambda r: _cell(r.get("dg_graph_ms"))), ("×floor", _xf("dg_graph")),
        ("DG graph / DoSA graph", ratio("dosa_graph_ms", "dg_graph_ms")),
        ("DoSA b2b ms", lambda r: _cell(r.get("dosa_b2b_ms"))), ("×floor", _xf("dosa_b2b")),
        ("DG+topk b2b ms", lambda r: _cell(r.get("dg_b2b_ms"))), ("×floor", _xf("dg_b2b")),
        ("DG b2b / DoSA b2b", ratio("dosa_b2b_ms", "dg_b2b_ms")),
        ("DG+select b2b ms", lambda r: _cell(r.get("dg_select_b2b_ms"))),
        ("DG+select b2b / DoSA b2b", ratio("dosa_b2b_ms", "dg_select_b2b_ms")),
        ("DoSA graph ids == dense (per step, b2b)",
         lambda r: f"{r.get('dosa_graph_ids_equal')}, {r.get('dosa_b2b_ids_equal')}"),
    ]  # fmt: skip
    intro = (
        "\nCaptured in CUDA graphs: DoSA (`check_layout=False`, default buffer, `out=`) and "
        "DeepGEMM metadata + logits + tail mask + torch.topk (torch.cuda.CUDAGraph). "
        '"graph": one graph replayed per step, synchronized, after copying the step\'s q, w '
        "and lengths into its buffers (the copies' and the graph's launches from the host "
        'timed). "b2b": one graph per step holding its input copies, the step and a copy '
        "of its output, the steps' graphs launched back to back and timed as a sequence "
        "(per step, median of rounds): the device time of a step inside a serving stack's "
        "captured decode, without the host's launch gaps. \"DG+select\": DeepGEMM's "
        "metadata + logits and the project's exact selection (`select_rows`) on them, "
        "captured and timed back to back the same way.\n\n"
    )
    return md_table(intro, cols, [r for r in rows if r.get("dosa_graph_ms") is not None])


def _peer_ran(r) -> bool:
    return any(r.get(k) is not None for k in ("dg_logits_ms", "dg_topk_ms", "own_select_ms"))


def peers_markdown(rows) -> str:
    """The peers table and the notes / errors ("" when no row has a peer time, note or
    error: rows of older runs, or of ``--no-peers``)."""
    rows = [r for r in rows if "peer_notes" in r]
    if not any(r["peer_notes"] or r.get("peer_errors") or _peer_ran(r) for r in rows):
        return ""

    def ms(key):
        return lambda r: _cell(r.get(key))

    def ratio(r):
        sel, tk = r.get("own_select_ms"), r.get("own_torch_topk_ms")
        return _cell(tk / sel if sel and tk is not None else None, "{:.2f}×")

    cols = [
        *_STEP_COLS,
        ("DG meta ms", ms("dg_meta_ms")), ("DG logits ms", ms("dg_logits_ms")),
        ("DG logits ×floor", _xf("dg_logits")), ("DG+topk ms", ms("dg_topk_ms")),
        ("DG+topk ×floor", _xf("dg_topk")),
        ("DG ids in dense", lambda r: _cell(r.get("dg_overlap_min"), "{:.4f}")),
        ("own select ms", ms("own_select_ms")),
        ("torch.topk ms (own logits)", ms("own_torch_topk_ms")), ("torch.topk / select", ratio),
    ]  # fmt: skip
    intro = (
        "\nPeers (same steps, same inputs; `--peers`): DeepGEMM paged logits (metadata timed "
        "apart, outside the logits' time), DeepGEMM + tail mask + torch.topk, and torch.topk "
        "vs own select on the project's own decode logits; DG ids in dense = the fraction of "
        "DeepGEMM+topk ids that the dense route also returned, worst row of all steps (sets, "
        "not bits: DeepGEMM's low bits differ).\n\n"
    )
    notes: list[str] = []
    for r in rows:
        shape = f"{r['H']}x{r['B']}x{r['ctx']} next_n={r['next_n']}"
        errs = [f"{shape}: {k} failed ({v})" for k, v in (r.get("peer_errors") or {}).items()]
        notes += [x for x in r["peer_notes"] + errs if x not in notes]
    tail = "\nPeers not timed: " + "; ".join(notes) + ".\n" if notes else ""
    return md_table(intro, cols, rows) + tail


def main(argv=None) -> int:
    ap = CommandParser(prog="dosa bench --decode", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="HxBxCTX,...")
    ap.add_argument("--filter", default=None,
                    help="keep shapes whose HxBxCTX contains one of these comma-separated "
                         "substrings")  # fmt: skip
    ap.add_argument("--next-n", default="1", help="queries per request per step, e.g. 1,2")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--history", type=int, default=2)
    ap.add_argument(
        "--buffer",
        type=int,
        default=None,
        help="records per row (default: room for every visible key, no host sync)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--regime",
        default="synthetic",
        help="synthetic (default), trained (held-out text through the shipped indexers; "
        "H 32 / 64, B·ctx ≤ 2^24), or both, comma-separated",
    )
    ap.add_argument(
        "--scorer",
        default="f16",
        help="the canonical scorer(s) of the project's routes: f16 (default), fp8 (sm_90a), "
        "fp8tma (fp8 with the scan fed by the copy engine, decode_ops.DECODE_TMA), comma-"
        "separated (each shape runs once per scorer); SCORER:B1+B2 runs it with the kernel "
        "builds B1, B2 (bench/builds.py, e.g. fp8:blockselect+witblocks4)",
    )
    ap.add_argument("--out", default=None, help="directory for bench_decode.json / .md")
    ap.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time DeepGEMM's paged logits (+ torch.topk) and torch.topk vs own select "
        "on the same steps, when torch / deep_gemm are importable (decode_peers.py)",
    )
    a = ap.parse_args(argv)
    if a.reps < 10:
        raise ValueError(f"reps: at least 10 replays, got {a.reps}")
    if a.warm < 1:
        raise ValueError(f"warm: at least 1 warm-up step, got {a.warm}")
    nns = [int(x) for x in a.next_n.split(",")]
    if any(x not in (1, 2) for x in nns):
        raise ValueError(f"next-n: expected values in {{1, 2}}, got {a.next_n!r}")
    shapes = parse_shapes(a.shapes, a.filter)
    if not shapes:
        raise ValueError(f"filter: no shape of --shapes contains any of {a.filter!r}")
    scorers = a.scorer.split(",")
    if not scorers or {sc.partition(":")[0] for sc in scorers} - {"f16", "fp8", "fp8tma"}:
        raise ValueError(f"scorer: expected f16, fp8 and/or fp8tma, got {a.scorer!r}")
    from .builds import builds_on, parse_builds

    builds = {sc: parse_builds(sc.partition(":")[2]) for sc in scorers}
    regimes = a.regime.split(",")
    if set(regimes) - {"synthetic", "trained"} or not regimes:
        raise ValueError(f"regime: expected synthetic and/or trained, got {a.regime!r}")
    if "trained" in regimes:
        for H, B, ctx in shapes:
            if H not in (32, 64) or B * ctx > TRAINED_MAX_TOKENS:
                raise ValueError(f"shapes: the trained regime needs H 32 or 64 and B·ctx ≤ "
                                 f"{TRAINED_MAX_TOKENS}, got {H}x{B}x{ctx}")  # fmt: skip
    from .timing import no_gpu_exit

    rc = no_gpu_exit("dosa bench --decode")
    if rc is not None:
        return rc
    from .decode_peers import discover

    peers = discover(a.peers)
    for note in peers.notes if peers else ():
        print(f"# peers: {note}", flush=True)
    rows = []
    for regime in regimes:
        for H, B, ctx in shapes:
            for n in nns:
                for sc in scorers:
                    t0 = time.time()
                    base = sc.partition(":")[0]
                    tma = ("decode_tma",) if base == "fp8tma" else ()
                    with builds_on(tma + builds[sc]):
                        row = bench_shape(H, B, ctx, n, a.K, a.reps, a.warm, a.history,
                                          a.buffer, a.seed, lambda s: print(s, flush=True),
                                          peers=peers, regime=regime,
                                          scorer="fp8" if base == "fp8tma" else base)  # fmt: skip
                    rows.append(dict(row, scorer=sc))
                    print(f"# {regime} {sc} {H}x{B}x{ctx} next_n={n} done in "
                          f"{time.time() - t0:.1f}s", flush=True)  # fmt: skip
                import cupy as cp  # the shape's arrays are gone: return their memory

                cp.get_default_memory_pool().free_all_blocks()
                _write(a.out, rows)  # after every shape: a call cut short keeps what finished
    print(markdown(rows))
    ok = all(r["ids_equal"] and r.get("dosa_graph_ids_equal") is not False
             and r.get("dosa_b2b_ids_equal") is not False for r in rows)  # fmt: skip
    return 0 if ok else 1


def _write(out, rows) -> None:
    if out:
        p = Path(out)
        p.mkdir(parents=True, exist_ok=True)
        (p / "bench_decode.json").write_text(json.dumps(rows, indent=1))
        (p / "bench_decode.md").write_text(markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
