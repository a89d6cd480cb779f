"""Hard graphs (issue 16): each case runs training steps with every pass that applies (a
memory budget half-way between the stock peak and the smallest plan, the gradient pool)
and compares with the same graphs compiled without passes. FX execution
(``inductor=False``): these passes do not change arithmetic, so losses and gradients must be
bitwise equal. A case dsgraph does not support must fail with a clear error, never with a
silent mismatch."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.errors import BudgetError, find_cause

REFERENCE = {"inductor": False, "pipeline": "", "fallback": "error"}


def step(fn, model, inputs, seed=0, zero=True):
    if zero:
        for p in model.parameters():
            p.grad = None
    torch.manual_seed(seed)
    out = fn(*inputs)
    loss = out if out.dim() == 0 else out.float().square().mean()
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _joint_memory():
    return [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory


def full_options(make, **extra):
    """Every pass that applies, with a budget that binds: half-way between the stock
    partition's predicted peak and the smallest plan the planner reaches."""
    base = {"inductor": False, "fallback": "error", "grad_pool": True, **extra}
    model, inputs = make()
    torch._dynamo.reset()
    dsgraph.clear_reports()
    step(torch.compile(model, backend="dsgraph", options={**base, "memory_budget": "1TiB"}), model, inputs)
    stock = _joint_memory()["checkpoint_stock_peak"]
    model, inputs = make()
    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed) as info:
        step(torch.compile(model, backend="dsgraph", options={**base, "memory_budget": 1}), model, inputs)
    floor = find_cause(info.value, BudgetError).smallest_feasible
    torch._dynamo.reset()
    return {**base, "memory_budget": max(floor, (stock + floor) // 2)}


def assert_bitwise(got, ref):
    (loss, grads), (ref_loss, ref_grads) = got, ref
    assert torch.equal(loss, ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None), name
        assert g is None or torch.equal(g, r), name


def run(make, options, steps=1, zero=True, inputs_for_step=None):
    model, inputs = make()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    out = []
    for s in range(steps):
        x = inputs if inputs_for_step is None else inputs_for_step(s)
        out.append(step(compiled, model, x, seed=s, zero=zero))
    return out, model


def compare(make, options=None, steps=1, zero=True, inputs_for_step=None):
    """Reference vs ``options`` (default: every pass), step by step, bitwise; returns the
    dsgraph run's model."""
    options = options or full_options(make)
    ref, _ = run(make, REFERENCE, steps, zero, inputs_for_step)
    got, model = run(make, options, steps, zero, inputs_for_step)
    for g, r in zip(got, ref):
        assert_bitwise(g, r)
    return model


def seeded(build):
    def make():
        torch.manual_seed(0)
        return build()
    return make


# -- the cases --------------------------------------------------------------------------


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(13, 41), nn.Linear(41, 41), nn.Linear(41, 5)

    def forward(self, x):
        h = F.dropout(F.gelu(self.a(x)), 0.3, self.training)
        h = F.dropout(torch.tanh(self.b(h)), 0.2, self.training)
        return self.c(h)


def test_dropout_under_recomputation_draws_the_same_masks():
    compare(seeded(lambda: (Dropout(), (torch.randn(17, 13),))))


class MutatesInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(11, 23), nn.Linear(23, 3)

    def forward(self, x):
        x.mul_(2)  # the caller sees its input changed
        return self.b(torch.relu(self.a(x)))


def test_in_place_mutation_of_an_input():
    make = seeded(lambda: (MutatesInput(), (torch.randn(7, 11),)))
    options = full_options(make)
    for opts in (REFERENCE, options):
        model, (x,) = make()
        before = x.clone()
        torch._dynamo.reset()
        step(torch.compile(model, backend="dsgraph", options=opts), model, (x,))
        assert torch.equal(x, before * 2)
    compare(make, options)


class TwoViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(9, 9)

    def forward(self, x, y):
        return self.a(x).sum(0) + self.a(y).sigmoid().sum(0)


def test_aliased_inputs_and_the_same_tensor_twice():
    def aliased():
        torch.manual_seed(0)
        x = torch.randn(6, 9)
        return TwoViews(), (x, x[1:])

    def same():
        torch.manual_seed(0)
        x = torch.randn(6, 9)
        return TwoViews(), (x, x)

    compare(aliased)
    compare(same)


class ReturnsView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 12)

    def forward(self, x):
        h = self.a(x)
        return h.view(-1), h.t()


def test_view_outputs_mutated_afterwards():
    def run_one(options):
        torch.manual_seed(0)
        model, x = ReturnsView(), torch.randn(5, 8)
        torch._dynamo.reset()
        flat, t = torch.compile(model, backend="dsgraph", options=options)(x)
        with torch.no_grad():
            flat.mul_(3)  # the views alias one buffer: t sees it
        torch.manual_seed(1)
        (t * torch.randn_like(t)).sum().backward()
        return t.detach(), [p.grad for p in model.parameters()]

    ref_t, ref_g = run_one(REFERENCE)
    got_t, got_g = run_one({"inductor": False, "grad_pool": True, "fallback": "error"})
    assert torch.equal(got_t, ref_t) and all(torch.equal(a, b) for a, b in zip(got_g, ref_g))


class Block(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 3 * d + 1), nn.Linear(3 * d + 1, d)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, n=4, d=24):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def stack():
    return seeded(lambda: (Stack(), (torch.randn(3, 19, 24),)))


