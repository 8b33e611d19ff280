"""One prefill shape of ``dosa bench``: every route on the same rotated inputs, ids
cross-checked, floors, survival and the stage split."""

from __future__ import annotations

import json
import time

import numpy as np

from ..cost import logits_flop
from . import fp8_dense
from . import peers as peer_routes
from .builds import builds_on, parse_builds
from .memplan import floors_ms, memory_plan, x_floor
from .report import device_name, ids_equal
from .shapes import shape_name
from .timing import free, is_oom, median_ms, median_ms_interleaved, slices


def _survival(survivors, screened) -> dict:
    s = np.asarray(survivors, dtype=np.float64)
    n = np.asarray(screened, dtype=np.float64)
    per_q = s / np.maximum(n, 1)
    qs = np.quantile(per_q, np.linspace(0, 1, 101)) if per_q.size else []
    return {
        "survival_pooled": float(s.sum() / max(n.sum(), 1)),
        "survival_mean": float(per_q.mean()) if per_q.size else float("nan"),
        "survival_p90": float(np.quantile(per_q, 0.9)) if per_q.size else float("nan"),
        # 101 quantiles (0 %, 1 %, …, 100 %) keep the per-query CDF without Qn floats a row
        "survival_quantiles": [float(f"{v:.6g}") for v in qs],
    }


def _route_record(rc) -> dict:
    """A ``cost.RouteChoice`` as JSON: route, reason, screen, r, predicted ms, survival,
    each sample's measured screen ms and queries, and the spent prefix charged with a
    memo."""
    return {"route": rc.route, "reason": rc.reason, "screen": rc.screen, "r": rc.r,
            "predicted_ms": dict(rc.predicted_ms), "survival": dict(rc.survival),
            "sample_ms": dict(rc.sample_ms), "sample": dict(rc.sample),
            "spent_ms": rc.spent_ms}  # fmt: skip


def _scored_fractions(parts) -> tuple[float, float]:
    """``SelectStats.scored_fraction`` and ``anchor_scored_fraction`` (defined there) pooled
    over the sub-chunks' statistics: Σ min(scored, visible) / Σ visible (keys fully scored
    for the selection, re-scorings counted once) and Σ anchor_scored / Σ visible."""
    vis = sum(int(p.visible.sum()) for p in parts)
    done = sum(int(np.minimum(p.scored, p.visible).sum()) for p in parts)
    anchors = sum(int(p.anchor_scored) for p in parts)
    return (done / vis, anchors / vis) if vis else (float("nan"), float("nan"))


STAGE_RUNS = 3  # synchronized timing runs per sub-chunk whose stage times are medianed


def _all_equal(cp, runs, want) -> bool:
    """Whether every run's ids (``_stats_run``) equal ``want`` bitwise."""
    return all(bool(cp.array_equal(x, want)) for x in runs)


def _calls_ids(fn, s, sub, K, opts):
    """ids of one plain call of ``fn`` per sub-chunk of set ``s``, concatenated."""
    import cupy as cp

    return cp.concatenate([fn(c["q"], c["w"], c["kp"], c["ksc"], K, c["ks"], c["ke"], **opts)
                           for c in slices(s, sub)])  # fmt: skip


def _stats_run(fn, s, sub, K, opts):
    """ids and stats of one route over sub-chunks of set ``s`` (per-query arrays
    concatenated, the route choices listed, the scored fraction pooled; stage times
    summed over the sub-chunks).  Each sub-chunk runs once untimed (the memory pool the
    caller freed is filled again, so no stage pays a device allocation the timed replays
    do not), then ``STAGE_RUNS`` times with ``timing=True``: each stage's time is the
    median of those runs; ids: one array per run (every run must equal the dense route)."""
    import cupy as cp

    runs, parts, stage = [[] for _ in range(STAGE_RUNS)], [], {}
    for c in slices(s, sub):
        a = (c["q"], c["w"], c["kp"], c["ksc"], K, c["ks"], c["ke"])
        fn(*a, **opts)
        sts = []
        for run in runs:
            i, st = fn(*a, return_stats=True, timing=True, **opts)
            run.append(i)
            sts.append(st)
        parts.append(sts[0])
        for k in sts[0].stage_ms:
            med = float(np.median([x.stage_ms.get(k, 0.0) for x in sts]))
            stage[k] = stage.get(k, 0.0) + med
    cat = {
        # the route choice of each sub-chunk (dosa_cupy/route.py) and the work accounting
        "routes": [_route_record(p.route) for p in parts if getattr(p, "route", None)],
    }
    cat["scored_fraction"], cat["anchor_scored_fraction"] = _scored_fractions(parts)
    for k in ("survivors", "screened", "kept", "overflowed", "recovered"):
        vals = [getattr(p, k) for p in parts]
        cat[k] = None if any(v is None for v in vals) else np.concatenate(vals)
    return [cp.concatenate(run) for run in runs], cat, stage


