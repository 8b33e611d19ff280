"""Seeded synthetic DSA-indexer workloads with the paper's statistics (docs/method.md §9, §11).

``make_workload(name, Qn, N, H, D, seed)`` returns a ``Workload`` (q [Qn,H,D], w [Qn,H],
k [N,D] float32; ks, ke int32) for one causal prefill chunk: the chunk is the last Qn
positions of an N-key context and query t sees keys ``[0, N − Qn + t + 1)``.  Regimes
(``REGIMES``; every knob is documented on ``Regime``):

  calibrated     GLM-5.2-like H=32, tuned to the paper's certificate ablation (below).
  isotropic      isotropic Gaussian keys — the certificate's premise is gone and pruning
                 fails (shown, not hidden: ≈41% survival, see below).
  many_positive  every head positive with probability 1/2 (≈15 positive heads per query).
  h64            DeepSeek-V3.2-like H=64 variant of calibrated.

What the calibrated regime looks like.  Keys have a large shared mean direction b_0
(cosine ≈ 0.7 with it), a power-law spectrum on the other D−1 directions and a topic
(cluster) structure in contiguous segments.  Per query, about 2 of 32 heads have positive
weight (4 "positive-prone" heads, each positive with probability 1/2 and active on
≈ 70% of keys, the others positive with probability 1%).  Of the 28 other heads, 20 are
reliably active (q·k ≈ β_on = 40 noise units: their sum is a large, almost linear
penalty that the majority aggregate a_A captures exactly and that dropping it —
neg_aggregate="none" — loses completely) and 8 are "uncertain" (p_h ≈ 0.85 ± 0.1),
which are what the retained set R and the aggregate's cancellation slack are about.  Head queries
share a chunk-wide direction per head (so the anchor queries' Top-K are good seeds), a
per-query direction shared by all heads (heads correlated within a query) and a pull
towards the chunk's relevant topics signed by the head's weight.

How it was tuned (``dosa_topk(..., seeds="local+anchor")`` with the default certificate
and r="auto"; survival = Σ survivors / Σ screened pooled over 4 seeds = 4 "layers",
Qn=32, N=65536, K=2048; one knob moved at a time from the final point, majority / all /
none survival in %):

  final point                    2.74 / 4.16 / 100   projection rows 0%
  q_query 0.8 → 0.6              2.05 / 3.34 / 100   the per-query part of the head
      queries sets the seed gap τ* − τ (anchor Top-K less representative): the main
      knob for the majority survival, which is mostly boundary mass above τ.
  frac_unc 0.25 → 0.15 / 0.35    1.62 / 2.80 / 98  ·  3.39 / 5.73 / 100   uncertain
      heads: the cancellation / missed-head slack of Prop. 6; moves majority and all.
  pos_scale 4 → 2                4.01 / 5.47 / 100   weaker positive heads give a less
      separated Top-K (and, with a wide weight spread, are cheap to project, so choose_r
      omits them: at earlier tuning points with w_sigma 0.5 projection rows were 6–22%).
  beta_on 40 → 15                2.74 / 4.16 / 84    (per layer 72 / 94 / 100 / 69)
      the "none" statistic: each always-active negative head must carry an offset
      β_on·|w_h| larger than the score spread, else choose_r (which minimises
      (r+2)/H + m(r) and never compares with dense scoring) jumps to r = H − 1 with
      m ≈ 5% instead of r = 1 with m ≈ 100%, and the ablation becomes bimodal.
  key_mean_jitter 0 → 0.5          1.84 / 2.56 / 99   (3% of key_mean per key; one
      layer's "none" at 97%).  Per-key jitter of the mean component (and key_norm_sigma)
      scales every always-active head's offset per key, widening the score spread along
      a direction the aggregate captures exactly; with β_on ≈ 20 and a 2% jitter the
      "none" ablation collapsed as just described.
  w_sigma 0.25 → 0.5               2.68 / 4.04 / 96   (one layer's "none" at 85%).
  all − majority                 comes only from omitted heads with p_h < 1/2 (majority
      drops them as "missed", all pays |w_h||q_h·k| of cancellation on most keys):
      beta_unc_mean, beta_pos (positive-prone heads are negative half of the time;
      beta_pos 0.7 → 0: 2.94 / 5.02 / 100) and frac_off/beta_off (mostly-inactive heads;
      frac_off 0.03 with beta_off −0.75 gave all ≈ 6%, 2.5× majority).
  positive projection rows       pos_scale, w_sigma/w_jitter (weight spread) and beta_pos
      (correlation between positive heads): the cost model projects a positive head only
      when that is cheap, i.e. when it is weak or nearly collinear with a retained head.

Measured (``dosa_ref.calibration.calibration_table()`` defaults: 4 layers × Qn=32 ×
N=65536, H=32, D=128, K=2048; 2 s per variant and layer, 4 s for "none" (every key
refined); 33 s wall in all on 2 cores):

  statistic                        paper    measured   per layer (seeds 0..3)
  survival, full certificate       2.65%    2.74%      1.61 / 4.21 / 2.45 / 2.69
  survival, neg_aggregate="none"   95.06%   100.00%    100 in every layer (r = 1 chosen)
  survival, neg_aggregate="all"    4.06%    4.16%      2.51 / 5.47 / 4.69 / 3.98
  positive projection rows         0.42%    0.00%      (brief: < 1%)

Other regimes (seed 0, Qn=32, N=65536, default certificate): isotropic 41.4% survival
(τ gap 124%, r ≈ 9, screening + refinement ≈ 0.73 of dense work: pruning fails);
many_positive 2.8% with r ≈ 15 and projection in 6% of rows; h64 2.4%
(``calibration_table(name="h64")``, 4 layers: 2.21% / none 100% / all 4.01%,
projection rows 0.78%).  With the paper's fixed r=16 instead of "auto" the
calibrated regime gives majority = all ≈ 1.9% (no omitted head has p_h < 1/2 once 16
heads are retained) and none 100%.

Files: ``save_workload`` / ``load_workload`` (.npz or .safetensors, tensors q, w, k, ks,
ke, optional metadata name/params/K), validated on load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .options import check_count
from .validate import check_qwk_shapes

__all__ = [
    "REGIMES",
    "TRAINED",
    "Regime",
    "Workload",
    "load_workload",
    "make_workload",
    "regime_names",
    "save_workload",
    "validate_workload",
]


@dataclass(frozen=True)
class Regime:
    """Parameters of one workload family (all knobs of ``make_workload``).

    Keys (in an orthonormal basis B drawn from the seed; b_0 is the shared mean direction):
      key_mean: length of the shared mean component along b_0 (the activation scale);
      key_mean_jitter: per-key relative jitter of that component;
      key_decay: the other D−1 coordinates have std ∝ (j+1)^−key_decay (0 = isotropic),
        normalised to mean variance 1;
      key_norm_sigma: per-key lognormal norm scale;
      n_topics, topic_len, topic_zipf, topic_scale: keys come in contiguous segments
        (geometric length, mean topic_len) of one topic each (Zipf popularity); the topic
        centre (unit vector, same spectrum) is added with weight topic_scale·√(D−1).
    Heads (per query t, head h): q = (β_th / key_mean)·b_0 + u_th (u_th ⟂ b_0, ‖u‖ = 1,
      so q·k ≈ β_th + N(0, 1): β is the activation z-score and p_h ≈ Φ(β)):
      head roles drawn once per workload, in exact counts — ``n_pos_heads`` positive-prone
      heads (β ~ beta_pos), ``frac_unc``·H uncertain heads (β ~ N(beta_unc_mean, beta_unc)),
      ``frac_off``·H mostly-inactive heads (β ~ beta_off), the rest mostly-active
      (β ~ N(beta_on, beta_on_std)); beta_jitter: per-query jitter of β.
      u_th = normalise(q_base·base_h + q_query·g_t + q_noise·n_th) + q_topic·sign(w_th)·r:
      base_h is shared by all queries of the chunk (so anchor queries' Top-K are good
      seeds), g_t by all heads of a query (heads correlated within a query), r is the
      direction of the chunk's ``n_rel`` relevant topics (a head with positive weight
      looks for them, a negative one looks away).
    Weights: w_th = ±|w| with P(w_th > 0) = pos_prob on positive-prone heads and
      pos_prob_other elsewhere; |w| = exp(w_sigma·N_h + w_jitter·N_th) (×pos_scale when
      positive; ×unc_scale on uncertain heads).
    """

    doc: str = ""
    H: int = 32
    key_mean: float = 16.0
    key_mean_jitter: float = 0.0
    key_decay: float = 0.5
    key_norm_sigma: float = 0.0
    n_topics: int = 64
    topic_len: float = 256.0
    topic_zipf: float = 1.0
    topic_scale: float = 1.0
    n_pos_heads: int = 4
    pos_prob: float = 0.5
    pos_prob_other: float = 0.01
    pos_scale: float = 4.0
    w_sigma: float = 0.25
    w_jitter: float = 0.15
    frac_unc: float = 0.25
    unc_scale: float = 1.0
    frac_off: float = 0.0
    beta_on: float = 40.0
    beta_on_std: float = 1.0
    beta_unc_mean: float = 1.6
    beta_unc: float = 0.5
    beta_off: float = -0.75
    beta_pos: float = 0.7
    beta_jitter: float = 0.3
    q_base: float = 1.0
    q_query: float = 0.8
    q_noise: float = 0.3
    q_topic: float = 0.2
    n_rel: int = 2

    def params(self) -> dict:
        d = asdict(self)
        d.pop("doc")
        return d


_CALIBRATED = Regime(
    doc="Calibrated to the paper's certificate ablation (see the module docstring).",
)

REGIMES: dict[str, Regime] = {
    "calibrated": _CALIBRATED,
    "isotropic": replace(
        _CALIBRATED,
        doc="Isotropic Gaussian keys: no mean direction, flat spectrum, no topics, no norm "
        "spread.  Every head is active on about half of the keys, so the negative "
        "aggregate cancels itself, seeds give a poor threshold and pruning fails "
        "(≈41% survival at Qn=32, N=65536, against 2.7% for calibrated).",
        key_mean=0.0,
        key_mean_jitter=1.0,
        key_decay=0.0,
        key_norm_sigma=0.0,
        topic_scale=0.0,
        q_topic=0.0,
        beta_on=0.0,
        beta_on_std=0.0,
        beta_unc_mean=0.0,
        beta_unc=0.0,
        beta_off=0.0,
        beta_pos=0.0,
        beta_jitter=0.0,
    ),
    "many_positive": replace(
        _CALIBRATED,
        doc="Calibrated geometry, but every head is positive with probability 1/2: about "
        "H/2 positive heads per query, so r < |H+| in most rows and the positive "
        "projection (Prop. 1) and allowances carry the bound.",
        pos_prob=0.5,
        pos_prob_other=0.5,
    ),
    "h64": replace(
        _CALIBRATED,
        doc="DeepSeek-V3.2-like: the calibrated regime with H = 64 indexer heads.",
        H=64,
        n_pos_heads=8,
    ),
}


TRAINED = "trained"  # not a Regime of generator knobs: dosa_ref/trained.py


def regime_names() -> list[str]:
    """Every regime ``make_workload`` knows, the trained one included."""
    return sorted([*REGIMES, TRAINED])


@dataclass
class Workload:
    """One prefill chunk of the DSA indexer (the shapes of docs/design.md's public contract).

    q float32 [Qn, H, D], w float32 [Qn, H], k float32 [N, D], ks/ke int32 [Qn] (query t
    sees keys [ks[t], ke[t])); ``name`` of the regime; ``params`` the generator knobs,
    sizes and seed (plus whatever metadata a loaded file carried).
    """

    q: np.ndarray
    w: np.ndarray
    k: np.ndarray
    ks: np.ndarray
    ke: np.ndarray
    name: str = "custom"
    params: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(Qn, H, D, N)."""
        Qn, H, D = self.q.shape
        return Qn, H, D, self.k.shape[0]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(q, w, k, ks, ke), the positional arguments of ``dosa_topk`` minus K."""
        return self.q, self.w, self.k, self.ks, self.ke


def _segments(rng: np.random.Generator, N: int, mean_len: float, T: int, zipf: float):
    """Topic id per key: contiguous segments of geometric length, Zipf topic popularity."""
    pop = 1.0 / (1.0 + np.arange(T)) ** zipf
    pop /= pop.sum()
    p = 1.0 / max(1.0, float(mean_len))
    lens = rng.geometric(p, size=max(1, int(2 * N * p) + 16))
    while lens.sum() < N:
        lens = np.concatenate([lens, rng.geometric(p, size=lens.size)])
    topics = rng.choice(T, size=lens.size, p=pop)
    return np.repeat(topics, lens)[:N]


def make_workload(
    name: str, Qn: int, N: int, H: int | None = None, D: int = 128, seed: int = 0
) -> Workload:
    """Seeded workload of regime ``name`` (a key of ``REGIMES``) with causal prefill ranges.

    The chunk is the last ``Qn`` positions of an ``N``-key context: query t sees keys
    ``[0, N − Qn + t + 1)``.  ``H`` defaults to the regime's head count (32; 64 for
    "h64"); an explicit H overrides it.  Same (name, Qn, N, H, D, seed) → bitwise the
    same arrays.
    """
    if name == TRAINED:  # real encoder, real text (dosa_ref/trained.py)
        return _trained_workload(Qn, N, 64 if H is None else H, D, seed)
    if name not in REGIMES:
        raise ValueError(f"name: unknown regime {name!r}; expected one of {regime_names()}")
    reg = REGIMES[name]
    H = reg.H if H is None else H
    for arg, v, lo in (("Qn", Qn, 1), ("N", N, 1), ("H", H, 1), ("D", D, 2)):
        check_count(arg, v, lo)
    if Qn > N:
        raise ValueError(f"Qn: the chunk ({Qn}) cannot be longer than the context N={N}")
    Qn, N, H, D = int(Qn), int(N), int(H), int(D)
    rng = np.random.default_rng([int(seed), Qn, N, H, D])
    Dm = D - 1

    # Keys: shared mean direction b_0, power-law spectrum, topic segments, norm spread.
    B, _ = np.linalg.qr(rng.standard_normal((D, D)))
    b0, Bp = B[:, 0], B[:, 1:]
    spec = (1.0 + np.arange(Dm)) ** (-reg.key_decay)
    spec /= np.sqrt(np.mean(spec**2))
    C = rng.standard_normal((reg.n_topics, Dm)) * spec
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    topic = _segments(rng, N, reg.topic_len, reg.n_topics, reg.topic_zipf)
    z = rng.standard_normal((N, Dm)) * spec
    if reg.topic_scale:
        z += (reg.topic_scale * np.sqrt(Dm)) * C[topic]
    mean = reg.key_mean + reg.key_mean_jitter * rng.standard_normal(N)
    k = np.outer(mean, b0) + z @ Bp.T
    k *= np.exp(reg.key_norm_sigma * rng.standard_normal(N))[:, None]

    # Head roles (exact counts), weights.
    perm = rng.permutation(H)
    n_pos = min(reg.n_pos_heads, H)
    n_unc = min(int(round(reg.frac_unc * H)), H - n_pos)
    n_off = min(int(round(reg.frac_off * H)), H - n_pos - n_unc)
    pos_h = perm[:n_pos]
    unc_h = perm[n_pos : n_pos + n_unc]
    off_h = perm[n_pos + n_unc : n_pos + n_unc + n_off]
    prob = np.full(H, reg.pos_prob_other)
    prob[pos_h] = reg.pos_prob
    sign = np.where(rng.random((Qn, H)) < prob, 1.0, -1.0)
    mag = np.exp(reg.w_sigma * rng.standard_normal(H))[None, :] * np.exp(
        reg.w_jitter * rng.standard_normal((Qn, H))
    )
    mag[:, unc_h] *= reg.unc_scale
    w = sign * mag * np.where(sign > 0, reg.pos_scale, 1.0)

    beta = reg.beta_on + reg.beta_on_std * rng.standard_normal(H)
    beta[unc_h] = reg.beta_unc_mean + reg.beta_unc * rng.standard_normal(n_unc)
    beta[off_h] = reg.beta_off + 0.5 * rng.standard_normal(n_off)
    beta[pos_h] = reg.beta_pos + 0.5 * rng.standard_normal(n_pos)
    bt = beta[None, :] + reg.beta_jitter * rng.standard_normal((Qn, H))

    # Query heads: chunk-shared base per head, per-query shared part, noise, topic pull.
    u = (
        reg.q_base * rng.standard_normal((1, H, Dm))
        + reg.q_query * rng.standard_normal((Qn, 1, Dm))
        + reg.q_noise * rng.standard_normal((Qn, H, Dm))
    )
    u /= np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-30)
    if reg.q_topic and reg.n_rel > 0:
        rel = topic[rng.integers(0, N, reg.n_rel)]
        rdir = C[rel].sum(axis=0)
        rdir /= max(np.linalg.norm(rdir), 1e-30)
        u = u + reg.q_topic * sign[..., None] * rdir
    q = (bt / (reg.key_mean if reg.key_mean > 0 else 1.0))[..., None] * b0 + u @ Bp.T

    ks = np.zeros(Qn, dtype=np.int32)
    ke = (N - Qn + 1 + np.arange(Qn)).astype(np.int32)
    params = dict(reg.params(), Qn=Qn, N=N, H=H, D=D, seed=int(seed))
    return Workload(
        q=q.astype(np.float32),
        w=w.astype(np.float32),
        k=k.astype(np.float32),
        ks=ks,
        ke=ke,
        name=name,
        params=params,
    )


def _trained_workload(Qn: int, N: int, H: int, D: int, seed: int) -> Workload:
    """The trained regime on the host (numpy; dosa_ref/trained.py, docs/workloads.md §1)."""
    from . import trained

    if D != trained.D:
        raise ValueError(f"D: the trained indexers have D = {trained.D}, got {D}")
    d = trained.make_trained_workload(Qn, N, H, seed)  # checks the counts
    return Workload(d["q"], d["w"], d["k"], d["ks"], d["ke"], name=TRAINED, params=d["params"])


# --------------------------------------------------------------------------- save / load

TENSORS = ("q", "w", "k", "ks", "ke")


def validate_workload(q, w, k, ks, ke) -> tuple[np.ndarray, ...]:
    """Check a workload's arrays; return (q, w, k) float32 (float64 kept as float64, never
    narrowed) and (ks, ke) int32.

    Raises ValueError naming the tensor: wrong rank or shape, a non-float q/w/k (float16,
    float32 and float64 are accepted; float16 widens exactly), non-finite values,
    non-integer ranges, or ranges outside 0 <= ks <= ke <= N.
    """
    out = []
    for name, a, ndim in (("q", q, 3), ("w", w, 2), ("k", k, 2)):
        a = np.asarray(a)
        if a.dtype not in (np.float32, np.float16, np.float64):
            raise ValueError(f"{name}: expected float16/32/64, got dtype {a.dtype}")
        if a.ndim != ndim:
            raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name}: contains non-finite values (nan or inf)")
        dt = np.float64 if a.dtype == np.float64 else np.float32
        out.append(np.ascontiguousarray(a, dtype=dt))
    q, w, k = out
    check_qwk_shapes(q.shape, w.shape, k.shape)
    Qn, N = q.shape[0], k.shape[0]
    rng_out = []
    for name, a in (("ks", ks), ("ke", ke)):
        a = np.asarray(a)
        if a.dtype.kind not in "iu":
            raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype}")
        if a.shape != (Qn,):
            raise ValueError(f"{name}: expected shape ({Qn},), got {a.shape}")
        if np.any(a < 0) or np.any(a > N):
            raise ValueError(f"{name}: entries must lie in [0, N={N}]")
        rng_out.append(a.astype(np.int32))
    ks, ke = rng_out
    if np.any(ks > ke):
        t = int(np.flatnonzero(ks > ke)[0])
        raise ValueError(f"ks: ks[{t}]={ks[t]} > ke[{t}]={ke[t]}")
    return q, w, k, ks, ke


def _meta(wl: Workload, K: int | None) -> dict[str, str]:
    meta = {"name": str(wl.name), "params": json.dumps(wl.params, sort_keys=True, default=str)}
    if K is not None:
        meta["K"] = str(int(K))
    return meta


def save_workload(wl: Workload, path, K: int | None = None) -> Path:
    """Write ``wl`` to ``path`` (``.npz`` or ``.safetensors``) as tensors q, w, k, ks, ke.

    Metadata (strings): name, params (JSON) and, if given, K.  In ``.npz`` they are one
    extra unicode array ``__metadata__`` holding that JSON; in ``.safetensors`` they are
    the header's metadata dict.  The arrays are validated before writing.
    """
    path = Path(path)
    arrays = dict(zip(TENSORS, validate_workload(*wl.arrays()), strict=True))
    meta = _meta(wl, K)
    if path.suffix == ".npz":
        with open(path, "wb") as f:
            np.savez(f, **arrays, __metadata__=np.array(json.dumps(meta)))
    elif path.suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file(arrays, str(path), metadata=meta)
    else:
        raise ValueError(f"path: expected a .npz or .safetensors file, got {str(path)!r}")
    return path


def load_workload(path) -> Workload:
    """Read a workload written by ``save_workload`` (or any file with tensors q, w, k, ks,
    ke); validate it (``validate_workload``) and return it.  ``params`` holds the stored
    params plus ``K`` when the file has it.  Unreadable files, missing tensors and invalid
    arrays raise ValueError naming the file or the tensor.
    """
    path = Path(path)
    meta: dict[str, str] = {}
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {name: z[name] for name in z.files}
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"path: cannot read {str(path)!r} as .npz: {e}") from e
        except Exception as e:  # zipfile.BadZipFile and friends
            raise ValueError(f"path: cannot read {str(path)!r} as .npz: {e}") from e
        if "__metadata__" in arrays:
            try:
                meta = json.loads(str(arrays.pop("__metadata__")))
            except (TypeError, ValueError) as e:
                raise ValueError(f"__metadata__: not valid JSON in {str(path)!r}") from e
    elif path.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.numpy import load_file

        try:
            arrays = load_file(str(path))
            with safe_open(str(path), framework="np") as f:
                meta = dict(f.metadata() or {})
        except Exception as e:  # SafetensorError, OSError, ...
            raise ValueError(f"path: cannot read {str(path)!r} as .safetensors: {e}") from e
    else:
        raise ValueError(f"path: expected a .npz or .safetensors file, got {str(path)!r}")
    for name in TENSORS:
        if name not in arrays:
            raise ValueError(f"{name}: tensor missing from {str(path)!r}")
    q, w, k, ks, ke = validate_workload(*(arrays[n] for n in TENSORS))
    params: dict = {}
    if meta.get("params"):
        try:
            params = json.loads(meta["params"])
        except ValueError as e:
            raise ValueError(f"params: metadata is not valid JSON in {str(path)!r}") from e
    if "K" in meta:
        try:
            params["K"] = int(meta["K"])
        except ValueError as e:
            raise ValueError(f"K: metadata {meta['K']!r} is not an integer") from e
    return Workload(q, w, k, ks, ke, name=str(meta.get("name", "custom")), params=params)
