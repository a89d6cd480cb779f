"""The CPU scheduler fuses two independent pointwise kernels horizontally only when their
loops agree (``CppScheduling._why_fuse_nodes``: the same loop sizes), and a kernel's loop
runs in the order of the buffer it writes (``simplify_and_reorder`` picks the loop order
from the store's strides and the reads'), not in the order of the FX node's sizes.

Llama's smallest plan was predicted 3.16% low because of this (issue 12): the recomputed
layer's rotated q, which the attention backward wants as (batch, heads, positions, head
size) with the heads inside the positions in memory, iterates (batch, positions, heads,
head size); Inductor fused it with the rotary backward of the later layer's q gradient
(a contiguous (batch, positions, heads, head size)), the emulation with the later layer's
rotated q, which ran the recomputation before the later layer's attention backward and
raised the wrapper's peak estimate enough to refuse a pooled buffer Inductor reuses.

Both cases below were read from Inductor's generated CPU code (torch 2.13): ``q`` (sizes
(3, 4, 7, 8), strides (224, 8, 32, 1)) and ``g`` (a contiguous (3, 7, 4, 8)) are computed
in one loop nest over (3, 7, 4, 8); with ``g`` a contiguous (3, 4, 7, 8) instead, the same
FX sizes as ``q``, they are two kernels."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgraph.analysis.step_model as step_model
from dsgraph.analysis.inductor_ops import loop_shape
from dsgraph.analysis.step_model import StepModel
from dsgraph.recompute import truth


def test_the_loop_runs_in_the_order_of_the_strides():
    x = torch.empty(3, 7, 4, 8)
    assert loop_shape(x) == (3, 7, 4, 8)
    assert loop_shape(x.transpose(1, 2)) == (3, 7, 4, 8)
    assert loop_shape(torch.empty(3, 4, 7, 8)) == (3, 4, 7, 8)
    assert loop_shape(torch.empty(3, 1, 7, 8).transpose(2, 3)) == (3, 7, 8)  # size 1 left out


class QAndGate(nn.Module):
    """``q`` for the attention (a transposed view times a table) and ``g`` for a matmul
    (the same table read), independent of each other: ``permuted=True`` gives ``g`` the
    positions-then-heads memory order of ``q``, ``False`` the FX sizes of ``q``."""

    def __init__(self, permuted: bool, S=7, H=4, D=8):
        super().__init__()
        self.permuted, self.S, self.H, self.D = permuted, S, H, D
        self.wq = nn.Linear(H * D, H * D, bias=False)
        self.wg = nn.Linear(H * D, H * D, bias=False)
        self.wo = nn.Linear(H * D, H * D, bias=False)
        self.scale = nn.Parameter(torch.randn(S, D))

    def forward(self, x):
        B, S, H, D = x.shape[0], self.S, self.H, self.D
        q = self.wq(x).view(B, S, H, D).transpose(1, 2) * self.scale
        a = F.scaled_dot_product_attention(q, q, q)
        if self.permuted:
            g = self.wg(x).view(B, S, H, D) * self.scale[:, None, :]
        else:
            g = self.wg(x).view(B, H, S, D) * self.scale
        return (a.transpose(1, 2).reshape(B, S, H * D) + self.wo(g.reshape(B, S, H * D))).sum()


def stock_runs(module, inputs, monkeypatch):
    """The step model of ``module``'s joint graph and the emulated Inductor runs (forward,
    backward) of its stock partition."""
    j = truth.capture_joint(module, inputs)
    static = j.kwargs.get("static_lifetime_input_indices") or []
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static)
    runs = []
    emulate = step_model.emulate

    def spy(g, rules):
        runs.append(emulate(g, rules))
        return runs[-1]

    monkeypatch.setattr(step_model, "emulate", spy)
    by_name = {n.name: n for n in j.gm.graph.nodes}
    model.evaluate([model.index[by_name[n]] for n in j.stock_saved], "inductor")
    return j, model, runs


@pytest.mark.parametrize("permuted", [True, False])
def test_horizontal_fusion_compares_loops_in_memory_order(permuted, monkeypatch):
    torch.manual_seed(0)
    j, model, runs = stock_runs(QAndGate(permuted), (torch.randn(3, 7, 32),), monkeypatch)
    forward = runs[0]
    kernels = set(forward.kernels)
    muls = [model.index[n] for n in j.gm.graph.nodes
            if n.target is torch.ops.aten.mul.Tensor and model.index[n] in kernels]
    assert len(muls) == 2, [model.nodes[i].name for i in muls]  # q and g, each a kernel of its own before fusion
    together = [grp for grp in forward.groups if set(muls) <= set(grp)]
    assert bool(together) == permuted, [[model.nodes[i].name for i in grp] for grp in forward.groups]
