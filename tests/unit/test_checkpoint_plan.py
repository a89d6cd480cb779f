"""The checkpoint planner on joint graphs captured by AOTAutograd (no Inductor): cuts,
the recomputation closure, interval options, the step model against FX's own plan of
the partitioned graphs, and plans against the budget."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_module_simplified

from dsgraph import compat
from dsgraph.analysis.cost_model import CostModel
from dsgraph.analysis.plan import fx_plan
from dsgraph.analysis.step_model import StepModel
from dsgraph.analysis.timeline import Interval, stitch
from dsgraph.errors import BudgetError
from dsgraph.recompute.cuts import all_cuts, candidate_cuts
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.model import PlanEvaluator, measure_terms, uniform_plan
from dsgraph.recompute.options import Intervals
from dsgraph.recompute.partition import closure, partition, saved_names
from dsgraph.recompute.planner import external_bytes, plan_checkpoint, stock_saved
from dsgraph.recompute.solver import exhaustive, pareto_dp


class Chain(nn.Module):
    def __init__(self, width=24, depth=4, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.dropout = dropout

    def forward(self, x):
        for layer in self.layers:
            x = F.dropout(F.gelu(layer(x)), self.dropout, self.training)
        return x.square().mean()


class Masked(nn.Module):
    """Every layer and the loss read a mask made from the input: it is live throughout."""

    def __init__(self, width=20, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        mask = (x > 0.1).to(x.dtype)
        h = x
        for layer in self.layers:
            h = h + torch.tanh(layer(h)) * mask
        return (h * mask).sum() / mask.sum()


class Skip(nn.Module):
    """A U-Net-like long skip: the first layer's output is read by the last, so every cut
    in between is crossed by two tensors."""

    def __init__(self, width=18, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        first = torch.relu(self.layers[0](x))
        h = first
        for layer in self.layers[1:-1]:
            h = torch.relu(layer(h))
        return (self.layers[-1](h) * first).mean()


def capture_joint(model, x):
    """The joint graph and partition arguments AOTAutograd hands a partitioner."""
    seen = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        seen.update(gm=compat.copy_graph_module(gm), inputs=joint_inputs, kwargs=kwargs)
        fw, bw = compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)
        seen["stock"] = saved_names(bw)
        return fw, bw

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: g, partition_fn=partition_fn)

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).backward()
    return seen


@pytest.fixture
def chain_joint():
    torch.manual_seed(0)
    return capture_joint(Chain(), torch.randn(64, 24))


def build(seen):
    kwargs = seen["kwargs"]
    return JointGraph.build(seen["gm"], kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices") or [])


def test_cuts_are_crossed_by_the_layer_outputs(chain_joint):
    joint = build(chain_joint)
    cuts = candidate_cuts(joint)
    assert cuts[0].position == 0 and cuts[-1].position == len(joint.forward)
    assert not cuts[0].crossing and not cuts[-1].crossing
    assert [c.position for c in cuts] == sorted({c.position for c in cuts})
    inner = cuts[1:-1]
    assert inner and all(not joint.is_free(n) and joint.is_activation(n) for c in inner for n in c.crossing)
    # a layer's output is its GELU's, or the dropout's copy of it: each layer but the
    # last (the loss reads it) has a cut crossed by it
    gelus = [n for n in joint.forward if "gelu" in str(n.target)]
    outs = [{g} | {u for u in g.users if u in joint.position} for g in gelus]
    assert all(any(out & set(c.crossing) for c in inner) for out in outs[:-1]), [c.crossing for c in inner]


def test_an_input_derived_mask_crosses_no_cut():
    """A mask made from the input is live everywhere; it is free (recomputed from the
    primals), so it does not make every cut cost it, and cuts exist inside the model."""
    torch.manual_seed(0)
    seen = capture_joint(Masked(), torch.randn(33, 20))
    joint = build(seen)
    masks = [n for n in joint.forward if n in joint.input_only]
    assert masks
    cuts = candidate_cuts(joint)
    assert len(cuts) > 4
    assert not any(n in masks for c in cuts for n in c.crossing)


def test_cuts_of_any_size():
    """With a long skip connection two tensors cross every cut in between; such cuts are
    still candidates (no single-tensor boundary is needed)."""
    torch.manual_seed(0)
    seen = capture_joint(Skip(), torch.randn(29, 18))
    joint = build(seen)
    inner = candidate_cuts(joint)[1:-1]
    assert any(len(c.crossing) == 2 for c in inner)
    first = next(n for n in joint.forward if "relu" in str(n.target))
    for c in all_cuts(joint):
        made_after = joint.position[first] < c.position
        used_before = c.position <= max(joint.position[u] for u in first.users if u in joint.position)
        assert (first in c.crossing) == (made_after and used_before)


class Pooled(nn.Module):
    """Max pooling with indices: one op, two outputs taken by getitems placed after it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.relu(self.head(h)).square().mean()


