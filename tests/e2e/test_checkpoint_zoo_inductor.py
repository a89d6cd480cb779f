"""The checkpoint planner's Inductor predictions on the model zoo (tests/zoo.py), CPU sizes:
stock, a plan halfway and the smallest plan compiled through Inductor (plans read after
code generation), each prediction within 3% of Inductor's own buffer plans. Its own file so
that the test runner can run it beside the FX half (tests/e2e/test_checkpoint_zoo.py)."""

import pytest

from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint
from tests import zoo
from tests.e2e.test_checkpoint_zoo import NAMES, _requires, captured, smallest, stock_peak


# Llama's smallest plan before session 10's recompute-then-cheap candidates (``mixes=False``:
# the descent's plan) is predicted more than 3% low (the residue in the docstring below): a
# known failure, recorded as one so the suite stays a true account; strict, so a fix that
# closes it has to remove this mark. With the candidates (the default) the planner picks
# another plan of the same peak at that budget (``recompute8+cheap1+0``, -1.49%)
_KNOWN_GAP = pytest.mark.xfail(strict=True, reason="llama smallest plan without the mixes -3.16% below "
                               "Inductor's plan (session 9): Inductor keeps the SwiGLU backward's sigmoid "
                               "as a buffer (see docstring)")


@pytest.mark.e2e
@pytest.mark.parametrize("name, mixes", [(n, True) for n in NAMES]
                         + [pytest.param("llama", False, marks=_KNOWN_GAP, id="llama-nomixes")])
def test_inductor_predictions_against_inductors_own_plans(name, mixes, tmp_path, monkeypatch):
    """Stock, the smallest plan and a plan halfway, each compiled through Inductor (plans
    read after code generation, ``compat.inductor_codegen_only``): the predicted peak
    within 3% of the peak of Inductor's own buffer plans.

    Llama's smallest plan was the last to pass (-3.3 to -4.05% in session 8): Inductor's
    horizontal fusion computes another layer's recomputed k in the kernel of this
    layer's, for their common read of the rotary table, so that it lives until its own
    attention (``dsgraph.analysis.inductor_horizontal``). The CNN's plans were 2 to 2.8%
    low: the forward returns channels-last copies of the saved input batch and convolution
    weights (``dsgraph.analysis.inductor_layout``).

    Known residue (a strict xfail, the planner without ``mixes``): Llama's smallest plan,
    -3.16% after both session-9
    branches merged (-1.38% on the horizontal-fusion branch alone, where the emulation
    also held a backward ``cat_1`` of 85760 B that Inductor does not: two errors that
    partly cancelled). At Inductor's peak (the recomputed layer's SDPA backward,
    ``python -m benchmarks.planner_gap llama --plan smallest``) Inductor holds the SwiGLU
    backward's ``sigmoid`` (229140 B, live from step 117 to 172) as a buffer, which the
    emulation keeps inside the fused kernel that is its only reader (outer-loop fusion over
    loops the emulation does not see); the emulation holds a forward ``mm`` (85760 B) that
    Inductor has freed there."""
    _requires(name)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    j = captured(name)
    low = smallest(j, "inductor").smallest_feasible
    stock = stock_peak(j, "inductor")
    model, inputs = zoo.build(name)
    errors = {}
    for label, budget in (("stock", 1 << 50), ("halfway", (low + stock) // 2), ("smallest", low)):
        made = {}

        def choose(gm, joint_inputs, kwargs, budget=budget):
            made["plan"] = plan_checkpoint(gm, joint_inputs, kwargs, budget, executor="inductor", mixes=mixes)
            return made["plan"].forward, made["plan"].backward

        real = truth.compiled_peaks(model, inputs, choose, inductor=True).inductor_peak
        errors[label] = made["plan"].predicted_peak / real - 1
    assert all(abs(e) <= 0.03 for e in errors.values()), {k: f"{v:+.2%}" for k, v in errors.items()}
