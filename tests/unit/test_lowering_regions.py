"""Region selection on small aten graphs and on a real backward graph: what joins a region,
what ends one (unsupported ops, side effects, paths that leave and come back), and which
regions each selector picks. No kernels run here."""

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dsgraph.report.capture import capture as capture_compiles
from dsgraph.lowering.kernel_ir import region_ir
from dsgraph.lowering.regions import find_regions, recomputed, selector, tagged

from models import TinyBlock

aten = torch.ops.aten


def regions_of(fn, *example):
    gm = make_fx(fn, tracing_mode="fake")(*example)
    return gm, find_regions(gm)


def names(regions):
    return [r.names for r in regions]


def test_unsupported_op_ends_a_region():
    def fn(x, w):
        h = torch.exp(x) * 2  # region 1
        m = h @ w  # mm: unsupported
        return torch.sigmoid(m) + 1  # region 2

    gm, regions = regions_of(fn, torch.randn(4, 6), torch.randn(6, 5))
    assert names(regions) == [["exp", "mul"], ["sigmoid", "add"]]
    assert [n.name for n in regions[1].inputs] == ["mm"]


def test_a_path_through_an_unsupported_op_keeps_regions_apart():
    def fn(x, w):
        a = torch.exp(x)
        m = a @ w  # a -> mm -> c: a and c in one kernel would need mm in between
        return a * m

    gm, regions = regions_of(fn, torch.randn(5, 5), torch.randn(5, 5))
    assert names(regions) == [["exp"], ["mul"]]


def test_side_effect_inside_the_span_keeps_regions_apart():
    def fn(x, y):
        a = torch.exp(x)
        y.add_(1)  # mutates an input between a and its consumer
        return a * 3

    gm, regions = regions_of(fn, torch.randn(3, 4), torch.randn(3, 4))
    assert any(n.target is aten.add_.Tensor for n in gm.graph.nodes)
    assert names(regions) == [["exp"], ["mul"]]


def test_pool_slot_write_joins_and_is_selected_by_default():
    def fn(slot, g):
        slot.copy_(slot + g * 0.5)
        return g * 3

    gm, regions = regions_of(fn, torch.randn(3, 4), torch.randn(3, 4))
    slot = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert len(regions) == 1
    region = regions[0]
    assert [w.target for w in region.writes] == [aten.copy_.default]
    assert region.writes[0].args[0] is slot
    ir, binding = region_ir(region)
    assert {n.name: p.mutated for n, p in zip(binding.params, ir.params)} == {"slot_1": True, "g_1": False}
    assert not tagged(region)  # a placeholder of any name is not a pool slot
    slot.name = "dsgraph_grad_0"
    assert tagged(region)


def test_reading_the_written_tensor_inside_the_span_blocks_the_write():
    def fn(slot, g):
        total = slot + g
        s = slot.sum()  # reads the slot between the add and the copy: must see the old value
        slot.copy_(total)
        return s

    gm, regions = regions_of(fn, torch.randn(3, 4), torch.randn(3, 4))
    assert all(not r.writes for r in regions)


def test_layer_norm_is_one_reduction_region_with_its_getitems():
    def fn(x, w, b):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        rstd = torch.rsqrt(var + 1e-5)
        return (x - mean) * rstd * w + b, mean, rstd

    gm, regions = regions_of(fn, torch.randn(2, 3, 8), torch.randn(8), torch.randn(8))
    (region,) = regions
    assert region.kind == "reduction"
    assert [n.name for n in region.outputs] == ["getitem_1", "rsqrt", "add_1"]
    assert region.space[gm.graph.find_nodes(op="call_function", target=aten.rsqrt.default)[0]] == "row"
    assert any(n.target is operator.getitem for n in region.nodes)


def test_a_reduction_over_another_dim_ends_a_region():
    def fn(x):
        h = torch.exp(x)
        return h.sum(0), h.sum(-1, keepdim=True) * 2

    gm, regions = regions_of(fn, torch.randn(5, 7))
    assert names(regions) == [["exp", "sum_2", "mul"]]  # sum over dim 0 stays outside
    assert [n.name for n in regions[0].outputs] == ["exp", "mul"]


