"""The arena on small graphs: the plan (what is planned, packing valid, best fit, symbolic
offsets at other sizes), the rewritten code, numerics, and debug mode's NaN poisoning."""

import itertools
import random

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.analysis.arena_plan import ALIGN, graph_symbols, plan_arena
from dsgraph.analysis.arena_packing import ArenaBlock, best_fit, symbolic_offsets
from dsgraph.passes.arena import apply_arena

aten = torch.ops.aten


def trace(fn, *inputs, mode="fake"):
    return make_fx(fn, tracing_mode=mode)(*inputs)


def overlapping_in_time(a, b):
    return a.start <= b.end and b.start <= a.end


def assert_valid(plan, at=None):
    """No two planned tensors live at the same time share a byte; all fit in the arena;
    offsets aligned. ``at``: {symbol: value} to check the expressions at other sizes."""
    def value(expr, hint):
        return hint if at is None else int(sympy.sympify(expr).xreplace(at))

    total = {key: value(b.nbytes_expr, b.nbytes) for key, b in plan.buffers.items()}
    ranges = [(s, value(s.offset_expr, s.offset), value(s.nbytes_expr, s.nbytes)) for s in plan.slots]
    for s, off, n in ranges:
        assert off % plan.align == 0 and n > 0, s
        assert off + n <= total[s.buffer], (s, off, n, total[s.buffer])
    for (a, oa, na), (b, ob, nb) in itertools.combinations(ranges, 2):
        if a.buffer == b.buffer and overlapping_in_time(a, b):
            assert oa + na <= ob or ob + nb <= oa, (a, b)
    # a device's buffers are never live at the same time
    for a, b in itertools.combinations(plan.buffers.values(), 2):
        assert a.device != b.device or a.end < b.start or b.end < a.start, (a, b)


def chain(x, w):
    a = torch.mm(x, w)
    b = a.relu()
    c = b * 3
    d = c.sin()
    e = d + c
    return e.sum(dim=0)


