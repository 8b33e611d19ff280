"""Peers of ``dosa bench --decode`` (``--peers``, on by default when importable), timed on
the decode benchmark's own steps and inputs:

- ``dg_logits``: DeepGEMM's paged indexer logits (``deep_gemm.fp8_fp4_paged_mqa_logits``,
  fp32, 2-D context lengths) on the project's cache repacked into DeepGEMM's fused layout
  (``pack_deepgemm_kv``, once per shape, untimed); the schedule metadata
  (``deep_gemm.get_paged_mqa_logits_metadata``) is computed once per step outside the
  logits' timed region, as a serving stack does for all layers, and timed on its own;
- ``dg_topk``: those logits with each row's tail past its visible end set to −inf, then
  ``torch.topk`` — a full Top-K route;
- ``own_torch_topk`` vs ``own_select``: ``torch.topk`` and the project's exact selection
  (``dosa_cupy.dense.select_rows``) on the same rows of the project's own decode logits;
- ``dg_graph`` / ``dg_b2b``: DeepGEMM + mask + topk captured in CUDA graphs, replayed per
  step or back to back; ``dg_select_b2b``: DeepGEMM's logits + the project's exact selection
  on them, captured and launched back to back the same way.

DeepGEMM accumulates in another order than the project's canonical scorer, so its ids are
compared with the dense route's as sets (``peers.set_overlap``), never bitwise.  A missing
peer is a note, a failing one an entry of ``peer_errors``; the row stays either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dosa_cupy.decode_ops import PAGE, D  # PAGE is also DeepGEMM's block_kv on SM90

from .peers import _why, padded_rows, set_overlap
from .timing import free


@dataclass
class DecodePeers:
    """The peer libraries importable in this process (``discover``): torch (needed by every
    peer route) and deep_gemm (None when not importable), with the reasons as notes."""

    torch: Any = None
    deep_gemm: Any = None
    notes: list[str] = field(default_factory=list)


def discover(enabled: bool = True) -> DecodePeers | None:
    """Import torch and deep_gemm (``enabled`` False: no peers → None)."""
    if not enabled:
        return None
    p = DecodePeers()
    try:
        import torch
    except Exception as e:
        p.notes.append(f"peers need torch, not importable ({_why(e)}): no DeepGEMM, no torch.topk")
        return p
    p.torch = torch
    try:
        import deep_gemm
    except Exception as e:
        p.notes.append(f"deep_gemm not importable ({_why(e)}): no DeepGEMM paged logits")
    else:
        p.deep_gemm = deep_gemm
    return p


def pack_deepgemm_kv(kv, sc, xp=np):
    """DeepGEMM's fused FP8 paged cache from the project's cache.

    ``kv`` uint8 [nb, 64, 128] (e4m3 bits), ``sc`` float32 [nb, 64] (numpy or CuPy, as
    ``xp``).  Returns uint8 [nb, 64, 1, 132]: per block, bytes [0, 64·128) are the block's
    payload (token-major) and bytes [64·128, 64·132) its 64 fp32 scales (little-endian
    bytes); the [64, 1, 132] shape is DeepGEMM's view of that block, not a per-token
    interleave.
    """
    nb = int(kv.shape[0])
    if tuple(kv.shape) != (nb, PAGE, D) or tuple(sc.shape) != (nb, PAGE):
        raise ValueError(f"kv {tuple(kv.shape)} / sc {tuple(sc.shape)}: expected [nb, 64, 128]"
                         " / [nb, 64]")  # fmt: skip
    out = xp.empty((nb, PAGE * (D + 4)), dtype=xp.uint8)
    out[:, : PAGE * D] = xp.asarray(kv, dtype=xp.uint8).reshape(nb, PAGE * D)
    scales = xp.ascontiguousarray(xp.asarray(sc, dtype=xp.float32))
    out[:, PAGE * D :] = scales.view(xp.uint8).reshape(nb, PAGE * 4)
    return out.reshape(nb, PAGE, 1, D + 4)


def _tail_masker(torch, L):
    """fn(logits [R, L], ke [R, 1]) → the logits with positions ≥ ke set to −inf, in place.

    On SM90 (sm90_fp8_paged_mqa_logits.cuh) DeepGEMM writes, for every row of a request,
    the unmasked scores of whole 256-key splits up to the request's last row's length: past
    a row's own end they are scores of keys that row must not see (or of block 0, where a
    split runs past the request's blocks), and positions past the last split are never
    written (uninitialised memory, NaN possible).  ``clean_logits=True`` cannot clean them:
    the host asserts ``not is_context_lens_2d`` when cleaning (csrc/apis/attention.hpp) and
    2-D lengths are the only ones it takes.  So the route masks the tail itself, inside its
    timed region: one more pass over the logits, as a caller must do.
    """
    cols = torch.arange(L, device="cuda", dtype=torch.int32)

    def mask(lg, ke):
        return lg.masked_fill_(cols >= ke, float("-inf"))

    return mask


def _dg_steps(p, c):
    """Per step: the torch views DeepGEMM takes (q fp8 [B, n, H, 128], weights fp32
    [B·n, H], context_lens int32 [B, n] = the project's visible ends, ke int32 [B·n, 1]),
    over the step's CuPy arrays (kept alive in the same dict)."""
    from dosa_cupy.decode import visible_ends

    cp, torch = c["cp"], p.torch
    B, n, H = c["B"], c["n"], c["H"]
    out = []
    for (q, w), lens in zip(c["walk"], c["lengths"], strict=True):
        ke = cp.ascontiguousarray(visible_ends(lens, n, cp))
        s = dict(cq=cp.ascontiguousarray(q), cw=cp.ascontiguousarray(w.reshape(B * n, H)), cke=ke)
        s["q"] = torch.as_tensor(s["cq"], device="cuda").view(torch.float8_e4m3fn)
        s["w"] = torch.as_tensor(s["cw"], device="cuda")
        s["ctx"] = torch.as_tensor(ke, device="cuda")
        s["ke"] = s["ctx"].reshape(B * n, 1)
        out.append(s)
    return out


def _dg_calls(p, c):
    """(meta(s), logits(s)): DeepGEMM's two calls on a step's inputs ``s`` (``_dg_steps``,
    with ``s["meta"]`` set before ``logits``); the packed cache is built here, once."""
    torch, dg = p.torch, p.deep_gemm
    kvc = torch.as_tensor(pack_deepgemm_kv(c["kv"], c["sc"], c["cp"]), device="cuda")
    bt = torch.as_tensor(c["cp"].ascontiguousarray(c["bt"]), device="cuda")
    L, sms = int(c["bt"].shape[1]) * PAGE, dg.get_num_sms()

    def meta(s):
        return dg.get_paged_mqa_logits_metadata(s["ctx"], PAGE, sms)

    def logits(s):
        return dg.fp8_fp4_paged_mqa_logits(
            q=(s["q"], None), kv_cache=kvc, weights=s["w"], context_lens=s["ctx"],
            block_table=bt, schedule_meta=s["meta"], max_context_len=L, clean_logits=False,
            logits_dtype=torch.float32,
        )  # fmt: skip

    return meta, logits, L


def run_deepgemm(p, c, timed) -> dict:
    """(a) metadata and DeepGEMM logits alone, (b) logits + tail mask + torch.topk, on the
    warm-up steps (untimed: JIT builds) then the timed steps; ids of (b) vs the dense ids.

    ``c``: the bench context (``run``); ``timed(fn, idx)`` → (ms list, outputs) with CUDA
    events.  Returns dg_meta_ms, dg_logits_ms, dg_topk_ms (medians, + ``_all``),
    dg_overlap_min (worst row of every timed step), dg_overlap_pooled (mean over steps).
    """
    torch, cp, K = p.torch, c["cp"], c["K"]
    steps = _dg_steps(p, c)
    meta, logits, L = _dg_calls(p, c)
    mask = _tail_masker(torch, L)

    def logits_only(i):  # the logits are dropped: none stay alive across steps
        logits(steps[i])

    def topk(i):
        s = steps[i]
        return torch.topk(mask(logits(s), s["ke"]), K, dim=-1).indices

    for i in range(c["warm"]):
        steps[i]["meta"] = meta(steps[i])
        logits_only(i)
        topk(i)
    idx = c["idx"]
    ts_meta, metas = timed(lambda i: meta(steps[i]), idx)
    for i, m in zip(idx, metas, strict=True):
        steps[i]["meta"] = m
    ts_lg, _ = timed(logits_only, idx)
    ts_tk, ids = timed(topk, idx)
    ov = [set_overlap(cp.from_dlpack(t), c["dense_ids"][i].reshape(t.shape[0], K), cp)
          for i, t in zip(idx, ids, strict=True)]  # fmt: skip
    return {
        **medians("dg_meta", ts_meta), **medians("dg_logits", ts_lg),
        **medians("dg_topk", ts_tk),
        "dg_overlap_min": min(o["overlap_min"] for o in ov),
        "dg_overlap_pooled": float(np.mean([o["overlap_pooled"] for o in ov])),
    }  # fmt: skip


def torch_capture(torch, fn):
    """``fn``'s kernels captured once in a torch.cuda.CUDAGraph: (replay, the output
    tensor that every replay rewrites)."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g.replay, out


def run_deepgemm_graph(p, c, timed) -> dict:
    """DeepGEMM's metadata + logits + tail mask + torch.topk captured once in a
    torch.cuda.CUDAGraph (as a serving stack records its decode step) and replayed per
    step after copying the step's q, weights and lengths into the captured tensors (the
    copies are timed too).  Returns dg_graph_ms (median, + ``_all``), dg_graph_overlap_min.
    """
    torch, cp, K = p.torch, c["cp"], c["K"]
    steps = _dg_steps(p, c)
    meta, logits, L = _dg_calls(p, c)
    mask = _tail_masker(torch, L)
    st = {k: steps[0][k].clone() for k in ("q", "w", "ctx")}
    st["ke"] = st["ctx"].reshape(-1, 1)

    def put(i):
        for k in ("q", "w", "ctx"):
            st[k].copy_(steps[i][k])

    def body():
        st["meta"] = meta(st)
        return torch.topk(mask(logits(st), st["ke"]), K, dim=-1).indices

    for i in range(c["warm"]):  # eager warm-up: JIT builds outside the capture
        put(i)
        body()
    replay, out = torch_capture(torch, body)
    ts, ov = [], []
    for i in c["idx"]:
        (t,), _ = timed(lambda j: (put(j), replay()), [i])
        ts.append(t)
        own = c["dense_ids"][i].reshape(out.shape[0], K)
        ov.append(set_overlap(cp.from_dlpack(out.clone()), own, cp)["overlap_min"])
    # one graph per step with its input copies, launched back to back (bench.decode.
    # back_to_back; the DoSA side's dosa_b2b_ms)
    whole = {i: torch_capture(torch, lambda i=i: (put(i), body())[1]) for i in c["idx"]}
    b2b = c["back_to_back"]([whole[i][0] for i in c["idx"]], lambda: None)
    ov_b2b = [set_overlap(cp.from_dlpack(whole[i][1]),
                          c["dense_ids"][i].reshape(out.shape[0], K), cp)["overlap_min"]
              for i in c["idx"]]  # fmt: skip
    return {**medians("dg_graph", ts), "dg_graph_overlap_min": min(ov),
            **medians("dg_b2b", b2b), "dg_b2b_overlap_min": min(ov_b2b)}  # fmt: skip


def _capture_stream(cp, torch):
    """A CuPy stream on torch's current stream (inside ``torch.cuda.graph``: its capture
    stream), so that CuPy's launches join the torch graph."""
    return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def run_deepgemm_select_graph(p, c, timed) -> dict:
    """DeepGEMM's metadata + logits and the project's exact selection on them
    (``dense.select_rows`` over each row's visible range [0, ke): the tail past it is never
    read, so no mask) captured in one torch.cuda.CUDAGraph per step with its input copies,
    the selection's buffers allocated before the captures (``dense.rows_work``), launched
    back to back (``c["back_to_back"]``) as DeepGEMM + topk's are for dg_b2b_ms.  Returns
    dg_select_b2b_ms (+ ``_all``)
    and dg_select_overlap_min (DeepGEMM's low bits differ: sets against the dense ids)."""
    from dosa_cupy.dense import _select_rows, rows_work

    torch, cp, K = p.torch, c["cp"], c["K"]
    steps = _dg_steps(p, c)
    meta, logits, _ = _dg_calls(p, c)
    R = c["B"] * c["n"]
    st = {k: steps[0][k].clone() for k in ("q", "w", "ctx")}
    ke = cp.from_dlpack(st["ctx"]).reshape(R)  # the visible ends, a view of ctx
    ks = cp.zeros(R, dtype=cp.int32)

    def body(i, work=None):  # work None: the logits' rows, for their shape
        for k in ("q", "w", "ctx"):
            st[k].copy_(steps[i][k])
        st["meta"] = meta(st)
        lg = logits(st)
        with _capture_stream(cp, torch):  # DeepGEMM pads its rows: take them whole
            rows = padded_rows(lg, cp)
            if work is None:
                return rows.shape
            _select_rows(rows, K, ks, ke, work=work)
        return work.ids

    shape = body(0)  # [R, DeepGEMM's row stride]: the selection's rows
    works = {i: rows_work(*shape, K) for i in c["idx"]}
    for i in range(c["warm"]):  # eager warm-up: JIT builds outside the captures
        body(i, works[c["idx"][0]])
    # the graph's output stays CuPy's (work.ids): no exchange with torch inside the capture
    whole = {i: torch_capture(torch, lambda i=i: body(i, works[i]))[0] for i in c["idx"]}
    b2b = c["back_to_back"]([whole[i] for i in c["idx"]], lambda: None)
    ov = [set_overlap(works[i].ids.astype(cp.int64),
                      c["dense_ids"][i].reshape(R, K), cp)["overlap_min"]
          for i in c["idx"]]  # fmt: skip
    return {**medians("dg_select_b2b", b2b), "dg_select_overlap_min": min(ov)}


