"""The checkpoint planner keeps the softmax's row statistics of a wide loss head.

A GPT's log-softmax over its vocabulary is a looped reduction in Inductor (rows wider than
``PERSISTENT_RNUMEL``): recomputing its row maximum and log-sum in the backward takes a
pass over the logits of its own (on the H200, 0.60 ms of a 24-layer GPT's step at
per-block checkpointing's memory, docs/BENCHMARKS.md session 21), while saving them costs a
row's worth of bytes. The stock partition saves them; a plan that recomputes the loss
head's pointwise ops (``cheap``) now saves them too. Captured on CPU under bf16 autocast,
the shape of the H200 step (bf16 logits, fp32 statistics), planned for Inductor."""

import torch

from dsgraph.analysis.cost_model import PERSISTENT_RNUMEL
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint


def test_plans_under_a_budget_save_the_loss_heads_row_statistics():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=4001, seq=64, layers=4, heads=2, dim=64)
    assert cfg.vocab > PERSISTENT_RNUMEL
    model, inputs = GPT(cfg), gpt_inputs(cfg, batch=4, seed=7)
    j = truth.capture_joint(model, inputs, autocast=torch.bfloat16)
    # what the stock partition saves of the loss head: the row maximum and the log-sum
    stats = {name for name in j.stock_saved if name.rstrip("_0123456789") in ("amax", "log")}
    assert sorted(s.rstrip("_0123456789") for s in stats) == ["amax", "log"]
    stock = j.stock_prediction("inductor")
    for share in (0.9, 0.8, 0.7):
        plan = plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, int(stock * share), executor="inductor", workers=1)
        assert plan.regions and plan.predicted_peak <= int(stock * share)
        saved = {s.name for s in plan.saved}
        assert stats <= saved, (share, sorted(stats - saved))