BASE = "(base)"  # the DoSA call's name among the paired calls (no variant's name: shapes.py)


def paired_variants(cp, res: dict, opts: dict, route, reps: int, rotate) -> None:
    """``--paired``: the DoSA call (options ``opts``) and each variant of ``res`` that ran and
    keeps no memo (its options over ``opts``, builds included; ``route(fn, options)`` makes a
    call of input sets) timed in turn — every replay one
    call of each (``timing.median_ms_interleaved``, 2·``reps`` replays) — so that a drift of
    the GPU or the host between the variants' own blocks of replays falls on all of them
    alike (docs/benchmark_method.md "Timing"): ``res["dosa_paired_ms"]`` and
    each variant's ``paired_ms``.  Nothing where no variant qualifies."""
    import dosa_cupy

    fns = {}
    for name, v in (res.get("variants") or {}).items():
        o = dict(opts, **v["options"])
        if "error" in v or "ms" not in v or o.get("route_memo") is not None:
            continue
        names = parse_builds(o.pop("builds", ""))
        call = route(dosa_cupy.dosa_topk, _with_objects(o))

        def under_builds(cs, call=call, names=names):
            with builds_on(names):
                call(cs)

        fns[name] = under_builds
    if not fns:
        return
    base = route(dosa_cupy.dosa_topk, opts)
    times = median_ms_interleaved(cp, {BASE: base, **fns}, 2 * reps, rotate=rotate)
    free(cp)
    res["dosa_paired_ms"] = times[BASE][0]
    for name in fns:
        res["variants"][name]["paired_ms"] = times[name][0]


def _with_objects(vo: dict) -> dict:
    """A variant's options with its objects made: ``route_memo=1`` → one ``RouteMemo`` of
    the variant, ``graph=1`` → one ``capture.StepGraphs`` of it (its captured steps)."""
    import dosa_cupy
    from dosa_cupy.capture import StepGraphs

    vo = dict(vo)
    if vo.get("route_memo") == 1:
        vo["route_memo"] = dosa_cupy.RouteMemo()
    if vo.get("graph") == 1:
        vo["graph"] = StepGraphs()
    return vo


def _ratio(a, b):
    """a / b, None where a route did not run."""
    return None if a is None else a / b


