"""The gradient pool against eager and against the same pipeline without it, through every
way people use gradients. Graphs run as FX code (inductor=False) except where marked e2e;
every multi-step test uses different data per step (accumulation bugs hide behind equal data).
The checkpoint planner's predictions with the pool: test_grad_pool_budget.py."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgraph
from dsgraph.testing import check_training_step
from dsgraph.runtime.pool import MANAGER

from models import MLP, TinyGPT, gpt_batch

POOL = {"inductor": False, "grad_pool": True}
NO_POOL = {"inductor": False, "pipeline": "lifetimes"}


def batches(n, shape=(6, 13), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def run(model, options, data, step=None, zero=None):
    """Compile (options None: eager), run one forward+backward per batch; ``zero(model, i)``
    before step i and ``step(model, i)`` after it; returns the grads after each step."""
    fn = model if options is None else torch.compile(model, backend="dsgraph", options=options)
    history = []
    for i, x in enumerate(data):
        if zero:
            zero(model, i)
        loss = fn(*x) if isinstance(x, tuple) else fn(x)
        (loss if loss.dim() == 0 else loss.sum()).backward()
        history.append({n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()})
        if step:
            step(model, i)
    return history


def compare(a, b, bitwise):
    for step, (ga, gb) in enumerate(zip(a, b)):
        assert ga.keys() == gb.keys()
        for name in ga:
            x, y = ga[name], gb[name]
            assert (x is None) == (y is None), (step, name)
            if x is None:
                continue
            if bitwise:
                assert torch.equal(x, y), (step, name, (x - y).abs().max())
            else:
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"step {step} {name}")


def three_ways(make, data, **kw):
    torch.manual_seed(0)
    model = make()
    copies = [copy.deepcopy(model) for _ in range(3)]
    eager = run(copies[0], None, data, **kw)
    torch._dynamo.reset()
    plain = run(copies[1], NO_POOL, data, **kw)
    torch._dynamo.reset()
    dsgraph.clear_reports()
    pooled = run(copies[2], POOL, data, **kw)
    assert not any(r.fallback for r in dsgraph.reports())
    assert any(p.name == "grad_pool" and p.changed for r in dsgraph.reports() for p in r.passes)
    compare(pooled, plain, bitwise=True)  # the pool changes no arithmetic
    compare(pooled, eager, bitwise=False)
    return copies[2]


def test_accumulation_without_zeroing():
    model = three_ways(MLP, batches(4))
    pool = dsgraph.grad_pool(model)
    assert set(pool.slots) == {n for n, _ in model.named_parameters()}
    buffer = next(iter(pool.buffers.values()))
    for name, p in model.named_parameters():
        key, offset, numel = pool.slots[name]
        assert p.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert p.grad.storage_offset() == offset and p.grad.numel() == numel and p.grad.shape == p.shape


def test_zero_grad_set_to_none_and_in_place():
    def zero(model, i):
        model.zero_grad(set_to_none=(i % 2 == 0))

    model = three_ways(MLP, batches(5), zero=zero)
    assert all(MANAGER.owns(p) for p in model.parameters())  # .grad stayed the pool's view


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
])
def test_optimizers_step_on_the_views(make_opt):
    optimizers = {}

    def step(model, i):
        if id(model) not in optimizers:
            optimizers[id(model)] = make_opt(model.parameters())
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizers[id(model)].step()
        optimizers[id(model)].zero_grad(set_to_none=(i % 2 == 1))

    three_ways(MLP, batches(4), step=step)


def test_tied_frozen_and_unused_parameters():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(19, 12)
            self.head = nn.Linear(12, 19, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.frozen = nn.Linear(12, 12)
            self.frozen.requires_grad_(False)
            self.unused = nn.Linear(12, 3)  # never called: no gradient, .grad stays None

        def forward(self, idx):
            return self.head(torch.tanh(self.frozen(self.emb(idx)))).logsumexp(-1).mean()

    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 19, (4, 7), generator=g) for _ in range(3)]
    model = three_ways(Odd, data)
    assert model.frozen.weight.grad is None and model.unused.weight.grad is None
    pool = dsgraph.grad_pool(model)
    assert set(pool.slots) == {"emb.weight"}  # tied once, frozen and unused not at all


def test_gradient_strides_follow_the_parameter():
    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 5, 3)
            self.conv.weight.data = self.conv.weight.data.to(memory_format=torch.channels_last)

        def forward(self, x):
            return self.conv(x).square().mean()

    g = torch.Generator().manual_seed(2)
    model = three_ways(Conv, [torch.randn(2, 3, 9, 8, generator=g) for _ in range(2)])
    assert model.conv.weight.grad.stride() == model.conv.weight.stride()
    assert not model.conv.weight.grad.is_contiguous()


def test_several_dtypes_get_one_buffer_each():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8).double()

        def forward(self, x):
            return self.b(self.a(x).double()).sum()

    model = three_ways(Mixed, batches(3, (4, 8)))
    pool = dsgraph.grad_pool(model)
    assert {k[1] for k in pool.buffers} == {torch.float32, torch.float64}
    assert {k[1] for k, _, _ in pool.slots.values()} == {torch.float32, torch.float64}


def test_graph_breaks_and_recompiles_share_one_pool():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(13, 17)
            self.b = nn.Linear(17, 5)

        def forward(self, x):
            h = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(h)

    data = batches(2, (6, 13)) + batches(2, (9, 13), seed=1)  # a new batch size recompiles
    model = three_ways(Broken, data)
    pool = dsgraph.grad_pool(model)
    assert len(pool.buffers) == 1 and set(pool.slots) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    backward_reports = [r for r in dsgraph.reports() if r.kind == "backward" and r.passes[-1].name == "grad_pool"]
    assert len(backward_reports) >= 3  # two graphs, then recompiles: all write the same pool


def test_hooks_fire_with_eagers_values():
    def make():
        torch.manual_seed(3)
        return MLP()

    def instrument(model, log):
        model.fc1.weight.register_hook(lambda g: log.append(("pre", g.clone())) or g * 2)
        model.fc2.bias.register_post_accumulate_grad_hook(lambda p: log.append(("post", p.grad.clone())))

    data = batches(3)
    logs = []
    results = []
    for options in (None, POOL):
        torch._dynamo.reset()
        model, log = make(), []
        instrument(model, log)
        results.append(run(model, options, data))
        logs.append(log)
    compare(results[1], results[0], bitwise=False)
    assert [k for k, _ in logs[0]] == [k for k, _ in logs[1]] and len(logs[0]) == 6
    assert all(isinstance(g, torch.Tensor) for _, g in logs[1])
    for (_, a), (_, b) in zip(logs[0], logs[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_grad_pool_is_none_before_the_first_backward():
    model = MLP()
    assert dsgraph.grad_pool(model) is None
    compiled = torch.compile(model, backend="dsgraph", options=POOL)
    compiled(torch.randn(3, 13))  # compiled, backward not run yet
    assert dsgraph.grad_pool(model) is None


def test_debug_pool_memory_is_nan_until_written():
    from dsgraph.runtime.pool import PoolManager

    manager = PoolManager()
    a, b = nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(7))
    sa, sb = manager.slot(a), manager.slot(b)
    assert sb.offset % 16 == 0 and sb.offset >= sa.numel
    buffer = manager.buffer(sa.key, debug=True)
    assert buffer.numel() == sb.offset + 7 and torch.isnan(buffer).all()
    view = manager.view(sa)
    assert view.shape == a.shape and view.data_ptr() == buffer.data_ptr()


def test_debug_mode_gives_the_same_gradients():
    """debug=True sets each slot a matmul will overwrite to NaN before the backward: were it
    read (accumulated into instead of overwritten), the gradients would come out NaN."""
    torch.manual_seed(4)
    model = MLP()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={**POOL, "debug": True})
    data = batches(3)
    for i, x in enumerate(data):
        if i == 2:
            model.zero_grad(set_to_none=True)  # fresh again: matmul slots overwritten
        compiled(x).sum().backward()
    expected = run(reference, None, [data[2]])[0]
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6)


def test_gpt_with_pool_matches_eager():
    data = [gpt_batch(seed=s) for s in range(3)]
    three_ways(TinyGPT, data)


@pytest.mark.e2e
def test_weight_grads_are_written_by_their_matmul_and_copies_fuse():
    """On CPU Inductor: both Linear weight gradients come out of ``mm_into_`` (no copy after
    the matmul) and no generated kernel is a bare copy into the pool. (The strict kernel
    count against stock Inductor is checked on CUDA in tests/gpu: the CPU backend also
    fuses unrelated reductions side by side, and a mutating fallback op in the graph stops
    one such side-by-side fusion here, which is not a copy.)"""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(5)
    compiled = torch.compile(MLP(), backend="dsgraph", options={"grad_pool": True})
    _, codes = run_and_get_code(lambda: compiled(torch.randn(6, 13)).sum().backward())
    calls = [line.strip() for line in codes[-1].split("def call(")[1].splitlines()]
    assert sum(c.startswith("torch.ops.dsgraph.mm_into_.default(dsgraph_grad_") for c in calls) == 2
    assert not any(c.startswith("extern_kernels.mm(") and "primals_3" in c for c in calls)
    import re

    assert not [c for c in calls if re.match(r"cpp_fused_\d+\(", c)], calls  # a kernel named after no op copies
    torch.manual_seed(6)
    check_training_step(MLP(), torch.randn(6, 13), {"grad_pool": True})


@pytest.mark.e2e
def test_embedding_gradients_through_inductor_accumulate_like_eager_with_no_extra_kernels():
    """GPT with a tied token table and a position table through CPU Inductor: the pooled
    backward has no more kernels than stock (the tied gradient is one ``addmm_into_``, the
    position scatter adds into its slot), and gradients follow eager through accumulation
    without zeroing, ``set_to_none`` (matmul slots overwritten again) and in-place zeroing."""
    import re

    from torch._inductor.utils import run_and_get_code

    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    cfg = GPTConfig(vocab=67, seq=16, layers=1, heads=2, dim=32)
    data = [gpt_inputs(cfg, 2, seed=s) for s in range(5)]
    torch.manual_seed(0)
    model = GPT(cfg)
    kernels = {}
    for name, options in (("stock", {"pipeline": ""}), ("pooled", {"grad_pool": True, "fallback": "error"})):
        torch._dynamo.reset()
        compiled = torch.compile(copy.deepcopy(model), backend="dsgraph", options=options)
        _, codes = run_and_get_code(lambda: compiled(*data[0]).backward())
        calls = [c.strip() for c in codes[-1].split("def call(")[1].splitlines()]
        kernels[name] = [c for c in calls if re.match(r"(cpp_fused\w*\(|extern_kernels\.|torch\.ops\.)", c)]
    assert any(c.startswith("torch.ops.dsgraph.addmm_into_.default(dsgraph_grad_") for c in kernels["pooled"])
    assert len(kernels["pooled"]) <= len(kernels["stock"]), kernels

    def zero(m, i):
        if i == 2:
            m.zero_grad(set_to_none=True)
        if i == 4:
            m.zero_grad(set_to_none=False)

    eager = run(copy.deepcopy(model), None, data, zero=zero)
    torch._dynamo.reset()
    pooled = run(copy.deepcopy(model), {"grad_pool": True, "fallback": "error"}, data, zero=zero)
    compare(pooled, eager, bitwise=False)


class _Block(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d + 3), nn.Linear(2 * d + 3, d)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


class _BreakInLoop(nn.Module):
    """A graph break inside the loop over blocks: Dynamo compiles one block's graph and runs
    it again for the blocks after it, with their parameters as inputs."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(4))

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i == 1:
                torch._dynamo.graph_break()
        return x


