"""CPU: every launch is checked against the kernel's C parameter list (dosa_cupy._signature,
_build.Kernel).  Every kernel that dosa_cupy launches is found, with its parameters, in the
build it is launched from; a wrong count or type raises TypeError naming the kernel and the
parameter; the argument tuples that the host code builds pass.  numpy arrays stand in for
CuPy's through ``ndarray_types``; the real path (``_build.launch_check``) checks
cupy.ndarray."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import numpy as np
import pytest
from cuda_signatures import check_args, param_types, read_source
from gpu_support import numpy_as_cupy

from dosa_cupy import _build, _signature, dense, sm90a
from dosa_cupy._build import TILES, Kernel, KernelSpec, Module, main_spec
from dosa_cupy._signature import LaunchCheck, Param, check_launch, preprocess, signatures
from dosa_cupy.bench.fp8_dense import VARIANTS as FP8_DENSE
from dosa_cupy.bench.screen_variants import QG_ARG, SURV, VARIANTS, WGT_VARIANTS
from dosa_cupy.decode_ops import DECODE
from dosa_cupy.plan import PLAN

PKG = Path(_build.__file__).resolve().parent
NP = (np.ndarray,)
MT = range(1, 5)

# Every kernel dosa_cupy launches, by source (each name's call site in the comment; the
# screen's names are built in screen.ScreenLaunch.of, which the call-site scan cannot read).
LAUNCHED = {
    "kernels.cu": [
        "check_values_i32", "check_values_i64", "check_scales", "quantize_keys_kernel",  # prepare
        "key_rho_kernel", "key_rho_int_kernel",  # prepare (RHO_INT)
        *(f"dense_logits_mt{m}" for m in MT),  # scorer
        *(f"fused_mt{m}" for m in MT),  # fused
        "pool_mark", "pool_count", "pool_ids", "seed_ranges", "local_ranges",  # seeds
        "pool_sample",  # plan (POOL_SAMPLE_KERNEL)
        "cert_clear_below_tau",  # seeds
        *(f"seed_score_mt{m}" for m in MT), *(f"seed_ids_mt{m}" for m in MT),  # seeds
        *(f"screen{c}_mt{m}{t}" for c in ("", "_cert") for m in (1, 2) for t in ("", "_tie")),
        "screen_pair", "screen_pair_tie",  # screen
        *(f"refine_mt{m}" for m in MT),  # refine
        "select_kernel", "select_kernel_ilp", "select_kernel_buf",  # dense (SELECT_ILP, _BUF)
        "select_wide_hist", "select_wide_cut", "select_wide_compact",  # dense
        "select_rank",  # dense (decode_ops.RANK_SELECT)
        "tau_from_kth", "extend_from_spill",  # select, refine (SPILL)
        "floor_wide_hist", "floor_of_cut",  # select (FLOOR_WIDE)
        "e4m3_round_f64",  # plan
        "route_head", "route_sample", "route_gate",  # route (COUNT_KERNELS, SAMPLE_GATE)
        "route_pick", "recover_pick",  # route, select (a captured step's conditions)
    ],
    "decode.cu": [  # decode_ops
        *(f"decode_{k}_mt{m}" for k in ("logits", "fused", "witness") for m in MT),
        "decode_layout", "decode_witness_dedup", "decode_ring_push", "decode_ring_advance",
        "decode_witness_dedup_zero", "decode_step_finish",  # decode_ops (STEP_FOLD)
    ],
    "plan.cu": [f"plan{a}_mt{m}" for a in ("", "_i8") for m in MT]  # build_plans_fused
               + ["screen_row_constants_fresh"],  # plan.screen_row_constants
    "screen_sm90a.cu": ["screen_wg_mt{m}", "screen_wg_mt{m}_tie"],  # screen (wg), sm90a
    "screen_wgt.cu": [f"screen_wgt{b}_rows{n}{t}" for b in ("", "_ring", "_image")  # WGT_SPEC
                      for n in (32, 16, 8) for t in ("", "_tie")]
                     + [f"screen_wgt_fp8_ring_rows{n}{g}" for n in (32, 16, 8)  # FP8 builds
                        for g in ("", "_g32", "_g32p")],
    "fp8_probe.cu": ["fp8_wgmma_probe", "fp8_wgmma_probe_n32", "fp8_wgmma_probe_n16", "tma_probe"],
    "dense_fp8.cu": [f"dense_fp8_h{h}_{v}" for h in (32, 64) for v in FP8_DENSE],  # bench/fp8_dense
    "score_fp8.cu": [f"{k}_h{h}" for h in (64, 32) for k in  # bench/fp8_dense; the FP8 stages
                     ("score_fp8_ids", "refine_fp8", "refine_fp8_spill", "seed_score_fp8",
                      "seed_ids_fp8", "seed_logits_fp8", "fused_fp8", "decode_logits_fp8",
                      "decode_fused_fp8", "decode_witness_fp8", "decode_survivors_fp8",
                      "decode_witness_kth_fp8")]  # decode_ops (WITNESS_KTH)
                   + [f"decode_witness_fp8_h{h}_n2" for h in (64, 32)]  # (WITNESS_ROWS)
                   + [f"decode_{k}_tma_fp8_h{h}_n{n}{a}" for h in (64, 32) for n in (1, 2)
                      for k in ("logits", "fused")
                      for a in ("", "_ahead")]  # decode_ops.scan_fp8_tma
                   + [f"decode_screen_tma_r{r}_n{n}" for r in (16, 32)
                      for n in (1, 2)],  # decode_ops.screen_step
}  # fmt: skip


def _builds():
    """(spec, kernel names) of every build that launches come from."""
    out = [(main_spec(t), LAUNCHED["kernels.cu"]) for t in TILES]
    out += [(DECODE, LAUNCHED["decode.cu"]), (PLAN, LAUNCHED["plan.cu"])]
    for t in TILES:
        for m, (defines, _) in sm90a.BUILDS.items():
            names = [n.format(m=m) for n in LAUNCHED["screen_sm90a.cu"]]
            out.append((sm90a.spec(t, defines), names + (["wg_probe_mma"] if m == 1 else [])))
        for defines in VARIANTS.values():  # bench/screen_variants
            out.append((sm90a.spec(t, defines), ["screen_wg_mt1"]))
    for source in ("screen_wgt.cu", "fp8_probe.cu", "dense_fp8.cu", "score_fp8.cu"):
        out.append((KernelSpec(source, (), sm90a=True), LAUNCHED[source]))
    for defines, *_ in WGT_VARIANTS.values():  # bench/screen_variants --wgt
        out.append((KernelSpec("screen_wgt.cu", defines, sm90a=True), LAUNCHED["screen_wgt.cu"]))
    return out


BUILDS = _builds()


@pytest.mark.parametrize("spec,names", BUILDS, ids=[f"{s.source}{s.defines}" for s, _ in BUILDS])
def test_every_launched_kernel_is_parsed(spec, names):
    sig = signatures(spec)
    missing = [n for n in names if n not in sig]
    assert not missing, f"{spec.source} {spec.defines}: no parameter list for {missing}"
    for n in names:
        assert sig[n] and all(isinstance(p, Param) for p in sig[n]), n


def _patterns(e) -> list[str] | None:
    """Regexes of the kernel names expression ``e`` evaluates to (an f-string's fields:
    ``\\w*``), or None where it is not a literal, an f-string or a choice between them."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return [re.escape(e.value)]
    if isinstance(e, ast.JoinedStr):
        return ["".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w*"
                        for v in e.values)]  # fmt: skip
    if isinstance(e, ast.IfExp):
        a, b = _patterns(e.body), _patterns(e.orelse)
        return None if a is None or b is None else a + b
    return None