def test_non_keepdim_row_values_do_not_meet_full_ones_without_a_view():
    def fn(x):
        s = x.sum(-1) * 2  # [M]: row values without keepdim
        return x / s.unsqueeze(-1)  # the view is not lowered: the division is a new region

    gm, regions = regions_of(fn, torch.randn(5, 7))
    assert names(regions) == [["sum_1", "mul"], ["div"]]
    assert regions[0].space[regions[0].nodes[1]] == "rownk"


def test_differently_shaped_pointwise_ops_are_separate_kernels():
    def fn(x, w):
        return x * (w + 1)  # w + 1 is [N]; x * ... is [M, N]

    gm, regions = regions_of(fn, torch.randn(5, 7), torch.randn(7))
    assert names(regions) == [["add"], ["mul"]]


def tiny_block_backward():
    torch.manual_seed(0)
    model = TinyBlock()
    x = torch.randn(2, 7, 24, requires_grad=True)
    with capture_compiles() as cap:
        torch.compile(model, backend="dsgraph", options={"inductor": False, "pipeline": ""})(x).sum().backward()
    return cap.compiles[0].stages["backward"].before


def test_regions_of_a_real_backward_and_the_selectors():
    bw = tiny_block_backward()
    regions = find_regions(bw)
    by_first = {r.nodes[0].name: r for r in regions}
    # the recomputed GELU and its derivative with the incoming gradient: one pointwise kernel
    gelu = next(r for r in regions if "erf" in r.names)
    assert gelu.kind == "pointwise" and {"mul_5", "erf", "exp", "mul_13"} <= set(gelu.names)
    # layer norm backward: the row sums and the residual gradient's add in one reduction kernel
    ln = next(r for r in regions if "sum_3" in r.names)
    assert ln.kind == "reduction" and {"sum_4", "mul_19", "add_9"} <= set(ln.names)
    # weight/bias gradient reductions over [0, 1] and the matmuls are not lowered
    lowered = {n for r in regions for n in r.names}
    assert not lowered & {"sum_5", "sum_6", "mm", "mm_1", "sum_1"}
    # every region is convex and its members keep graph order
    pos = {n: i for i, n in enumerate(bw.graph.nodes)}
    for r in regions:
        assert [pos[n] for n in r.nodes] == sorted(pos[n] for n in r.nodes)
    # selectors: nothing carries a dsgraph tag yet; the recomputed GELU reads no tangent
    assert [r for r in regions if tagged(r)] == []
    assert gelu in [r for r in regions if recomputed(r)]
    assert selector("all")(by_first[regions[0].nodes[0].name])
    gelu.nodes[0].meta["dsgraph_recomputed"] = True
    assert [r for r in regions if tagged(r)] == [gelu]
    with pytest.raises(ValueError, match="select must be one of"):
        selector("most")


def test_a_bare_pool_accumulation_is_left_to_inductor_by_default():
    """``slot += g`` alone is what Inductor fuses into g's producer; a kernel of its own would
    read g again. With more work in the region (a scale and cast for communication) it is taken."""
    def accumulate(dsgraph_grad_0, g):
        dsgraph_grad_0.copy_(dsgraph_grad_0 + g)

    def accumulate_scale_cast(dsgraph_grad_0, g):
        total = dsgraph_grad_0 + g
        dsgraph_grad_0.copy_(total)
        return (total * 0.5).to(torch.bfloat16)

    for fn, taken in ((accumulate, False), (accumulate_scale_cast, True)):
        gm, regions = regions_of(fn, torch.randn(3, 4), torch.randn(3, 4))
        slot = next(n for n in gm.graph.nodes if n.op == "placeholder")
        slot.name = "dsgraph_grad_0"  # as the grad_pool pass names its slot inputs
        (region,) = regions
        assert region.writes and tagged(region) is taken


def test_regions_that_together_close_a_cycle_are_not_both_kept():
    """A = {a1, a2} and B = {b1, b2} are each convex, but a1 -> mm -> b2 and b1 -> mm -> a2:
    as two fused nodes each would wait for the other."""
    from dsgraph.lowering.regions import acyclic

    def fn(x, y, w):
        a1 = torch.exp(x)
        b1 = torch.exp(y)
        m1 = a1 @ w
        m2 = b1 @ w
        a2 = x * m2  # joins a1's region (both read x)
        b2 = y * m1  # joins b1's region
        return a2, b2

    gm, regions = regions_of(fn, torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    assert sorted(names(regions)) == [["exp", "mul"], ["exp_1", "mul_1"]]
    kept = acyclic(regions, list(gm.graph.nodes))
    assert kept == regions[:1]
