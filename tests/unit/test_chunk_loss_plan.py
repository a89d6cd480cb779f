"""chunk_loss on Dynamo graphs captured from small modules (no AOTAutograd, no Inductor):
which patterns are found and which are refused with a reason, the chunk count rules, and the
rewritten graph's loss and gradients against the original graph run eagerly."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dsgraph.passes import chunk_loss as cl
from dsgraph.runtime import linear_cross_entropy as lce


def capture(fn, *args, dynamic=()):
    """Dynamo's graph of ``fn(*args)`` and its example inputs (parameters lifted)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    for t, dim in dynamic:
        torch._dynamo.mark_dynamic(t, dim)
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0]


def loss_and_grads(gm, inputs):
    out = gm(*inputs)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return loss.detach(), torch.autograd.grad(loss * 1.3, wrt)  # an upstream gradient other than 1


def rewritten_matches_original(gm, inputs, plan, tol=1e-12):
    """fp64 models: ``tol`` 1e-12, or the fp32 rule's 1e-5 where the loss is computed in fp32
    (an fp32 upcast in the graph: only the chunking regroups sums)."""
    ref_loss, ref_grads = loss_and_grads(gm, inputs)
    new = cl.apply_chunk_loss(gm, plan)
    targets = [n.target for n in new.graph.nodes if n.op == "call_function"]
    assert lce.linear_cross_entropy in targets and F.cross_entropy not in targets
    loss, grads = loss_and_grads(new, inputs)
    assert loss.dtype == ref_loss.dtype and abs(float(loss - ref_loss)) <= tol * abs(float(ref_loss)), (loss, ref_loss)
    assert len(grads) == len(ref_grads) > 0
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype and float((g - r).norm() / r.norm()) <= tol


class TiedLM(nn.Module):
    """GPT's head: tied embedding and projection, logits.flatten(0, 1).float()."""

    def __init__(self, vocab=53, dim=12):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        logits = self.head(torch.tanh(self.mix(self.tok(idx))))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class BiasLM(nn.Module):
    """Untied projection with a bias; options of cross_entropy given by the test."""

    def __init__(self, vocab=41, dim=10, **ce):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)
        self.ce = ce

    def forward(self, idx, targets):
        logits = self.head(torch.sin(self.tok(idx)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), **self.ce)


class HFCausalLM(nn.Module):
    """transformers' ForCausalLMLoss path: fp32 upcast, labels padded with -100 and shifted,
    logits.view(-1, V), ignore_index=-100 (transformers 5.x code, written out)."""

    def __init__(self, vocab=37, dim=14):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.vocab = vocab

    def forward(self, input_ids, labels):
        logits = self.lm_head(torch.relu(self.wte(input_ids)))
        logits = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)
        shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, self.vocab)
        shift_labels = shift_labels.view(-1).to(logits.device)
        return F.cross_entropy(logits, shift_labels, ignore_index=-100, reduction="mean")


class ShiftedLogits(nn.Module):
    """The classic causal shift on the logits: logits[..., :-1, :].contiguous()."""

    def __init__(self, vocab=29, dim=9):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.proj = nn.Parameter(torch.randn(dim, vocab, dtype=torch.float64))

    def forward(self, idx, labels):
        logits = torch.cos(self.tok(idx)) @ self.proj  # a matmul with a (D, V) matrix
        shift_logits = logits[..., :-1, :].contiguous()
        return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), labels[..., 1:].contiguous().view(-1))


def tokens(vocab, b, t, seed, ignore=None):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (b, t), generator=g)
    targets = torch.randint(0, vocab, (b, t), generator=g)
    if ignore is not None:
        targets[torch.rand(b, t, generator=g) < 0.3] = ignore
    return idx, targets


@pytest.mark.parametrize("chunks", [1, 4, 7])
def test_tied_projection_is_found_and_the_rewrite_is_exact_in_fp64(chunks):
    torch.manual_seed(0)
    model = TiedLM().double()
    gm, inputs = capture(model, *tokens(53, 3, 11, seed=chunks))
    plan = cl.plan_chunk_loss(gm, chunks=chunks)
    (site,) = [s.site for s in plan.sites]
    assert site.kind == "linear" and site.tied and site.bias is None
    assert [m for _, _, m in site.chain] == ["flatten", "float"]
    assert site.tokens == 33 and site.vocab == 53 and site.dim == 12
    assert plan.sites[0].chunks == min(chunks, 33) and plan.sites[0].chunk_tokens == math.ceil(33 / chunks)
    assert site.mm_dtype == torch.float64 and site.loss_dtype == torch.float32  # the .float() upcast
    rewritten_matches_original(gm, inputs, plan, tol=1e-5)


