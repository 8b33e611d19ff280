"""The mutation targets (module → fast deterministic tests, out-of-scope code) and the
equivalent mutants with the argument for each (``dosa mutate``; docs/mutation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """One module under mutation.

    path: file relative to the repository root; tests: test files run for its mutants
    (in this order, stopping at the first failure; missing files are ignored);
    skip: qualified names (``Class``, ``Class.method``, ``function``) whose bodies are
    not mutated (option parsing, statistics, serialisation: no bearing on soundness).
    """

    path: str
    tests: tuple[str, ...]
    skip: tuple[str, ...] = ()

    @property
    def id_stem(self) -> str:
        """The module part of its mutant ids: the file's stem, with ``cupy_`` in front for
        dosa_cupy's modules (several share a stem with a dosa_ref module)."""
        stem = Path(self.path).stem
        return "cupy_" + stem if self.path.startswith("dosa_cupy/") else stem


_SELECT_TESTS = (
    "tests/test_mut_select.py",
    "tests/test_mut_stages.py",
    "tests/test_mut_fresh.py",
    "tests/test_select.py",
    "tests/test_zero_plateau.py",
)
_NUM_TESTS = (
    "tests/test_mut_numeric.py",
    "tests/test_mut_stages.py",
    "tests/test_mut_fresh.py",
    "tests/test_numeric.py",
)
_CERT_TESTS = ("tests/test_mut_certificate.py", "tests/test_certificate.py")
TARGETS: tuple[Target, ...] = (
    Target("dosa_ref/certificate.py", (*_CERT_TESTS, *_SELECT_TESTS)),
    Target("dosa_ref/plan.py", (*_CERT_TESTS, *_SELECT_TESTS), skip=("PlanOptions",)),
    Target("dosa_ref/seeds.py", _SELECT_TESTS),
    Target("dosa_ref/select.py", (*_SELECT_TESTS, "tests/test_numeric.py")),
    Target("dosa_ref/screen.py", (*_SELECT_TESTS, *_NUM_TESTS)),
    Target("dosa_ref/cost.py", _SELECT_TESTS),
    Target(
        "dosa_ref/pipeline.py",
        (*_SELECT_TESTS, *_NUM_TESTS),
        skip=("DosaStats", "FP8Stats", "DosaResult", "FP8Result", "topk_check", "_slack_sample"),
    ),
    Target(
        "dosa_ref/prepare.py",
        (*_SELECT_TESTS, "tests/test_numeric.py", "tests/test_validation.py"),
        skip=("Chunk",),
    ),
    Target("dosa_ref/refine.py", _SELECT_TESTS),
    Target(
        "dosa_ref/scorer.py",
        (
            "tests/test_mut_select.py",
            "tests/test_mut_stages.py",
            "tests/test_select.py",
            "tests/test_certificate.py",
        ),
    ),
    Target(
        "dosa_ref/fp8.py",
        (
            "tests/test_mut_fp8.py",
            "tests/test_mut_stages.py",
            "tests/test_mut_fresh.py",
            "tests/test_fp8.py",
            "tests/test_numeric.py",
        ),
    ),
    Target("dosa_ref/rounding.py", _NUM_TESTS),
    Target(
        "dosa_ref/error_model.py",
        _NUM_TESTS,
        skip=(
            "ErrorModel.to_dict",
            "ErrorModel.to_json",
            "ErrorModel.from_dict",
            "Arithmetic.to_dict",
            "_model_fields",
            "simulate_dot",
            "_trunc_f32",
            "simulate_scorer",
        ),
    ),
    Target(
        "dosa_ref/numeric.py",
        _NUM_TESTS,
        skip=("FP8Bounds", "FP8ScreenPlan", "simulate_screen"),
    ),
    Target(
        "dosa_cupy/plan.py",
        (
            "tests/test_mut_gpu_plan.py",
            "tests/test_gpu.py",
            "tests/test_plan_fused.py",
            "tests/test_screen_pair.py",
        ),
        # the fused planner's launcher is checked by the kernel emulation of test_plan_fused
        # and on the GPU, not by mutation (docs/mutation.md)
        skip=("DevicePlan", "_kernel", "plan_smem_bytes", "plan_constants", "build_plans_fused"),
    ),
    Target(
        "dosa_cupy/screen.py",
        (
            "tests/test_gpu_tie_reject.py",
            "tests/test_screen_pair.py",
            "tests/test_gpu_sm90a.py",
        ),
        # device launches and the per-chunk driver: GPU-only, tested on the H200
        skip=("ScreenLaunch", "Screened", "screen_stage", "tie_screen_wanted"),
    ),
    # the decode step's host side: run on the CPU through numpy stand-ins for CuPy and the
    # kernels (tests/test_gpu_decode.py's fake_cupy) and the numpy emulation of the step
    Target(
        "dosa_cupy/decode_ops.py",
        ("tests/test_gpu_decode.py", "tests/test_decode.py"),
        skip=("_tune", "_kernel"),  # the NVRTC build and its tuning knob: GPU-only
    ),
    Target("dosa_cupy/decode.py", ("tests/test_gpu_decode.py", "tests/test_decode.py")),
    # the route choice's cost model and memo (the sampled decision launches kernels: GPU-only,
    # tests/test_gpu_route.py on the H200)
    Target("dosa_cupy/cost.py", ("tests/test_cost.py",)),
    # the serving layouts' host logic (offsets, visible ranges, relative ids, page rows; the
    # CPU tests run it with numpy for CuPy and an exact Top-K for dosa_topk)
    Target("dosa_cupy/serving.py", ("tests/test_serving.py",)),
    # the GPU options' checks and resolution (host logic; the statistics' filling, the
    # stage timer and start() need CuPy arrays: GPU tests)
    Target(
        "dosa_cupy/options.py",
        (
            "tests/test_cost.py",
            "tests/test_gpu.py",
            "tests/test_gpu_cert.py",
            "tests/test_gpu_sm90a.py",
            "tests/test_gpu_tie_reject.py",
            "tests/test_screen_pair.py",
            "tests/test_capture.py",
            "tests/test_validation.py",
        ),
        skip=("DosaGpuStats.fill_common", "DosaGpuStats.fill_seeds", "StageTimer", "start"),
    ),
    # the captured prefill step's host side: option refusal, the arena's arithmetic, the
    # shape key, the out check, finish (numpy for CuPy); the step itself launches kernels
    # (GPU tests in the same file)
    Target(
        "dosa_cupy/capture.py",
        ("tests/test_capture.py",),
        skip=(
            "PrefillSelectorGPU.step",
            "PrefillSelectorGPU._first",
            "PrefillSelectorGPU._run",
            "PrefillSelectorGPU.release",
            "_Shape",
        ),
    ),
    # the references named after the kernels (the GPU tests compare each kernel with its
    # reference; the CPU tests pin the references themselves)
    Target("dosa_ref/stages.py", ("tests/test_stages.py",)),
    # the explicit seeds' table (which ids may join τ: visible, distinct, not default seeds);
    # the stage functions launch kernels (GPU tests)
    Target(
        "dosa_cupy/seeds.py",
        ("tests/test_gpu.py", "tests/test_stages.py", "tests/test_validation.py"),
        skip=(
            "seed_stage",
            "anchor_pool",
            "seed_ranges",
            "score_seed_tiles",
            "score_seed_ids",
            "cert_clear",
            "certificate_seeds",
            "device_seed_ids",
            "Seeds",
        ),
    ),
)


