"""The checkpoint planner on a bf16 ResNet-50 (tests/zoo.py ``resnet50``: torchvision's
structure at base width 8, batch 4 x 64²), as FX code.

Under autocast every convolution reads the images' (or the previous layer's) bf16 values
and its weight's bf16 cast, a static value. ``JointGraph`` counted a value computed from
data inputs and static values as input-only (free to keep across a cut), so the whole
network was input-only, no cut was crossed by a byte, and the planner found 2 segments: on
the H200 its smallest plan was 3.37 GiB against 3.08 GiB for Inductor's
``activation_memory_budget=0.5`` (docs/BENCHMARKS.md, session 12). A static value derived
from a parameter is not an input now."""

import pytest
import torch

from dsgraph.errors import BudgetError
from dsgraph.recompute import truth
from dsgraph.recompute.cuts import candidate_cuts
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.planner import plan_checkpoint
from tests import zoo

_cache: dict = {}


def _joint() -> tuple[truth.JointCapture, JointGraph]:
    if "j" not in _cache:
        model, inputs = zoo.build("resnet50")
        j = truth.capture_joint(model, inputs, torch.bfloat16)
        _cache["j"] = (j, JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"],
                                           j.kwargs.get("static_lifetime_input_indices") or []))
    return _cache["j"]


def _smallest_fx(j: truth.JointCapture) -> int:
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor="fx")
    return info.value.smallest_feasible


@pytest.mark.e2e
def test_bf16_convolutions_are_activations_and_each_block_has_a_cut():
    _, joint = _joint()
    convs = [n for n in joint.forward if n.target is torch.ops.aten.convolution.default]
    assert len(convs) == 53
    assert not [n.name for n in convs if joint.is_free(n)]
    cuts = candidate_cuts(joint)
    # 16 bottlenecks, each ending in relu(add(...)): every block output has a cut crossed
    # by it alone, but the last, after which the pooled head's cuts are cheaper (80 B);
    # a positional thinning window once lost the first stage's outputs beside max
    # pooling's 16 KB cut
    outs = [n for n in joint.forward
            if n.target is torch.ops.aten.relu.default and n.args[0].target is torch.ops.aten.add.Tensor]
    assert len(outs) == 16
    alone = {c.crossing[0] for c in cuts if len(c.crossing) == 1}
    assert [o.name for o in outs if o not in alone] == [outs[-1].name], [(c.position, c.nbytes) for c in cuts]


@pytest.mark.e2e
def test_cuts_start_after_the_empty_stem_and_hold_max_poolings_outputs():
    """The weight casts before the stem's convolution cross nothing: those cuts are the
    start itself (dropped), and a cut after max pooling holds its outputs."""
    _, joint = _joint()
    cuts = candidate_cuts(joint)
    assert [c.position for c in cuts if not c.crossing] == [0, len(joint.forward)]
    pool = next(n for n in joint.forward if "max_pool" in str(n.target))
    after_pool = [c for c in cuts if joint.position[pool] < c.position < joint.position[pool] + 20]
    assert after_pool, [(c.position, c.nbytes) for c in cuts[:4]]


@pytest.mark.e2e
def test_smallest_plan_is_fxs_own_plan():
    j, _ = _joint()
    low = _smallest_fx(j)
    model, inputs = zoo.build("resnet50")
    made = {}

    def choose(gm, joint_inputs, kwargs):
        made["plan"] = plan_checkpoint(gm, joint_inputs, kwargs, low, executor="fx")
        return made["plan"].forward, made["plan"].backward

    real = truth.compiled_peaks(model, inputs, choose, inductor=False, autocast=torch.bfloat16)
    assert made["plan"].predicted_peak == real.fx_peak == low
    assert made["plan"].segments >= 16


@pytest.mark.e2e
def test_smallest_plan_is_at_or_below_per_block_checkpointing():
    j, _ = _joint()
    model, inputs = zoo.build("resnet50", per_block=True)
    per_block = truth.compiled_peaks(model, inputs, truth.stock, inductor=False, autocast=torch.bfloat16).fx_peak
    assert _smallest_fx(j) <= per_block