def test_calls_under_no_grad_and_inference_mode():
    make = stack()
    options = full_options(make)
    model, (x,) = make()
    ref_model = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    with torch.no_grad():
        a = compiled(x)
    with torch.inference_mode():
        b = compiled(x)
    with torch.no_grad():
        expected = ref_model(x)
    torch.testing.assert_close(a, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b, expected, rtol=1e-5, atol=1e-6)
    assert any(r.kind == "inference" for r in dsgraph.reports())
    compare(make, options)  # and training afterwards still matches


def test_double_backward_is_a_clear_error_or_works():
    make = stack()
    model, (x,) = make()
    x.requires_grad_(True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=full_options(make))
    out = compiled(x).square().mean()
    try:
        (gx,) = torch.autograd.grad(out, x, create_graph=True)
        gx.square().sum().backward()
    except RuntimeError as e:
        assert "double backward" in str(e) or "create_graph" in str(e) or "twice" in str(e), str(e)
    else:
        ref_model, _ = make()
        x2 = x.detach().clone().requires_grad_(True)
        (rx,) = torch.autograd.grad(ref_model(x2).square().mean(), x2, create_graph=True)
        torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-7)


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class UsesFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(10, 30), nn.Linear(30, 4)

    def forward(self, x):
        return self.b(Cube.apply(torch.tanh(self.a(x))))


def test_autograd_function():
    compare(seeded(lambda: (UsesFunction(), (torch.randn(8, 10),))))


def test_parameter_hooks_and_accumulation_without_zeroing():
    make = stack()
    options = full_options(make)

    def with_hooks(options):
        model, _ = make()
        seen = []
        model.head.weight.register_hook(lambda g: g * 0.5)
        model.blocks[0].up.bias.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="dsgraph", options=options)
        for s in range(3):  # different data each step, gradients accumulate
            torch.manual_seed(10 + s)
            compiled(torch.randn(3, 19, 24)).square().mean().backward()
        return [p.grad.clone() for p in model.parameters()], seen

    ref_grads, ref_seen = with_hooks(REFERENCE)
    grads, seen = with_hooks(options)
    assert len(seen) == len(ref_seen) == 3
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert all(torch.equal(a, b) for a, b in zip(seen, ref_seen))


class MixedPrecision(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 3)

    def forward(self, x):
        h = F.gelu(self.a(x))
        with torch.autocast("cpu", enabled=False):
            h = torch.softmax(self.b(h.float()), dim=-1)
        return self.c(h)