def call_site_names():
    """(file:line, [regex]) of the kernel named by each call of ``kernel`` / ``_kernel`` /
    ``_launch_tokens`` in dosa_cupy: the first argument as a literal, an f-string or a local
    variable assigned those in the same function; and (file:line, expression) of those it
    cannot read."""
    found, unread = [], []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs, *fn.args.posonlyargs)}
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call) or not call.args:
                    continue
                f = call.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name not in ("kernel", "_kernel", "_launch_tokens"):
                    continue
                where, e = f"{path.relative_to(PKG.parent)}:{call.lineno}", call.args[0]
                if isinstance(e, ast.Name) and e.id in args:
                    continue  # a wrapper passing its caller's name on: the callers are read
                pats = _patterns(e)
                if isinstance(e, ast.Name):
                    values = [
                        n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == e.id for t in n.targets)
                    ]  # fmt: skip
                    got = [_patterns(v) for v in values]
                    pats = None if not got or None in got else sum(got, [])
                if pats is None:
                    unread.append((where, ast.unparse(e)))
                else:
                    found.append((where, pats))
    return sorted(set((w, tuple(p)) for w, p in found)), sorted(set(unread))


def test_call_sites_name_listed_kernels():
    """Each kernel a call site names is in LAUNCHED (so parsed, above); the one call site
    whose name is built elsewhere is the screen's (ScreenLaunch.name)."""
    found, unread = call_site_names()
    assert len(found) >= 25, found  # the scan sees the call sites
    listed = {n.format(m=m) for names in LAUNCHED.values() for n in names for m in (1, 2)}
    listed.add("wg_probe_mma")
    for where, pats in found:
        for pat in pats:
            assert any(re.fullmatch(pat, n) for n in listed), f"{where}: {pat} is not in LAUNCHED"
    assert all(w.startswith("dosa_cupy/screen.py") and e == "self.name" for w, e in unread), unread


