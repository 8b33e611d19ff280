"""Peers timed inside ``dosa bench`` on the project's own inputs (``--peers``, on by default
when importable): the strongest routes a user could assemble from other libraries.

- ``deepgemm``: DeepGEMM's fp8 indexer logits (``deep_gemm.fp8_fp4_mqa_logits``, fp32, rows
  cleaned to −inf outside [ks, ke)) on torch fp8 views of the project's uint8 payloads;
- ``deepgemm+torch.topk``, ``deepgemm+select_rows`` (the project's exact selection, reading
  DeepGEMM's row-padded buffer in place: the kernel reads only [ks, ke) of each row, so the
  padding past N is never touched), ``deepgemm+flashinfer.top_k`` (on a contiguous copy
  of the padded rows): full Top-K routes;
- ``flashinfer.top_k`` on the project's own logits: a selection peer beside own select and
  torch.topk.

DeepGEMM accumulates in another order than the project's canonical scorer, so its low bits
differ and its ids are compared as sets (``set_overlap``), never bitwise.  A missing peer is
a note in the report, not an error; a peer that fails records its error and the row stays.
Each full route is also given as the best peer's time over its own (``attach_ratios``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .timing import free, median_ms

LOGITS = "deepgemm"


@dataclass
class Peers:
    """The peers importable in this process (``discover``).

    ``logits(c)``: peer logits of one query sub-chunk ``c`` (bench_shape's sub-chunk dict of
    CuPy arrays q e4m3 uint8 [rows, H, 128], w fp32 [rows, H], kp uint8 [N, 128], ksc fp32
    [N], ks / ke int32 [rows]), or None.  ``selects[name](logits, c, K)``: CuPy ids [rows, K]
    of a selection applied to ``logits`` (the peer's, or the project's after
    ``from_own``); ``on_own``: the selections also timed on the project's logits.
    """

    logits: Callable | None = None
    selects: dict[str, Callable] = field(default_factory=dict)
    on_own: tuple[str, ...] = ()
    from_own: Callable = lambda lg: lg
    notes: list[str] = field(default_factory=list)


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"


def discover(enabled: bool | None = None) -> Peers | None:
    """Import the peers (``enabled`` None: whichever are importable; False: none → None)."""
    if enabled is False:
        return None
    p = Peers()
    try:
        import torch
    except Exception as e:  # no torch: no peer at all
        p.notes.append(f"peers need torch, not importable ({_why(e)})")
        return p
    import cupy as cp

    from dosa_cupy.dense import _select_rows

    def tv(x):
        return torch.as_tensor(x, device="cuda")

    p.from_own = torch.from_dlpack
    p.selects["torch.topk"] = lambda lg, c, K: cp.from_dlpack(torch.topk(lg, K, 1).indices)
    p.selects["select_rows"] = lambda lg, c, K: _select_rows(
        padded_rows(lg, cp), K, c["ks"], c["ke"]
    )
    try:
        import deep_gemm

        f8 = torch.float8_e4m3fn

        def logits(c):
            return deep_gemm.fp8_fp4_mqa_logits(
                (tv(c["q"]).view(f8), None), (tv(c["kp"]).view(f8), tv(c["ksc"])), tv(c["w"]),
                tv(c["ks"]), tv(c["ke"]), clean_logits=True, max_seqlen_k=0,
                logits_dtype=torch.float32,
            )  # fmt: skip

        p.logits = logits
    except Exception as e:
        p.notes.append(f"deep_gemm not importable ({_why(e)}): no DeepGEMM routes")
    try:
        import flashinfer

        def fi_topk(lg, c, K):  # a row-padded view is copied first, as a caller would
            lg = lg if lg.is_contiguous() else lg.contiguous()
            return cp.from_dlpack(flashinfer.top_k(lg, K)[1])

        p.selects["flashinfer.top_k"] = fi_topk
        p.on_own = ("flashinfer.top_k",)
    except Exception as e:
        p.notes.append(f"flashinfer not importable ({_why(e)}): no FlashInfer top-k")
    return p


def padded_rows(lg, cp):
    """CuPy [rows, stride] over the whole buffer of a row-padded torch view [rows, N] (no
    copy), so that a kernel taking rows of ``shape[1]`` steps by the real row stride; a
    contiguous copy when the buffer does not extend that far (or columns are strided)."""
    rows, n = lg.shape
    s0, s1 = lg.stride()
    if s1 == 1 and s0 == n:
        return cp.from_dlpack(lg)
    fits = (lg.storage_offset() + rows * s0) * lg.element_size() <= lg.untyped_storage().nbytes()
    if s1 == 1 and s0 > n and fits:
        return cp.from_dlpack(lg.as_strided((rows, s0), (s0, 1)))
    return cp.from_dlpack(lg.contiguous())


def set_overlap(peer_ids, own_ids, xp) -> dict:
    """How many of each row's project ids the peer also returned.

    ``peer_ids`` / ``own_ids``: integer [rows, K] (−1 pads; ids unique within a row).  Per
    row, |peer ∩ own| / |own valid ids| (1 for a row without any); returns the minimum over
    rows, the pooled fraction Σ|∩| / Σ|own|, and the number of rows with the same set.
    """
    own = xp.asarray(own_ids).astype(xp.int64)
    peer = xp.asarray(peer_ids).astype(xp.int64)
    if own.shape[0] != peer.shape[0]:
        raise ValueError(f"peer_ids: {peer.shape[0]} rows, the project's ids {own.shape[0]}")
    peer = xp.where(peer >= 0, peer, -2)  # a pad never meets the other side's pad
    both = xp.sort(xp.concatenate([own, peer], axis=1), axis=1)
    inter = xp.sum((both[:, 1:] == both[:, :-1]) & (both[:, 1:] >= 0), axis=1)
    n_own = xp.sum(own >= 0, axis=1)
    frac = xp.where(n_own > 0, inter / xp.maximum(n_own, 1), 1.0)
    return {
        "overlap_min": float(frac.min()) if frac.size else 1.0,
        "overlap_pooled": float(inter.sum() / max(int(n_own.sum()), 1)),
        "rows_same_set": int(xp.sum(inter == n_own)),
        "rows": int(own.shape[0]),
    }


def _attempt(out: dict, name: str, kind: str, fn, log, cleanup) -> None:
    """out[name] = {"kind", ...fn()} or {"kind", "error"}: a failing peer (out of memory
    included) keeps the shape's row; ``cleanup()`` releases cached memory either way."""
    try:
        out[name] = {"kind": kind, **fn()}
    except Exception as e:
        out[name] = {"kind": kind, "error": _why(e)}
        log(f"# peer {name} failed: {out[name]['error']}")
    finally:
        cleanup()