def test_bf16_autocast_with_an_inner_region_in_fp32():
    make = seeded(lambda: (MixedPrecision(), (torch.randn(12, 16),)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        options = full_options(make)
        compare(make, options)


def test_dynamic_shapes_three_sizes_bounded_recompiles():
    sizes = [19, 23, 31]

    def inputs_for(s):
        x = torch.randn(3, sizes[s], 24, generator=torch.Generator().manual_seed(s))
        torch._dynamo.mark_dynamic(x, 1)
        return (x,)

    def make():
        torch.manual_seed(0)
        return Stack(), inputs_for(0)

    options = full_options(make)  # planned on the dynamic graph, at the first size

    dsgraph.clear_reports()
    compare(make, options, steps=3, inputs_for_step=inputs_for)
    joint = [r for r in dsgraph.reports() if r.kind == "joint"]
    assert len(joint) <= 2  # reference + dsgraph: one compile each for the three sizes


class BreaksInTheMiddle(Stack):
    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i == 1:
                torch._dynamo.graph_break()
        return self.head(x)


def test_graph_break_each_piece_gets_its_own_plan():
    make = seeded(lambda: (BreaksInTheMiddle(), (torch.randn(3, 19, 24),)))
    options = {"inductor": False, "fallback": "error", "grad_pool": True, "memory_budget": "1TiB"}
    dsgraph.clear_reports()
    compare(make, options)
    joints = [r for r in dsgraph.reports() if r.kind == "joint" and "checkpoint_budget" in r.memory]
    assert len(joints) == 2  # two graphs, each planned on its own against the whole budget (README)


def test_non_contiguous_and_broadcast_inputs():
    def make():
        torch.manual_seed(0)
        x = torch.randn(24, 19, 3).permute(2, 1, 0)  # (3, 19, 24), not contiguous
        return Stack(), (x,)

    compare(make)

    class Broadcast(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(24, 24)

        def forward(self, x, bias):
            return torch.tanh(self.a(x) + bias).sum(-1)

    def make_b():
        torch.manual_seed(0)
        return Broadcast(), (torch.randn(5, 7, 24), torch.randn(24).expand(7, 24))

    compare(make_b)


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_buffers_mutated_in_forward():
    make = seeded(lambda: (WithBatchNorm(), (torch.randn(4, 3, 9, 9),)))
    options = full_options(make)
    ref, ref_model = run(make, REFERENCE, steps=2)
    got, model = run(make, options, steps=2)
    for g, r in zip(got, ref):
        assert_bitwise(g, r)
    assert torch.equal(model.bn.running_mean, ref_model.bn.running_mean)
    assert torch.equal(model.bn.running_var, ref_model.bn.running_var)
    assert int(model.bn.num_batches_tracked) == 2


class UnusedAndFrozen(Stack):
    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(24, 24)
        self.blocks[1].requires_grad_(False)


def test_parameters_without_gradients_and_frozen_ones():
    model = compare(seeded(lambda: (UnusedAndFrozen(), (torch.randn(3, 19, 24),))))
    assert model.unused.weight.grad is None
    assert all(p.grad is None for p in model.blocks[1].parameters())


def test_model_moved_to_another_dtype_after_compiling():
    """The recompile for float64 is planned afresh. (A budget in bytes that float32 met can
    be below what float64 needs: then the recompile raises BudgetError, as any budget too
    small; here the budget does not bind.)"""
    make = stack()
    options = {"inductor": False, "fallback": "error", "grad_pool": True, "memory_budget": "1TiB"}
    model, (x,) = make()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    step(compiled, model, (x,))
    model.double()  # recompiles for the new dtype
    loss, grads = step(compiled, model, (x.double(),))
    ref_model, _ = make()
    ref_model.double()
    ref_loss, ref_grads = step(ref_model, ref_model, (x.double(),))
    assert all(g.dtype == torch.float64 for g in grads.values())
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-10, atol=1e-12)


def test_two_compiled_models_sharing_parameters():
    def make():
        torch.manual_seed(0)
        a = Stack()
        b = Stack()
        b.head = a.head  # shared module: its parameters get gradients from both
        return (a, b), (torch.randn(3, 19, 24), torch.randn(3, 23, 24))

    def both(options):
        (a, b), (x, y) = make()
        torch._dynamo.reset()
        ca = torch.compile(a, backend="dsgraph", options=options)
        cb = torch.compile(b, backend="dsgraph", options=options)
        (ca(x).square().mean() + cb(y).square().mean()).backward()
        return {**{f"a.{n}": p.grad for n, p in a.named_parameters()}, **{f"b.{n}": p.grad for n, p in b.named_parameters()}}

    ref = both(REFERENCE)
    got = both({"inductor": False, "grad_pool": True, "fallback": "error"})
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
