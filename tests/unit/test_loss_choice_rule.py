"""The loss choice's rule (passes/loss_choice.py), compile by compile: the checkpoint
pass's plans handed to ``after_planning`` in the order the driver compiles, the carried
choice passed on as the driver does (``Recompile.carry`` into the next compile's state).
The end-to-end tests (tests/e2e/test_loss_choice.py) run the rule on real models; on the
small CPU models the chunked plan always recomputes less, so the branch where the unchunked
loss wins on price (compile 3) is held here with plans whose prices are set."""

import pytest

import dsgraph
from dsgraph.compile.pipeline import parse
from dsgraph.errors import BudgetError
from dsgraph.pass_api import CompileConfig, PassContext, Recompile
from dsgraph.pass_api.context import CompileState
from dsgraph.passes import loss_choice
from dsgraph.passes.checkpoint import MAX_COMPILES
from dsgraph.recompute.planner import CheckpointPlan, Region

LossChoice = loss_choice.LossChoice
PIPELINE = "chunk_loss{choose=faster},lifetimes,checkpoint{budget=1000}"


def plan(recompute_ms: float, recomputes: bool = True) -> CheckpointPlan:
    regions = [Region("1", "recompute", ["gelu"], 10, recompute_ms / 1e3)] if recomputes else []
    return CheckpointPlan(budget=1000, predicted_peak=900, stock_peak=1200 if recomputes else 900,
                          recompute_seconds=recompute_ms / 1e3, saved=[], regions=regions, candidates=[],
                          segments=2, solver_seconds=0.0, analysis_seconds=0.0, evaluations=1)


def context(carried=None, attempt=1, loss_left_unchunked=True) -> PassContext:
    state = CompileState(attempt=attempt)
    if carried is not None:
        state.carry["chunk_loss"] = carried
    if loss_left_unchunked and carried is None:
        state.findings["chunk_loss"] = ["cross_entropy"]  # what the chunk_loss pass records
    cfg = CompileConfig(options=dsgraph.validate_options({}), pipeline=parse(PIPELINE))
    ctx = PassContext(cfg, "joint", f"c000_joint_{attempt}", state=state)
    return ctx


def next_compile(ctx, got_plan, error=None) -> Recompile:
    with pytest.raises(Recompile) as info:
        loss_choice.after_planning(ctx, got_plan, error)
    assert info.value.pass_name == "chunk_loss"
    return info.value


def test_the_unchunked_loss_recomputing_no_more_is_compiled_a_third_time_decided():
    first = next_compile(context(), plan(2.0))
    assert first.carry == LossChoice(True, spent=1, unchunked_ms=2.0)
    assert first.max_compiles == MAX_COMPILES + 1
    # compile 2, chunked: recomputes more than the unchunked plan
    second = next_compile(context(first.carry, attempt=2), plan(2.5))
    assert second.carry.chunked is False and second.carry.decided and second.carry.spent == 2
    assert (second.carry.unchunked_ms, second.carry.chunked_ms) == (2.0, 2.5)
    assert second.carry.reason == "the unchunked plan recomputes no more (2.000 ms against 2.500 ms chunked)"
    assert second.max_compiles == MAX_COMPILES + 2
    # compile 3, unchunked again: decided, no further compile, the choice reported
    third = context(second.carry, attempt=3)
    loss_choice.after_planning(third, plan(2.0), None)
    assert third.figures["loss_chunked"] is False and third.figures["loss_choice_compiles"] == 3
    assert third.figures["loss_unchunked_recompute_ms"] == 2.0
    assert third.figures["loss_chunked_recompute_ms"] == 2.5
    assert "loss unchunked: the unchunked plan recomputes no more" in third.dump_files["loss_choice.md"]
    assert loss_choice.compiles_spent(third) == 2


def test_a_tie_goes_to_the_unchunked_loss():
    first = next_compile(context(), plan(1.5))
    second = next_compile(context(first.carry, attempt=2), plan(1.5))
    assert second.carry.chunked is False


def test_the_chunked_loss_recomputing_less_is_kept_in_two_compiles():
    first = next_compile(context(), plan(2.0))
    second = context(first.carry, attempt=2)
    loss_choice.after_planning(second, plan(0.5), None)
    assert second.figures["loss_chunked"] is True and second.figures["loss_choice_compiles"] == 2
    assert second.figures["loss_choice"] == "the chunked plan recomputes less (0.500 ms against 2.000 ms)"


def test_a_chunked_step_that_cannot_meet_the_budget_goes_back_to_the_unchunked_plan():
    first = next_compile(context(), plan(2.0))
    error = BudgetError("too small", smallest_feasible=1100)
    second = next_compile(context(first.carry, attempt=2), None, error)
    assert second.carry.chunked is False and second.carry.decided and second.carry.chunked_ms is None
    assert second.carry.reason == "the chunked loss cannot meet the budget"


def test_a_graph_without_a_loss_site_makes_no_choice():
    ctx = context(loss_left_unchunked=False)
    loss_choice.after_planning(ctx, plan(2.0), None)  # no Recompile
    assert "loss_chunked" not in ctx.figures
