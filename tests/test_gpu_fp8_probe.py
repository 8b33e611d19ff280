"""The e4m3 wgmma accumulator on the GPU (docs/numerics.md "The e4m3 wgmma accumulator"):
every result of the crafted probe cases equals ``dosa_ref.mma_model.WGMMA_E4M3`` bit for bit,
swapped operands give the transpose, a repeated row and column one value everywhere, and
the MMAs of 32 and 16 columns give each column the 64-column MMA's bits;
the bulk tensor copy lands the 128-byte-swizzled layout with the map passed either way.
Needs a compute-capability-9.0 GPU (sm_90a)."""

import numpy as np
import pytest
from gpu_support import gpu, needs_sm90a, ptxas_report

from dosa_cupy import _build
from dosa_cupy.bench import fp8_probe


@pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize(
    "source", ["fp8_probe.cu", "dense_fp8.cu", "score_fp8.cu", "screen_wgt.cu"]
)
def test_sm90a_sources_compile_with_asynchronous_wgmma(source, tmp_path):
    """The sm_90a code of these files (empty for every other target, so the sm_90 build of
    CI does not see it) compiles for sm_90a with no serialised or waited-on wgmma
    (ptxas C7512 / C7514 / C7515 / C7517 / C7518) and no spills in the FP8 dense builds and
    in the transposed screen (screen_wgt_rows32, _rows16, _rows8, the ring build's
    screen_wgt_ring_rows* and screen_wgt_image_rows*, their tie-aware variants, and the FP8
    build's screen_wgt_fp8_ring_rows* and screen_wgt_fp8_image_rows*, and its fp32-guard
    kernels screen_wgt_fp8_ring_rows*_g32 and *_g32p)."""
    report = ptxas_report(_build.KernelSpec(source, (), sm90a=True), tmp_path)
    for code in ("C7512", "C7514", "C7515", "C7517", "C7518"):
        assert code not in report, report
    if source == "dense_fp8.cu":
        assert "dense_fp8_h64_lean_n128q4_w3_seq" in report
        spills = [ln for ln in report.splitlines() if "spill stores" in ln]
        assert spills and all(" 0 bytes spill stores" in ln for ln in spills), report
    if source == "screen_wgt.cu":
        for n in (32, 16, 8):
            for build in ("", "_ring", "_image"):
                assert f"screen_wgt{build}_rows{n}_tie" in report
            for build in ("_fp8_ring", "_fp8_image"):
                assert f"screen_wgt{build}_rows{n}" in report
            assert f"screen_wgt_fp8_ring_rows{n}_g32" in report
            assert f"screen_wgt_fp8_ring_rows{n}_g32p" in report
        for code in ("C7510", "C7511", "C7513", "C7516", "C7519", "C7520"):
            assert code not in report, report
        spills = [ln for ln in report.splitlines() if "spill stores" in ln]
        assert len(spills) == 32 and all(" 0 bytes spill stores" in ln for ln in spills), report


@pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize(
    "define", ["DOSA_WGT_STAGE8=1", "DOSA_WGT_TWO_ACC=0", "DOSA_WGT_GROUPS=2", "DOSA_WGT_WORDS=1"]
)
def test_transposed_screen_builds_compile(define, tmp_path):
    """The transposed screen's other builds (csrc/screen_wgt.cu: the conflict-free staging,
    the one-accumulator schedule, two warpgroups per block, the gathered words) compile for
    sm_90a with their compile-time layout checks, no serialised or waited-on wgmma and no
    spills."""
    report = ptxas_report(_build.KernelSpec("screen_wgt.cu", (define,), sm90a=True), tmp_path)
    for code in ("C7510", "C7511", "C7512", "C7513", "C7514", "C7515", "C7516", "C7517",
                 "C7518", "C7519", "C7520"):  # fmt: skip
        assert code not in report, report
    spills = [ln for ln in report.splitlines() if "spill stores" in ln]
    assert len(spills) == 32 and all(" 0 bytes spill stores" in ln for ln in spills), report


@gpu
@needs_sm90a
def test_wgmma_e4m3_step_model_holds_on_every_crafted_case():
    cases = fp8_probe.make_cases(seed=3)  # other operands than the recorded run's seed 0
    d = fp8_probe.run_gpu(cases)
    fam = cases["family"]
    per = {str(f): fp8_probe.mismatches(fp8_probe.WGMMA_E4M3, cases, d, np.nonzero(fam == f)[0])
           for f in dict.fromkeys(fam)}  # fmt: skip
    assert per == {f: 0 for f in per}, per
    narrow = {cols: fp8_probe.run_gpu(cases, cols) for cols in (32, 16)}
    got = fp8_probe.structural(cases, d, narrow)
    assert got == {"swap_mismatch": 0, "const_mismatch": 0, "n32_mismatch": 0, "n16_mismatch": 0}


