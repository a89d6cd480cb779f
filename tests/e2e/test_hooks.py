"""The driver's hooks, through torch.compile with passes registered by the tests: graph
variants chosen at run time, post-compile checks that ask for another compile, and the
partitioner a joint pass sets. FX execution (inductor=False), so these are quick."""

import pytest
import torch
import torch.nn as nn
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.errors import DsgraphFallbackWarning, PassFailure, find_cause

from passes_for_tests import RECORD, registered


@pytest.fixture(autouse=True)
def _passes():
    with registered():
        yield


def model_and_input(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(11, 19), nn.Tanh(), nn.Linear(19, 3)), torch.randn(5, 11)


def stock_grads(model, x):
    """Gradients of the same graphs without passes (FX execution): the hooks change no arithmetic."""
    torch._dynamo.reset()
    grads = grads_of(torch.compile(model, backend="dsgraph", options={"inductor": False, "pipeline": ""}), model, x)
    torch._dynamo.reset()
    return grads


def grads_of(compiled, model, x):
    for p in model.parameters():
        p.grad = None
    compiled(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_variant_is_compiled_once_and_chosen_per_call():
    model, x = model_and_input()
    compiled = torch.compile(model, backend="dsgraph",
                             options={"inductor": False, "pipeline": "t_variant", "fallback": "error"})
    plain = grads_of(compiled, model, x)
    RECORD["use_variant"].append(True)
    doubled = grads_of(compiled, model, x)
    RECORD["use_variant"].clear()
    again = grads_of(compiled, model, x)
    assert all(torch.equal(d, 2 * p) for d, p in zip(doubled, plain))
    assert all(torch.equal(a, p) for a, p in zip(again, plain))
    backward = [r for r in dsgraph.reports() if r.kind == "backward"]
    assert len(backward) == 1  # one compile serves both variants
    assert [p.name for p in backward[0].passes] == ["t_variant"]


def test_a_post_compile_check_gets_another_compile_with_what_it_carried():
    model, x = model_and_input()
    reference = stock_grads(model, x)
    dsgraph.clear_reports()
    compiled = torch.compile(model, backend="dsgraph",
                             options={"inductor": False, "pipeline": "t_recompile", "fallback": "error"})
    assert all(torch.equal(g, r) for g, r in zip(grads_of(compiled, model, x), reference))
    assert RECORD["carried"] == [None, "from attempt 1"]
    assert [(e, a) for e, a, _ in RECORD["steps_checked"]] == [("fx", 1), ("fx", 2)]
    assert all(n > 0 for _, _, n in RECORD["steps_checked"])  # the backward receives saved values
    joint = [r for r in dsgraph.reports() if r.kind == "joint"]
    assert len(joint) == 1 and joint[0].memory["t_recompile_attempt"] == 2  # only the kept compile is reported


def test_a_check_that_asks_past_its_limit_is_a_pass_failure():
    model, x = model_and_input()
    options = {"inductor": False, "pipeline": "t_recompile_forever"}
    with pytest.raises(BackendCompilerFailed) as info:
        grads_of(torch.compile(model, backend="dsgraph", options={**options, "fallback": "error"}), model, x)
    failure = find_cause(info.value, PassFailure)
    assert failure is not None and failure.pass_name == "t_recompile_forever"
    assert "at most 2" in str(failure)
    reference = stock_grads(model, x)
    with pytest.warns(DsgraphFallbackWarning, match="t_recompile_forever"):
        got = grads_of(torch.compile(model, backend="dsgraph", options=options), model, x)
    assert all(torch.equal(g, r) for g, r in zip(got, reference))


def test_a_joint_pass_sets_the_partitioner():
    model, x = model_and_input()
    compiled = torch.compile(model, backend="dsgraph",
                             options={"inductor": False, "pipeline": "t_partition", "fallback": "error"})
    grads_of(compiled, model, x)
    assert len(RECORD["partitioned"]) == 1 and "num_fwd_outputs" in RECORD["partitioned"][0]


def test_the_partitioner_hook_belongs_to_the_joint_stage():
    model, x = model_and_input()
    compiled = torch.compile(model, backend="dsgraph",
                             options={"inductor": False, "pipeline": "t_partition_late", "fallback": "error"})
    with pytest.raises(BackendCompilerFailed, match="set_partitioner is a joint-stage hook"):
        grads_of(compiled, model, x)