def test_chain_is_packed_with_reuse():
    x, w = torch.randn(9, 5), torch.randn(5, 13)
    gm = trace(chain, x, w)
    plan = plan_arena(gm, split=False)
    # every intermediate is planned; the output (sum) is not
    assert [s.name for s in plan.slots] == ["mm", "relu", "mul", "sin", "add"]
    assert [s.writer for s in plan.slots] == ["aten.mm.out", "aten.relu.out", "aten.mul.out", "aten.sin.out",
                                             "aten.add.out"]
    assert all(s.nbytes == 9 * 13 * 4 for s in plan.slots)
    assert_valid(plan)
    aligned = -(-9 * 13 * 4 // ALIGN) * ALIGN  # 512
    # at most three of them are live at once (c, d and e at the add): freed bytes are reused
    assert plan.lower_bound == 3 * aligned
    assert plan.arena_bytes == 3 * aligned < plan.unpacked_bytes
    assert plan.stats()["arena_tensors"] == 5 and plan.stats()["arena_skipped"] == 0


def test_outputs_inputs_views_of_outputs_and_ops_without_out_are_left_alone():
    def f(x, y):
        a = x * 2  # returned through a view: escapes
        t = a.t()
        b = y + 1  # returned: an output
        c = b.exp()  # intermediate: planned
        y.mul_(2)  # an input mutated in place: never planned
        r = torch.ops.prims.iota(7, start=0, step=1, dtype=torch.int64, device=x.device, requires_grad=False)
        m, v = torch.var_mean(c, dim=1, keepdim=True)  # var dies inside, mean is returned
        return t, b, v, (c - m).sum() + r.sum()

    gm = trace(f, torch.randn(6, 7), torch.randn(6, 7))
    plan = plan_arena(gm)
    names = {s.name for s in plan.slots}
    assert {"exp", "var_mean[0]", "sub"} <= names
    assert not names & {"mul", "add", "var_mean[1]", "iota", "mul_1"}
    assert plan.skipped["no out variant: prims.iota.default"] == 1
    ref = gm(torch.ones(6, 7) * 0.5, torch.arange(42.0).view(6, 7) / 7)
    apply_arena(gm, plan)
    FileCheck().check("arena = torch.ops.aten.empty.memory_format").check("torch.uint8") \
        .check("exp = torch.ops.aten.exp.out(").check("out = exp_in_arena") \
        .check("var_mean_out1 = torch.ops.aten.empty_strided.default") \
        .check("var_mean.correction_out(").check("out0 = var_mean_in_arena, out1 = var_mean_out1").run(gm.code)
    got = gm(torch.ones(6, 7) * 0.5, torch.arange(42.0).view(6, 7) / 7)
    for r, g in zip(ref, got):
        assert torch.equal(r, g)


def test_rewritten_graph_is_bitwise_the_original_on_fresh_data():
    def f(x, w, b):
        h = torch.addmm(b, x, w.t())  # transposed weight
        g = torch.nn.functional.gelu(h)
        n = torch.nn.functional.layer_norm(g, (g.shape[-1],))
        s = torch.softmax(n * 2.5, dim=-1)
        full = torch.full((1, 11), 0.25) + s.mean(0, keepdim=True)
        return (s.to(torch.float64) * full).sum(0)

    x, w, b = torch.randn(7, 5), torch.randn(11, 5), torch.randn(11)
    gm = trace(f, x, w, b)
    plan = plan_arena(gm, split=False)
    assert {s.writer for s in plan.slots} >= {"aten.addmm.out", "fill_", "copy_"}
    assert_valid(plan)
    args = (torch.randn(7, 5), torch.randn(11, 5), torch.randn(11))
    ref = gm(*args)
    apply_arena(gm, plan)
    assert torch.equal(gm(*args), ref)


def layers(x, w):
    """A burst of large short-lived intermediates first, then layers whose outputs are
    returned (as a forward saves activations): what is live outside the arena grows."""
    big = torch.cat([x] * 16, dim=1).sin()
    x = big.view(x.shape[0], 16, -1).sum(1) @ w
    saved = []
    for _ in range(6):
        x = ((x * 1.5).cos() @ w).tanh()
        saved.append(x.repeat(1, 4))
    return saved


def test_segments_keep_the_arena_from_raising_the_peak():
    x, w = torch.randn(16, 32), torch.randn(32, 32)
    single = trace(layers, x, w)
    split = trace(layers, x, w)
    whole, segmented = plan_arena(single, split=False), plan_arena(split)
    assert len(whole.buffers) == 1 and len(segmented.buffers) > 1
    assert_valid(segmented)
    peak = max(TensorLifetimes(single).live)  # no arena
    ref = single(x, w)
    apply_arena(single, whole)
    apply_arena(split, segmented)
    one_buffer, segments = max(TensorLifetimes(single).live), max(TensorLifetimes(split).live)
    # one buffer for the whole graph holds the layers' intermediates next to every saved output
    assert one_buffer > peak * 1.2
    assert segments < peak * 1.1
    for r, a, b in zip(ref, single(x, w), split(x, w)):
        assert torch.equal(r, a) and torch.equal(r, b)


def test_best_fit_takes_the_smallest_gap_that_holds_the_block():
    # a..d live together at step 0; b and d die, leaving gaps of 128 (b) and 64 (d) bytes
    a, b, c, d, e = (ArenaBlock(name, 0, end, size, sympy.Integer(size))
                     for name, end, size in [("a", 5, 64), ("b", 0, 128), ("c", 5, 64), ("d", 0, 64), ("e", 5, 64)])
    new = ArenaBlock("new", 1, 5, 64, sympy.Integer(64))
    best_fit([a, b, c, d, e, new])
    placed = {blk.slot: blk.offset for blk in (a, b, c, d, e)}
    assert placed == {"b": 0, "a": 128, "c": 192, "d": 256, "e": 320}  # larger first at one step
    assert new.offset == 256  # d's 64-byte hole, not b's 128
    exprs, total, total_hint = symbolic_offsets([a, b, c, d, e, new])
    assert total_hint == 384 and total == 384
    assert all(int(exprs[blk]) == blk.offset for blk in (a, b, c, d, e, new))


def test_dynamic_offsets_stay_valid_at_other_sizes():
    def f(x, y):
        a = x * 2  # (s0, 5)
        b = y.exp()  # (3, 7): constant size
        c = a.cos() + 1  # (s0, 5)
        d = (b @ b.t()).sum() + c.sum()
        e = torch.cat([c, c], dim=0)  # (2*s0, 5)
        return e.sum() * d

    gm = trace(f, torch.randn(4, 5), torch.randn(3, 7), mode="symbolic")  # every dim a symbol
    plan = plan_arena(gm, split=False)
    hints = {sym: hint for sym, (_, _, hint) in graph_symbols(gm).items()}
    assert sorted(hints.values()) == [3, 4, 5, 7]
    assert {"mul", "exp", "cos", "add", "cat"} <= {s.name for s in plan.slots}
    assert not all(s.offset_expr.is_Integer for s in plan.slots)
    assert_valid(plan)
    rng = random.Random(0)
    for _ in range(50):  # sizes far from the hints, both ways
        assert_valid(plan, at={sym: rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(100, 5000)]) for sym in hints})
    # the expressions evaluate to the planned ints at the size hints
    assert all(int(s.offset_expr.xreplace(hints)) == s.offset for s in plan.slots)
    assert int(plan.buffers["cpu#0"].nbytes_expr.xreplace(hints)) == plan.arena_bytes
    args = (torch.randn(37, 5), torch.randn(3, 7))
    ref = gm(*args)
    apply_arena(gm, plan)
    assert "torch.sym_max" in gm.code or "sym_size" in gm.code  # sizes computed at run time
    assert torch.equal(gm(*args), ref)
    small = (torch.randn(2, 5), torch.randn(3, 7))
    assert torch.equal(gm(*small), trace(f, torch.randn(4, 5), torch.randn(3, 7), mode="symbolic")(*small))


