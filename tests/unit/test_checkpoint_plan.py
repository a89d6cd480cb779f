"""The checkpoint planner on joint graphs captured by AOTAutograd (no Inductor): boundaries,
the recomputation closure, segment options, and plans against the budget."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_module_simplified

from dsgraph import compat
from dsgraph.errors import BudgetError
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.model import measure_terms, external_bytes
from dsgraph.recompute.partition import closure
from dsgraph.recompute.planner import plan_checkpoint, stock_saved
from dsgraph.analysis.lifetimes import bytes_of
from dsgraph.recompute.segments import build_segments, build_spans
from dsgraph.recompute.solver import exhaustive, pareto_dp
from dsgraph.analysis.cost_model import CostModel


class Chain(nn.Module):
    def __init__(self, width=24, depth=4, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.dropout = dropout

    def forward(self, x):
        for layer in self.layers:
            x = F.dropout(F.gelu(layer(x)), self.dropout, self.training)
        return x.square().mean()


def capture_joint(model, x):
    """The joint graph and partition arguments AOTAutograd hands a partitioner."""
    seen = {}

    def partition(gm, joint_inputs, **kwargs):
        seen.update(gm=gm, inputs=joint_inputs, kwargs=kwargs)
        return compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: g, partition_fn=partition)

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).backward()
    return seen["gm"], seen["inputs"], seen["kwargs"]


@pytest.fixture
def chain_joint():
    torch.manual_seed(0)
    return capture_joint(Chain(), torch.randn(64, 24))


def build(gm, kwargs):
    return JointGraph.build(gm, kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices") or [])


def test_boundaries_are_the_layer_inputs(chain_joint):
    gm, _, kwargs = chain_joint
    joint = build(gm, kwargs)
    carried = [n for _, n in joint.boundaries]
    # every tensor carried across a boundary is an activation, and each layer's output is one
    assert all(joint.is_activation(n) for n in carried)
    gelus = [n for n in joint.forward if "gelu" in str(n.target)]
    assert len(gelus) == 4 and all(g in carried for g in gelus[:-1])


def test_closure_recomputes_forward_nodes_only_and_sends_needed_primals(chain_joint):
    gm, _, kwargs = chain_joint
    joint = build(gm, kwargs)
    plan = closure(joint, [n for _, n in joint.boundaries])
    assert plan.recomputed and all(n in joint.position for n in plan.recomputed)
    assert not (set(plan.recomputed) & set(plan.saved))
    weights = [p for p in joint.primals if p in joint.params]
    assert any(p in plan.saved for p in weights)  # the backward reads the weights


def test_random_nodes_are_saved_never_recomputed():
    torch.manual_seed(0)
    model = Chain(dropout=0.5).train()
    gm, _, kwargs = capture_joint(model, torch.randn(64, 24))
    joint = build(gm, kwargs)
    assert joint.random
    plan = closure(joint, [n for _, n in joint.boundaries])
    assert plan.forced and set(plan.forced) <= joint.random
    assert not (set(plan.recomputed) & joint.random)


def test_segment_options_trade_bytes_for_time(chain_joint):
    gm, _, kwargs = chain_joint
    joint = build(gm, kwargs)
    stock = {n for n in joint.forward if n.name in stock_saved(gm, None, kwargs)}
    _, segments = build_segments(joint, stock, CostModel(gm))
    assert segments
    traded = 0
    for seg in segments:
        keep = seg.option("keep")
        assert keep is not None and seg.options[0] is keep
        for other in seg.options[1:]:  # every other option saves no more and recomputes no less
            assert other.saved_bytes <= keep.saved_bytes + bytes_of([seg.carried]) and other.seconds >= keep.seconds
            traded += other.saved_bytes < keep.saved_bytes and other.seconds > keep.seconds
    assert traded > 0


def test_dp_equals_exhaustive_on_the_graph_terms(chain_joint):
    gm, _, kwargs = chain_joint
    joint = build(gm, kwargs)
    stock = {n for n in joint.forward if n.name in stock_saved(gm, None, kwargs)}
    prefix, segments = build_segments(joint, stock, CostModel(gm))
    static = kwargs.get("static_lifetime_input_indices") or []
    spans = build_spans(joint, segments, CostModel(gm), max_len=3)
    terms, const, _, first_in = measure_terms(joint, prefix, segments, static, external_bytes(joint), spans)
    assert any(t.length > 1 for row in terms for t in row)
    dp = [(p.peak, p.seconds) for p in pareto_dp(terms, const, first_in_saved=first_in)]
    ex = [(p.peak, p.seconds) for p in exhaustive(terms, const, first_in)]
    assert dp == ex and len(dp) > 1


def test_plans_meet_the_budget_and_are_monotone(chain_joint):
    gm, inputs, kwargs = chain_joint
    loose = plan_checkpoint(gm, inputs, kwargs, budget=1 << 40)
    assert not loose.regions and loose.predicted_peak == loose.stock_peak
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(gm, inputs, kwargs, budget=1)
    smallest = info.value.smallest_feasible
    assert smallest < loose.stock_peak
    peaks = []
    for i in range(5):
        budget = loose.stock_peak - (loose.stock_peak - smallest) * i // 4
        plan = plan_checkpoint(gm, inputs, kwargs, budget=budget)
        assert plan.predicted_peak <= budget
        peaks.append(plan.predicted_peak)
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert plan.regions and plan.saved_bytes < loose.saved_bytes
    assert "segment input" in plan.text()


def test_a_feasible_budget_never_raises_when_the_search_gives_up(chain_joint, monkeypatch):
    """Where the model errs low, every frontier point checked can simulate above the budget.
    The planner then takes the smallest plan if it fits, and raises only when it does not
    (an HF GPT-2 budget of 3 GiB once raised "smallest feasible 2.39 GiB")."""
    from dsgraph.recompute import planner

    gm, inputs, kwargs = chain_joint
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(gm, inputs, kwargs, budget=1)
    smallest = info.value.smallest_feasible
    monkeypatch.setattr(planner, "MAX_SIMULATIONS", 0)  # the search checks nothing
    plan = plan_checkpoint(gm, inputs, kwargs, budget=smallest)
    assert plan.predicted_peak == smallest  # the smallest plan, taken without a search
    with pytest.raises(BudgetError) as again:
        plan_checkpoint(gm, inputs, kwargs, budget=smallest - 1)
    assert again.value.smallest_feasible == smallest


@pytest.mark.parametrize("autocast", [False, True])
def test_keep_everywhere_is_exactly_the_stock_partition(autocast):
    """The planner's ``keep`` options, all together, save what Inductor's min-cut saves,
    also where the stock partition recomputes across a boundary (under bf16 autocast the
    fp32 upcast of the logits is recomputed from the bf16 matmul, not saved)."""
    from dsgraph.models import GPT, GPTConfig, gpt_inputs
    from dsgraph.recompute.model import simulate
    from dsgraph.recompute.partition import saved_names

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=97, seq=16, layers=2, heads=2, dim=32)
    model = GPT(cfg)
    idx, tgt = gpt_inputs(cfg, 2)
    seen = {}

    def partition(gm, joint_inputs, **kwargs):
        seen.update(gm=gm, kwargs=kwargs)
        fw, bw = compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)
        seen["stock"] = saved_names(bw)
        return fw, bw

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: g, partition_fn=partition)

    torch._dynamo.reset()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        torch.compile(model, backend=backend)(idx, tgt).backward()
    gm, kwargs = seen["gm"], seen["kwargs"]
    joint = build(gm, kwargs)
    stock = {n for n in joint.forward if n.name in set(seen["stock"])}
    prefix, segments = build_segments(joint, stock, CostModel(gm))
    saved = list(prefix.options[0].saved) + [n for seg in segments for n in seg.option("keep").saved]
    static = kwargs.get("static_lifetime_input_indices") or []
    sim = simulate(joint, saved, static, external_bytes(joint))
    assert sorted(sim.saved) == sorted(seen["stock"])


def capture_dsgraph_joint(model, x, autocast: bool):
    """The joint graph dsgraph's partitioner receives (Inductor's decompositions applied:
    GELU is erf and its derivative's pieces, computed in the forward)."""
    seen = {}
    stock = compat.default_partition

    def spy(gm, joint_inputs, **kwargs):
        seen.update(gm=compat.copy_graph_module(gm), kwargs=kwargs)
        return stock(gm, joint_inputs, **kwargs)

    torch._dynamo.reset()
    compat.default_partition = spy
    try:
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            torch.compile(model, backend="dsgraph", options={"inductor": False, "fallback": "error"})(x).backward()
    finally:
        compat.default_partition = stock
    return seen["gm"], seen["kwargs"]