def _each(fn):
    """A replay over one rotated set: fn(c) for each sub-chunk, each result dropped before
    the next (one sub-chunk's logits alive at a time)."""

    def replay(cs):
        for c in cs:
            fn(c)

    return replay


def run(peers: Peers, ctx: dict, log) -> dict:
    """Time every peer route of one shape on bench_shape's inputs and compare its ids.

    ``ctx``: cp (CuPy), dchunks (per rotated set, its query sub-chunks), dense_ids (the
    project's ids of set 0, CuPy int [Qn, K]), K, reps, own_logits (c → the project's
    logits of sub-chunk c).  Returns {"notes": [...], "routes": {name: {"kind": "logits" |
    "route" | "select", "ms", overlap fields | "error"}}}.
    """
    cp, dchunks, K, reps = ctx["cp"], ctx["dchunks"], ctx["K"], ctx["reps"]
    routes: dict[str, dict] = {}

    def timed(fn, ids_of=None) -> dict:
        ms, _ = median_ms(cp, _each(fn), reps, rotate=dchunks)
        row = {"ms": ms}
        if ids_of is not None:
            ids = cp.concatenate([cp.asarray(ids_of(c)) for c in dchunks[0]])
            row.update(set_overlap(ids, ctx["dense_ids"], cp))
        return row

    def attempt(name, kind, fn):
        _attempt(routes, name, kind, fn, log, cleanup=lambda: free(cp))

    if peers.logits is not None:
        attempt(LOGITS, "logits", lambda: timed(peers.logits))
        for name, sel in peers.selects.items():

            def route(c, sel=sel):
                return sel(peers.logits(c), c, K)

            attempt(f"{LOGITS}+{name}", "route", lambda r=route: timed(r, r))
    for name in peers.on_own:
        sel = peers.selects[name]

        def on_own(sel=sel):
            ms, ids = 0.0, []
            for c in dchunks[0]:  # one sub-chunk's logits at a time, as own select
                lg = peers.from_own(ctx["own_logits"](c))
                m, _ = median_ms(cp, lambda a, lg=lg, c=c: sel(lg, c, K), reps, rotate=[None])
                ms += m
                ids.append(cp.asarray(sel(lg, c, K)))
                del lg
                free(cp)
            return {"ms": ms, **set_overlap(cp.concatenate(ids), ctx["dense_ids"], cp)}

        attempt(name, "select", on_own)
    return {"notes": list(peers.notes), "routes": routes}


