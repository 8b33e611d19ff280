"""``python -m dosa_cupy.sass`` (docs/design.md "Kernel sources"): the SASS parser keys each
kernel's instructions by its name, ignores cuobjdump's column padding and nothing else, and
``compare`` names every kernel that differs; one real build when nvcc and cuobjdump exist."""

from __future__ import annotations

import pytest

from dosa_cupy import sass

DUMP = """
\tcode for sm_90
\t\tFunction : k_a
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;          /* 0x00000a00ff017b82 */
                                                                   /* 0x000fe20000000800 */
        /*0010*/                   EXIT ;                          /* 0x000000000000794d */
                                                                   /* 0x000fea0003800000 */
\t\t..........

\t\tFunction : k_b
        /*0000*/                   FADD R2, R2, 1 ;                /* 0x3f80000002027421 */
                                                                   /* 0x000fe20000000000 */
"""


def test_the_parser_keys_instructions_by_kernel_and_ignores_padding():
    got = sass._sass_functions(DUMP)
    assert set(got) == {"k_a", "k_b"}
    padded = DUMP.replace("LDC R1, c[0x0][0x28] ;", "LDC R1, c[0x0][0x28] ;      ")
    assert sass._sass_functions(padded) == got
    changed = DUMP.replace("FADD R2, R2, 1", "FADD R2, R3, 1")
    diff = sass._sass_functions(changed)
    assert diff["k_a"] == got["k_a"] and diff["k_b"] != got["k_b"]
    encoding = DUMP.replace("0x000fe20000000000", "0x000fe20000000001")
    assert sass._sass_functions(encoding)["k_b"] != got["k_b"]


def test_compare_names_each_difference():
    a = {"x.cu sm_90": {"k": "1", "m": "2"}, "y.cu sm_90": {"k": "3"}}
    assert sass.compare(a, a) == []
    b = {"x.cu sm_90": {"k": "1", "m": "9", "n": "4"}}
    assert sass.compare(a, b) == [
        "x.cu sm_90: m changed",
        "x.cu sm_90: n added",
        "y.cu sm_90: only in the first",
    ]


def test_every_build_names_a_source_of_csrc():
    assert len({b.name for b in sass.BUILDS}) == len(sass.BUILDS)
    for b in sass.BUILDS:
        assert (sass.CSRC / b.source).is_file(), b.name


def test_a_real_build_is_deterministic():
    try:
        sass._tool("nvcc"), sass._tool("cuobjdump")
    except ValueError as e:
        pytest.skip(str(e))
    build = sass.Build("e4m3_round.cu", sass._SM90)
    one, two = (sass.digests([build], jobs=1) for _ in range(2))
    assert one == two and one[build.name], one


def test_compare_by_code_ignores_names():
    a = {"x.cu sm_90": {"k": "d1", "k2": "d2"}}
    b = {"x.cu sm_90": {"k": "d1"}, "x.cu sm_90 T": {"k_tie": "d2"}}
    assert sass.compare_code(a, b) == []
    lines = sass.compare_code(a, {"x.cu sm_90": {"k": "d1", "k2": "d3"}})
    assert lines == ["only in the first: x.cu sm_90: k2", "only in the second: x.cu sm_90: k2"]


def test_nvrtc_builds_the_code_that_runs():
    """--compiler nvrtc: the portable modules with CuPy's options, the Hopper one with the
    library's sm_90a flags (skipped without libnvrtc or cuobjdump)."""
    if sass.nvrtc_library() is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    try:
        sass._tool("cuobjdump")
    except ValueError as e:
        pytest.skip(str(e))
    builds = [sass.Build("e4m3_round.cu", sass._SM90)]
    t = sass.digests(builds, jobs=1, compiler="nvrtc")
    assert list(t[builds[0].name]) == ["e4m3_round_f64"]
    assert "-arch=sm_90" in sass.CUPY_NVRTC and "-ftz=true" in sass.CUPY_NVRTC
    with pytest.raises(ValueError, match="^compiler:"):
        sass.digests(builds, compiler="clang")