def _own_step(p, c, i, timed):
    """Step ``i``: the project's decode logits (untimed) as [B·n, L], then select_rows and
    torch.topk on them, each timed: (select ms, topk ms, select ids int32 [B·n, K], topk ids
    CuPy int64 [B·n, K]); the logits are dropped on return."""
    from dosa_cupy.decode import paged_logits, visible_ends
    from dosa_cupy.dense import _select_rows

    torch, cp, K = p.torch, c["cp"], c["K"]
    q, w = c["walk"][i]
    lg = paged_logits(q, w, c["kv"], c["sc"], c["bt"], c["lengths"][i], check_values=False)
    lg = lg.reshape(-1, lg.shape[-1])
    ke = cp.ascontiguousarray(visible_ends(c["lengths"][i], c["n"], cp).reshape(-1))
    ks = cp.zeros(ke.shape[0], dtype=cp.int32)
    tl = torch.from_dlpack(lg)
    (t1,), (ids,) = timed(lambda _: _select_rows(lg, K, ks, ke), [i])
    (t2,), (tk,) = timed(lambda _: torch.topk(tl, K, dim=-1).indices, [i])
    return t1, t2, ids, cp.from_dlpack(tk)


def run_own_select(p, c, timed) -> dict:
    """(c) torch.topk vs the project's select_rows on the project's own decode logits
    (fp32 [B·n, L], −inf where not visible), per step, the warm-up steps untimed.

    Returns own_select_ms, own_torch_topk_ms (medians, + ``_all``), own_select_ids_equal
    (select_rows == the dense route's ids, bitwise) and own_torch_overlap_min.
    """
    cp, K = c["cp"], c["K"]
    for i in range(c["warm"]):  # warm both up
        _own_step(p, c, i, timed)
    ts_sel, ts_tk, equal, ov = [], [], True, []
    for i in c["idx"]:
        t1, t2, ids, tk = _own_step(p, c, i, timed)
        own = c["dense_ids"][i].reshape(ids.shape[0], K)
        ts_sel.append(t1)
        ts_tk.append(t2)
        equal = equal and bool(cp.array_equal(ids.astype(cp.int64), own))
        ov.append(set_overlap(tk, own, cp)["overlap_min"])
    return {
        **medians("own_select", ts_sel), **medians("own_torch_topk", ts_tk),
        "own_select_ids_equal": equal, "own_torch_overlap_min": min(ov),
    }  # fmt: skip