@pytest.mark.parametrize("autocast", [False, True])
def test_frontier_time_is_what_the_whole_plan_recomputes(autocast):
    """A plan's recomputation time is the sum of its options' times; that sum must cover
    what the whole plan's partition recomputes. Under bf16 autocast an MLP's casts make
    one-node segments, and an option that counted on a later segment's value while that
    segment's option counted on it left a matmul recomputed that no option was charged for
    (H200: four extra matmuls, 1.4 ms, in a plan the model priced at 0.3 ms)."""
    from dsgraph.analysis.cost_model import node_flops
    from dsgraph.recompute.planner import walk
    from dsgraph.recompute.segments import options_by_position

    from dsgraph.models import MLP

    torch.manual_seed(0)
    gm, kwargs = capture_dsgraph_joint(MLP(width=64, depth=6), torch.randn(128, 64), autocast)
    joint = build(gm, kwargs)
    stock = {n for n in joint.forward if n.name in stock_saved(gm, None, kwargs)}
    costs = CostModel(gm)
    prefix, segments = build_segments(joint, stock, costs)
    spans = build_spans(joint, segments, costs)
    options_at = options_by_position(segments, spans)
    static = kwargs.get("static_lifetime_input_indices") or []
    terms, const, _, first_in = measure_terms(joint, prefix, segments, static, external_bytes(joint), spans)
    points = pareto_dp(terms, const, first_in_saved=first_in)
    assert len(points) > 3
    for point in points:
        steps = [option for _, option in walk(options_at, point)]
        saved = list(prefix.options[0].saved) + [n for option in steps for n in option.saved]
        whole = closure(joint, saved).recomputed
        charged = {n for option in steps for n in option.recomputed} | set(prefix.options[0].recomputed)
        # static values (weight casts, transposes) are the one exception: an option counts
        # on them as available, and the plan recomputes those no option saves, from the
        # parameters (a cast or a transpose, no FLOPs)
        missing = [n.name for n in whole if n not in charged and n not in joint.static]
        assert not missing, f"recomputed but charged to no option: {missing}"
        assert not any(node_flops(n) > 0 for n in whole if n not in charged)
