"""The bit-level model of the e4m3 wgmma step (dosa_ref.mma_model, docs/numerics.md "The e4m3
wgmma accumulator"): dots observed on the H200 reproduced bit for bit, the model's laws
(exact when nothing falls below the window, truncation toward zero, the error bound of one
step from c = 0), and its validation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dosa_ref.fp8 import e4m3_values
from dosa_ref.mma_model import (
    WGMMA_E4M3,
    StepModel,
    chain,
    chained_dots,
    e4m3_exponent,
    fma_f32,
    fresh_dots,
    step,
    window_rows,
)

# (family, a row [128 codes], b row, c0, k32 chunks in step order, H200 result): dots of the
# probe run 2026-12-02 at bd198f4 (docs/records/gpu_tests.md) whose result differs from the
# exact sum by more than 2^-13 of it — each was reproduced bit for bit by WGMMA_E4M3.
OBSERVED = [
    (
        "window",
        "8b8e0b8e8a8b0a0e8d0f8e0f0c0f0ff78c890b0e8a8f0b8a0b8d8b0e898a0a89000000000a000000"
        "880059000000960000005996000000670000000014000000000000a900000000002a000000000000"
        "00000000002f000000000000000060000e008e000e00b60009008b0c0a8f0b89880008000a000000"
        "0009008e00000000",
        "c0c028c0b8a8b8c848402838b83848b828b0c0b8b030b0a838b028c8c8c038c0b040b840b8a828b0"
        "b840c0a828c0a8c038c038c8c0a848b0c82830283848b048b838c03848b0a8c828b8b03040a840a8"
        "302848a848b048c838b038b828c0b0284848b048304048b0a848c0b8484030c0b0384830a82840b0"
        "c0a8284828c0b038",
        0.0,
        [0],
        240.09375,
    ),
    (
        "window",
        "0a8b000800000e00000000008f0b0e000e5000008b8f8d000e0088000b00008f0000000000000000"
        "0000000000130000000000003d000000000000000090000000000000000000000000005b000000fe"
        "00000000000000000000000000000000000000000000000000000000650045000000000000000000"
        "0000000000000000",
        "b8c0b0c8a8c048a8482828c03840284028c8b82840b028b038c0b0b8c8c8b0c0b0c0a8c0b840b0b0"
        "a8b038b03038c8c0c0c038b030483828a840c03048c828284830b0403038b8483838404038b0b828"
        "4040c838b828c0c830a82848a83038a848b0403830403040403048b0b840c8a8b0b84830c038c028"
        "c848b82840304830",
        0.0,
        [0],
        -31.93359375,
    ),
    (
        "window_c",
        "8c00db00a49d0d0000d500000c000000008f0000da8a8fde002400efd00a77000a00000000000000"
        "0000000088004700000000000000000000000000000000000c006300890000000000000000000000"
        "0000000000008b0b000000000000000000de00957000a00000000e0000008fbc0000000000000000"
        "000000000000005e",
        "40b8a8b8b83030384028c040b0c830c030b030a8c028c8a8b830b848b84840284040b8b040c840c8"
        "303828b0c0b04848b8a84838c048c8a838b8382828c83048b8b8b840c0b03828b84840c0b02830c0"
        "38b030b84838a8c0b048b8a82838483830b8b0b83830b030c0c8b040c0403828c0c0403040b840b0"
        "c82838484840c0b8",
        1.7457646131515503,
        [0],
        59.34375,
    ),
    (
        "uniform_c",
        "74b7ba56a84acbc6946fb5f6a39b952de198ea67d4e259f66e532f5b845bf0cca5296b72758bcc76"
        "8e2c9259c166b5fcbbfe4e3e40c5930cd4f31a1380b327ba1921c91d3eef6119c443646751a4a4bc"
        "81b3ecc032db68cb31fcb7a3d476dc299e8457775b231e0db61819e0f5ede00d697a41851f8fa01f"
        "fd96e82bbf32bd48",
        "dc73c4e3ab5e24e8fc7b797548c1e58e7650725adb84f71479e9d164bd4881113c365edf79643aa5"
        "1edb6acb0abe9744aa794918498baa28a6a246303227384bf57014eb8704c21b8443f930e7641185"
        "de0c1d67fadfc3f91156bb9bea56e54c2770cb878edbd0b1ad7da9016fa330a62222c09983730720"
        "3a7625dc00ab7568",
        -0.04735584929585457,
        [3, 0, 2],
        -39040.0,
    ),
    (
        "gauss",
        "d6676168ededf76cfe755eefd2f0f473f27af2e068e369f0e7e462f66a6d71647a7466716ad278dd"
        "dd6d5aead6e2fd5278f0d070dbdee864dff8ed5de15b6bed727175ea62db68456f63ed75697969ec"
        "ed756e6d705ef46cf1ea70f478e7e8ebf76f70e564f1caf274cde968e7536077ef6fe5eb65e8ecec"
        "7863437253e97ae3",
        "c0cdf272e86a6d69727855746672e94d73f36d4e6e616af6ecf4cef068f3f171f269f86e616f70e9"
        "7253f8e8ea48ea71f8626d6ffb67ef7677edf5e7ed67dee4606e71f3ee6feee7657e5177ecece3f6"
        "6d6e606a59e5f46a7ce8e7eaf06aea6a6d6b63f2f9fa5eeae973f9f165e371dc73f4626d61eb6873"
        "6d746964edc7e547",
        0.0,
        [0, 1, 2, 3],
        29028.0,
    ),
]


def _run(model, a_hex, b_hex, c0, order):
    a = np.frombuffer(bytes.fromhex(a_hex), np.uint8).reshape(1, 1, 128)
    b = np.frombuffer(bytes.fromhex(b_hex), np.uint8).reshape(1, 1, 128)
    o = np.array([order + [0] * (4 - len(order))])
    n = np.array([len(order)])
    return chain(model, np.array([[[c0]]]), e4m3_values(a), e4m3_values(b), o, n, a, b)[0, 0, 0]


@pytest.mark.parametrize("case", OBSERVED, ids=[c[0] for c in OBSERVED])
def test_reproduces_the_h200(case):
    _, a, b, c0, order, want = case
    assert np.float32(_run(WGMMA_E4M3, a, b, c0, order)) == np.float32(want)


@pytest.mark.parametrize("case", OBSERVED[:3], ids=[c[0] for c in OBSERVED[:3]])
def test_each_rule_is_needed(case):
    """Observed single steps that the neighbouring models miss: the window of 13 bits below
    the exponent fields' maximum and the 14-bit write-back are both visible in the data."""
    _, a, b, c0, order, want = case
    others = [StepModel(14, "trunc", "exponent", True, 32, "rn", 14),
              StepModel(13, "trunc", "exponent", True, 32, "rn", None),
              StepModel(13, "floor", "exponent", True, 32, "rn", 14)]  # fmt: skip
    assert any(np.float32(_run(m, a, b, c0, order)) != np.float32(want) for m in others)