def test_screen_variants_argument_positions():
    """bench/screen_variants patches the screen's arguments by position."""
    names = [p.name for p in signatures(main_spec())["screen_mt1"]]
    assert names[SURV] == "surv" and names[QG_ARG] == "QG"
    wgt = signatures(KernelSpec("screen_wgt.cu", (), sm90a=True))
    for rows in (8, 16, 32):  # --wgt patches the transposed screen's at the same positions
        names = [p.name for p in wgt[f"screen_wgt_rows{rows}"]]
        assert names[SURV] == "surv" and names[QG_ARG] == "QG"


# ---------------------------------------------------------------------------------------
# The parser on a source of every construct it reads
# ---------------------------------------------------------------------------------------

SOURCE = r"""
#include "part.cuh"
#include "part.cuh"  // #pragma once: one copy
#include <cuda_fp8.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#ifndef W
#define W 1
#endif
#define T_PARAMS const float* __restrict__ x, \
                 long long n
#define INST(NAME, T) \
  extern "C" __global__ void __launch_bounds__(256, 1) NAME(T_PARAMS, const T* y, T s) { \
    body(x, n, y, s);                                                                       \
  }
INST(k_float, float)
INST(k_double, double)
extern "C" __global__ void CAT(CAT(k_w, W), _tie)(int a) {}
#if W == 2 && defined(EXTRA)
extern "C" __global__ void only_w2_extra(int a) {}
#elif (W & 1) == 1
extern "C" __global__ void odd_w(unsigned long long* p) {}
#else
extern "C" __global__ void even_w(unsigned* p) {}
#endif
#if 2 | 0 == 1  /* C: 2 | (0 == 1) = 2 */
extern "C" __global__ void c_precedence(int a) {}
#endif
#define VA(name, ...) extern "C" __global__ void name(__VA_ARGS__) {}
VA(k_variadic, int a, double b)
#undef W
#ifdef W
extern "C" __global__ void undefined(int a) {}
#endif
extern "C" __global__ void declared_only(int a);
__global__ void not_extern_c(int a) {}
/* extern "C" __global__ void commented(int a) {} */
const char* s = "extern \"C\" __global__ void in_string(int a) {}";
"""
PART = """#pragma once
extern "C" __global__ void from_include(const __grid_constant__ dosa::TensorMap m,
                                        const uint4* __restrict__ v) {}
"""


@pytest.fixture
def toy(tmp_path):
    (tmp_path / "toy.cu").write_text(SOURCE)
    (tmp_path / "part.cuh").write_text(PART)
    return lambda *defines: _signature.kernels(preprocess(tmp_path / "toy.cu", defines), "toy")


def test_parser_reads_macros_conditionals_and_includes(toy):
    k = toy()
    assert sorted(k) == sorted(["from_include", "k_float", "k_double", "k_w1_tie", "odd_w",
                                "c_precedence", "k_variadic"])  # fmt: skip
    assert k["k_float"] == (
        Param(np.float32, "x", "float*"), Param(np.int64, "n", "long long"),
        Param(np.float32, "y", "float*"), Param(np.float32, "s", "float"),
    )  # fmt: skip
    assert [p.dtype for p in k["k_double"]][2:] == [np.float64, np.float64]
    assert k["odd_w"] == (Param(np.uint64, "p", "unsigned long long*"),)
    assert k["k_variadic"] == (Param(np.int32, "a", "int"), Param(np.float64, "b", "double"))
    m, v = k["from_include"]
    assert m.dtype == np.dtype((np.void, 128)) and not m.pointer and m.ctype == "dosa::TensorMap"
    assert v == Param(np.uint8, "v", "uint4*") and v.pointer


def test_parser_applies_the_defines(toy):
    assert {"k_w2_tie", "only_w2_extra"} <= set(toy("W=2", "EXTRA"))
    k = toy("W=2")
    assert "even_w" in k and "odd_w" not in k and "only_w2_extra" not in k
    assert k["even_w"] == (Param(np.uint32, "p", "unsigned*"),)


def test_parser_names_an_unknown_type(tmp_path):
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k(const half2* h) {}\n')
    with pytest.raises(ValueError, match=r"k: parameter h: C type 'half2\*'"):
        _signature.kernels(preprocess(tmp_path / "bad.cu"), "bad.cu")


