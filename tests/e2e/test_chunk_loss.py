"""chunk_loss through torch.compile: loss and every gradient (tied embeddings included)
against eager for each pattern (GPT's head, an untied projection with a bias, ignore_index,
label smoothing, mean and sum, transformers' causal-LM loss), bf16 autocast within the bf16
rule, a dynamic sequence length, the gradient pool, a memory budget, a model without the
pattern left alone, and the predicted peak dropping by about the logits' bytes. Graphs run
as FX code (inductor=False) except the tests marked e2e (CPU Inductor)."""

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgraph
from dsgraph.models import GPT, MLP, GPTConfig, gpt_inputs
from dsgraph.testing import check_training_step, fp32_exact

FX = {"inductor": False, "fallback": "error"}


def tiny_gpt(seq=19, vocab=101, dim=32, layers=2):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=vocab, seq=seq, layers=layers, heads=2, dim=dim)
    return GPT(cfg), cfg


def pre_grad_stats():
    reports = [r for r in dsgraph.reports() if r.kind == "pre_grad"]
    assert reports, "no pre_grad stage ran"
    (record,) = [p for p in reports[-1].passes if p.name == "chunk_loss"]
    return record


def test_gpt_tied_head_matches_eager_with_a_ragged_last_chunk():
    model, cfg = tiny_gpt()
    inputs = gpt_inputs(cfg, batch=3, seed=1)  # 57 tokens: chunks of 15, the last of 12
    result = check_training_step(model, inputs, {**FX, "chunk_loss": 4})
    assert len(result.rows) == 1 + len(list(model.parameters()))  # the tied weight once, checked
    record = pre_grad_stats()
    assert record.changed and record.stats["chunks"] == "4" and record.stats["chunk_tokens"] == "15"
    assert record.stats["logits_bytes"] == 57 * 101 * 4


class LossOptionsLM(nn.Module):
    """Untied output projection with a bias; cross_entropy's options from the test."""

    def __init__(self, vocab=67, dim=24, **ce):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, vocab)
        self.ce = ce

    def forward(self, idx, targets):
        logits = self.head(self.block(self.tok(idx)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), **self.ce)


def lm_batch(vocab, b, t, seed, ignore=None):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (b, t), generator=g)
    targets = torch.randint(0, vocab, (b, t), generator=g)
    if ignore is not None:
        targets[torch.rand(b, t, generator=g) < 0.3] = ignore
    return idx, targets


@pytest.mark.parametrize("ce, chunks", [
    (dict(reduction="mean", ignore_index=-100), 3),
    (dict(reduction="sum", ignore_index=7), 5),
    (dict(reduction="mean", label_smoothing=0.1, ignore_index=-1), 2),
    (dict(reduction="sum", label_smoothing=0.2), 6),
])
def test_untied_bias_ignore_index_label_smoothing_mean_and_sum(ce, chunks):
    torch.manual_seed(2)
    model = LossOptionsLM(**ce)
    inputs = lm_batch(67, 3, 13, seed=chunks, ignore=ce.get("ignore_index"))
    if "ignore_index" in ce:
        assert (inputs[1] == ce["ignore_index"]).any() and (inputs[1] != ce["ignore_index"]).any()
    check_training_step(model, inputs, {**FX, "chunk_loss": chunks})
    assert pre_grad_stats().changed


class CausalLMLoss(nn.Module):
    """A decoder whose loss is transformers' ForCausalLMLoss (5.x), written out: fp32
    upcast, labels padded with -100 and shifted by one, logits.view(-1, V)."""

    def __init__(self, vocab=59, dim=20):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.LayerNorm(dim))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.vocab = vocab

    def forward(self, input_ids, labels):
        logits = self.lm_head(self.body(self.wte(input_ids)))
        logits = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)
        shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, self.vocab)
        shift_labels = shift_labels.view(-1).to(logits.device)
        return F.cross_entropy(logits, shift_labels, ignore_index=-100, reduction="mean")


def test_transformers_causal_lm_loss_path_written_out():
    torch.manual_seed(3)
    model = CausalLMLoss()
    idx, labels = lm_batch(59, 2, 17, seed=4)
    labels[:, :5] = -100  # a masked prompt
    check_training_step(model, (idx, labels), {**FX, "chunk_loss": 3})
    assert pre_grad_stats().changed


class HFWithLoss(nn.Module):
    """transformers' GPT2LMHeadModel with transformers' own ForCausalLMLoss applied outside
    the model (``labels=`` breaks Dynamo's graph: FACTS.md)."""

    def __init__(self, lm, loss_fn):
        super().__init__()
        self.lm = lm
        self.loss_fn = loss_fn

    def forward(self, input_ids, labels):
        logits = self.lm(input_ids=input_ids, use_cache=False).logits
        return self.loss_fn(logits, labels, vocab_size=self.lm.config.vocab_size)