def test_a_graph_reused_for_other_parameters_writes_their_slots():
    """Found by the hard-graph tests: the pool bound slots to the parameters a graph was
    compiled for, so the blocks that reused it wrote their gradients into another block's
    slots (and theirs stayed None). The backward now receives the parameters and each call
    writes the slots of the ones it was given."""
    def grads(options):
        torch.manual_seed(0)
        model, x = _BreakInLoop(), torch.randn(2, 9, 12)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="dsgraph", options=options)
        for step in range(2):  # accumulate over two steps with different data
            torch.manual_seed(step)
            compiled(x + step).square().mean().backward()
        return model, {n: p.grad.clone() for n, p in model.named_parameters()}

    _, ref = grads({"inductor": False, "pipeline": ""})
    compiles_before = len([r for r in dsgraph.reports() if r.kind == "backward"])
    model, got = grads({"inductor": False, "grad_pool": True, "fallback": "error"})
    backward_compiles = len([r for r in dsgraph.reports() if r.kind == "backward"]) - compiles_before
    assert backward_compiles < len(model.blocks)  # a graph really served several blocks
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    assert set(dsgraph.grad_pool(model).slots) == {n for n, _ in model.named_parameters()}


class _ConvBlock(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return x + F.relu(self.norm(self.conv(x)))


class _ConvNet(nn.Module):
    """Convolution blocks, with a graph break after the second so that Dynamo runs one
    block's graph again for the blocks after it (``reuse``)."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.stem, self.reuse = nn.Conv2d(3, 4, 3), reuse
        self.blocks = nn.ModuleList(_ConvBlock() for _ in range(4))

    def forward(self, x):
        x = self.stem(x)
        for i, b in enumerate(self.blocks):
            x = b(x)
            if self.reuse and i == 1:
                torch._dynamo.graph_break()
        return x


@pytest.mark.e2e
@pytest.mark.parametrize("reuse", [False, True], ids=["one_graph", "graph_reused_by_blocks"])
def test_convolution_weights_through_inductor_find_their_slots(reuse):
    """Found on the H200 (resnet18 of the model zoo): Inductor's layout optimization returns
    a saved convolution weight as a channels-last copy, so a backward that received the
    parameter itself to find its slot got a copy and refused to run. The backward now gets
    a view of each parameter that Inductor leaves alone (``compile.partition_edit``), also
    when one graph serves several blocks. Gradients bitwise equal to the same graphs
    without the pool, over two accumulating steps."""
    def grads(options):
        torch.manual_seed(0)
        model = _ConvNet(reuse)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="dsgraph", options=options)
        for step in range(2):
            torch.manual_seed(step)
            compiled(torch.randn(2, 3, 10, 10)).square().mean().backward()
        return model, {n: p.grad.clone() for n, p in model.named_parameters()}

    _, ref = grads({"pipeline": ""})
    model, got = grads({"grad_pool": True, "fallback": "error"})
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    # with the break in the loop Dynamo runs the stem eagerly and compiles one block's
    # graph, which then serves all four: every block's parameters are pooled
    pooled = set(dsgraph.grad_pool(model).slots)
    assert {n for n, _ in model.blocks.named_parameters(prefix="blocks")} <= pooled
    if not reuse:
        assert pooled == {n for n, _ in model.named_parameters()}
