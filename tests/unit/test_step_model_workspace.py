"""StepModel counts what an op allocates for itself (its registered workspace) at the op's
step, as the FX and Inductor plans the post-compile check reads do: without it the planner
predicted the chunked loss's step below what the check then measured."""

import pytest
import torch
from models import ChunkedHead

from dsgraph.analysis.step_model import StepModel
from dsgraph.analysis.workspace import workspace_bytes
from dsgraph.recompute import truth


@pytest.mark.parametrize("executor", ["fx", "inductor"])
def test_the_ops_workspace_is_live_at_its_step(executor):
    torch.manual_seed(0)
    j = truth.capture_joint(ChunkedHead(), (torch.randn(70, 24), torch.randint(0, 301, (70,))))
    static = j.kwargs.get("static_lifetime_input_indices") or []
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static)
    ops = {i: w for i, n in enumerate(model.nodes) if (w := workspace_bytes(n))}
    assert ops, "the chunked op is in the joint graph with a workspace"
    by_name = {n.name: n for n in j.gm.graph.nodes}
    saved = [model.index[by_name[n]] for n in j.stock_saved]
    with_ws = model.evaluate(saved, executor)
    model.workspace = {}
    without = model.evaluate(saved, executor)
    steps = [k for k, (_, i) in enumerate(with_ws.steps) if i in ops]
    assert steps, "the op runs at a step of its own"
    for k in steps:
        assert with_ws.live[k] - without.live[k] == ops[with_ws.steps[k][1]]
    assert with_ws.peak >= without.peak