codes = st.integers(0, 255).filter(lambda c: c & 0x7F != 0x7F)


@settings(max_examples=300, deadline=None)
@given(st.lists(codes, min_size=32, max_size=32), st.lists(codes, min_size=32, max_size=32))
def test_one_step_from_zero_within_its_bound(a, b):
    """|step − Σp| < 32·2^(E − 13) + 2^-13·|kept sum| with 2^E = 2^(max ea + max eb): the
    bound of one fresh step (docs/numerics.md)."""
    a, b = np.array(a, np.uint8), np.array(b, np.uint8)
    p = e4m3_values(a) * e4m3_values(b)
    pe = e4m3_exponent(a) + e4m3_exponent(b)
    got = step(WGMMA_E4M3, np.zeros(1), p[None, :], pe[None, :])[0]
    exact = p.sum()
    E = e4m3_exponent(a).max() + e4m3_exponent(b).max()
    bound = 32 * 2.0 ** (E - 13) + 2.0**-13 * (abs(exact) + 32 * 2.0 ** (E - 13))
    assert abs(got - exact) <= bound
    assert abs(got) <= abs(exact) + 32 * 2.0 ** (E - 13)  # truncation never grows |sum| past it


def test_exact_when_nothing_falls_below_the_window():
    p = np.array([[448.0 * 448.0, 2.0**8, -(2.0**9)] + [0.0] * 29])  # 2^(17.6), 2^8: 10 binades
    pe = np.array([[16, 8, 9] + [0] * 29])
    assert step(WGMMA_E4M3, np.zeros(1), p, pe)[0] == float(np.float32(p.sum()))


def test_model_fields_are_checked():
    bad = [(dict(kept_bits=0), "kept_bits"), (dict(rounding="up"), "rounding"),
           (dict(align="x"), "align"), (dict(final="x"), "final"), (dict(group=3), "group"),
           (dict(result_bits=30), "result_bits")]  # fmt: skip
    for kw, name in bad:
        kw = {"kept_bits": 13, **kw}
        with pytest.raises(ValueError, match=name):
            StepModel(**kw)
    with pytest.raises(ValueError, match="pe"):
        step(WGMMA_E4M3, np.zeros(1), np.zeros((1, 32)))


