"""The checkpoint planner's Inductor prediction under bf16 autocast, with chunk_loss at a
memory budget, against Inductor's own plans (CPU Inductor, plans read after code
generation).

Under autocast a weight's gradient is a bf16 matmul cast to the fp32 parameter's dtype,
and the cast is a graph output. Inductor stores a graph output that has dimensions when
it lowers it (``run_node``: ``require_exact_strides``), so the cast runs right after its
matmul and the bf16 product is freed there; the emulation stored every output at the end
of lowering, keeping the bf16 products of all layers alive through the backward in place
of the fp32 gradients (half their bytes): the smallest plan of the MLP below was predicted
3.99% low, and a bf16 GPT's plans with chunk_loss up to 9% low (docs/BENCHMARKS.md,
session 9). The fp32 zoo (tests/e2e/test_checkpoint_zoo_inductor.py) casts nothing and did
not see it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dsgraph.errors import BudgetError
from dsgraph.models import MLP
from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint
from dsgraph.runtime.linear_cross_entropy import GRADS_OP


class MLPLM(nn.Module):
    """Embedding, GELU MLP layers, an untied head and the cross-entropy chunk_loss replaces:
    weights larger than the activations of its 2 x 64 tokens, no attention."""

    def __init__(self, vocab=509, dim=256, depth=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx, targets):
        x = self.tok(idx)
        for layer in self.layers:
            x = F.gelu(layer(x))
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _smallest(j: truth.JointCapture) -> int:
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor="inductor")
    return info.value.smallest_feasible


def _error(model, inputs, budget_of, pre_grad_for=None) -> tuple[float, truth.JointCapture]:
    """(predicted / Inductor's plan - 1, the joint graph) of the plan made at
    ``budget_of(joint)``, with the pre_grad rewrite ``pre_grad_for(budget)`` when given (the
    chunk count follows the budget, as in a session: planned for the smallest plan's budget
    here, found on the graph chunked for the stock budget first)."""
    pre = pre_grad_for(1 << 50) if pre_grad_for else None
    j = truth.capture_joint(model, inputs, torch.bfloat16, pre)
    budget = budget_of(j)
    if pre_grad_for:
        pre = pre_grad_for(budget)
        j = truth.capture_joint(model, inputs, torch.bfloat16, pre)
        budget = budget_of(j)
    made = {}

    def choose(gm, joint_inputs, kwargs):
        made["plan"] = plan_checkpoint(gm, joint_inputs, kwargs, budget, executor="inductor")
        return made["plan"].forward, made["plan"].backward

    real = truth.compiled_peaks(model, inputs, choose, inductor=True, autocast=torch.bfloat16, pre_grad=pre)
    return made["plan"].predicted_peak / real.inductor_peak - 1, j


@pytest.mark.e2e
def test_mlp_smallest_plan_with_fp32_gradients_of_bf16_matmuls(tmp_path, monkeypatch):
    """Was -3.99% before the outputs were stored where Inductor lowers them."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = MLP(256, 4)
    x = torch.randn(512, 256, generator=torch.Generator().manual_seed(1))
    error, _ = _error(model, (x,), _smallest)
    assert abs(error) <= 0.03, f"{error:+.2%}"


@pytest.mark.e2e
def test_chunk_loss_at_the_smallest_budget_within_3_percent(tmp_path, monkeypatch):
    """chunk_loss planned for the budget, the planner's smallest plan under bf16 autocast:
    the prediction within 3% of Inductor's plans of the compiled graphs. A guard: it held
    before the fix too (0.00%); the GPT cases that moved are too slow for this suite or
    still outside 3% (docs/BENCHMARKS.md, session 9)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = MLPLM()
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 509, (2, 64), generator=g)
    targets = torch.randint(0, 509, (2, 64), generator=g)

    def pre_grad_for(budget):
        return lambda gm: apply_chunk_loss(gm, plan_chunk_loss(gm, budget=budget))

    error, j = _error(model, (idx, targets), _smallest, pre_grad_for)
    assert any(n.target is GRADS_OP for n in j.gm.graph.nodes), "chunk_loss did not rewrite the loss"
    assert abs(error) <= 0.03, f"{error:+.2%}"