def bench_shape(H, Qn, N, K, regime, reps, rot, opts, log, mem=None, parallel_setup=True,
                variants=None, inputs=None, peers=None, paired=False):  # fmt: skip
    """One shape: every route timed on the same rotated inputs, ids cross-checked, floors,
    survival and stage split.  ``mem``: ``memory_plan`` of the shape (sub-chunk sizes);
    ``parallel_setup``: generate the rotated input sets in threads; ``inputs``: workload
    files (``--inputs``), one rotated input set each (then ``rot`` = their number);
    ``peers``: ``peers.discover()`` (None: no peer section in the row); ``paired``
    (``--paired``): the DoSA call and its variants without a memo also timed in turn
    (``paired_variants``)."""
    import cupy as cp

    import dosa_cupy
    from dosa_cupy import workload
    from dosa_cupy.dense import _dense_topk_raw, _select_rows
    from dosa_cupy.prepare import check_inputs, pad_heads
    from dosa_cupy.scorer import dense_logits_raw

    scorer = opts.get("scorer", "f16")  # the canonical scorer of every route of the row

    if inputs is not None and len(inputs) != rot:
        raise ValueError(f"inputs: {len(inputs)} file(s) for {rot} rotated input set(s)")
    mem = mem or memory_plan(H, Qn, N, K, rotate=rot)
    sub = dict(mem["subchunk"])
    t0 = time.time()

    def make_set(seed):
        if inputs is not None:
            wl = workload.load_gpu_workload(inputs[seed - 100])
            if (wl["q"].shape[1], wl["q"].shape[0], wl["k_payload"].shape[0]) != (H, Qn, N):
                raise ValueError(f"inputs: {inputs[seed - 100]} is not {shape_name(H, Qn, N)}")
        else:
            wl = workload.make_gpu_workload(regime, Qn, N, H, seed=seed)
        for k in ("kf", "qf", "wf"):
            wl.pop(k)
        q, w, kp, ksc, _, ks, ke = check_inputs(
            wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"]
        )
        qp, wp = pad_heads(q, w, scorer)
        return dict(q=q, w=w, qp=qp, wp=wp, kp=kp, ksc=ksc, ks=ks, ke=ke)

    seeds = [100 + i for i in range(rot)]
    if parallel_setup and rot > 1:
        # The calibrated regimes are generated by numpy on the host (~10 s per 1M keys);
        # numpy releases the GIL in its fills and matmuls, so the rotated sets overlap.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=rot) as ex:
            sets = list(ex.map(make_set, seeds))
    else:
        sets = [make_set(sd) for sd in seeds]
    cp.cuda.Device().synchronize()
    vis = float(cp.sum((sets[0]["ke"] - sets[0]["ks"]).astype(cp.float64)))
    flops = logits_flop(vis, H)
    res = dict(
        H=H, Qn=Qn, N=N, K=K, regime=regime, r=int(opts.get("r", 14)), scorer=scorer, reps=reps,
        rotate=rot, visible_pairs=vis, dense_flop=flops, setup_s=time.time() - t0,
        dense_subchunk=sub["dense"], dosa_subchunk=sub["dosa"],
        stats_subchunk=sub["dosa_stats"], fused_subchunk=sub["fused"],
        memory_budget_gib=mem["budget_gib"], memory_notes=list(mem["notes"]),
    )  # fmt: skip
    res["device"] = device_name(cp)
    dchunks = [slices(s, sub["dense"]) for s in sets]

    # Dense logits alone (each sub-chunk's buffer released before the next is allocated).
    def own_logits(c):
        return dense_logits_raw(c["qp"], c["wp"], c["kp"], c["ksc"], c["ks"], c["ke"], scorer)

    def logits(cs):
        for c in cs:
            lg = own_logits(c)
            del lg

    res["logits_ms"], _ = median_ms(cp, logits, reps, rotate=dchunks)
    res["logits_tflops"] = flops / res["logits_ms"] / 1e9
    free(cp)

    # The native FP8 scorer's dense logits beside the f16 ones (issue 27): the fastest build
    # for H on the same sub-chunks, where the GPU runs sm_90a (with --scorer fp8 the row's
    # logits are these already)
    if scorer == "f16" and fp8_dense.available(H):
        v = fp8_dense.BEST[H]
        fsets = [[fp8_dense.as_workload(c) for c in cs] for cs in dchunks]

        def fp8_logits(ws):
            for wl in ws:
                lg = fp8_dense.fp8_logits(wl, v)
                del lg

        res["fp8_logits_build"] = v
        res["fp8_logits_ms"], _ = median_ms(cp, fp8_logits, reps, rotate=fsets)
        del fsets
        free(cp)

    # Own exact selection and torch.topk on the logits of set 0, one sub-chunk at a time
    # (time = Σ over sub-chunks of the per-sub-chunk median); the dense ids come from here.
    try:
        import torch
    except ImportError:
        torch = None
    sel_ms, tt_ms, dense_parts = 0.0, 0.0, []
    t_kth, t_vals = True, True
    for c in dchunks[0]:
        lg = own_logits(c)
        arg = [(lg, c["ks"], c["ke"])]
        m, _ = median_ms(cp, lambda a: _select_rows(a[0], K, a[1], a[2]), reps, rotate=arg)
        sel_ms += m
        ids_c = _select_rows(lg, K, c["ks"], c["ke"])
        dense_parts.append(ids_c)
        if torch is not None:
            tl = torch.from_dlpack(lg)
            m, _ = median_ms(cp, lambda a: torch.topk(a, K, dim=1), reps, rotate=[tl])
            tt_ms += m
            tv = cp.from_dlpack(torch.topk(tl, K, dim=1).values)
            own = cp.take_along_axis(lg, cp.maximum(ids_c, 0).astype(cp.int64), axis=1)
            own = cp.where(ids_c >= 0, own, -cp.inf)  # −1 pads ↔ −inf (invisible) values
            t_vals &= bool(cp.array_equal(tv, own))
            t_kth &= bool(cp.all(tv[:, -1] == own[:, -1]))
            del tl, tv, own
        del lg, arg
        free(cp)
    dense_ids = cp.concatenate(dense_parts)
    del dense_parts
    res["select_ms"] = sel_ms
    res["torch_topk_ms"] = tt_ms if torch is not None else None
    if torch is not None:
        res["torch_values_equal"] = t_vals
        res["torch_kth_match"] = t_kth

    def dense_route(s):
        _dense_topk_raw(s["qp"], s["wp"], s["kp"], s["ksc"], K, s["ks"], s["ke"],
                        chunk=sub["dense"], scorer=scorer)  # fmt: skip

    res["dense_route_ms"], _ = median_ms(cp, dense_route, reps, rotate=sets)
    free(cp)
    if peers is not None:  # other libraries' routes on the same sub-chunks (peers.py)
        ctx = dict(cp=cp, dchunks=dchunks, dense_ids=dense_ids, K=K, reps=reps,
                   own_logits=own_logits)  # fmt: skip
        res["peers"] = peer_routes.run(peers, ctx, log)
        free(cp)

    def route(fn, o):
        def run(cs):
            for c in cs:
                fn(c["q"], c["w"], c["kp"], c["ksc"], K, c["ks"], c["ke"], **o)

        return run

    # the fused route has no plan: r (and the plan's other options) are DoSA's alone
    fused_opts = {k: v for k, v in opts.items() if k not in ("r", "p_sample")}
    dosa_cs = [slices(s, sub["dosa"]) for s in sets]
    res["dosa_ms"], _ = median_ms(cp, route(dosa_cupy.dosa_topk, opts), reps, rotate=dosa_cs)
    free(cp)
    fused_cs = [slices(s, sub["fused"]) for s in sets]
    fused = route(dosa_cupy.fused_topk, fused_opts)
    res["fused_ms"], _ = median_ms(cp, fused, reps, rotate=fused_cs)
    free(cp)
    fids, _, fstage = _stats_run(dosa_cupy.fused_topk, sets[0], sub["fused"], K, fused_opts)
    res["fused_ids_equal_dense"] = _all_equal(cp, fids, dense_ids)
    res["fused_stage_ms"] = fstage
    del fids
    free(cp)
    # Variants: more DoSA routes (other options) on the same inputs, same run.
    for name, vopts in (variants or {}).items():
        vo = dict(opts, **vopts)
        vo = _with_objects(vo)
        names = parse_builds(vo.pop("builds", ""))  # kernel builds under trial (builds.py)
        v = {"options": vopts}
        res.setdefault("variants", {})[name] = v
        try:
            with builds_on(names):
                # a memo variant times two refresh cycles: their sampled calls among the timed
                # ones, so the mean is its cost per call (the median: the remembered route's)
                memo = vo.get("route_memo")
                vreps = reps if memo is None else max(reps, 2 * memo.refresh)
                v["ms"], v_all = median_ms(
                    cp, route(dosa_cupy.dosa_topk, vo), vreps, rotate=dosa_cs
                )  # fmt: skip
                if memo is not None:
                    v["mean_ms"] = float(np.mean(v_all))
                free(cp)
                vids, vst, vstage = _stats_run(
                    dosa_cupy.dosa_topk, sets[0], sub["dosa_stats"], K, vo
                )  # fmt: skip
                if vo.get("graph") is not None:  # the statistics ran eagerly: the replays'
                    vids.append(_calls_ids(dosa_cupy.dosa_topk, sets[0], sub["dosa"], K, vo))
                    vo["graph"].release()
        except Exception as e:  # an experimental option must not lose the shape's row
            if is_oom(e):
                raise
            v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"# variant {name} failed: {v['error']}")
            free(cp)
            continue
        v["ids_equal_dense"] = _all_equal(cp, vids, dense_ids)
        v["stage_ms"] = vstage
        v["routes"], v["scored_fraction"] = vst["routes"], vst["scored_fraction"]
        v["anchor_scored_fraction"] = vst["anchor_scored_fraction"]
        v["survival_pooled"] = _survival(vst["survivors"], vst["screened"])["survival_pooled"]
        v["speedup_vs_dense"] = res["dense_route_ms"] / v["ms"]
        v["speedup_vs_fused"] = _ratio(res["fused_ms"], v["ms"])
        del vids
        free(cp)
    if paired:
        paired_variants(cp, res, opts, route, reps, dosa_cs)
    ids, st, stage = _stats_run(dosa_cupy.dosa_topk, sets[0], sub["dosa_stats"], K, opts)
    res["dosa_ids_equal_dense"] = _all_equal(cp, ids, dense_ids)
    res["dosa_stage_ms"] = stage
    res["dosa_routes"], res["scored_fraction"] = st["routes"], st["scored_fraction"]
    res["anchor_scored_fraction"] = st["anchor_scored_fraction"]
    del ids
    res.update(_survival(st["survivors"], st["screened"]))
    res["kept_mean"] = float(st["kept"].mean())
    res["overflowed"] = int(st["overflowed"].sum())
    res["recovered"] = int(st["recovered"].sum())
    res["speedup_vs_dense"] = res["dense_route_ms"] / res["dosa_ms"]
    res["speedup_vs_fused"] = _ratio(res["fused_ms"], res["dosa_ms"])
    if res["torch_topk_ms"] is not None:
        # the route users run today: logits + torch.topk (sum of the two medians)
        res["dense_torch_ms"] = res["logits_ms"] + res["torch_topk_ms"]
        res["speedup_vs_dense_torch"] = res["dense_torch_ms"] / res["dosa_ms"]
    peer_routes.attach_ratios(res)
    res.update(floors_ms(H, Qn, N, vis, res["survival_pooled"], res["r"]))
    res["x_floor"] = x_floor(res)
    res["ids_equal"] = ids_equal(res)
    res["seconds"] = time.time() - t0
    del sets, dchunks, dosa_cs, fused_cs, dense_ids
    free(cp)
    log(json.dumps(res))
    return res