@gpu
@needs_sm90a
def test_bulk_tensor_copy_by_value_and_from_global_memory():
    assert fp8_probe.tma_check() == {"by_value": 0, "global": 0}


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
def test_fp8_dense_logits_equal_the_host_model(H):
    """Every build of csrc/dense_fp8.cu equals its host model bit for bit on sampled queries
    and keys — the fresh-step builds ``dosa_ref.mma_model.fp8_fresh_scores``, the chained
    timing build ``fp8_chained_scores`` (the step model's window over the running sum, in a
    chain) — and has the −inf pattern of the visibility ranges (a causal chunk with ranges
    that start and end inside key stages, a last stage past N)."""
    from dosa_cupy.bench import fp8_dense
    from dosa_cupy.workload import make_gpu_workload
    from dosa_ref.mma_model import fp8_chained_scores, fp8_fresh_scores

    wl = make_gpu_workload("calibrated", 37, 5000, H, seed=4)
    for v, (*_, fresh) in fp8_dense.VARIANTS.items():
        model = fp8_fresh_scores if fresh else fp8_chained_scores
        res = fp8_dense.check(wl, fp8_dense.fp8_logits(wl, v), np.random.default_rng(1), model,
                              nq=8, nk=600)  # fmt: skip
        assert res == {"model_mismatch": 0, "inf_pattern_mismatch": 0}, (v, res)


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
def test_deepgemm_logits_against_its_model(H):
    """DeepGEMM's fp8 indexer logits on the project's inputs equal
    ``dosa_ref.mma_model.deepgemm_scores`` bit for bit (chained k32 steps, its head-sum
    tree, α before the quad's butterfly), with the head sum's products contracted to fmaf or
    not — the model that says what the project's FP8 scorer would have to do to equal them
    (docs/error_model.md "DeepGEMM's logits, bit for bit")."""
    from dosa_cupy.bench import fp8_dense
    from dosa_cupy.bench.peers import discover
    from dosa_cupy.workload import make_gpu_workload

    peers = discover(None)
    if peers.logits is None:
        pytest.skip("deep_gemm is not importable here (docs/peers.md)")
    wl = make_gpu_workload("calibrated", 40, 6000, H, seed=8)
    res = fp8_dense.check_deepgemm(wl, peers.logits)
    assert res["inf_pattern_mismatch"] == 0, res
    assert min(res["fused_mismatch"], res["unfused_mismatch"]) == 0, res


@gpu
@needs_sm90a
@pytest.mark.parametrize("H", [64, 32])
def test_gathered_keys_score_the_dense_logits_bits(H):
    """The FP8 scorer on keys gathered by id (score_fp8.cu) gives each key the bits of the
    dense FP8 logits (every fresh build) and of the host model — the position independence
    refinement and seeds need (an id repeated, ids in any order, −1 slots, rows of M not a
    multiple of 64)."""
    import cupy as cp

    from dosa_cupy.bench import fp8_dense
    from dosa_cupy.workload import make_gpu_workload
    from dosa_ref.mma_model import fp8_fresh_scores

    wl = make_gpu_workload("calibrated", 9, 3000, H, seed=6)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 3000, (9, 100)).astype(np.int32)
    ids[:, 7] = ids[:, 3]  # a repeated id
    ids[:, -5:] = -1
    got = cp.asnumpy(fp8_dense.fp8_scores_at(wl, cp.asarray(ids)))
    assert np.all(np.isneginf(got[:, -5:]))
    q, w = cp.asnumpy(wl["q"]), cp.asnumpy(wl["w"])
    kp, ksc = cp.asnumpy(wl["k_payload"]), cp.asnumpy(wl["k_scale"])
    for t in range(9):
        want = fp8_fresh_scores(q[t], w[t], kp[ids[t, :-5]], ksc[ids[t, :-5]])
        assert np.array_equal(got[t, :-5].view(np.uint32), want.view(np.uint32)), t
    ks, ke = cp.asnumpy(wl["ks"]), cp.asnumpy(wl["ke"])
    for v, (*_, fresh) in fp8_dense.VARIANTS.items():
        if not fresh:
            continue
        lg = cp.asnumpy(fp8_dense.fp8_logits(wl, v))
        for t in range(9):
            vis = (ids[t] >= ks[t]) & (ids[t] < ke[t])
            assert np.array_equal(
                lg[t, ids[t][vis]].view(np.uint32), got[t][vis].view(np.uint32)
            ), v
