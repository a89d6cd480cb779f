"""A plan that recomputes the fused loss op runs its loss-only form in the forward
(``analysis.forward_variants``, ``recompute.light_forward``): the backward's recomputed call
makes the gradients, so the forward no longer computes them only to drop them. On a small
GPT with a large vocabulary and the chunked loss, the Inductor executor's smallest plan
recomputes the loss head: its forward calls ``dsgraph::linear_cross_entropy`` (no gradient
GEMMs), the backward ``dsgraph::linear_cross_entropy_grads``; the gradients are bitwise
those of the stock partition (both run as FX code); the step model's prediction of that plan
is Inductor's own plan within 3% and FX's own plan exactly; recomputing the op is priced at
the loss-only op's FLOPs (what the step computes beyond the stock partition)."""

import pytest
import torch

from dsgraph import compat
from dsgraph.analysis.cost_model import CostModel
from dsgraph.analysis.step_model import StepModel
from dsgraph.errors import BudgetError
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint
from dsgraph.runtime import linear_cross_entropy as lce
from tests.e2e.test_checkpoint_zoo import fx_truth


def model_and_inputs():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=2003, seq=32, layers=3, heads=2, dim=32)
    return GPT(cfg), gpt_inputs(cfg, batch=4, seed=3)


def chunked(gm):
    return apply_chunk_loss(gm, plan_chunk_loss(gm, chunks=4))


_joint: dict = {}


def joint() -> truth.JointCapture:
    if "j" not in _joint:
        model, inputs = model_and_inputs()
        _joint["j"] = truth.capture_joint(model, inputs, None, chunked)
    return _joint["j"]


def smallest_plan(j, executor="inductor"):
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor=executor)
    return plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, info.value.smallest_feasible, executor=executor)


def calls(gm, op) -> int:
    return sum(n.op == "call_function" and n.target is op for n in gm.graph.nodes)


def test_the_forward_of_a_plan_recomputing_the_loss_calls_the_loss_only_op():
    plan = smallest_plan(joint())
    assert calls(plan.forward, lce.LOSS_OP) == 1 and calls(plan.forward, lce.GRADS_OP) == 0
    assert calls(plan.backward, lce.GRADS_OP) == 1
    # without the rewrite the forward would have computed the gradients it drops
    assert calls(joint().gm, lce.GRADS_OP) == 1


def test_recomputing_the_op_is_priced_at_the_loss_only_flops():
    j = joint()
    (node,) = [n for n in j.gm.graph.nodes if n.target is lce.GRADS_OP]
    costs = CostModel(j.gm)
    x, w = (a.meta["val"] for a in node.args[:2])
    loss_flops = 2 * x.shape[0] * x.shape[1] * w.shape[0]
    assert costs.costs[node].flops == 3 * loss_flops  # the op's own: three GEMMs
    assert costs.recompute_flops[node] == loss_flops  # recomputed: one more than the stock step


def planned(seen: dict):
    """A ``truth`` partition choice: the smallest Inductor plan of the graph it is given."""
    def choose(gm, joint_inputs, kwargs):
        seen["plan"] = plan = smallest_plan(truth.JointCapture(gm, joint_inputs, kwargs, []))
        return plan.forward, plan.backward
    return choose


def step_with(choose):
    """Loss and gradients of one step whose partition ``choose`` makes, the graphs run as
    FX code (``truth``'s partitioner hook, the gradients kept)."""
    model, inputs = model_and_inputs()

    def partition(gm, joint_inputs, **kwargs):
        gm.graph = compat.fx_graph_cse(gm)
        gm.recompile()
        return choose(gm, joint_inputs, dict(kwargs))

    def backend(gm, example_inputs):
        with compat.dsgraph_compile_config():
            return compat.compile_fx(chunked(gm), example_inputs,
                                     inner_compile=lambda g, i, **kw: compat.boxed_fx(g),
                                     config_patches={"custom_partitioner_fn": truth._partitioner(partition)})

    compat.reset()
    loss = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    loss.backward()
    compat.reset()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_the_loss_and_gradients_are_bitwise_the_stock_partitions():
    seen: dict = {}
    loss, grads = step_with(truth.stock)
    loss_light, grads_light = step_with(planned(seen))
    assert calls(seen["plan"].forward, lce.LOSS_OP) == 1
    assert torch.equal(loss, loss_light)
    assert len(grads) == len(grads_light) and all(g is not None for g in grads)
    for a, b in zip(grads, grads_light):
        assert torch.equal(a, b)


def test_the_fx_prediction_of_the_plan_is_fxs_own_plan():
    j = joint()
    plan = smallest_plan(j)
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], j.kwargs.get("static_lifetime_input_indices") or [])
    by_name = {n.name: n for n in j.gm.graph.nodes}
    saved = [n.name for n in plan.backward.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]
    assert calls(plan.forward, lce.LOSS_OP) == 1
    assert model.evaluate([model.index[by_name[s]] for s in saved], "fx").peak == fx_truth(plan, j)


@pytest.mark.e2e
def test_the_inductor_prediction_is_inductors_own_plan_within_3_percent():
    seen: dict = {}
    model, inputs = model_and_inputs()
    real = truth.compiled_peaks(model, inputs, planned(seen), inductor=True, pre_grad=chunked)
    plan = seen["plan"]
    assert calls(plan.forward, lce.LOSS_OP) == 1
    inductor_peak = real.inductor.peak_bytes
    assert abs(plan.predicted_peak - inductor_peak) <= 0.03 * inductor_peak, (plan.predicted_peak, inductor_peak)
