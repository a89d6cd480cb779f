"""The parity harness's rules: fp32 (relative), fp64 (Inductor's accuracy rule against a
float64 copy), bitwise. Each rule is shown to pass what it should and to fail what it should."""

import pytest
import torch
import torch.nn as nn

from dsgraph.testing import check_training_step, training_step_parity

from passes_for_tests import registered


def model_and_input(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(19, 33), nn.GELU(), nn.LayerNorm(33), nn.Linear(33, 7))
    return model, torch.randn(9, 19)


def scaled(eps):
    """A "compiler" whose loss (so every gradient) is off by a factor 1 + eps."""
    return lambda m: (lambda *x: m(*x) * (1 + eps))


def test_fp64_rule_under_bf16_autocast_passes_dsgraph():
    model, x = model_and_input()
    result = check_training_step(model, x, {"inductor": False}, autocast=torch.bfloat16)
    assert result.rule == "fp64"
    rows = {row.name: row for row in result.rows}
    assert all(row.rmse is not None and row.ref_rmse is not None for row in rows.values())
    # bf16 eager really differs from float64 (the bound is not empty); the last bias's
    # gradient is a sum of ones, exact in every dtype
    assert rows["loss"].ref_rmse > 0 and rows["0.weight"].ref_rmse > 0
    # the fp64 tensor's own scale, for tolerances relative to it: the loss's is |loss|
    ref = model_and_input()[0].double()
    loss64 = ref(x.double())
    assert rows["loss"].exact_rms == pytest.approx(abs(float(loss64.sum())), rel=1e-12)
    assert "RMSE(g, g_fp64) <= 2 * RMSE(g_ref, g_fp64)" in result.table()


def test_fp64_rule_tells_rounding_from_a_real_error():
    model, x = model_and_input(1)
    small = training_step_parity(model, x, scaled(1e-9), rule="fp64", tol=0.0)
    large = training_step_parity(model, x, scaled(1e-2), rule="fp64", tol=0.0)
    assert small.ok, small.table()
    assert not large.ok and "FAIL" in large.table()


def test_fp64_rule_fails_a_pass_that_changes_the_result():
    model, x = model_and_input(2)
    with registered():
        result = training_step_parity(
            model, x, lambda m: torch.compile(m, backend="dsgraph", options={"inductor": False, "pipeline": "t_double"}),
            rule="fp64")
    failed = [r.name for r in result.rows if not r.ok]
    # the forward's outputs are doubled: the loss, and gradients that go through saved values
    assert failed[0] == "loss" and "0.weight" in failed


def test_fp32_and_bitwise_rules():
    model, x = model_and_input(3)
    assert training_step_parity(model, x, scaled(1e-7), rule="fp32").ok
    assert not training_step_parity(model, x, scaled(1e-4), rule="fp32").ok
    assert not training_step_parity(model, x, scaled(1e-7), bitwise=True).ok
    assert training_step_parity(model, x, scaled(0.0), bitwise=True).ok


def test_unknown_rule_is_refused():
    model, x = model_and_input()
    with pytest.raises(ValueError, match="rule must be one of"):
        training_step_parity(model, x, scaled(0.0), rule="close enough")