def test_transformers_gpt2_with_its_causal_lm_loss():
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=97,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(4)
    model = HFWithLoss(transformers.GPT2LMHeadModel(config), ForCausalLMLoss)
    idx, labels = lm_batch(97, 2, 21, seed=5)
    labels[0, :6] = -100
    check_training_step(model, (idx, labels), {**FX, "chunk_loss": 4})
    record = pre_grad_stats()
    assert record.changed and record.stats["chunks"] == "4"


def rmse(a, b):
    return float((a.detach().double() - b.detach().double()).square().mean().sqrt())


def test_bf16_autocast_within_the_bf16_rule(tmp_path):
    """Under CPU bf16 autocast the projection runs in bf16 and the loss in fp32 (GPT's
    .float()); against the model in fp64, dsgraph's loss and gradients are within
    2 x eager autocast's RMSE + 1e-3."""
    model, cfg = tiny_gpt(seq=23, vocab=131)
    idx, targets = gpt_inputs(cfg, batch=3, seed=6)

    def step(fn, m, autocast):
        for p in m.parameters():
            p.grad = None
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            loss = fn(idx, targets)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    m64 = copy.deepcopy(model).double()
    exact = step(m64, m64, False)
    eager = step(model, model, True)
    mc = copy.deepcopy(model)
    compiled = torch.compile(mc, backend="dsgraph", options={**FX, "chunk_loss": 3, "dump_dir": str(tmp_path)})
    got = step(compiled, mc, True)
    assert rmse(got[0], exact[0]) <= 2 * rmse(eager[0], exact[0]) + 1e-3
    for name in exact[1]:
        assert got[1][name].dtype == torch.float32
        assert rmse(got[1][name], exact[1][name]) <= 2 * rmse(eager[1][name], exact[1][name]) + 1e-3, name
    (folder,) = [d for d in os.listdir(tmp_path) if d.endswith("_pre_grad")]
    plan = (tmp_path / folder / "chunk_loss.md").read_text()
    assert "matmul in torch.bfloat16, loss in torch.float32" in plan and "tied" in plan


