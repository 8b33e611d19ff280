"""``dosa train-indexer``: train the trained regime's lightning indexers on the GPU.

The dense warm-up objective of DSA (docs/workloads.md §1 "The trained regime", §1.1), on
the continuous construction's hidden states: every token t of the training half is a query
once, in the window its state comes from (``dosa_ref.trained.token_sources``: its offset o
lies in BAND, so it has ≥ 128 tokens of left context there).  The target for t is that
window's encoder attention at layer ``layer`` summed over its 12 heads, restricted to the
window's keys s ≤ t except the window's first token (offsets 1 … o) and renormalized; the
indexer's distribution is the softmax over the same keys of ``Σ_h w_h ReLU(q_h·k_s)``; the
loss is the KL divergence of the target from it, averaged over queries.  The indexer's
inputs are the continuous states of t and of every s, each from its own source window, so
the target is the encoder's view of one window while the inputs do not come with that
window's positions: nothing rewards matching absolute positions (the query's own offset, a
window's first token) that a long context repeats.  The window's first token is left out
because the encoder, fed no [CLS], makes it a sink (29 % of the causal mass at layer 3)
while its continuous state is an ordinary token's (§1.1).  q and k pass through e4m3 (per
token and head for q, per token for k, amax scaling, a straight-through gradient), as the
indexer computes them at inference.

Hidden states and targets come from ``dosa_ref.trained.encode_sources`` on the GPU (CuPy)
over the corpus's training half; the optimizer is PyTorch's Adam.  Along the way it logs
the sign structure the certificate depends on (docs/workloads.md §3 "Sign structure"), on
held-out windows (the held-out half's plan, as the workloads see it): positive heads per
query, how often positive and negative heads are active, the KL and the top-32 recall.
Output (``--out``): ``indexer_h{H}.safetensors`` (float16 weights, metadata),
``train_log.jsonl``, ``train_summary.md``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from dosa_ref import trained as T
from dosa_ref.cmdline import CommandParser

CHECKPOINTS = (0, 100, 300, 1000, 2000, 4000, 8000)

# A window's rows and columns (docs/workloads.md §1.1): queries at offsets BAND[0] … BAND[1]
# (R of them), keys at offsets 0 … BAND[1] (L); the query at offset o has keys 1 … o.
R = T.BAND[1] - T.BAND[0] + 1
L = T.BAND[1] + 1


def _torch():
    try:
        import torch
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("dosa train-indexer needs PyTorch: pip install torch") from e
    return torch


def _fp8_ste(x, torch):
    """x through e4m3 with an amax scale over the last dimension; identity gradient."""
    amax = x.detach().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    s = 448.0 / amax
    y = (x * s).to(torch.float8_e4m3fn).to(x.dtype) / s
    return x + (y - x).detach()


class Model:
    """The indexer's parameters (torch tensors) and its score function."""

    def __init__(self, H: int, torch, dev, gen):
        def p(*shape, std):
            return (torch.randn(*shape, generator=gen, device=dev) * std).requires_grad_()

        self.H = H
        self.wq = p(H * T.D, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.ww = p(H, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.wk = p(T.D, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.kg = torch.ones(T.D, device=dev, requires_grad=True)
        self.kb = torch.zeros(T.D, device=dev, requires_grad=True)
        self.torch = torch

    def params(self) -> list:
        return [self.wq, self.ww, self.wk, self.kg, self.kb]

    def parts(self, xq, xk):
        """q [B, Q, H, D] float32 and w [B, Q, H] of query states xq [B, Q, 384]; k [B, S, D]
        of key states xk [B, S, 384]."""
        torch = self.torch
        B, nq, _ = xq.shape
        q = _fp8_ste((xq @ self.wq.T).view(B, nq, self.H, T.D), torch)
        k = torch.nn.functional.layer_norm(
            xk @ self.wk.T, (T.D,), self.kg, self.kb, T.LN_EPS_INDEXER
        )
        k = _fp8_ste(k, torch)
        w = (xq @ self.ww.T) / math.sqrt(self.H)
        return q, w, k

    def logits(self, xq, xk, support):
        """Scores [B, R, L] (query at offset BAND[0] + r, key at offset c of a window) of
        query states xq [B, R, 384] and key states xk [B, L, 384], −inf off ``support``
        bool [R, L]; and the parts (q, w, k, dots [B, R, H, L])."""
        torch = self.torch
        q, w, k = self.parts(xq, xk)
        dots = torch.einsum("bthd,bsd->bths", q, k)
        s = torch.einsum("bth,bths->bts", w, torch.relu(dots))
        return s.masked_fill(~support, float("-inf")), (q, w, k, dots)


def _support(torch, dev):
    """bool [R, L]: key offset c is in the target of the query at offset o = BAND[0] + r
    iff 1 ≤ c ≤ o (causal, without the window's first token: module docstring)."""
    c = torch.arange(L, device=dev)[None, :]
    o = torch.arange(T.BAND[0], T.BAND[1] + 1, device=dev)[:, None]
    return (c >= 1) & (c <= o)


def _targets(att, support):
    """Targets [B, R, L]: the summed attention att [B, R, L] on ``support``, renormalized."""
    p = att * support
    return p / p.sum(-1, keepdim=True)


def _kl(p, s, qmask, torch):
    """Mean over the queries of qmask bool [B, R] of KL(p ‖ softmax(s)); p, s [B, R, L]."""
    logq = torch.log_softmax(s, dim=-1)
    term = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p))
    return (term.sum(-1) * qmask).sum() / qmask.sum().clamp_min(1)


def _blocks(data: dict, idx):
    """Query states [B, R, 384], key states [B, L, 384], raw targets [B, R, L] and query
    masks [B, R] of windows idx (int64 [B], rows of ``_windows``'s arrays)."""
    pos = data["key0"][idx][:, None] + data["ar"][None, :]
    return data["x"][pos[:, T.BAND[0] :]], data["xk"][pos], data["a"][idx], data["qmask"][idx]


def _stats(model, data: dict, torch, chunk: int = 32) -> dict:
    """Sign structure and fit on held-out windows (docs/workloads.md §3) over the queries
    of every window of ``data`` (``_windows``), ``chunk`` windows at a time."""
    sup = data["support"]
    vis = sup.sum(-1).to(torch.float32)  # [R] visible keys per query row
    acc = dict(kl=0.0, hit=0.0, nq=0, pa=0.0, npa=0, na=0.0, nna=0, zero=0.0, pairs=0.0)
    npos_all = []
    with torch.no_grad():
        n = data["key0"].shape[0]
        for c0 in range(0, n, chunk):
            idx = torch.arange(c0, min(c0 + chunk, n), device=sup.device)
            xq, xk, att, qm = _blocks(data, idx)
            s, (q, w, k, dots) = model.logits(xq, xk, sup)
            p = _targets(att, sup)
            nq = int(qm.sum())
            acc["kl"] += float(_kl(p, s, qm, torch)) * nq
            acc["nq"] += nq
            pos = (w > 0)[qm]  # [nq, H]
            act = (((dots > 0) & sup[None, :, None, :]).sum(-1) / vis[None, :, None])[qm]
            acc["pa"] += float(act[pos].sum())
            acc["npa"] += int(pos.sum())
            acc["na"] += float(act[~pos].sum())
            acc["nna"] += int((~pos).sum())
            npos_all.append(pos.sum(-1).to(torch.float32))
            # top-32 recall against the target (every query has ≥ BAND[0] keys)
            tp = p[qm].topk(32, dim=-1).indices
            ti = s[qm].topk(32, dim=-1).indices
            acc["hit"] += float((tp[:, :, None] == ti[:, None, :]).any(-1).float().sum()) / 32
            acc["zero"] += float(((s == 0) & sup)[qm].sum())
            acc["pairs"] += float(vis[None, :].expand(qm.shape)[qm].sum())
    npos = torch.cat(npos_all)
    nan = float("nan")
    return dict(
        kl=acc["kl"] / max(acc["nq"], 1),
        recall32=acc["hit"] / max(acc["nq"], 1),
        pos_heads_mean=float(npos.mean()),
        pos_heads_p10=float(npos.quantile(0.1)),
        pos_heads_p90=float(npos.quantile(0.9)),
        pos_head_active=acc["pa"] / acc["npa"] if acc["npa"] else nan,
        neg_head_active=acc["na"] / acc["nna"] if acc["nna"] else nan,
        zero_score_frac=acc["zero"] / max(acc["pairs"], 1.0),
    )


def train(H: int, layer: int, steps: int, data: dict, held: dict, args, torch, log):
    """Train an indexer with H heads on ``data`` (``_windows``), logging ``_stats`` on
    ``held`` at CHECKPOINTS and at the last step; returns (model, last record)."""
    dev = data["x"].device
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1000 * H + layer)
    model = Model(H, torch, dev, gen)
    opt = torch.optim.Adam(model.params(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    nw = data["key0"].shape[0]
    sup = data["support"]
    t0 = time.time()
    for step in range(steps + 1):
        if step in CHECKPOINTS or step == steps:
            st = _stats(model, held, torch)
            rec = dict(H=H, layer=layer, step=step, seconds=round(time.time() - t0, 1), **st)
            log(rec)
        if step == steps:
            break
        idx = torch.randint(0, nw, (args.batch,), generator=gen, device=dev)
        xq, xk, att, qm = _blocks(data, idx)
        s, _ = model.logits(xq, xk, sup)
        loss = _kl(_targets(att, sup), s, qm, torch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model, rec


def _windows(ids, half: tuple[int, int], first: int, n: int, layer: int, xp, tt, torch, dev,
             limit: int | None = None, key_plan: int | None = None) -> dict:  # fmt: skip
    """The examples of tokens [first, first + n) of the corpus half ``half`` = (floor,
    ceiling) in the continuous construction (docs/workloads.md §1.1), as torch tensors on
    ``dev``: x float32 [n, 384], the tokens' states in plan 0 (the queries'); xk float32
    [n, 384], the keys' (plan ``key_plan``, or x itself if None: the workloads' view); then
    per window of plan 0 encoded whose L keys lie in [first, first + n) and that is the
    source of some token (the first ``limit`` such windows if given): key0 int64 (the row
    of x of its first token), a float32 [R, L] (layer ``layer``'s summed attention, raw),
    qmask bool [R] (the query rows whose token takes its state from this window: each
    token is a query once); plus ar (0 … L − 1), support (``_support``) and the counts
    ``windows`` and ``queries`` (ints)."""
    src = T.token_sources(first, n, *half)
    x, wins, att = T.encode_sources(ids, src, layer, xp, attention=True)
    if key_plan is not None:  # keys whose offsets say nothing of their distance (§1.1)
        xk = tt(T.encode_sources(ids, T.token_sources(first, n, *half, key_plan), layer, xp))
    key0 = src.starts[wins] - first
    pos = key0[:, None] + np.arange(T.BAND[0], T.BAND[1] + 1)[None, :]  # [m, R] query rows
    qmask = (pos < n) & (src.window[np.clip(pos, 0, n - 1)] == wins[:, None])
    keep = np.flatnonzero((key0 >= 0) & (key0 + L <= n) & qmask.any(1))[:limit]
    x = tt(x)
    return dict(
        x=x,
        xk=x if key_plan is None else xk,
        key0=torch.as_tensor(key0[keep], device=dev),
        a=tt(att[xp.asarray(keep)]),
        qmask=torch.as_tensor(qmask[keep], device=dev),
        ar=torch.arange(L, device=dev),
        support=_support(torch, dev),
        windows=int(keep.size),
        queries=int(qmask[keep].sum()),
    )


def save(model, path, meta):
    from safetensors.numpy import save_file

    t = {
        "wq": model.wq,
        "ww": model.ww,
        "wk": model.wk,
        "k_gamma": model.kg,
        "k_beta": model.kb,
    }
    arrays = {k: v.detach().float().cpu().numpy().astype(np.float16) for k, v in t.items()}
    save_file(arrays, str(path), metadata={k: str(v) for k, v in meta.items()})


def main(argv=None) -> int:
    ap = CommandParser(prog="dosa train-indexer", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for weights and log")
    ap.add_argument("--H", default="32,64", help="head counts of the shipped indexers")
    ap.add_argument("--layer", type=int, default=3, help="encoder layer of the shipped indexers")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--study-layers", default="1,2,4", help="more layers, H=64, for the study")
    ap.add_argument("--study-steps", type=int, default=2000)
    # 96 windows of ~80 queries each: about the 8,192 queries per step that 32 windows of
    # 256 gave before the continuous construction (docs/workloads.md §1, the "Training" item).
    ap.add_argument("--batch", type=int, default=96, help="windows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-tokens", type=int, default=0, help="0: the whole training half")
    ap.add_argument(
        "--eval-windows", type=int, default=192, help="held-out windows for the statistics"
    )
    ap.add_argument(
        "--key-plan",
        choices=("independent", "same"),
        default="independent",
        help="training keys' states: plan 1 (default) or the queries' plan 0 (an ablation)",
    )
    ap.add_argument("--cpu", action="store_true", help="numpy + torch on the CPU (smoke test)")
    a = ap.parse_args(argv)
    torch = _torch()
    torch.backends.cuda.matmul.allow_tf32 = True  # training precision; inference is e4m3
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "train_log.jsonl", "w")  # noqa: SIM115 — closed at the end of main

    def log(rec):
        line = json.dumps(rec)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if a.cpu:
        xp, dev = np, "cpu"
    else:
        import cupy as xp

        dev = "cuda"

    def tt(v):
        return torch.as_tensor(v, device=dev) if a.cpu else torch.from_dlpack(v)

    c = T.corpus()
    n_train = (
        c.split if a.train_tokens <= 0 else min(c.split, a.train_tokens // T.WINDOW * T.WINDOW)
    )
    # Training: the plan of the half [0, n_train), every token with a window inside it
    # (the first BAND[0] keys only, offsets < BAND[0]); held-out: the held-out half's plan
    # from its first token, enough tokens for eval_windows windows (§1.1).
    train_half, held_half = (0, n_train), (c.split, int(c.ids.size))
    n_held = (a.eval_windows + 4) * T.STRIDE[1] + T.WINDOW
    log(dict(corpus=c.source, text_sha256=c.text_sha256, tokens=int(c.ids.size),
             train_tokens=int(n_train), window=T.WINDOW, construction=T.CONTINUOUS,
             stride=list(T.STRIDE), band=list(T.BAND), key_plan=a.key_plan,
             batch=a.batch, torch=torch.__version__))  # fmt: skip
    Hs = [int(h) for h in a.H.split(",") if h]
    layers = sorted({a.layer, *(int(x) for x in a.study_layers.split(",") if x)})
    results = []
    for layer in layers:
        t0 = time.time()
        kp = 1 if a.key_plan == "independent" else None
        data = _windows(c.ids, train_half, 0, n_train - T.MARGIN, layer, xp, tt, torch, dev,
                        key_plan=kp)  # fmt: skip
        held = _windows(c.ids, held_half, c.split, n_held, layer, xp, tt, torch, dev,
                        limit=a.eval_windows)  # fmt: skip
        log(dict(layer=layer, encode_seconds=round(time.time() - t0, 1),
                 train_windows=data["windows"], train_queries=data["queries"],
                 held_windows=held["windows"], held_queries=held["queries"]))  # fmt: skip
        for H in Hs if layer == a.layer else [64]:
            steps = a.steps if layer == a.layer else a.study_steps
            model, last = train(H, layer, steps, data, held, a, torch, log)
            results.append(last)
            if layer == a.layer:
                meta = dict(layer=layer, H=H, D=T.D, steps=steps, batch=a.batch, lr=a.lr,
                            seed=a.seed, window=T.WINDOW, construction=T.CONTINUOUS,
                            stride=f"{T.STRIDE[0]}-{T.STRIDE[1]}",
                            band=f"{T.BAND[0]}-{T.BAND[1]}", key_plan=a.key_plan,
                            corpus_sha256=c.text_sha256,
                            corpus=c.source, train_tokens=n_train, kl=last["kl"],
                            recall32=last["recall32"], torch=torch.__version__,
                            date=time.strftime("%Y-%m-%d"))  # fmt: skip
                save(model, out / f"indexer_h{H}.safetensors", meta)
        del data, held
    keys = ("layer", "H", "step", "kl", "recall32", "pos_heads_mean", "pos_heads_p10",
            "pos_heads_p90", "pos_head_active", "neg_head_active", "zero_score_frac")  # fmt: skip
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in results:
        lines.append(
            "| "
            + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys)
            + " |"
        )
    (out / "train_summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    logf.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