def test_parsed_lists_equal_the_tests_reading_of_the_sources():
    """The build's lists equal those read from the sources as written (cuda_signatures, the
    emulations' reading) for kernels that a macro instantiates."""
    src = read_source(_build.CSRC / "kernels.cu")
    sig = signatures(main_spec())
    for name, pattern in [("screen_mt1", r"\bscreen_mt##MTS"), ("refine_mt3", r"\brefine_mt##MT"),
                          ("screen_cert_mt2_tie", r"\bscreen_cert_mt##MTS##_tie"),
                          ("cert_clear_below_tau", r"\bcert_clear_below_tau")]:  # fmt: skip
        assert [p.dtype for p in sig[name]] == param_types(src, pattern), name


# ---------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------

CERT = signatures(main_spec())["cert_clear_below_tau"]  # urec, ucnt, ucap, tau, Qn, NW, surv


def cert_args(Qn=3, cap=5, NW=4):
    urec, ucnt, tau = (
        np.zeros((Qn, cap), np.uint64),
        np.zeros(Qn, np.uint32),
        np.zeros(Qn, np.float32),
    )
    surv = np.zeros((Qn, NW), np.uint32)
    return (urec, ucnt, np.int64(cap), tau, np.int32(Qn), np.int64(NW), surv)


def _with(args, i, v):
    return (*args[:i], v, *args[i + 1 :])


BAD = {
    "one_short": (cert_args()[:-1], r"argument 6 \(uint32_t\* surv\) is missing"),
    "one_long": ((*cert_args(), np.int32(0)), r"argument 7 \(numpy.int32\) has no parameter"),
    "int64_for_int": (_with(cert_args(), 4, np.int64(3)),
                      r"argument 4 \(int Qn\): expected a numpy.int32 scalar, got numpy.int64"),
    "int32_for_long_long": (_with(cert_args(), 2, np.int32(5)), r"argument 2 \(long long ucap\)"),
    "python_int": (_with(cert_args(), 5, 4), r"argument 5 \(long long NW\).*got int$"),
    "float64_array_for_float": (
        _with(cert_args(), 3, np.zeros(3, np.float64)),
        r"argument 3 \(float\* tau\): expected a C-contiguous array of dtype float32.*"
        r"got numpy.ndarray of dtype float64"),
    "non_contiguous": (_with(cert_args(), 0, np.zeros((3, 10), np.uint64)[:, ::2]),
                       r"argument 0 \(unsigned long long\* urec\).*not C-contiguous"),
    "scalar_for_pointer": (_with(cert_args(), 1, np.uint32(0)),
                           r"argument 1 \(unsigned int\* ucnt\)"),
    "none_for_pointer": (_with(cert_args(), 6, None),
                         r"argument 6 \(uint32_t\* surv\).*got NoneType"),
    "array_for_scalar": (_with(cert_args(), 4, np.array([3], np.int32)), r"argument 4 \(int Qn\)"),
}  # fmt: skip


def test_a_correct_launch_passes():
    check_launch("cert_clear_below_tau", CERT, cert_args(), NP)
    null = np.uint64(0)  # a null pointer, as the optional buffers are passed (dense._NULL)
    check_launch("cert_clear_below_tau", CERT, _with(cert_args(), 0, null), NP)


@pytest.mark.parametrize("case", BAD)
def test_a_mismatch_raises_naming_the_parameter(case):
    args, match = BAD[case]
    with pytest.raises(TypeError, match=r"^cert_clear_below_tau: .*" + match):
        check_launch("cert_clear_below_tau", CERT, args, NP)
    with pytest.raises(TypeError, match=match):  # the cached check too, on a fresh kernel
        LaunchCheck("cert_clear_below_tau", CERT, NP)(args)


def test_float_double_and_struct_scalars():
    ps = (Param(np.float32, "f", "float"), Param(np.float64, "d", "double"),
          Param(np.dtype((np.void, 128)), "m", "dosa::TensorMap"))  # fmt: skip
    tmap = np.zeros(1, np.dtype([("w", np.uint64, (16,))]))[0]
    check_launch("k", ps, (np.float32(1), np.float64(1), tmap), NP)
    for args, match in [
        ((np.float64(1), np.float64(1), tmap), r"argument 0 \(float f\).*got numpy.float64"),
        ((np.float32(1), np.float32(1), tmap), r"argument 1 \(double d\).*got numpy.float32"),
        ((np.float32(1), 1.0, tmap), r"argument 1 \(double d\).*got float"),
        ((np.float32(1), np.float64(1), np.zeros(1, "V64")[0]), r"argument 2 .*of 64 bytes"),
    ]:
        with pytest.raises(TypeError, match=match):
            check_launch("k", ps, args, NP)