def _stale_read(gm, applied, slot, t):
    """Append a read of ``slot``'s arena bytes at the end of the graph (after its last use)."""
    graph = gm.graph
    out = graph.output_node()
    with graph.inserting_before(out):
        typed = graph.call_function(aten.view.dtype, (applied.arenas[slot.buffer], t.dtype))
        view = graph.call_function(aten.as_strided.default, (typed, list(t.shape), list(t.stride()),
                                                              slot.offset // t.element_size()))
        stale = graph.call_function(aten.clone.default, (view,))
    outs = out.args[0]
    out.args = ((*(outs if isinstance(outs, (tuple, list)) else (outs,)), stale),)
    gm.recompile()


@pytest.mark.parametrize("debug", [False, True])
def test_debug_mode_poisons_dead_regions_with_nan(debug):
    def f(x):
        a = x * 2  # planned; dies at the sum, and nothing reuses its bytes afterwards
        return a.sum(dim=1)

    x = torch.randn(5, 6)
    gm = trace(f, x)
    plan = plan_arena(gm)
    (slot,) = plan.slots
    applied = apply_arena(gm, plan, debug=debug)
    _stale_read(gm, applied, slot, x)
    result, stale = gm(x)
    assert torch.equal(result, (x * 2).sum(dim=1))
    if debug:
        assert torch.isnan(stale).all()  # the read after the last use sees NaN
        assert len(applied.fills) == 2  # the whole arena at allocation, the slot after its last use
    else:
        assert torch.equal(stale, x * 2)  # without poisoning a stale read returns old numbers
        assert not applied.fills


def test_debug_poison_is_nan_in_half_precision_and_minus_one_in_ints():
    def f(x, i):
        a = x * 3
        j = i + 1
        return a.sum(), j.sum()

    x, i = torch.randn(4, 8, dtype=torch.bfloat16), torch.arange(12).view(3, 4)
    gm = trace(f, x, i)
    plan = plan_arena(gm)
    applied = apply_arena(gm, plan, debug=True)
    by_name = {s.name: s for s in plan.slots}
    _stale_read(gm, applied, by_name["mul"], x)
    _stale_read(gm, applied, by_name["add"], i)
    *_, stale_bf16, stale_int = gm(x, i)
    assert torch.isnan(stale_bf16).all()
    assert (stale_int == -1).all()
