"""``dosa bench --screen-variants`` on the CPU: its flags (a bad one is one line and exit 2,
before CuPy is needed) and the ``--fp8`` builds it times (kernels the FP8 build defines)."""

import re

import pytest

from dosa_cupy import _build
from dosa_cupy.bench import screen_variants


@pytest.mark.parametrize(
    "argv", [["--fp8", "--wgt"], ["--fp8", "--r", "7"], ["--r", "x"], ["--nope"]]
)
def test_bad_flags_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        screen_variants.main(argv)
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_fp8_variants_name_kernels_of_every_row_build():
    """Each ``--fp8`` variant's suffix, after screen_wgt_fp8_ring_rows{8,16,32}, names a
    kernel of csrc/screen_wgt.cu (the macro that instantiates the FP8 builds)."""
    src = (_build.CSRC / "screen_wgt.cu").read_text()
    made = set(re.findall(r"screen_wgt_fp8_ring_rows##RQ(\w*)\(", src.replace("##_", "_")))
    assert {"", "_g32"} <= made, made  # the parse sees the default builds
    for name, suffix in screen_variants.FP8_VARIANTS.items():
        assert suffix in made, (name, suffix, made)