def test_only_the_given_array_type_is_an_array():
    """The real path's ndarray_types is (cupy.ndarray,): a host array is no device pointer."""

    class DeviceArray(np.ndarray):
        pass

    with pytest.raises(TypeError, match=r"argument 0 \(unsigned long long\* urec\).*numpy.ndarray"):
        check_launch("cert_clear_below_tau", CERT, cert_args(), (DeviceArray,))
    dev = tuple(a.view(DeviceArray) if isinstance(a, np.ndarray) else a for a in cert_args())
    check_launch("cert_clear_below_tau", CERT, dev, (DeviceArray,))


def test_check_runs_once_per_argument_types(monkeypatch):
    calls = []
    real = _signature.check_launch
    monkeypatch.setattr(_signature, "check_launch", lambda *a: (calls.append(1), real(*a)))
    c = LaunchCheck("cert_clear_below_tau", CERT, NP)
    c(cert_args())
    c(cert_args(Qn=7, cap=9))  # other shapes and values, the same types: not checked again
    assert len(calls) == 1
    with pytest.raises(TypeError):  # same dtypes, but not contiguous: checked (and refused)
        c(BAD["non_contiguous"][0])
    with pytest.raises(TypeError):  # a refused tuple is not remembered
        c(BAD["non_contiguous"][0])
    c(_with(cert_args(), 0, np.uint64(0)))
    assert len(calls) == 4


# ---------------------------------------------------------------------------------------
# The wrapper of the build path
# ---------------------------------------------------------------------------------------


class FakeRaw:
    """CuPy's RawKernel as the wrapper uses it: a call, and attributes."""

    def __init__(self):
        self.calls, self.max_dynamic_shared_size_bytes, self.num_regs = [], 0, 40

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


def test_kernel_checks_then_launches_and_forwards_attributes():
    raw = FakeRaw()
    k = Kernel(raw, LaunchCheck("cert_clear_below_tau", CERT, NP))
    args = cert_args()
    k((2, 3), (256,), args, shared_mem=128)
    assert raw.calls == [((2, 3), (256,), args, 128)]
    with pytest.raises(TypeError, match=r"argument 4 \(int Qn\)"):
        k((2, 3), (256,), BAD["int64_for_int"][0])
    assert len(raw.calls) == 1  # refused before CuPy saw it
    assert k.num_regs == 40
    k.max_dynamic_shared_size_bytes = 99 * 1024  # _build.raise_smem_limit sets it
    assert raw.max_dynamic_shared_size_bytes == 99 * 1024
    with pytest.raises(AttributeError):
        _ = k.no_such_attribute


def test_kernel_launches_on_the_given_stream():
    events = []

    class Stream:  # CuPy's: a context manager making itself the current stream
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    class Raw(FakeRaw):
        def __call__(self, *a, **kw):
            events.append("launch")

    Kernel(Raw(), LaunchCheck("k", (), NP))((1,), (32,), (), stream=Stream())
    assert events == ["enter", "launch", "exit"]


@pytest.fixture
def fake_cupy(monkeypatch):
    """_build's CuPy with numpy arrays as its ndarray, and the checks cached under it
    forgotten afterwards."""
    _build.launch_check.cache_clear()
    monkeypatch.setattr(_build, "cupy_or_raise", lambda: types.SimpleNamespace(ndarray=np.ndarray))
    yield
    _build.launch_check.cache_clear()


def test_module_gives_checked_kernels(fake_cupy):
    asked = []

    class RawModule:
        def get_function(self, name):
            asked.append(name)
            return FakeRaw()

    mod = Module(RawModule(), main_spec())
    k = mod.get_function("cert_clear_below_tau")
    assert isinstance(k, Kernel)
    assert _build.launch_check(main_spec(), "cert_clear_below_tau").ndarray_types == NP
    k((1, 3), (256,), cert_args())
    with pytest.raises(TypeError, match="cert_clear_below_tau: argument 3"):
        k((1, 3), (256,), BAD["float64_array_for_float"][0])
    with pytest.raises(LookupError, match="defines no extern \"C\" __global__ kernel 'screen_mt9'"):
        mod.get_function("screen_mt9")
    assert asked == ["cert_clear_below_tau"]  # the missing kernel is named before CuPy is asked