def project_routes(res: dict) -> dict[str, float]:
    """The project's full Top-K routes of a row: {name: ms} (those that were timed)."""
    out = {
        "DoSA": res.get("dosa_ms"),
        "fused": res.get("fused_ms"),
        "dense route": res.get("dense_route_ms"),
        "logits + torch.topk": res.get("dense_torch_ms"),
    }
    for name, v in (res.get("variants") or {}).items():
        out[f"DoSA variant {name}"] = v.get("ms")
    return {k: float(v) for k, v in out.items() if v}


def project_logits(res: dict) -> dict[str, float]:
    """The project's dense logits of a row, {name: ms}: the f16 canonical scorer's and the
    native FP8 scorer's (where it ran; issue 27 compares it with DeepGEMM's logits)."""
    out = {f"dense logits ({res.get('scorer', 'f16')})": res.get("logits_ms")}
    if res.get("fp8_logits_ms"):
        out[f"dense logits (FP8 {res.get('fp8_logits_build', '?')})"] = res["fp8_logits_ms"]
    return {k: float(v) for k, v in out.items() if v}


def attach_ratios(res: dict) -> None:
    """Add to ``res["peers"]`` the best (fastest) full peer route and, for every full route
    of the project and of the peers, best peer ms / route ms (> 1: faster than the best
    peer); for the project's dense logits, DeepGEMM's logits ms / theirs.  Nothing to add
    without a timed peer."""
    pr = res.get("peers")
    if not pr:
        return
    dg = pr["routes"].get(LOGITS, {}).get("ms")
    if dg:  # the project's logits against DeepGEMM's (> 1: faster)
        pr["vs_deepgemm_logits"] = {k: dg / ms for k, ms in project_logits(res).items()}
    full = {k: v["ms"] for k, v in pr["routes"].items() if v["kind"] == "route" and v.get("ms")}
    if not full:
        return
    best = min(full, key=full.get)
    pr["best"], pr["best_ms"] = best, full[best]
    every = {**project_routes(res), **full}
    pr["vs_best"] = {k: full[best] / ms for k, ms in every.items()}


def markdown(rows, cell, shape_cols) -> str:
    """The peers table of bench.md ("" when no row has a peer section).  ``cell``: the
    report's number formatter; ``shape_cols(row)``: the row's leading table cells."""
    rows = [r for r in rows if r.get("peers") is not None]
    if not rows:
        return ""
    out = [
        "\nPeers (same run, same inputs; `--peers`): vs best peer = the fastest full peer "
        "route's time / the route's time (> 1: faster; for the project's logits rows: DeepGEMM's "
        "logits time / theirs); ids in set = the project's ids that "
        "the peer also returned, the worst row / pooled (DeepGEMM's low bits differ from the "
        "canonical scorer: sets are compared, not bits).\n\n| regime | H | Qn | N | route | "
        "kind | ms | vs best peer | ids in set (min / pooled) |\n|" + "---|" * 9 + "\n"
    ]
    notes: list[str] = []
    for r in rows:
        pr = r["peers"]
        vs, vs_lg = pr.get("vs_best", {}), pr.get("vs_deepgemm_logits", {})
        lines = [(k, "project", ms, None) for k, ms in project_routes(r).items()]
        lines += [(k, "project logits", ms, None) for k, ms in project_logits(r).items()]
        lines += [(k, v["kind"], v.get("ms"), v) for k, v in pr.get("routes", {}).items()]
        for name, kind, ms, v in lines:
            if v is not None and "error" in v:
                ids = f"error: {v['error']}"
            elif v is not None and "overlap_min" in v:
                ids = f"{v['overlap_min']:.4f} / {v['overlap_pooled']:.4f}"
            else:
                ids = "-"
            best = " (best)" if name == pr.get("best") else ""
            ratio = vs_lg.get(name) if kind == "project logits" else vs.get(name)
            out.append(
                f"| {shape_cols(r)} | {name}{best} | {kind} | {cell(ms)} | "
                f"{cell(ratio, '{:.2f}×')} | {ids} |\n"
            )
        notes += [n for n in pr.get("notes", []) if n not in notes]
    if notes:
        out.append("\nPeers not timed: " + "; ".join(notes) + ".\n")
    return "".join(out)
