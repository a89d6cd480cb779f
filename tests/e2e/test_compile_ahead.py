"""The backward compiled ahead in Inductor's worker (``compile_ahead=True``, compile/ahead.py) on CPU:
served when the graph is the partition's, with gradients bitwise equal to the in-process
compile and the same buffer plan read for the budget's check; not sent when a backward pass
rewrites the graph; any other graph compiles in the process."""

import pytest
import torch

import dsgraph
from dsgraph import compat
from dsgraph.models import GPT, GPTConfig, gpt_inputs

CFG = GPTConfig(vocab=256, seq=32, layers=2, heads=2, dim=32)


@pytest.fixture(autouse=True)
def _deterministic():
    """Inductor's CPU embedding backward scatters with atomic adds inside OpenMP loops: two
    compiles of one graph can differ in the last bit (CI, session 17, with grad_pool). The
    bitwise comparisons here need deterministic kernels on both sides; the worker compiles
    under the same setting (``test_the_workers_torch_settings_are_this_processs``)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def _step(options, device="cpu"):
    torch._dynamo.reset()
    dsgraph.clear_reports()
    torch.manual_seed(0)
    model = GPT(CFG).to(device)
    compiled = torch.compile(model, backend="dsgraph", options={"fallback": "error", **options})
    loss = compiled(*gpt_inputs(CFG, 2, device))
    loss.backward()
    reports = {r.kind: r for r in dsgraph.reports()}
    return loss.detach(), [p.grad.clone() for p in model.parameters()], reports


def _bitwise(a, b):
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_served_with_a_budget_bitwise_and_the_same_checked_plan():
    budget = {"memory_budget": "64MiB"}  # above the stock peak: the check runs on the compiled plan
    here = _step({**budget, "compile_ahead": False})
    ahead = _step({**budget, "compile_ahead": True})
    figures = ahead[2]["backward"].memory
    assert figures["compile_ahead_served"] is True, figures
    assert figures["compile_ahead_error"] is None
    assert figures["compile_ahead_child_s"] > 0
    assert figures["compile_ahead_queued_s"] >= 0  # the worker was started at the backend's entry
    assert "compile_ahead_served" not in here[2]["backward"].memory
    assert _bitwise(here, ahead)
    # the worker read Inductor's plan of the backward; the check holds the same peak
    peak_here = here[2]["joint"].memory["checkpoint_inductor_peak"]
    assert peak_here > 0
    assert ahead[2]["joint"].memory["checkpoint_inductor_peak"] == peak_here


def test_not_sent_when_a_backward_pass_rewrites_the_graph():
    # grad_pool rewrites the backward (gradients into the pool): the partition's graph is
    # not the one compiled, so nothing is sent
    here = _step({"grad_pool": True, "compile_ahead": False})
    ahead = _step({"grad_pool": True, "compile_ahead": True})
    assert "compile_ahead_served" not in ahead[2]["backward"].memory
    assert _bitwise(here, ahead)


def test_off_by_default():
    _, _, reports = _step({})
    assert "compile_ahead_served" not in reports["backward"].memory


def test_a_graph_other_than_the_childs_compiles_here():
    """``serving`` hands the worker's result only to the graph it was made from."""
    calls = []

    def result(gm):
        calls.append(gm)
        return None

    def f(x):
        return (x.sin() * 2,)

    x = torch.randn(8)
    with compat.inductor_ahead.serving(("not this graph",), result):
        out = torch.compile(f, backend="inductor")(x)
    assert calls == []
    assert torch.allclose(out[0], f(x)[0])


@pytest.mark.parametrize("value", ["yes", "auto", 1, None])
def test_the_option_is_validated(value):
    with pytest.raises(ValueError, match="compile_ahead"):
        dsgraph.validate_options({"compile_ahead": value})


def test_the_workers_torch_settings_are_this_processs():
    """Deterministic algorithms change what Inductor generates (an embedding backward's
    scatter); the worker compiles under this process's setting (it reports the settings it
    compiled under, checked on return), and the fingerprint holds it, so the backward is
    still served, bitwise. Here with deterministic algorithms off (the fixture's on)."""
    torch.use_deterministic_algorithms(False)
    ahead = _step({"compile_ahead": True})
    assert ahead[2]["backward"].memory["compile_ahead_served"] is True
    assert ahead[2]["backward"].memory["compile_ahead_error"] is None


def _zoo_step(name, ahead):
    from tests import zoo

    torch._dynamo.reset()
    dsgraph.clear_reports()
    model, inputs = zoo.build(name)
    options = {"fallback": "error", "memory_budget": "1GiB", "compile_ahead": ahead}
    loss = torch.compile(model, backend="dsgraph", options=options)(*inputs)
    loss.backward()
    reports = {r.kind: r for r in dsgraph.reports()}
    return loss.detach(), [p.grad.clone() for p in model.parameters()], reports


@pytest.mark.parametrize("name", ["masked", "gated"])
def test_served_bitwise_on_other_shapes(name):
    """Beyond the GPT: a model with an input-derived mask and a gated residual network, each
    with a budget above its stock peak (the check reads the worker's plan)."""
    here, ahead = _zoo_step(name, False), _zoo_step(name, True)
    assert ahead[2]["backward"].memory["compile_ahead_served"] is True, ahead[2]["backward"].memory
    assert _bitwise(here, ahead)
    assert ahead[2]["joint"].memory["checkpoint_inductor_peak"] == here[2]["joint"].memory["checkpoint_inductor_peak"]


def test_not_sent_for_a_forward_inductor_lays_out_channels_last():
    """A CNN with BatchNorm: Inductor's layout optimization returns the saved activations
    channels last, so the backward's inputs are not the partition's strides; it is not
    sent (it would never be served), and the step is the in-process one."""
    here, ahead = _zoo_step("cnn", False), _zoo_step("cnn", True)
    assert "compile_ahead_served" not in ahead[2]["backward"].memory
    assert _bitwise(here, ahead)