# ---------------------------------------------------------------------------------------
# The host code's argument tuples
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", ["select_kernel_buf", "select_kernel_ilp", "select_kernel"])
def test_host_launches_pass_the_check(monkeypatch, rows):
    """dense's selections (logits rows, record lists with and without the optional lists,
    the wide selection), run on numpy through the build's Kernel wrapper, with each
    selection kernel (dense.SELECT_ILP, SELECT_BUF): every launch's tuple, null pointers
    (np.uint64(0)) included, passes the check of the kernel as built."""
    sig, launched = signatures(main_spec()), []
    monkeypatch.setattr(dense, "SELECT_ILP", rows != "select_kernel")
    monkeypatch.setattr(dense, "SELECT_BUF", rows == "select_kernel_buf")

    def kernel(name, *_):
        raw = FakeRaw()
        launched.append((name, raw))
        return Kernel(raw, LaunchCheck(name, sig[name], NP))

    monkeypatch.setattr(dense, "cupy_or_raise", numpy_as_cupy)
    monkeypatch.setattr(dense, "kernel", kernel)
    monkeypatch.setattr(dense, "num_sms", lambda: 4)
    lg = np.zeros((3, 100), np.float32)
    ks, ke = np.zeros(3, np.int32), np.full(3, 100, np.int32)
    dense.select_rows(lg, 7, ks, ke)
    ra, ca = np.zeros((2, 9), np.uint64), np.zeros(2, np.uint32)
    dense.select_records(6, ra, ca, ra.copy(), ca.copy(), want_kth=True)
    dense.select_records(6, ra, ca, want_ids=False, want_kth=True)
    wide = np.zeros((2, dense.WIDE_MIN_N), np.float32)
    wke = np.full(2, dense.WIDE_MIN_N, np.int32)
    dense.select_rows(wide, 5, ks[:2], wke)
    # with its buffers given (dense.rows_work, as a captured step passes them): the result
    # is work.ids, and buffers built for another shape are refused
    for x, kk, k in ((lg, ke, 7), (wide, wke, 5)):
        work = dense.rows_work(x.shape[0], x.shape[1], k)
        assert dense.select_rows(x, k, ks[: x.shape[0]], kk, work=work) is work.ids
        assert (work.hist is None) == (x is lg)  # the wide selection's buffers only for it
        with pytest.raises(ValueError, match="^work:"):
            dense.select_rows(x, k + 1, ks[: x.shape[0]], kk, work=work)
    names = {n for n, _ in launched}
    assert names == {rows, "select_wide_hist", "select_wide_cut", "select_wide_compact"}
    assert all(len(raw.calls) == 1 for _, raw in launched)  # every launch reached "CuPy"
    for name, raw in launched:  # the emulations' check agrees (it knows no null pointer)
        args = raw.calls[0][2]
        if not any(type(a) is np.uint64 for a in args):
            check_args(name, args, [p.dtype for p in sig[name]])


@pytest.mark.parametrize("case", BAD)
def test_the_emulations_check_agrees(case):
    """cuda_signatures.check_args (the emulations' check) accepts the correct tuple and
    refuses each tuple the launch check refuses — by its own dtype comparison, or by the
    launch check it runs too (a Python int has the dtype int64, so only the launch check
    refuses it for ``long long``: CuPy would pack it by its own type)."""
    types_ = [p.dtype for p in CERT]
    check_args("cert_clear_below_tau", cert_args(), types_)
    with pytest.raises((AssertionError, TypeError)):
        check_args("cert_clear_below_tau", BAD[case][0], types_)


# (rows, tie, fp8, pipe): the ring builds, then the FP8 ones (plain rule), the FP8 ones with
# the pipelined halves (screen.WGT_PIPE)
WGT_RING_BUILDS = [(rows, tie, fp8, pipe) for rows in (8, 16, 32) for tie, fp8, pipe in
                   ((False, False, False), (True, False, False), (False, True, False),
                    (False, True, True))]  # fmt: skip


