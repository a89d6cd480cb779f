"""The checkpoint planner on the model zoo (tests/zoo.py), CPU sizes.

For each model: the stock prediction equals FX's plan of the stock partition; each budget
from the stock peak down to the smallest plan is met, as predicted, by FX's plan of the
partition the planner returns (``fx_plan`` of the graphs it built), and the predicted
peaks are monotone; the smallest plan is at or below hand-written per-block checkpointing
(``torch.utils.checkpoint`` around each block, or transformers' own), measured the same
way: the compiled step's stock partition. Through Inductor (``e2e``): predictions against
the buffer plans Inductor really makes (``dsgraph.recompute.truth``). On a graph of under
200 nodes the planner's smallest plan is held against exhaustive search of its plan space,
every plan evaluated exactly.
"""

import pytest
import torch

from dsgraph.analysis.plan import fx_plan
from dsgraph.analysis.step_model import StepModel
from dsgraph.analysis.timeline import Interval, stitch
from dsgraph.errors import BudgetError
from dsgraph.recompute import truth
from dsgraph.recompute.cuts import candidate_cuts
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.model import PlanEvaluator
from dsgraph.recompute.options import POLICIES, Intervals
from dsgraph.recompute.planner import external_bytes, plan_checkpoint
from tests import zoo

NAMES = ["gated", "llama", "gpt24", "cnn", "masked", "vit"]


def _requires(name):
    if not zoo.available(name):
        pytest.importorskip("transformers")


_captured: dict = {}


def captured(name: str, per_block: bool = False) -> truth.JointCapture:
    """The joint graph of one training step of the zoo model (one capture per model)."""
    key = (name, per_block)
    if key not in _captured:
        model, inputs = zoo.build(name, per_block=per_block)
        _captured[key] = truth.capture_joint(model, inputs)
    return _captured[key]


def stock_peak(j: truth.JointCapture, executor: str) -> int:
    """The stock partition's predicted peak (what Inductor's partitioner saved)."""
    return j.stock_prediction(executor)


def fx_truth(plan, j: truth.JointCapture) -> int:
    """FX's own plan of the graphs the planner built, stitched over the step."""
    fw, bw = plan.forward, plan.backward
    saved = [n.name for n in bw.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]
    joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], j.kwargs.get("static_lifetime_input_indices") or [])
    return stitch(fx_plan(fw), fx_plan(bw), [Interval("primals", external_bytes(joint), 0, 0)], saved).peak_bytes


def smallest(j: truth.JointCapture, executor: str, workers: int | None = None) -> BudgetError:
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor=executor, workers=workers)
    return info.value


@pytest.mark.parametrize("name", NAMES)
def test_stock_prediction_is_fxs_own_plan(name):
    _requires(name)
    model, inputs = zoo.build(name)
    real = truth.compiled_peaks(model, inputs, truth.stock, inductor=False)
    assert stock_peak(real.joint, "fx") == real.fx_peak


@pytest.mark.parametrize("name", NAMES)
def test_budgets_are_met_as_predicted_and_monotone_fx(name):
    _requires(name)
    j = captured(name)
    error = smallest(j, "fx")
    low, bound = error.smallest_feasible, error.lower_bound
    stock = stock_peak(j, "fx")
    assert bound <= low < stock
    peaks = []
    for i in range(4):
        budget = stock - (stock - low) * i // 3
        plan = plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor="fx")
        assert plan.predicted_peak <= budget
        assert fx_truth(plan, j) == plan.predicted_peak  # honoured as predicted: FX's plan of those graphs
        peaks.append(plan.predicted_peak)
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] == low < peaks[0]


