"""The canonical scorer of a call (dosa_cupy/scorer.py, docs/design.md "The canonical scorer of
a call"): the option's values and errors, the head padding of each scorer, the plan's
allowance and the cost model it selects — host code, no GPU."""

import pytest

from dosa_cupy import cost, options, scorer


def test_scorer_names_and_errors():
    assert scorer.check_scorer("f16") == "f16"
    for bad in ("bf16", "FP8", 8, None):
        with pytest.raises(ValueError, match="^scorer: expected one of"):
            scorer.check_scorer(bad)
    if not scorer.fp8_available():  # a machine without a compute-capability-9.0 GPU
        with pytest.raises(ValueError, match="^scorer: 'fp8' needs"):
            scorer.check_scorer("fp8")


def test_the_option_is_checked_before_any_device_work():
    o = options.check_options({"scorer": "fp8"})
    assert o["scorer"] == "fp8" and options.OPTIONS["scorer"] == "f16"
    with pytest.raises(ValueError, match="^scorer: expected one of"):
        options.check_options({"scorer": "fp16"})


@pytest.mark.parametrize(
    "H,f16,fp8", [(1, 16, 32), (16, 16, 32), (20, 32, 32), (32, 32, 32), (33, 48, 64),
                  (48, 48, 64), (64, 64, 64)],
)  # fmt: skip
def test_padded_heads(H, f16, fp8):
    """f16: a multiple of 16; fp8: 32 or 64 (the kernels' H; zero heads add exact +0)."""
    assert scorer.padded_heads(H, "f16") == f16
    assert scorer.padded_heads(H, "fp8") == fp8


def test_the_scorer_picks_the_allowance_and_the_cost_model():
    assert scorer.plan_scorer("f16") == "f16" and scorer.plan_scorer("fp8") == "fp8_fresh"
    assert cost.model_for("f16") is cost.H200 and cost.model_for("fp8") is cost.H200_FP8
    # the FP8 dense logits are faster than the f16 ones at both H (their records)
    for H in (32, 64):
        assert cost.H200_FP8.logits_flop_per_ms[H] > cost.H200.logits_flop_per_ms[H]
    assert set(scorer.FP8_DENSE) == {32, 64}