@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("kind", ["random", "crafted"])
@pytest.mark.parametrize("scorer", ["fp8_fresh", "fp8_chained"])
def test_fp8_scorer_within_the_plans_allowance(H, kind, scorer):
    """The scores of the FP8 scorers (the H200's arithmetic: fp8_fresh_scores, and the
    chained steps of fp8_chained_scores) lie within the allowance the plan charges for each
    (dosa_cupy.plan.scorer_allowance), per key:
    |s − s_exact| ≤ α(g·Σ_h|w_h|Σ_d|q̄_hd||k̄_d| + Σ_h|w_h|·a_h)."""
    from dosa_cupy.plan import plan_constants, scorer_allowance
    from dosa_ref.fp8 import e4m3_bits
    from dosa_ref.mma_model import fp8_chained_scores, fp8_fresh_scores

    rng = np.random.default_rng(H + len(kind))
    if kind == "random":
        q = e4m3_bits((rng.standard_normal((H, 128)) * 120).astype(np.float32))
        k = e4m3_bits((rng.standard_normal((400, 128)) * 120).astype(np.float32))
    else:
        q, k = window_rows(rng, H), window_rows(rng, 400)
    w = rng.standard_normal(H).astype(np.float32)
    alpha = (rng.random(400) + 0.5).astype(np.float32)
    qv, kv = e4m3_values(q), e4m3_values(k)
    exact = (np.maximum(kv @ qv.T, 0) @ w.astype(np.float64)) * alpha
    model = fp8_fresh_scores if scorer == "fp8_fresh" else fp8_chained_scores
    got = model(q, w, k, alpha).astype(np.float64)
    g, a = scorer_allowance(scorer, q[None], H // 16, 17, np)
    _, _, flushed = plan_constants(H, 1, 17, scorer)  # ε_raw's 2^-126 terms
    allow = alpha * (g * (np.abs(kv) @ np.abs(qv).T @ np.abs(w).astype(np.float64))
                     + float(np.sum(np.abs(w) * a[0])) + flushed)  # fmt: skip
    assert np.all(np.abs(got - exact) <= allow)
    assert np.max(np.abs(got - exact) / allow) > 1e-4  # the test can see an error at all


@pytest.mark.parametrize("kind", ["random", "crafted"])
def test_reference_error_model_covers_the_fresh_wgmma_dot(kind):
    """dosa_ref's ErrorModel of the fresh-step scorer (accumulator "wgmma_e4m3_fresh") bounds
    the bit-exact model's dot error: |x̂ − x| ≤ γ·Σ|q̄_d k̄_d| + dot_abs (payload units)."""
    from dosa_ref.error_model import ErrorModel
    from dosa_ref.fp8 import e4m3_bits

    rng = np.random.default_rng(7 + len(kind))
    if kind == "random":
        q = e4m3_bits((rng.standard_normal((8, 128)) * 150).astype(np.float32))
        k = e4m3_bits((rng.standard_normal((64, 128)) * 150).astype(np.float32))
    else:
        q, k = window_rows(rng, 8), window_rows(rng, 64)
    a = ErrorModel.hopper_wgmma_fresh().scorer
    g, ab = a.dot_relative_error(128), a.dot_absolute_error(128)
    qv, kv = e4m3_values(q), e4m3_values(k)
    x = fresh_dots(q, k)
    exact = kv @ qv.T
    mag = np.abs(kv) @ np.abs(qv).T
    assert np.all(np.abs(x.astype(np.float64) - exact) <= g * mag + ab)
    with pytest.raises(ValueError, match="exact_products"):
        type(a)(accumulator="wgmma_e4m3_fresh", exact_products=False)


def test_chained_dots_are_the_probes_chain():
    """chained_dots (the scorer's four k32 steps in k order, each on the previous result) is
    the probe's ``chain`` with order 0, 1, 2, 3 from a zero accumulator: one step model."""
    from dosa_ref.fp8 import e4m3_bits

    rng = np.random.default_rng(11)
    q = e4m3_bits((rng.standard_normal((16, 128)) * 60).astype(np.float32))
    k = np.concatenate([e4m3_bits((rng.standard_normal((24, 128)) * 60).astype(np.float32)),
                        window_rows(rng, 8)])  # fmt: skip
    n = k.shape[0]
    a = np.broadcast_to(e4m3_values(k)[None], (1, n, 128))
    b = np.broadcast_to(e4m3_values(q)[None], (1, 16, 128))
    want = chain(WGMMA_E4M3, np.zeros((1, n, 16)), a, b, np.arange(4)[None], np.array([4]),
                 a_codes=k[None], b_codes=q[None])[0]  # fmt: skip
    got = chained_dots(q, k)
    assert np.array_equal(got.astype(np.float64), want)
    assert not np.array_equal(got, fresh_dots(q, k))  # the two arithmetics differ here


def test_deepgemm_model_equals_deepgemms_recorded_logits():
    """DeepGEMM's own fp32 logits (``fp8_fp4_mqa_logits`` at 54e2261 on the H200, one
    calibrated query of H = 64 and of H = 32 against 384 keys, recorded in
    tests/data/deepgemm_logits_54e2261.npz; docs/records/gpu_tests.md) equal
    ``deepgemm_scores`` bit for bit; the contraction of the second product instead of the
    first, and no contraction, each miss some (the record discriminates the three)."""
    from pathlib import Path

    from dosa_ref.mma_model import deepgemm_scores

    rec = np.load(Path(__file__).parent / "data" / "deepgemm_logits_54e2261.npz")
    for H in (64, 32):
        q, w, k, alpha, want = (rec[f"h{H}_{n}"] for n in ("q", "w", "k", "alpha", "logits"))
        assert q.shape == (H, 128) and k.shape == (384, 128)
        got = deepgemm_scores(q, w, k, alpha)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        unfused = deepgemm_scores(q, w, k, alpha, fused=False)
        assert np.any(unfused.view(np.uint32) != want.view(np.uint32))
        assert np.any(_second_product_fused(q, w, k, alpha).view(np.uint32) != want.view(np.uint32))


def _second_product_fused(q, w, k, alpha):
    """deepgemm_scores with the first add contracting t_1 instead of t_0 (the model this
    session's record refuted): fmaf(x_1, w_1, round(t_0)), then fmaf on."""
    x = np.maximum(chained_dots(q, k), np.float32(0))
    f32 = np.float32
    part = []
    for c in range(4):
        s = [None, None]
        for e in (0, 1):
            for j in range(q.shape[0] // 8):
                h = 8 * j + 2 * c + e
                t = np.full(x.shape[0], w[h], f32)
                s[e] = (x[:, h] * w[h]).astype(f32) if j == 0 else fma_f32(x[:, h], t, s[e])
        part.append(((s[0] + s[1]).astype(f32) * alpha).astype(f32))
    return (((part[0] + part[1]).astype(f32)) + ((part[2] + part[3]).astype(f32))).astype(f32)


def test_deepgemm_model_is_the_chained_dots_with_another_tree():
    """deepgemm_scores: the chained dots of the project's chained build, another head-sum
    order (chains by column parity, α before the butterfly) — the same value up to fp32
    roundings, and not always the same bits; fused and unfused products differ too.  Each
    tree rounds a term at most H/8 + 4 times (its chain of H/8, the parity or even/odd add,
    × α, the butterfly's two adds) on non-negative terms [x]_+·|w|, so the two differ by at
    most 2·γ_(H/8+4)·α·Σ_h|w_h|[x_h]_+ (Higham, Lemma 3.1)."""
    from dosa_ref.fp8 import e4m3_bits
    from dosa_ref.mma_model import deepgemm_scores, fp8_chained_scores

    rng = np.random.default_rng(12)
    for H in (32, 64):
        q = e4m3_bits((rng.standard_normal((H, 128)) * 60).astype(np.float32))
        k = e4m3_bits((rng.standard_normal((500, 128)) * 60).astype(np.float32))
        w = rng.standard_normal(H).astype(np.float32)
        alpha = (rng.random(500) + 0.5).astype(np.float32)
        dg = deepgemm_scores(q, w, k, alpha)
        own = fp8_chained_scores(q, w, k, alpha)
        mag = (np.maximum(chained_dots(q, k), 0).astype(np.float64) @ np.abs(w)) * alpha
        n = H // 8 + 4
        gamma = n * 2.0**-24 / (1 - n * 2.0**-24)
        assert np.all(np.abs(dg.astype(np.float64) - own) <= 2 * gamma * mag)
        assert np.any(dg != own)
        assert np.any(dg != deepgemm_scores(q, w, k, alpha, fused=False))