def medians(name: str, ts: list[float]) -> dict:
    """{name_ms: median of ts, name_ms_all: ts}."""
    return {f"{name}_ms": float(np.median(ts)), f"{name}_ms_all": list(ts)}


PEER_KEYS = (
    "dg_meta_ms", "dg_logits_ms", "dg_topk_ms", "dg_overlap_min", "dg_overlap_pooled",
    "dg_graph_ms", "dg_graph_overlap_min", "dg_b2b_ms", "dg_b2b_overlap_min",
    "dg_select_b2b_ms", "dg_select_overlap_min",
    "own_select_ms", "own_torch_topk_ms", "own_select_ids_equal", "own_torch_overlap_min",
)  # fmt: skip


def run(p: DecodePeers | None, c: dict, timed, log) -> dict:
    """Every peer route of one decode shape; the keys of ``PEER_KEYS`` (None where a peer
    did not run), peer_notes (why not) and peer_errors ({route: error}).

    ``c``: cp, B, n, H, K, warm, idx (timed steps), walk (per step (q uint8 [B, n, H, 128],
    w fp32 [B, n, H])), lengths (per step int32 [B]), kv uint8 [nb, 64, 128], sc fp32
    [nb, 64], bt int32 [B, max_blocks], dense_ids ({step: int64 [B, n, K]}), back_to_back
    (graphs, rebuild → ms per step of each round: ``bench.decode.back_to_back``).
    """
    res: dict = dict.fromkeys(PEER_KEYS)
    res.update(peer_notes=[] if p is None else list(p.notes), peer_errors={})
    if p is None or p.torch is None:
        return res
    routes = [("own_select", run_own_select)]
    if p.deep_gemm is not None:
        routes[:0] = [
            ("deepgemm", run_deepgemm),
            ("deepgemm_graph", run_deepgemm_graph),
            ("deepgemm_select_graph", run_deepgemm_select_graph),
        ]
    for name, fn in routes:
        try:
            res.update(fn(p, c, timed))
        except Exception as e:  # out of memory, an unsupported shape: the row stays
            res["peer_errors"][name] = _why(e)
            log(f"# peer {name} failed: {res['peer_errors'][name]}")
        finally:
            free(c["cp"])
    return res