def test_dump_shows_the_plan_and_the_forward_repro_runs(tmp_path):
    model, cfg = tiny_gpt()
    compiled = torch.compile(model, backend="dsgraph", options={**FX, "chunk_loss": 3, "dump_dir": str(tmp_path)})
    compiled(*gpt_inputs(cfg, batch=2, seed=14)).backward()
    (cid,) = [d[:-len("_pre_grad")] for d in os.listdir(tmp_path) if d.endswith("_pre_grad")]
    pre = tmp_path / f"{cid}_pre_grad"
    assert sorted(os.listdir(pre)) == ["00_input.py", "01_chunk_loss.py", "chunk_loss.md"]
    assert "linear_cross_entropy(" in (pre / "01_chunk_loss.py").read_text()
    assert "chunks: 3 of 13 tokens" in (pre / "chunk_loss.md").read_text()
    forward = tmp_path / f"{cid}_forward"
    assert "torch.ops.dsgraph.linear_cross_entropy_grads.default(" in (forward / "repro.py").read_text()
    done = subprocess.run([sys.executable, "repro.py"], cwd=forward, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_dynamic_sequence_length_one_compile_and_exact_at_each_length():
    """mark_dynamic on the sequence: chunks of a fixed token count planned at the first
    length, the count follows the length at run time; one compile serves three lengths."""
    model, cfg = tiny_gpt(seq=40)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={**FX, "chunk_loss": 3})
    with fp32_exact():
        for i, t in enumerate((31, 23, 37)):
            g = torch.Generator().manual_seed(10 + i)
            idx = torch.randint(0, cfg.vocab, (2, t), generator=g)
            tgt = torch.randint(0, cfg.vocab, (2, t), generator=g)
            torch._dynamo.mark_dynamic(idx, 1)
            torch._dynamo.mark_dynamic(tgt, 1)
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
            loss = compiled(idx, tgt)
            loss.backward()
            ref_loss = ref(idx, tgt)
            ref_loss.backward()
            assert abs(float(loss - ref_loss)) <= 1e-5 * float(ref_loss)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                assert float((p.grad - q.grad).norm() / q.grad.norm()) <= 1e-5, (t, name)
    pre = [r for r in dsgraph.reports() if r.kind == "pre_grad"]
    assert len(pre) == 1  # one compile for the three lengths
    stats = pre[0].passes[0].stats
    assert stats["chunks"] == "3" and stats["chunk_tokens"] == str(-(-2 * 31 // 3))


def test_gradient_pool_accumulates_like_eager():
    """grad_pool with chunking: two steps accumulate (different data per step)."""
    model, cfg = tiny_gpt()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={**FX, "chunk_loss": 3, "grad_pool": True})
    with fp32_exact():
        for seed in (1, 2):
            inputs = gpt_inputs(cfg, batch=2, seed=seed)
            compiled(*inputs).backward()
            ref(*inputs).backward()
    assert dsgraph.grad_pool(model) is not None
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert float((p.grad - q.grad).norm() / q.grad.norm()) <= 1e-5, name


def test_memory_budget_turns_chunking_on_and_sizes_the_chunks():
    model, cfg = tiny_gpt(seq=32, vocab=257)
    inputs = gpt_inputs(cfg, batch=4, seed=7)
    check_training_step(model, inputs, {**FX, "memory_budget": "1TiB"})
    assert pre_grad_stats().stats["chunks"] == "1"  # no pressure: one chunk
    stock = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory["checkpoint_stock_peak"]
    dsgraph.clear_reports()
    check_training_step(model, inputs, {**FX, "memory_budget": stock})
    record = pre_grad_stats()
    assert int(record.stats["chunks"]) > 1
    assert record.stats["workspace_bytes"] <= stock  # one chunk's buffers within a share of the budget
    memory = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    assert memory["checkpoint_predicted_peak"] <= stock
    dsgraph.clear_reports()
    check_training_step(model, inputs, {**FX, "memory_budget": stock, "chunk_loss": False})
    assert not [r for r in dsgraph.reports() if r.kind == "pre_grad"]


def test_pipeline_argument_is_the_same_as_the_option():
    model, cfg = tiny_gpt()
    inputs = gpt_inputs(cfg, batch=2, seed=8)
    check_training_step(model, inputs, {**FX, "chunk_loss": 5})
    a = pre_grad_stats().stats
    dsgraph.clear_reports()
    check_training_step(model, inputs, {**FX, "pipeline": "chunk_loss{chunks=5},lifetimes"})
    assert pre_grad_stats().stats == a


def test_a_model_without_the_pattern_is_left_alone_and_says_why():
    torch.manual_seed(9)
    model = MLP(width=24, depth=3)
    x = torch.randn(7, 24)
    check_training_step(model, (x,), {**FX, "chunk_loss": True}, reference={**FX, "chunk_loss": False},
                        bitwise=True)
    record = pre_grad_stats()
    assert not record.changed and record.stats == {"sites": 0, "reason": "no cross_entropy in the graph"}


def test_without_gradients_the_chunked_loss_equals_eager():
    model, cfg = tiny_gpt()
    inputs = gpt_inputs(cfg, batch=3, seed=11)
    compiled = torch.compile(model, backend="dsgraph", options={**FX, "chunk_loss": 4})
    with torch.no_grad(), fp32_exact():
        got, ref = compiled(*inputs), model(*inputs)
    assert abs(float(got - ref)) <= 1e-5 * float(ref)
    assert [r.kind for r in dsgraph.reports()] == ["pre_grad", "inference"]


@pytest.mark.parametrize("executor", ["fx", "fused"])
def test_predicted_peak_drops_by_about_the_logits(executor):
    """On a model whose logits dominate, memory_profile's prediction (FX execution, and
    Inductor's plan predicted from FX) falls by about the logits' bytes: at least the logits
    less one chunk's buffers (the op's workspace, which the prediction counts) and the op's
    gradient outputs (made in the forward, alive at its step), and less than all the
    full-size loss tensors of the unchunked step (logits, log-probabilities, their
    gradients: four of them in FX execution)."""
    model, cfg = tiny_gpt(seq=64, vocab=4001, layers=1)
    inputs = gpt_inputs(cfg, batch=4, seed=12)
    logits = 4 * 64 * 4001 * 4
    peaks = {}
    for chunks in (False, 8):
        prof = dsgraph.memory_profile(model, *inputs, inductor=False, chunk_loss=chunks)
        peaks[chunks] = prof.timelines[executor].peak_bytes if executor == "fused" else prof.fx_peak_bytes
    workspace = pre_grad_stats().stats["workspace_bytes"]
    outputs = (4 * 64 + 4001) * 32 * 4  # the op's gradients of x and of the weight, made in the forward
    assert workspace + outputs < logits / 3
    drop = peaks[False] - peaks[8]
    assert logits - workspace - outputs <= drop < 4 * logits, (peaks, logits, workspace)


@pytest.mark.e2e
def test_inductor_with_a_budget_and_the_pool_matches_eager_and_counts_the_workspace():
    """Through CPU Inductor: the chunked op is a fallback kernel, the pooled backward adds
    the tied weight's two gradients into its slot; the budget check holds Inductor's own
    plan (with the op's workspace) against the budget."""
    from dsgraph.memory import step_timelines
    from dsgraph.report.capture import capture

    model, cfg = tiny_gpt(seq=32, vocab=257)
    inputs = gpt_inputs(cfg, batch=4, seed=13)
    with capture() as captured:
        check_training_step(model, inputs, {"fallback": "error", "chunk_loss": 3, "memory_budget": "1TiB",
                                            "grad_pool": True})
    record = pre_grad_stats()
    assert record.changed and record.stats["chunks"] == "3"
    joint = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    assert joint["checkpoint_inductor_peak"] >= record.stats["workspace_bytes"]
    (compiled,) = [c for c in captured.compiles if "backward" in c.stages]
    timelines = step_timelines(compiled, [])
    for name in ("inductor", "fused", "fx"):  # Inductor's own plan of the compiled graphs, and both predictions
        (ws,) = [iv for iv in timelines[name].intervals if iv.label.endswith(":workspace")]
        assert ws.nbytes == record.stats["workspace_bytes"] and ws.start == ws.end, name