def test_a_multi_output_ops_outputs_are_made_at_the_op():
    """The cut right after max pooling (before its getitems) is crossed by its values and
    indices: the getitems are made where the op runs. Counted as made at their own
    positions, that cut was crossed by neither, and a segment starting there could not
    recompute them from what crosses it (the op's tuple is no tensor to save)."""
    torch.manual_seed(0)
    joint = build(capture_joint(Pooled(), torch.randn(2, 3, 8, 8)))
    pool = next(n for n in joint.forward if "max_pool2d_with_indices" in str(n.target)
                and "backward" not in str(n.target))
    outs = [u for u in pool.users if u in joint.position]
    assert len(outs) == 2 and all(joint.position[g] > joint.position[pool] for g in outs)
    after_op = next(c for c in all_cuts(joint) if c.position == joint.position[pool] + 1)
    assert set(outs) <= set(after_op.crossing), [n.name for n in after_op.crossing]
    # a cut between the op and its getitems is the same moment as the one after the last
    # getitem: no candidate
    last = max(joint.position[g] for g in outs)
    assert not [c.position for c in candidate_cuts(joint) if joint.position[pool] < c.position <= last]


def test_closure_recomputes_forward_nodes_only_and_sends_needed_primals(chain_joint):
    joint = build(chain_joint)
    cut_nodes = [n for c in candidate_cuts(joint) for n in c.crossing]
    plan = closure(joint, cut_nodes)
    assert plan.recomputed and all(n in joint.position for n in plan.recomputed)
    assert not (set(plan.recomputed) & set(plan.saved))
    weights = [p for p in joint.primals if p in joint.params]
    assert any(p in plan.saved for p in weights)  # the backward reads the weights


def test_random_nodes_are_saved_never_recomputed():
    torch.manual_seed(0)
    seen = capture_joint(Chain(dropout=0.5).train(), torch.randn(64, 24))
    joint = build(seen)
    assert joint.random
    plan = closure(joint, [n for c in candidate_cuts(joint) for n in c.crossing])
    assert plan.forced and set(plan.forced) <= joint.random
    assert not (set(plan.recomputed) & joint.random)


def intervals_of(seen, fused=False):
    joint = build(seen)
    stock = {n for n in joint.forward if n.name in set(seen["stock"])}
    costs = CostModel(seen["gm"])
    return joint, Intervals(joint, candidate_cuts(joint), stock, costs, set(), fused=fused, max_len=3)


def test_options_trade_bytes_for_time(chain_joint):
    joint, intervals = intervals_of(chain_joint)
    # intervals of one to three segments: a one-segment interval between two cuts that
    # cross the same storages has nothing to drop, so the trade shows on longer ones
    traded = 0
    for length in (1, 2, 3):
        for k in range(intervals.segments - length + 1):
            keep = intervals.option("keep", k, k + length)
            for policy in ("cheap", "recompute"):
                other = intervals.option(policy, k, k + length)
                assert intervals.charge(other) <= intervals.charge(keep)
                assert other.seconds >= keep.seconds
                traded += intervals.charge(other) < intervals.charge(keep) and other.seconds > keep.seconds
            assert not intervals.option("recompute", k, k + length).inner
    assert traded > 0


def test_a_plan_recomputes_what_its_options_are_charged_for(chain_joint):
    """Cut sets are saved at both ends of every interval, so each interval's
    recomputation is its own: the whole plan's closure recomputes exactly what its options
    recompute (static values such as weight transposes aside, which cost no FLOPs)."""
    joint, intervals = intervals_of(chain_joint)
    for policy in ("keep", "cheap", "recompute"):
        for length in (1, 2):
            plan = uniform_plan(intervals, policy, length, 0)
            whole = closure(joint, intervals.saved_of(plan)).recomputed
            charged = {n for option in plan for n in option.recomputed}
            assert {n for n in whole if n not in joint.static} == {n for n in charged if n not in joint.static}


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_fx_prediction_equals_fx_plan_of_the_partitioned_graphs(dropout):
    """``StepModel`` predicts FX execution without building graphs; building them
    (``partition``) and reading FX's plan (``fx_plan`` + ``stitch``) gives the same peak
    for the stock saved set and for plans that recompute."""
    torch.manual_seed(1)
    seen = capture_joint(Chain(dropout=dropout, depth=5).train(), torch.randn(57, 24))
    joint, intervals = intervals_of(seen)
    kwargs = seen["kwargs"]
    static = kwargs.get("static_lifetime_input_indices") or []
    model = StepModel(seen["gm"], kwargs["num_fwd_outputs"], static)
    stock = {n for n in joint.forward if n.name in set(seen["stock"])}
    plans = [list(stock)] + [intervals.saved_of(uniform_plan(intervals, p, n, 0))
                             for p in ("cheap", "recompute") for n in (1, 2)]
    for saved in plans:
        fw, bw = partition(joint, saved, static)
        names = saved_names(bw)
        real = stitch(fx_plan(fw), fx_plan(bw), [Interval("primals", external_bytes(joint), 0, 0)], names)
        by_name = {n.name: n for n in seen["gm"].graph.nodes}
        predicted = model.evaluate([model.index[by_name[n]] for n in names], "fx")
        assert predicted.peak == real.peak_bytes
        assert sorted(model.nodes[i].name for i in predicted.saved) == sorted(names)


