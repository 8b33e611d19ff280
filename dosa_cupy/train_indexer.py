"""``dosa train-indexer``: train the trained regime's lightning indexers on the GPU.

The dense warm-up objective of DSA (docs/workloads.md §1 "The trained regime"): for each
query token t of a window, the target is the encoder's attention at layer ``layer`` summed
over its 12 heads, restricted to the causal prefix s ≤ t and renormalized; the indexer's
distribution is the softmax over s ≤ t of ``Σ_h w_h ReLU(q_h·k_s)``; the loss is the KL
divergence of the target from it, averaged over queries.  q and k pass through e4m3 (per
token and head for q, per token for k, amax scaling, a straight-through gradient), as the
indexer computes them at inference.

Hidden states and targets come from ``dosa_ref.trained.encode`` on the GPU (CuPy) over the
corpus's training half; the optimizer is PyTorch's Adam.  Along the way it logs the sign
structure the certificate depends on (docs/workloads.md §3 "Sign structure"), on held-out
windows: positive heads per query, how often positive and negative heads are active, the
KL and the top-32 recall.  Output (``--out``): ``indexer_h{H}.safetensors`` (float16
weights, metadata), ``train_log.jsonl``, ``train_summary.md``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from dosa_ref import trained as T
from dosa_ref.cli import CommandParser

CHECKPOINTS = (0, 100, 300, 1000, 2000, 4000, 8000)


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

    def __init__(self, H, torch, dev, gen):
        def p(*shape, std):
            return (torch.randn(*shape, generator=gen, device=dev) * std).requires_grad_()

        self.H = H
        self.wq = p(H * T.D, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.ww = p(H, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.wk = p(T.D, T.HIDDEN, std=T.HIDDEN**-0.5)
        self.kg = torch.ones(T.D, device=dev, requires_grad=True)
        self.kb = torch.zeros(T.D, device=dev, requires_grad=True)
        self.torch = torch

    def params(self):
        return [self.wq, self.ww, self.wk, self.kg, self.kb]

    def parts(self, x):
        """q [B, W, H, D], w [B, W, H], k [B, W, D] of hidden states x [B, W, 384]."""
        torch = self.torch
        B, W, _ = x.shape
        q = _fp8_ste((x @ self.wq.T).view(B, W, self.H, T.D), torch)
        k = torch.nn.functional.layer_norm(
            x @ self.wk.T, (T.D,), self.kg, self.kb, T.LN_EPS_INDEXER
        )
        k = _fp8_ste(k, torch)
        w = (x @ self.ww.T) / math.sqrt(self.H)
        return q, w, k

    def logits(self, x):
        """Scores [B, W, W] (query t, key s) with s > t set to −inf, and the parts."""
        torch = self.torch
        q, w, k = self.parts(x)
        dots = torch.einsum("bthd,bsd->bths", q, k)
        s = torch.einsum("bth,bths->bts", w, torch.relu(dots))
        W = x.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=x.device).tril()
        return s.masked_fill(~causal, float("-inf")), (q, w, k, dots)


def _targets(att, torch):
    """Causal, renormalized targets [B, W, W] from summed attention [B, W, W]."""
    W = att.shape[-1]
    p = att * torch.ones(W, W, device=att.device).tril()
    return p / p.sum(-1, keepdim=True)


def _kl(p, s, torch):
    logq = torch.log_softmax(s, dim=-1)
    term = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p))
    return term.sum(-1).mean()


def _stats(model, x, att, torch):
    """Sign structure and fit on held-out windows (docs/workloads.md §3)."""
    with torch.no_grad():
        s, (q, w, k, dots) = model.logits(x)
        p = _targets(att, torch)
        kl = float(_kl(p, s, torch))
        W = x.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=x.device).tril()
        pos = w > 0  # [B, W, H]
        active = (dots > 0) & causal[None, :, None, :]  # [B, t, H, s]
        vis = causal.sum(-1).to(torch.float32)[None, :, None]  # visible keys per query
        act_frac = active.sum(-1) / vis  # [B, t, H]
        npos = pos.sum(-1).to(torch.float32)
        pa = act_frac[pos].mean() if pos.any() else torch.tensor(float("nan"))
        na = act_frac[~pos].mean() if (~pos).any() else torch.tensor(float("nan"))
        # top-32 recall against the target over queries with ≥ 64 visible keys
        t0 = 64
        tp = p[:, t0:].topk(32, dim=-1).indices
        ti = s[:, t0:].topk(32, dim=-1).indices
        hit = (tp[..., :, None] == ti[..., None, :]).any(-1).float().mean()
        zero = ((s == 0) & causal).sum() / causal.sum() / x.shape[0]
        return dict(
            kl=kl,
            recall32=float(hit),
            pos_heads_mean=float(npos.mean()),
            pos_heads_p10=float(npos.quantile(0.1)),
            pos_heads_p90=float(npos.quantile(0.9)),
            pos_head_active=float(pa),
            neg_head_active=float(na),
            zero_score_frac=float(zero),
        )


def train(H, layer, steps, data, args, torch, log):
    dev = data["x"].device
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1000 * H + layer)
    model = Model(H, torch, dev, gen)
    opt = torch.optim.Adam(model.params(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    nw = data["x"].shape[0]
    t0 = time.time()
    for step in range(steps + 1):
        if step in CHECKPOINTS or step == steps:
            st = _stats(model, data["xe"], data["ae"], torch)
            rec = dict(H=H, layer=layer, step=step, seconds=round(time.time() - t0, 1), **st)
            log(rec)
        if step == steps:
            break
        idx = torch.randint(0, nw, (args.batch,), generator=gen, device=dev)
        s, _ = model.logits(data["x"][idx])
        loss = _kl(_targets(data["a"][idx], torch), s, torch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model, rec


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
    ap.add_argument("--batch", type=int, default=32, help="windows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-tokens", type=int, default=0, help="0: the whole training half")
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
    c = T.corpus()
    n_train = (
        c.split if a.train_tokens <= 0 else min(c.split, a.train_tokens // T.WINDOW * T.WINDOW)
    )
    held = c.ids[c.split : c.split + 64 * T.WINDOW]
    log(dict(corpus=c.source, text_sha256=c.text_sha256, tokens=int(c.ids.size),
             train_tokens=int(n_train), window=T.WINDOW, torch=torch.__version__))  # fmt: skip
    Hs = [int(h) for h in a.H.split(",") if h]
    layers = sorted({a.layer, *(int(x) for x in a.study_layers.split(",") if x)})
    results = []
    for layer in layers:
        t0 = time.time()
        h, att = T.encode(c.ids[:n_train], layer, xp, attention=True)
        he, ae = T.encode(held, layer, xp, attention=True)

        def tt(v):
            return torch.as_tensor(v, device=dev) if a.cpu else torch.from_dlpack(v)

        W = T.WINDOW
        data = dict(
            x=tt(h).view(-1, W, T.HIDDEN), a=tt(att), xe=tt(he).view(-1, W, T.HIDDEN), ae=tt(ae)
        )
        log(dict(layer=layer, encode_seconds=round(time.time() - t0, 1)))
        for H in Hs if layer == a.layer else [64]:
            steps = a.steps if layer == a.layer else a.study_steps
            model, last = train(H, layer, steps, data, a, torch, log)
            results.append(last)
            if layer == a.layer:
                meta = dict(layer=layer, H=H, D=T.D, steps=steps, batch=a.batch, lr=a.lr,
                            seed=a.seed, window=W, corpus_sha256=c.text_sha256,
                            corpus=c.source, train_tokens=n_train, kl=last["kl"],
                            recall32=last["recall32"], torch=torch.__version__,
                            date=time.strftime("%Y-%m-%d"))  # fmt: skip
                save(model, out / f"indexer_h{H}.safetensors", meta)
        del data, h, att
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