@pytest.mark.parametrize("executor", ["fx", "inductor"])
@pytest.mark.parametrize("name", NAMES)
def test_smallest_plan_is_at_or_below_per_block_checkpointing(name, executor):
    """The hand-written baseline is compiled as it is (its own stock partition, which
    honours torch.utils.checkpoint's recompute tags) and predicted the same way."""
    _requires(name)
    low = smallest(captured(name), executor).smallest_feasible
    per_block = stock_peak(captured(name, per_block=True), executor)
    assert low <= per_block, f"{name}: smallest plan {low} B, per-block checkpointing {per_block} B"


def test_per_block_prediction_is_fxs_own_plan():
    """The baseline's FX prediction is FX's own plan of its compiled step (CNN: BatchNorm
    buffers, recompute tags, random-free)."""
    model, inputs = zoo.build("cnn", per_block=True)
    real = truth.compiled_peaks(model, inputs, truth.stock, inductor=False)
    assert stock_peak(real.joint, "fx") == real.fx_peak


def _all_plans(intervals: Intervals, max_len: int):
    """Every sequence of options covering the segments (the planner's whole plan space)."""
    m = intervals.segments

    def rest(k):
        if k == m:
            yield []
            return
        for length in range(1, min(max_len, m - k) + 1):
            for policy in POLICIES:
                for tail in rest(k + length):
                    yield [intervals.option(policy, k, k + length)] + tail

    return rest(0)


@pytest.mark.parametrize("executor", ["fx", "inductor"])
def test_smallest_plan_against_exhaustive_search(executor):
    """A gated layer (under 200 joint nodes, 7 segments): every plan of the planner's space
    (11661 option sequences) evaluated exactly; the planner's smallest plan is the
    smallest of them all."""
    from dsgraph.analysis.cost_model import CostModel
    from dsgraph.recompute import planner

    torch.manual_seed(0)
    model = zoo.GatedNet(dim=23, hidden=41, layers=1)
    j = truth.capture_joint(model, (torch.randn(97, 23),))
    assert len(j.gm.graph.nodes) < 200
    static = j.kwargs.get("static_lifetime_input_indices") or []
    joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], static)
    stock = {n for n in joint.forward if n.name in set(j.stock_saved)}
    sm = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static, external=external_bytes(joint))
    intervals = Intervals(joint, candidate_cuts(joint), stock, CostModel(j.gm), set(), max_len=planner.MAX_SPAN)
    evaluator = PlanEvaluator(joint, sm, intervals, executor)
    assert intervals.segments <= 7  # keeps the enumeration to seconds
    plans = list(_all_plans(intervals, planner.MAX_SPAN))
    best = min(evaluator.evaluate(plan).peak.peak for plan in plans)
    low = smallest(j, executor).smallest_feasible
    assert low == best, f"planner {low} B, exhaustive {best} B over {len(plans)} plans"


# the Inductor executor on the models whose planning takes seconds on CPU; the 24-layer GPT
# (tens of seconds per plan there) with FX only
WORKER_CASES = [(n, "fx") for n in NAMES] + [(n, "inductor") for n in ("llama", "cnn", "masked")]


@pytest.mark.parametrize("name,executor", WORKER_CASES)
def test_forked_workers_give_the_same_plans_on_the_zoo(name, executor):
    """The planner's forked evaluation workers (recompute.workers) on models beyond the
    unit test's gated network: at the smallest plan and halfway to the stock peak, the
    same candidates, saved values and prediction with 2 workers as in-process."""
    from dsgraph.recompute import workers

    if not workers.can_fork():
        pytest.skip("the planner's workers are forked processes (Linux)")
    _requires(name)
    j = captured(name)
    low = smallest(j, executor, workers=1).smallest_feasible
    assert smallest(j, executor, workers=2).smallest_feasible == low
    budget = (stock_peak(j, executor) + low) // 2
    plans = [plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor=executor, workers=count)
             for count in (1, 2)]
    assert plans[0].regions, "halfway, the plan must recompute something"
    assert plans[1].candidates == plans[0].candidates
    assert [t.name for t in plans[1].saved] == [t.name for t in plans[0].saved]
    assert plans[1].predicted_peak == plans[0].predicted_peak