@dataclass(frozen=True)
class Equivalent:
    """A mutant excluded from the score: module path, the original source line and the
    mutated line (both stripped; line numbers are not used, so edits elsewhere in the file
    keep the entry valid), ``kind`` and the argument.

    kind "identical": the mutant computes the same values on every input the code can
    receive.  kind "contract": the values may differ in the last bits, but the property
    every caller relies on (an outward bound, "any R is valid") provably or, where stated,
    demonstrably still holds; docs/mutation.md gives the evidence.
    """

    path: str
    before: str
    after: str
    why: str
    kind: str = "identical"


_NUM = "dosa_ref/numeric.py"
_ROUND = "dosa_ref/rounding.py"
_EMODEL = "dosa_ref/error_model.py"
_CPLAN = "dosa_cupy/plan.py"
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        _EMODEL,
        "eps = float(sub_up(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))",
        "eps = float(sub_down(mul_up(add_up(1.0, g), add_up(1.0, ge)), 1.0))",
        "(screen and scorer coefficients) the last subtraction rounded down instead of up, "
        "after two upward roundings of the "
        "factors: over 8 error models, D 1..512, H 1..128 and r 1..64 (48,724 cases) the "
        "screen and scorer coefficients still dominate margins.model_coefficients_exact "
        "(docs/records/mutation_contract_check.py)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "return 0.0",
        "return 1.0",
        "both `return 0.0` of _joint_up: with no omitted head (line 1) _positive_enclosure "
        "returns before calling it; with every u_h = 0 (line 2) the caller takes "
        "min(triangle, joint) and the triangle term is itself an upper bound of the exact "
        "allowance 0, so min(tri, 1.0) is still one",
        "contract",
    ),
    Equivalent(
        _NUM,
        "rad = np.maximum(sub_up(hi, m), sub_up(m, lo))",
        "rad = np.maximum(sub_up(hi, m), sub_down(m, lo))",
        "rad only needs to cover both half-widths; hi - m is still rounded up, and m - lo "
        "differs from it by at most the rounding of the midpoint m; 0 violations of "
        "E_plus >= exact allowance on 600 fixed plans (docs/records/mutation_contract_check.py)",
        "contract",
    ),
    Equivalent(
        _EMODEL,
        "g = INF if St >= 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "g = INF if St > 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "differs only when St = up(S * theta) is exactly 1.0; a search over kept_bits 1..39, "
        "k_step 1..299 and every step count S near 1/theta found no such case (up() always "
        "steps past the correctly rounded product), and St > 1 gives inf either way",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "return add_up(mul_up(p, add_up(1.0, 2.0 * g)), n * 2.0**-1073)",
        "return add_up(mul_up(p, add_down(1.0, 2.0 * g)), n * 2.0**-1073)",
        "the exact x satisfies x <= p / (1 - g); 1 + 2g leaves g - 2g^2 of slack, which covers "
        "the lost ulp for n >= 4; for n <= 3, 1 + 2g_n is (nearly) representable and "
        "down() gives 1 + (n - 1)2^-52, which with mul_up's own upward ulp still covers "
        "1 / (1 - g_n); 0 violations in 20,000 random dot products (n = 2..8) checked in "
        "rationals",
        "contract",
    ),
    Equivalent(
        _NUM,
        "z = y @ fplan.aux_scale.astype(np.float64)",
        "z = y @ (fplan.aux_scale)",
        "y is float64, so float64 @ float32 promotes to float64; float32 -> float64 is "
        "exact, and the product is the same float64 matmul",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "ratio = np.where(nR > 0, dots / np.where(nR > 0, nR, 1.0), 0.0)",
        "ratio = np.where(nR > 0, dots / np.where(nR >= 0, nR, 1.0), 0.0)",
        "the inner where only changes entries with nR == 0, which the outer where replaces "
        "by 0.0 (the division warning is silenced by the surrounding errstate)",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "if not (np.isfinite(b) and b >= np.finfo(np.float64).tiny):",
        "if not (np.isfinite(b) and b > np.finfo(np.float64).tiny):",
        "only beta == 2^-1022 exactly is no longer projected; Prop. 1 holds for any "
        "beta >= 0 including beta = 0 (no projection), so the plan stays valid "
        "(docs/method.md §3); only the allowance of that head can grow",
        "contract",
    ),
    Equivalent(
        "dosa_ref/screen.py",
        "ok = (hi <= 0.0) & (m <= 2.0**1000)",
        "ok = (hi < 0.0) & (m <= 2.0**1000)",
        "certifies fewer keys (those with hi == 0 exactly lose the plateau bound and keep "
        "their U): every key still has a valid bound and ids never change",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "return p, n, gamma_up(max(n, 1), 2.0**-53)",
        "return p, n, gamma_up(max(n, 2), 2.0**-53)",
        "gamma_2 >= gamma_1 and, for n = 0, p = 0: the matmul bounds only widen "
        "(matmul_abs_up rises, matmul_enclose's interval grows)",
        "contract",
    ),
    Equivalent(
        _CPLAN,
        "mth = Hp // 16",
        "mth = Hp / 16",
        "Hp is padded to a multiple of 16 (build_plans' contract: heads padded to 16*MT_H), "
        "so Hp / 16 is the same integer as a float, and mth only enters arithmetic "
        "(gamma(2 * mth + 5), the eps_raw count) where the float gives the same value",
    ),
    Equivalent(
        "dosa_ref/seeds.py",
        "if n <= m:",
        "if n < m:",
        "for n == m the other branch gives a + (arange(m) * n) // m = a + arange(m), the "
        "same int64 array",
    ),
    Equivalent(
        "dosa_ref/scorer.py",
        "logits = np.matmul(kp.reshape(-1, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]",
        "logits = np.matmul(kp.reshape(-2, SCORE_TILE, D), q_t.T).reshape(m, -1)[:n]  # [n, H]",
        "NumPy 2.4 (the version in use) takes any negative entry of a reshape as the one "
        "inferred dimension, so -2 and -1 give the same shape",
    ),
    Equivalent(
        _NUM,
        "if e > 0:  # downscaling may round: widen",
        "if e >= 0:  # downscaling may round: widen",
        "at e = 0 the scaling is the identity; the mutant only adds one outward step "
        "(down(lo), up(hi)) to an enclosure that is already valid: E_g^+ can only grow",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "err = mul_up(mul_up(a, 1.0 + 2.0 * g), g)",
        "err = mul_up(mul_up(a, 1.0 + 4.0 * g), g)",
        "a larger error term: sum_up only rises and sum_down only falls, both stay bounds "
        "(the factor 1 + 2g already covers the rounding of the computed |sum|)",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "e = np.where(np.isfinite(mx) & (mx > 0), e, 0)",
        "e = np.where(np.isfinite(mx) & (mx > 0), e, 1)",
        "only rows whose maximum is 0 or not finite are affected: a zero row's tiny upper "
        "bound (up(0) squared and summed, about 2^-537) is doubled, still an upper bound of "
        "0; inf and NaN rows give inf and NaN either way",
        "contract",
    ),
    Equivalent(
        "dosa_ref/certificate.py",
        "cuts = zip(key[:-1], key[1:], strict=True)",
        "cuts = zip(key[:-1], key[1:], strict=False)",
        "key[:-1] and key[1:] always have the same length, so strict never fires",
    ),
    Equivalent(
        "dosa_ref/fp8.py",
        "s = (np.asarray(amax32, dtype=np.float32) / np.float32(E4M3_MAX)).astype(np.float32)",
        "s = (np.asarray(amax32, dtype=np.float32) / (E4M3_MAX)).astype(np.float32)",
        "448 is exact in fp32; a float32 array over a Python float divides in fp32 (NEP 50), "
        "and where NumPy promotes to float64 instead, fp32(fl64(a/b)) = fl32(a/b) for fp32 "
        "a, b (double rounding is innocuous for division since 53 >= 2*24 + 2)",
    ),
    Equivalent(
        _CPLAN,
        "sig = cp.ldexp(cp.ones(Qn), cp.where(m == 0.5, e - 1, e).astype(cp.int32))",
        "sig = cp.ldexp(cp.ones(Qn), (cp.where(m == 0.5, e - 1, e)))",
        "frexp returns int32 exponents in NumPy and CuPy, e - 1 and where keep int32: "
        "the cast is a no-op",
    ),
    Equivalent(
        _NUM,
        "smp = kbar[stride_sample(a, b, sample)] if b > a else kbar[:0]",
        "smp = kbar[stride_sample(a, b, sample)] if b >= a else kbar[:0]",
        "for b == a, stride_sample(a, a, m) is empty and kbar[empty] equals kbar[:0]",
    ),
    Equivalent(
        _NUM,
        "mx = float(np.max(np.maximum(np.abs(u_lo), np.abs(u_hi))))",
        "mx = float(np.max(np.maximum(np.abs(u_lo), (u_hi))))",
        "enclosures have u_lo <= u_hi, so a negative u_hi has |u_hi| <= |u_lo| and "
        "max(|u_lo|, u_hi) = max(|u_lo|, |u_hi|)",
    ),
    Equivalent(
        _ROUND,
        "mag = np.maximum(np.abs(lo), np.abs(hi))",
        "mag = np.maximum(np.abs(lo), (hi))",
        "intervals have lo <= hi, so a negative hi has |hi| <= |lo|: same maximum",
    ),
    Equivalent(
        _NUM,
        "and np.all(np.isfinite(omega))",
        "and np.any(np.isfinite(omega))",
        "a non-finite omega_j makes its row of M (|omega| @ |qhat|: inf, or NaN for a zero "
        "row), hence J_screen, J and C non-finite (eps_s > 0: the CPU float64 term is "
        "always added), so valid is already False",
    ),
    Equivalent(
        _NUM,
        "R=R.astype(np.int64),",
        "R=(R),",
        "plan.R is already int64 (build_plan: np.unique(np.asarray(R, dtype=np.int64)))",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "d_s = qs[P].copy()  # d̃_h, in units of 2^{e_h}",
        "d_s = (qs[P])  # d̃_h, in units of 2^{e_h}",
        "indexing with the integer array P already returns a new array",
    ),
    Equivalent(
        "dosa_ref/seeds.py",
        "if n <= 0 or Qn == 0:",
        "if n < 0 or Qn == 0:",
        "for n = 0, linspace(0, Qn - 1, 0) is empty, the loop adds nothing and the same "
        "empty int64 array is returned",
    ),
    Equivalent(
        _CPLAN,
        "key = prim + sec / (1.0 + sec)",
        "key = prim + sec / (2.0 + sec)",
        "x/(1+x) and x/(2+x) are both increasing maps of [0, inf) into [0, 1): the "
        "class-then-priority order, hence R, is the same except where rounding merges "
        "priorities above ~2^52 (both versions merge there); any R is valid "
        "(docs/method.md §3), so ids never change",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact",
        "ms = np.where(e > 1, up(ms), ms)  # downscaling may round; upscaling is exact",
        "e = 1 halves the row: exact except for elements below 2^-1021, whose squares "
        "underflow and are replaced by up(0) = 2^-1074 >= their exact square either way; the "
        "result stays an upper bound (0 violations on 2000 fixed plans, docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _EMODEL,
        "g = INF if St >= 1.0 else float(div_up(St, sub_down(1.0, St)))",
        "g = INF if St >= 1.0 else float(div_up(St, sub_up(1.0, St)))",
        "one ulp less in the denominator's widening; S*theta already carries >= 3 upward "
        "ulps, and over W 8..24, k 8..64 and 43,444 step counts the mutant's gamma exceeds "
        "the exact S*theta/(1 - S*theta) by >= 6.6e-16 relative (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om < 0.0)",
        "only turns same from True to False (when omega == 0), selecting the other branch "
        "|c||q| + |omega||qhat|, an upper bound for any signs (triangle inequality); with "
        "omega = 0 both branches bound |c||q|",
        "contract",
    ),
    Equivalent(
        _NUM,
        "same = (c_lo >= 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "same = (c_lo > 0.0 and om >= 0.0) or (c_hi <= 0.0 and om <= 0.0)",
        "only turns same from True to False (c_lo == 0), selecting the branch that is an "
        "upper bound for any signs (see the om < 0.0 entry)",
        "contract",
    ),
    Equivalent(
        _ROUND,
        "ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact",
        "ms = np.where(e > 0, down(ms), ms)  # downscaling may round; upscaling is exact",
        "halving rows with max >= 1 is exact in the normal range; the one-ulp inward step "
        "is absorbed by mul_up, sum_up, sqrt_up and the final up: 0 violations on 30,000 "
        "random vectors up to 2^900 checked in rationals (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "S = (sum_down(lo, axis=0), sum_up(hi, axis=0))",
        "S = (sum_up(lo, axis=0), sum_up(hi, axis=0))",
        "_joint_up works at a power-of-two scale near 1 where the lower end of the column "
        "sums loses <= gamma_n*sum|x|, less than the slack of the Gram part and of the "
        "final widenings; 0 violations on 2000 fixed plans (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "G = add_up(G, matmul_abs_up(am, rad.T))",
        "G = add_down(G, matmul_abs_up(am, rad.T))",
        "one of three widenings of the Gram enclosure (plus gamma_n of matmul_enclose) "
        "turned inward by one ulp; 0 violations on 2000 fixed plans (docs/mutation.md)",
        "contract",
    ),
    Equivalent(
        _NUM,
        "G = add_up(G, matmul_abs_up(rad, am.T))",
        "G = add_down(G, matmul_abs_up(rad, am.T))",
        "as the previous entry (the symmetric cross term)",
        "contract",
    ),
    Equivalent(
        "dosa_ref/fp8.py",
        "return np.clip(x32, np.float32(-E4M3_MAX), np.float32(E4M3_MAX))"
        ".astype(E4M3).view(np.uint8)",
        "return np.clip(x32, np.float32(-E4M3_MAX), (E4M3_MAX)).astype(E4M3).view(np.uint8)",
        "E4M3_MAX = 448.0 is a Python float: numpy 2 treats it as a weak scalar, so the clip "
        "of the float32 array is float32 either way, and 448 is exact in float32",
    ),
    Equivalent(
        "dosa_ref/fp8.py",
        "return np.clip(x32, np.float32(-E4M3_MAX), np.float32(E4M3_MAX))"
        ".astype(E4M3).view(np.uint8)",
        "return np.clip(x32, (-E4M3_MAX), np.float32(E4M3_MAX)).astype(E4M3).view(np.uint8)",
        "as the previous entry (the lower end −448.0)",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "return np.sort(R).astype(np.int64)",
        "return (np.sort(R))",
        "R is built from np.flatnonzero indices (dtype intp) by indexing, concatenate and "
        "sort, which keep intp; intp is int64 on the 64-bit platforms numpy 2 supports "
        "(Windows included), so the cast only copies an int64 array np.sort already copied",
    ),
    Equivalent(
        "dosa_ref/pipeline.py",
        'return RChoice(int(opt.r), False, f, float("nan"), float("nan"), 0.0)',
        'return RChoice(int(opt.r), False, f, float("nan"), float("nan"), 1.0)',
        "sample_work of the fixed-r choice: its only reader (bound_work += ch.sample_work) is "
        "in the r = 'auto' branch of _pick_r, after this return; _screened_query reads r, "
        "dense and the estimates only",
    ),
    Equivalent(
        "dosa_ref/pipeline.py",
        "return FP8Result(ids=ids, stats=st, plans=bound.plans, tau=st.tau.copy())",
        "return FP8Result(ids=ids, stats=st, plans=bound.plans, tau=(st.tau))",
        "FP8Result.tau gets the same float64 [Qn] values as stats.tau; no library code writes "
        "either array after fp8_topk returns (only a caller writing into one of them would "
        "see the other change)",
    ),
    Equivalent(
        "dosa_ref/certificate.py",
        "if key == (0, self.k.shape[1]):",
        "if key == (1, self.k.shape[1]):",
        "the shortcut self.norm = safe_norm(k, axis=1) equals the general branch's "
        "safe_norm(k[:, 0:D], axis=1) (same function, same input); group cuts start at 0 "
        "(allowance_groups), so the key (1, D) never occurs",
    ),
    Equivalent(
        _NUM,
        "and np.all(np.isfinite(aux_scale))",
        "and np.any(np.isfinite(aux_scale))",
        "both aux scales are np.float32 of _pow2_scale(amax, -126, 127), a power of two in "
        "[2^-126, 2^127] (or 1.0): always finite, so all() and any() are both True",
    ),
    Equivalent(
        _ROUND,
        "e = np.where(np.isfinite(mx) & (mx > 0), e, 0)",
        "e = np.where(np.isfinite(mx) & (mx >= 0), e, 0)",
        "differs only where mx == 0 (a zero row), and np.frexp(0.0) already gives exponent 0",
    ),
    Equivalent(
        _CPLAN,
        "beta = cp.where(use, gj / (cp.where(qj > 0, qj, 1.0) ** 2), 0.0)",
        "beta = cp.where(use, gj / (cp.where(qj >= 0, qj, 1.0) ** 2), 0.0)",
        "where use holds, rmax > 0 needs ratio > 0 at j*, and ratio is −1 unless qn > 0 "
        "there, so qj > 0 and both divisors agree; elsewhere β is 0.0 in both",
    ),
    Equivalent(
        _ROUND,
        "rad = add_up(mul_up(matmul_abs_up(np.abs(A), np.abs(B)), g), n * 2.0**-1073)",
        "rad = add_up(mul_up(matmul_abs_up(np.abs(A), np.abs(B)), g), n * 2.0**-1074)",
        "matmul_enclose's underflow term halved: a product that underflows is off by at most "
        "2^-1075 (half a subnormal step; sums of subnormals and FMAs round once), so the "
        "underflow part of an n-term dot is at most n·2^-1075·(1 + γ_n) and n·2^-1074 still "
        "covers it; test_mut_fresh's worst case (every product a subnormal tie rounded the "
        "same way) stays enclosed",
        "contract",
    ),
    Equivalent(
        _NUM,
        "if u_lo.shape[0] == 0:",
        "if u_lo.shape[1] == 0:",
        "_joint_up is only called by _positive_enclosure after its P.size == 0 return (so "
        "shape[0] = |P| >= 1) on a group slice of coordinate_groups, whose G' = min(G, D) "
        "groups are never empty (shape[1] >= 1): neither test is ever true",
    ),
    Equivalent(
        "dosa_ref/plan.py",
        "if options.pos_projection and R.size > 0 and P.size > 0:",
        "if options.pos_projection and R.size > 0 and P.size >= 0:",
        "with P empty the block only builds [0, r] arrays (argmax over the non-empty r axis "
        "is an empty array) and its loop over P runs zero times: anchor, beta, d_s and "
        "w_fold are unchanged",
    ),
    Equivalent(
        _ROUND,
        "ms = np.where(e > 0, up(ms), ms)  # downscaling may round; upscaling is exact",
        "pass  # downscaling may round; upscaling is exact",
        "norm_up without the widening of downscaled elements: the row maximum scales exactly "
        "into [0.5, 1), and an element can only round when it lands below 2^-1022; its "
        "square then loses < 2^-2094, while sum_up's margin over its own error is at least "
        "(γ_n − γ_{n−1})·0.25 ≥ 2^-55, so the bound still holds for any n",
        "contract",
    ),
)


# --------------------------------------------------------------------------------------
# Mutant generation
# --------------------------------------------------------------------------------------