def test_dp_equals_exhaustive_on_the_graph_terms():
    torch.manual_seed(0)
    seen = capture_joint(Chain(depth=2), torch.randn(41, 24))
    joint, intervals = intervals_of(seen)
    assert 3 <= intervals.segments <= 8
    kwargs = seen["kwargs"]
    model = StepModel(seen["gm"], kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices") or [])
    evaluator = PlanEvaluator(joint, model, intervals, "fx")
    rows, const, evaluated = measure_terms(evaluator, ("cheap", "recompute"), 3)
    terms = [[t for _, t in row] for row in rows]
    assert any(t.length > 1 for row in terms for t in row) and evaluated
    dp = [(p.peak, p.seconds) for p in pareto_dp(terms, const)]
    ex = [(p.peak, p.seconds) for p in exhaustive(terms, const)]
    assert dp == ex and len(dp) > 1


@pytest.mark.parametrize("executor", ["fx", "inductor"])
def test_plans_meet_the_budget_and_are_monotone(chain_joint, executor):
    gm, inputs, kwargs = chain_joint["gm"], chain_joint["inputs"], chain_joint["kwargs"]
    loose = plan_checkpoint(gm, inputs, kwargs, budget=1 << 40, executor=executor)
    assert not loose.regions and loose.predicted_peak == loose.stock_peak and loose.executor == executor
    assert sorted(loose.backward.graph.find_nodes(op="placeholder"), key=str)  # the stock graphs, built
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(gm, inputs, kwargs, budget=1, executor=executor)
    smallest, bound = info.value.smallest_feasible, info.value.lower_bound
    assert bound <= smallest < loose.stock_peak
    assert info.value.dominated_by in ("gradients", "random", "kernel")
    assert str(smallest) in str(info.value) and "no partition of this graph peaks below" in str(info.value)
    peaks = []
    for i in range(5):
        budget = loose.stock_peak - (loose.stock_peak - smallest) * i // 4
        plan = plan_checkpoint(gm, inputs, kwargs, budget=budget, executor=executor)
        assert plan.predicted_peak <= budget
        peaks.append(plan.predicted_peak)
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert peaks[-1] == smallest  # asking for the smallest feasible budget gives that plan
    assert plan.regions and plan.saved_bytes < loose.saved_bytes
    assert "crosses a cut" in plan.text()
    with pytest.raises(BudgetError) as again:
        plan_checkpoint(gm, inputs, kwargs, budget=smallest - 1, executor=executor)
    assert again.value.smallest_feasible == smallest


def test_the_stock_choice_is_the_min_cut_partitions():
    """``compat.min_cut_saved_names`` stops Inductor's partitioner before it builds graphs:
    once the values its backward does not read are dropped, it is what the full
    partitioner saves."""
    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=97, seq=16, layers=2, heads=2, dim=32)
    model = GPT(cfg)
    idx, tgt = gpt_inputs(cfg, 2)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: g, partition_fn=spy)

    seen = {}

    def spy(gm, joint_inputs, **kwargs):
        seen.update(gm=compat.copy_graph_module(gm), inputs=joint_inputs, kwargs=kwargs)
        fw, bw = compat.default_partition(gm, joint_inputs, **kwargs)
        seen["stock"] = saved_names(bw)
        return fw, bw

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(idx, tgt).backward()
    kwargs = seen["kwargs"]
    chosen = compat.min_cut_saved_names(seen["gm"], seen["inputs"], **kwargs)
    model = StepModel(seen["gm"], kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices") or [])
    by_name = {n.name: n for n in seen["gm"].graph.nodes}
    used = model.partition([model.index[by_name[n]] for n in chosen], sink=False)[3]
    assert sorted(model.nodes[i].name for i in used) == sorted(seen["stock"])
    assert set(stock_saved(seen["gm"], seen["inputs"], kwargs)) == set(seen["stock"])