@pytest.mark.parametrize("rows,tie,fp8,pipe", WGT_RING_BUILDS)
def test_wgt_ring_launches_pass_the_check(monkeypatch, rows, tie, fp8, pipe):
    """The ring build of screen="wgt" (screen.WGT_RING) and its FP8 build (a plan built for
    the "fp8_fresh" dots, whatever WGT_RING says): ``ScreenLaunch.of`` names the ring kernel
    of the plan's width with its shared memory, and its call launches the image kernel (one
    block per query group, an image of every group) and then the ring kernel, each with the
    screen's arguments, the outputs and the image — as the kernels' parameter lists say."""
    import types

    from dosa_cupy import screen as S

    sig, launched = signatures(S.WGT_SPEC), []

    def kernel(name, smem=0, spec=None):
        assert spec is S.WGT_SPEC
        raw = FakeRaw()
        launched.append((name, smem, raw))
        return Kernel(raw, LaunchCheck(name, sig[name], NP))

    monkeypatch.setattr(S, "kernel", kernel)
    monkeypatch.setattr(S, "cupy_or_raise", numpy_as_cupy)
    monkeypatch.setattr(S, "WGT_RING", not fp8)
    monkeypatch.setattr(S, "WGT_PIPE", pipe)
    Qn, N, mts = 37, 1000, 2 if rows == 32 else 1
    z = np.zeros
    b = types.SimpleNamespace(Qn=Qn, N=N, kp=z((N, 128), np.uint8), ksc=z(N, np.float32),
                              ks=z(Qn, np.int32), ke=z(Qn, np.int32))  # fmt: skip
    plan = types.SimpleNamespace(rows=z((Qn, 16 * mts, 128), np.uint8),
                                 omega=z((Qn, 16 * mts), np.float32), sigma=z(Qn, np.float32),
                                 C=z(Qn), eps_raw=z(Qn), eps_out=0.0, mts=mts,
                                 r_max={8: 6, 16: 14, 32: None}[rows],
                                 screen="fp8_fresh" if fp8 else "f16")  # fmt: skip
    seeds = types.SimpleNamespace(
        tau=z(Qn, np.float32),
        kth_id=z(Qn, np.int32),
        default_args=lambda: (np.int32(3), np.int32(17), z((N + 31) // 32, np.uint32)),
    )
    zrow = z((Qn, 16 * mts), np.float32) if tie else None
    launch = S.ScreenLaunch.of(b, plan, seeds, z(N, np.float32), "wgt", False, zrow)
    t, f = "_tie" if tie else "", "_fp8" if fp8 else ""
    # the FP8 build's guard (screen.WGT_GUARD32) and its pipelined halves (WGT_PIPE)
    g = ("_g32p" if pipe else "_g32") if fp8 and S.WGT_GUARD32 else ""
    assert launch.name == f"screen_wgt{f}_ring_rows{rows}{t}{g}" and launch.ring == rows
    assert launch.smem == S.wgt_ring_smem_bytes(rows, fp8) <= 227 * 1024
    surv = z((Qn, (N + 31) // 32), np.uint32)
    launch(surv, None, None, z(Qn, np.uint32) if tie else None)
    (iname, _, iraw), (rname, rsmem, rraw) = launched[-2], launched[-1]
    assert (iname, rname) == (f"screen_wgt{f}_image_rows{rows}{t}", launch.name)
    groups = -(-Qn // (128 // rows))
    (igrid, iblock, iargs, _), (rgrid, rblock, rargs, shared) = iraw.calls[0], rraw.calls[0]
    assert igrid == (groups,) and iblock == rblock == (S.WGT_THREADS,)
    assert iargs[-1] is rargs[-1] and iargs[-1].nbytes == groups * S.wgt_image_bytes(rows, fp8)
    assert rgrid == launch.grid and shared == rsmem == launch.smem
    assert rargs[len(launch.args)] is surv
    src = (PKG / "csrc" / "screen_wgt.cu").read_text()  # the slots the kernel was built with
    assert re.search(r"constexpr int kRing = (\d+);", src).group(1) == str(S.WGT_RING_SLOTS)


@pytest.mark.parametrize(
    "screen,tie,mts,arith",
    [("wgt", True, 1, "fp8_fresh"), ("wg", False, 1, "fp8_fresh"), ("wgt", True, 2, "fp8_fresh"),
     ("wgt", False, 1, "fp8_k64"), ("fp64", False, 1, "fp8_chained")],
)  # fmt: skip
def test_fp8_plan_refused_by_other_screens(screen, tie, mts, arith):
    """A plan built for the FP8 build's dots (plan.screen = "fp8_fresh") screened by any other
    kernel — another screen, the tie-aware rule — and a plan for dots no kernel computes
    (the emulation's other FP8 arithmetics) are a ValueError naming the plan, never a launch
    whose bound would not cover its dots."""
    import types

    from dosa_cupy import screen as S

    Qn, N, z = 5, 100, np.zeros
    b = types.SimpleNamespace(Qn=Qn, N=N, kp=z((N, 128), np.uint8), ksc=z(N, np.float32),
                              ks=z(Qn, np.int32), ke=z(Qn, np.int32))  # fmt: skip
    plan = types.SimpleNamespace(rows=z((Qn, 16 * mts, 128), np.uint8), mts=mts, r_max=6,
                                 omega=z((Qn, 16 * mts), np.float32),
                                 screen=arith)  # fmt: skip
    seeds = types.SimpleNamespace(tau=z(Qn, np.float32), kth_id=z(Qn, np.int32))
    zrow = z((Qn, 16 * mts), np.float32) if tie else None
    with pytest.raises(ValueError, match="plan"):
        S.ScreenLaunch.of(b, plan, seeds, z(N, np.float32), screen, False, zrow)


def test_screen_arith_takes_fp8_only_where_its_build_runs(monkeypatch):
    """``screen.screen_arith``: "fp8_fresh" only with WGT_FP8 on (the default), screen "wgt"
    and the plain rule decided; "f16" otherwise (the tie rule undecided included)."""
    from dosa_cupy import screen as S

    assert S.screen_arith("wgt", False) == "fp8_fresh"  # on by default
    for args in (("wgt", True), ("wgt", None), ("wg", False), ("pair", False), ("fp64", False)):
        assert S.screen_arith(*args) == "f16", args
    monkeypatch.setattr(S, "WGT_FP8", False)
    assert S.screen_arith("wgt", False) == "f16"


@pytest.mark.parametrize("ring,fp8,tie", [(0, False, False), (8, True, False), (16, False, True)])
def test_screen_launch_load_builds_every_kernel_it_runs(monkeypatch, ring, fp8, tie):
    """``ScreenLaunch.load`` (what route.route_stage calls before timing a sample) builds the
    ring build's image kernel (``image_function``, which ``images`` launches) as well as the
    screen kernel, so no build lands in the timed launch."""
    from dosa_cupy import screen

    built = []
    monkeypatch.setattr(screen, "kernel", lambda name, *a: built.append(name) or name)
    name = f"screen_wgt{'_fp8' if fp8 else ''}_ring_rows{ring or 8}"
    launch = screen.ScreenLaunch(name, (1, 1), 0, (), wgt=True, ring=ring, fp8=fp8, tie=tie)
    launch.load()
    image = f"screen_wgt{'_fp8' if fp8 else ''}_image_rows{ring}{'_tie' if tie else ''}"
    assert built == ([name, image] if ring else [name])


def test_screen_launch_prime_launches_once_per_build_and_zeroes_the_tie_count(monkeypatch):
    """``ScreenLaunch.prime`` (what route.route_stage calls before timing a sample) loads the
    launch every time, launches it untimed only on the build's first use in the process on
    its device, and leaves the tie-aware count zeroed after that launch."""
    from types import SimpleNamespace

    from dosa_cupy import screen

    device = SimpleNamespace(id=0)
    fake_cp = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: device))
    monkeypatch.setattr(screen, "cupy_or_raise", lambda: fake_cp)
    monkeypatch.setattr(screen, "_PRIMED", set())
    loads, runs = [], []
    monkeypatch.setattr(screen.ScreenLaunch, "load", lambda self: loads.append(self.name))

    def run(self, surv, bounds=None, cert=None, tcnt=None):
        runs.append(self.name)
        if tcnt is not None:
            tcnt += 5  # the tie-aware variant adds to its count

    monkeypatch.setattr(screen.ScreenLaunch, "__call__", run)
    tie = screen.ScreenLaunch("screen_wgt_ring_rows8_tie", (1, 1), 0, (), wgt=True, ring=8,
                              tie=True)  # fmt: skip
    plain = screen.ScreenLaunch("screen_wgt_ring_rows8", (1, 1), 0, (), wgt=True, ring=8)
    tcnt = np.zeros(4, dtype=np.uint32)
    tie.prime(None, tcnt)
    assert runs == [tie.name] and not tcnt.any()
    tie.prime(None, tcnt)
    plain.prime(None)
    plain.prime(None)
    assert runs == [tie.name, plain.name]
    device.id = 1  # the same build on another device is primed there too
    plain.prime(None)
    assert runs == [tie.name, plain.name, plain.name]
    assert loads == [tie.name] * 2 + [plain.name] * 3


def test_first_uses_counts_each_kernel_s_first_launch_check_once(monkeypatch):
    """``_build.first_uses`` grows by one on the first use of a kernel of a build in the
    process (its launch check is made then, once) and not on later uses: what pipeline.py
    reads to leave a span with a build out of the memo's prefix."""
    monkeypatch.setattr(_build, "cupy_or_raise", lambda: types.SimpleNamespace(ndarray=np.ndarray))
    _build.launch_check.cache_clear()
    spec = _build.main_spec()
    n = _build.first_uses()
    _build.launch_check(spec, "route_gate")
    _build.launch_check(spec, "route_gate")
    assert _build.first_uses() == n + 1
    _build.launch_check(spec, "route_head")
    assert _build.first_uses() == n + 2
    _build.launch_check.cache_clear()