@pytest.mark.parametrize("ce", [dict(reduction="sum"), dict(ignore_index=-1, label_smoothing=0.1),
                                dict(reduction="sum", ignore_index=5, label_smoothing=0.25)])
def test_bias_ignore_index_label_smoothing_and_sum(ce):
    torch.manual_seed(1)
    model = BiasLM(**ce).double()
    idx, targets = tokens(41, 2, 13, seed=3, ignore=ce.get("ignore_index"))
    gm, inputs = capture(model, idx, targets)
    plan = cl.plan_chunk_loss(gm, chunks=3)
    site = plan.sites[0].site
    assert site.bias is not None and not site.tied
    assert (site.reduction, site.ignore_index, site.label_smoothing) == (
        ce.get("reduction", "mean"), ce.get("ignore_index", -100), ce.get("label_smoothing", 0.0))
    rewritten_matches_original(gm, inputs, plan)


def test_transformers_causal_lm_loss_path():
    torch.manual_seed(2)
    model = HFCausalLM().double()
    idx, labels = tokens(37, 3, 10, seed=4)
    labels[0, :4] = -100  # a masked prompt
    gm, inputs = capture(model, idx, labels)
    plan = cl.plan_chunk_loss(gm, chunks=4)
    site = plan.sites[0].site
    assert site.tied and site.ignore_index == -100 and site.loss_dtype == torch.float32  # .float()
    assert [m for _, _, m in site.chain] == ["float", "view"]
    rewritten_matches_original(gm, inputs, plan, tol=1e-5)


def test_shift_on_the_logits_and_a_matmul_projection():
    torch.manual_seed(3)
    model = ShiftedLogits().double()
    gm, inputs = capture(model, *tokens(29, 2, 9, seed=5))
    plan = cl.plan_chunk_loss(gm, chunks=5)
    site = plan.sites[0].site
    assert site.kind == "matmul" and site.tokens == 2 * 8  # the last position of each row is dropped
    assert [m for _, _, m in site.chain] == ["getitem", "contiguous", "view"]
    rewritten_matches_original(gm, inputs, plan)


class MethodMatmul(nn.Module):
    """``h.matmul(E.t())`` with E the embedding table (tied, through a transpose)."""

    def __init__(self, vocab=31, dim=7):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)

    def forward(self, idx, targets):
        logits = torch.sigmoid(self.tok(idx)).matmul(self.tok.weight.t())
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def test_a_method_matmul_with_a_transposed_tied_table():
    torch.manual_seed(7)
    model = MethodMatmul().double()
    gm, inputs = capture(model, *tokens(31, 3, 7, seed=10))
    plan = cl.plan_chunk_loss(gm, chunks=4)
    site = plan.sites[0].site
    assert site.kind == "matmul" and (site.tokens, site.vocab, site.dim) == (21, 31, 7)
    rewritten_matches_original(gm, inputs, plan)


