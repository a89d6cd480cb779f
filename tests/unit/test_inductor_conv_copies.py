"""The gradient pool's convolution weights in the emulated backward (issue 12, a pooled
ResNet-18's smallest plan predicted 6.2% low on a CPU): the backward receives each weight as
a contiguous handle, and ``convolution_backward`` copies it to channels last for the input
gradient, with layout optimization (a recomputed convolution) and without it (the saved
input arrives channels last); never for the stem, which computes no input gradient. A
fallback's pooled weight gradient is freed after its copy into the slot, right after its
kernel, not on the clock of the unfused kernels."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dsgraph.analysis import step_model
from dsgraph.analysis.step_model import StepModel
from dsgraph.recompute import truth


class _TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.norm, self.conv = nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)

    def forward(self, x):
        return self.conv(F.relu(self.norm(self.stem(x)))).square().mean()


def _pooled_backward(recompute: bool, monkeypatch):
    torch.manual_seed(0)
    module = _TwoConvs()
    j = truth.capture_joint(module, (torch.randn(2, 3, 11, 9),))
    primals = [n for n in j.gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    outputs = list(j.gm.graph.output_node().args[0])[j.kwargs["num_fwd_outputs"]:]
    # the parameters are the primals with a gradient (the input batch and the BatchNorm's
    # statistics have none): the pool takes their gradients, the backward has their handles
    params = {p: o for p, o in zip(primals, outputs) if o is not None}
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], j.kwargs.get("static_lifetime_input_indices") or [],
                      pooled=frozenset(o.name for o in params.values()), handled=frozenset(p.name for p in params))
    runs = []
    emulate = step_model.emulate
    monkeypatch.setattr(step_model, "emulate", lambda g, rules: runs.append(emulate(g, rules)) or runs[-1])
    by_name = {n.name: n for n in j.gm.graph.nodes}
    saved = primals if recompute else [by_name[n] for n in j.stock_saved]  # recompute: only the primals saved
    model.evaluate([model.index[n] for n in saved], "inductor")
    shapes = {"stem": (8, 3, 3, 3), "conv": (8, 8, 3, 3)}
    weights = {name: model.index[p] for p in params for name, shape in shapes.items()
               if tuple(p.meta["val"].shape) == shape}
    return model, runs[1], weights


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
def test_the_backward_copies_a_handled_weight_for_the_input_gradient_only(recompute, monkeypatch):
    model, backward, weights = _pooled_backward(recompute, monkeypatch)
    copies = [b for b in backward.buffers if not b.input and b.node in weights.values()]
    readers = {(model.nodes[b.node].name, model.nodes[backward.schedule[b.end]].target) for b in copies}
    conv, stem = model.nodes[weights["conv"]].name, model.nodes[weights["stem"]].name
    # the stem's convolution_backward computes no input gradient: its weight is not copied
    expected = {(conv, torch.ops.aten.convolution_backward.default)}
    if recompute:  # layout optimization on: each recomputed convolution copies its weight too
        expected |= {(conv, torch.ops.aten.convolution.default), (stem, torch.ops.aten.convolution.default)}
    assert readers == expected, readers  # each freed after the kernel it is made for


def test_a_fallbacks_pooled_weight_gradient_is_freed_at_its_kernel(monkeypatch):
    model, backward, _ = _pooled_backward(False, monkeypatch)
    grads = [b for b in backward.buffers if not b.input and b.nbytes
             and model.nodes[b.node].target is torch.ops.aten.convolution_backward.default]
    weight_grads = [b for b in grads if b.nbytes in (8 * 8 * 3 * 3 * 4, 8 * 3 * 3 * 3 * 4)]
    assert len(weight_grads) == 2
    assert all(max(b.end, b.start) == b.start for b in weight_grads), [(b.start, b.end) for b in weight_grads]
