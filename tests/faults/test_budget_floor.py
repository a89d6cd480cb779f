"""A memory budget below the floor through CPU Inductor: a BudgetError (a ValueError) giving
the smallest feasible budget in bytes, raised whatever ``fallback`` says, before Inductor
compiles anything; that budget then compiles and trains like eager. The FX-execution side
(the floor is exact and monotone) is tests/e2e/test_checkpoint.py."""

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.errors import BudgetError, find_cause
from dsgraph.testing import check_training_step

from faults_common import fresh_lm, lm_batch


@pytest.mark.e2e
@pytest.mark.parametrize("budget", [0, "1KiB"])
def test_budget_below_the_floor_names_the_smallest_feasible_one(budget, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    compiled = torch.compile(fresh_lm(4), backend="dsgraph", options={"memory_budget": budget, "fallback": "inductor"})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(*lm_batch(4)).backward()
    error = find_cause(info.value, BudgetError)
    assert isinstance(error, BudgetError) and isinstance(error, ValueError)
    floor = error.smallest_feasible
    assert floor > 0 and str(floor) in str(info.value) and "smallest feasible budget" in str(info.value)
    assert dsgraph.reports() == []  # nothing compiled stock behind the user's back
    if budget == 0:
        result = check_training_step(fresh_lm(4), lm_batch(4), {"memory_budget": floor, "fallback": "error"})
        assert result.ok
        joint = [r for r in dsgraph.reports() if r.kind == "joint"][-1]
        assert joint.memory["checkpoint_predicted_peak"] <= floor