class Returns(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.tok = nn.Embedding(31, 8)
        self.head = nn.Linear(8, 31)
        self.how = how

    def forward(self, idx, targets):
        h = self.tok(idx)
        logits = self.head(h).flatten(0, 1)
        t = targets.flatten()
        if self.how == "logits_too":
            return F.cross_entropy(logits, t), logits
        if self.how == "class_weights":
            return F.cross_entropy(logits, t, weight=torch.ones(31))
        if self.how == "no_reduction":
            return F.cross_entropy(logits, t, reduction="none").sum()
        if self.how == "not_after_matmul":
            return F.cross_entropy(torch.tanh(logits), t)
        if self.how == "class_dim_1":
            return F.cross_entropy(self.head(h).transpose(1, 2), targets)
        return logits.square().mean()


@pytest.mark.parametrize("how, reason", [
    ("logits_too", "are also read by output"),
    ("class_weights", "with weight= is not chunked"),
    ("no_reduction", "reduction='none' is not chunked"),
    ("not_after_matmul", "no cross_entropy after a matmul"),
    ("class_dim_1", "not a 2-D tensor"),
    ("no_loss", "no cross_entropy in the graph"),
])
def test_graphs_without_the_pattern_are_left_alone_with_a_reason(how, reason):
    gm, _ = capture(Returns(how), *tokens(31, 2, 5, seed=6))
    before = gm.code
    plan = cl.plan_chunk_loss(gm, chunks=2)
    assert not plan.found and reason in plan.stats()["reason"], plan.stats()
    assert "pattern not found" in plan.text() and reason in plan.text()
    assert cl.apply_chunk_loss(gm, plan).code == before


def test_budget_rule_takes_the_smallest_count_whose_chunk_buffers_fit_the_share():
    torch.manual_seed(4)
    gm, _ = capture(TiedLM(vocab=211, dim=16), *tokens(211, 4, 50, seed=7))
    site = cl.find_loss_sites(gm)[0][0]
    n = site.tokens_hint
    per_token = cl._chunk_part(site, 1)
    assert per_token > 211 * 4  # at least the fp32 logits row
    for budget in (per_token * 40 * 16, per_token * 7 * 16 + 5, per_token * 16 * 1000):
        sp = cl.plan_site(site, budget=budget)
        limit = int(budget * cl.BUDGET_SHARE)
        assert cl._chunk_part(site, sp.chunk_tokens) <= limit
        if sp.chunks > 1:  # one chunk fewer would not fit
            assert cl._chunk_part(site, math.ceil(n / (sp.chunks - 1))) > limit
        assert "budget" in sp.rule
    assert cl.plan_site(site, budget=per_token * 16 * 1000).chunks == 1
    assert cl.plan_site(site, budget=per_token * 40 * 16).chunks == math.ceil(n / 40)
    # no budget: chunk buffers of at most DEFAULT_CHUNK_BYTES (one chunk for this small graph)
    assert cl.plan_site(site).chunks == 1 and "no budget" in cl.plan_site(site).rule



def test_a_budget_below_one_token_gives_one_token_per_chunk():
    """The 1-byte budget the smallest-feasible-budget probe uses (it divided by zero on the
    H200's GPU test): one token per chunk, and the checkpoint planner says what is feasible."""
    gm, _ = capture(TiedLM(vocab=211, dim=16), *tokens(211, 4, 50, seed=8))
    site = cl.find_loss_sites(gm)[0][0]
    for budget in (1, 15, cl._chunk_part(site, 1) * 8):
        sp = cl.plan_site(site, budget=budget)
        assert sp.chunk_tokens == 1 and sp.chunks == site.tokens_hint

def test_plan_reports_bytes_and_prints():
    torch.manual_seed(5)
    gm, _ = capture(TiedLM(vocab=101, dim=8), *tokens(101, 3, 20, seed=8))
    plan = cl.plan_chunk_loss(gm, chunks=6)
    sp = plan.sites[0]
    assert sp.logits_bytes == 60 * 101 * 4
    assert sp.unchunked_bytes == 2 * sp.logits_bytes  # fp32 matmul: no upcast, logits + gradient
    assert 0 < sp.workspace_bytes < sp.logits_bytes
    stats = plan.stats()
    assert stats["sites"] == 1 and stats["chunks"] == "6" and stats["chunk_tokens"] == "10"
    assert stats["avoided_bytes"] == sp.unchunked_bytes - sp.workspace_bytes
    text = plan.text()
    assert "6 of 10 tokens" in text and "tied" in text and "chunks=6 asked for" in text


def test_dynamic_token_count_gives_a_symbolic_chunk_count():
    torch.manual_seed(6)
    idx, targets = tokens(53, 2, 24, seed=9)
    gm, inputs = capture(TiedLM().double(), idx, targets, dynamic=[(idx, 1), (targets, 1)])
    plan = cl.plan_chunk_loss(gm, chunks=5)
    sp = plan.sites[0]
    assert not isinstance(sp.site.tokens, int) and sp.site.tokens_hint == 48
    assert sp.chunk_tokens == 10 and sp.chunks == 5 and sp.chunks_expr.startswith("ceiling(")
    rewritten_matches_original(gm, inputs, plan, tol=1e-5)
