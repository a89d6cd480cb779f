"""inductor_plan: the tensors a multi-output kernel returns exist from the step its op runs.

Inductor schedules an opaque op with several outputs (a custom op, SDPA, dsgraph's chunked
loss) as a container whose ``MultiOutput`` children take the tensors out of the returned
tuple at later steps; the op itself allocated them while it ran. Placed at the children's
steps, the plan missed them at the op's step: on the H200 the GPU budget test's forward
peak (the chunked loss's op, with its workspace) was 160 MiB (the weight and input
gradients it returns) over the plan (``benchmarks.alloc_replay``, session 8)."""

import pytest
import torch

from dsgraph.analysis.inductor_plan import GraphCapture, inductor_plan

pytestmark = pytest.mark.e2e


@torch.library.custom_op("dsgraph_test::two_outputs", mutates_args=())
def two_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x.repeat(2, 1)


@two_outputs.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty(2 * x.shape[0], x.shape[1])


def test_multi_output_children_allocate_at_their_kernels_step(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def fn(x):
        a, b = two_outputs(x.sin())
        return a.cos().sum() + b.tan().sum()

    torch._dynamo.reset()
    with GraphCapture().active() as cap:
        torch.compile(fn, backend="inductor")(torch.randn(64, 32))
    (graph,) = cap.graphs
    plan = inductor_plan(graph)
    nodes = graph.scheduler.nodes
    container = next(i for i, s in enumerate(nodes) if type(s.node).__name__ == "FallbackKernel")
    children = [s.get_name() for s in nodes if type(s.node).__name__ == "MultiOutput"]
    blocks = {b.name: b for b in plan.blocks}
    outs = [blocks[n] for s in nodes if type(s.node).__name__ == "MultiOutput" for n in [s.node.get_name()]]
    assert len(children) == 2 and len(outs) == 2
    assert all(b.start == container for b in outs), (container, [(b.name, b.start) for b in outs])
    assert sorted(b.nbytes for b in outs) == [64 * 32 * 4, 2 * 64 * 32 * 4]
