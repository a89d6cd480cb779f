"""A plan that recomputes the fused loss op runs its loss-only form in the forward
(``analysis.forward_variants``, ``recompute.light_forward``): the backward's recomputed call
makes the gradients, so the forward no longer computes them only to drop them. On a small
GPT with a large vocabulary and the chunked loss, the plan that recomputes every segment
(the loss head included) from its cut, built on the planner's own intervals and partitioned
as the planner partitions: its forward calls ``dsgraph::linear_cross_entropy`` (no gradient
GEMMs), the backward ``dsgraph::linear_cross_entropy_grads``; loss and gradients are bitwise
those of the stock partition (both run as FX code); the step model's predictions of that
plan are FX's own plan exactly and Inductor's own plan within 3%; recomputing the op is
priced at the loss-only op's FLOPs (what the step computes beyond the stock partition)."""

import pytest
import torch

from dsgraph import compat
from dsgraph.analysis.cost_model import CostModel
from dsgraph.analysis.step_model import StepModel
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
from dsgraph.recompute import truth
from dsgraph.recompute.cuts import candidate_cuts
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.model import PlanEvaluator, uniform_plan
from dsgraph.recompute.options import Intervals
from dsgraph.recompute.partition import partition
from dsgraph.recompute.planner import _held, external_bytes
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


def recompute_everything(gm, joint_inputs, kwargs):
    """(forward, backward, the step model, the saved ids) of the plan recomputing every
    segment of ``gm``'s forward from its cut, partitioned as the planner partitions."""
    static = list(kwargs.get("static_lifetime_input_indices") or [])
    jg = JointGraph.build(gm, kwargs["num_fwd_outputs"], static)
    model = StepModel(gm, kwargs["num_fwd_outputs"], static, external=external_bytes(jg))
    names, _ = compat.min_cut_partition_if(gm, joint_inputs, lambda n: False, **kwargs)
    stock = {n for n in jg.forward if n.name in set(names)}
    intervals = Intervals(jg, candidate_cuts(jg), stock, CostModel(gm), _held(jg, model), fused=True, max_len=1)
    saved = PlanEvaluator(jg, model, intervals, "inductor").saved(uniform_plan(intervals, "recompute", 1, 0))
    fw, bw = partition(jg, saved, static)
    return fw, bw, model, [model.index[n] for n in saved]


def calls(gm, op) -> int:
    return sum(n.op == "call_function" and n.target is op for n in gm.graph.nodes)


def test_the_forward_of_a_plan_recomputing_the_loss_calls_the_loss_only_op():
    j = joint()
    fw, bw, _, _ = recompute_everything(j.gm, j.joint_inputs, j.kwargs)
    assert calls(fw, lce.LOSS_OP) == 1 and calls(fw, lce.GRADS_OP) == 0
    assert calls(bw, lce.GRADS_OP) == 1
    # without the rewrite the forward would have computed the gradients it drops
    assert calls(j.gm, lce.GRADS_OP) == 1


def test_recomputing_the_op_is_priced_at_the_loss_only_flops():
    j = joint()
    (node,) = [n for n in j.gm.graph.nodes if n.target is lce.GRADS_OP]
    costs = CostModel(j.gm)
    x, w = (a.meta["val"] for a in node.args[:2])
    loss_flops = 2 * x.shape[0] * x.shape[1] * w.shape[0]
    assert costs.costs[node].flops == 3 * loss_flops  # the op's own: three GEMMs
    assert costs.recompute_flops[node] == loss_flops  # recomputed: one more than the stock step


def planned(seen: dict):
    """A ``truth`` partition choice: the recompute-everything plan of the graph it is given."""
    def choose(gm, joint_inputs, kwargs):
        fw, bw, model, saved = recompute_everything(gm, joint_inputs, kwargs)
        seen.update(forward=fw, model=model, saved=saved)
        return fw, bw
    return choose


def step_with(choose):
    """Loss and gradients of one step whose partition ``choose`` makes, the graphs run as
    FX code (``truth``'s partitioner hook, the gradients kept)."""
    model, inputs = model_and_inputs()

    def partition_hook(gm, joint_inputs, **kwargs):
        gm.graph = compat.fx_graph_cse(gm)
        gm.recompile()
        return choose(gm, joint_inputs, dict(kwargs))

    def backend(gm, example_inputs):
        with compat.dsgraph_compile_config():
            return compat.compile_fx(chunked(gm), example_inputs,
                                     inner_compile=lambda g, i, **kw: compat.boxed_fx(g),
                                     config_patches={"custom_partitioner_fn": truth._partitioner(partition_hook)})

    compat.reset()
    loss = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    loss.backward()
    compat.reset()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_the_loss_and_gradients_are_bitwise_the_stock_partitions():
    seen: dict = {}
    loss, grads = step_with(truth.stock)
    loss_light, grads_light = step_with(planned(seen))
    assert calls(seen["forward"], lce.LOSS_OP) == 1
    assert torch.equal(loss, loss_light)
    assert len(grads) == len(grads_light) and all(g is not None for g in grads)
    for a, b in zip(grads, grads_light):
        assert torch.equal(a, b)


class _Plan:
    def __init__(self, forward, backward):
        self.forward, self.backward = forward, backward


def test_the_fx_prediction_of_the_plan_is_fxs_own_plan():
    j = joint()
    fw, bw, model, saved = recompute_everything(j.gm, j.joint_inputs, j.kwargs)
    assert calls(fw, lce.LOSS_OP) == 1
    assert model.evaluate(saved, "fx").peak == fx_truth(_Plan(fw, bw), j)


@pytest.mark.e2e
def test_the_inductor_prediction_is_inductors_own_plan_within_3_percent():
    seen: dict = {}
    model, inputs = model_and_inputs()
    real = truth.compiled_peaks(model, inputs, planned(seen), inductor=True, pre_grad=chunked)
    assert calls(seen["forward"], lce.LOSS_OP) == 1
    predicted = seen["model"].evaluate(seen["saved"], "inductor").peak
    inductor_peak = real.inductor.peak_bytes
    assert abs(predicted - inductor_peak) <= 0.03 * inductor_peak, (predicted, inductor_peak)
