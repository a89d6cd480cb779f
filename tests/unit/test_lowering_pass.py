"""The lower_triton pass on small graphs: the plan, the rewritten code, numerics of the
rewritten graph against eager, the fallback when a kernel fails, and the form in which
the kernels go to Inductor.

Kernels run under Triton's interpreter (the ``triton_interpreter`` fixture); one test
turns the interpreter off for its own kernel to see the GPU path's graph."""

import importlib
import operator

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

from dsgraph.lowering.check import rel_err
from dsgraph.lowering.kernels import DsgraphLoweringWarning

lower_triton = importlib.import_module("dsgraph.passes.lower_triton")


@pytest.fixture(autouse=True, scope="module")
def triton_interpreter():
    """Triton's interpreter for this module's kernels (CPU tensors). Set through Triton's
    knob for the module only, not TRITON_INTERPRET in the environment: pytest imports every
    module before running any, and an environment variable set at import would make the
    GPU tests' Inductor kernels interpreted too. Triton reads the knob when a kernel is
    made, and dsgraph makes its kernels lazily, inside the tests."""
    import triton

    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    yield
    triton.knobs.runtime.interpret = old


def block(x, w, b, h):
    """A layer norm, a GELU on another tensor, and a residual add that reads both."""
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    y = (x - mean) * torch.rsqrt(var + 1e-5) * w + b
    g = F.gelu(h)
    return y + g, mean


def make_inputs():
    return [torch.randn(3, 5, 29), torch.randn(29), torch.randn(29), torch.randn(3, 5, 29)]


def graph(fn, inputs, mode="fake"):
    return make_fx(fn, tracing_mode=mode)(*inputs)


def outputs_of(gm, inputs):
    out = gm(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_plan_lists_regions_kernels_and_bytes():
    gm = graph(block, make_inputs())
    plan = lower_triton.plan_lowering(gm, "all")
    assert len(plan.regions) == 1  # the gelu reads h, the add joins both: one reduction kernel
    planned = plan.regions[0]
    assert planned.region.kind == "reduction"
    # reads x, w, b, h once each; writes the sum and the mean (fp32)
    assert planned.bytes_read == 4 * (3 * 5 * 29 * 2 + 29 * 2)
    assert planned.bytes_written == 4 * (3 * 5 * 29 + 3 * 5)
    text = str(plan)
    for expected in (planned.kernel, "var_mean", "gelu", "add_1", "bytes moved", "x_1", "h_1"):
        assert expected in text
    assert plan.stats()["selected"] == 1 and plan.stats()["lowered"] == 0  # nothing applied yet
    # the default selection takes only what dsgraph's passes made: nothing here
    assert lower_triton.plan_lowering(gm).regions == []


def test_apply_replaces_the_region_with_one_call_and_matches_eager():
    inputs = make_inputs()
    gm = graph(block, inputs)
    plan = lower_triton.plan_lowering(gm, "all")
    gm = lower_triton.apply_lowering(gm, plan)
    kernel = plan.regions[0].kernel
    code = gm.code
    (FileCheck().check(f"torch.ops.dsgraph_triton.{kernel}_interpreted.default(x_1, w_1, b_1, h_1)")
     .check("getitem").check("getitem").check("return").run(code))
    for gone in ("var_mean", "rsqrt", "gelu", "aten.add"):
        assert gone not in code
    assert plan.regions[0].status == "lowered" and plan.stats()["lowered"] == 1
    fresh = make_inputs()
    for got, want in zip(outputs_of(gm, fresh), block(*fresh)):
        assert rel_err(got, want) <= 1e-5


def test_pure_nodes_between_members_that_read_an_output_move_after_the_kernel():
    def fn(x, w):
        a = torch.exp(x)
        m = a @ w  # not lowered; reads the region's output a, sits between a and c
        c = x * 2 + a  # c reads a and x: same region as a
        return m, c

    inputs = [torch.randn(6, 6), torch.randn(6, 6)]
    gm = graph(fn, inputs)
    plan = lower_triton.plan_lowering(gm, "all")
    assert [p.region.names for p in plan.regions] == [["exp", "mul", "add"]]
    gm = lower_triton.apply_lowering(gm, plan)
    FileCheck().check("dsgraph_triton").check("aten.mm").run(gm.code)
    fresh = [torch.randn(6, 6), torch.randn(6, 6)]
    for got, want in zip(outputs_of(gm, fresh), fn(*fresh)):
        assert rel_err(got, want) <= 1e-5


def test_a_one_node_region_keeps_everything_after_it_in_order():
    def fn(x, w):
        a = torch.exp(x)  # alone: its users are matmuls
        return a @ w, (a @ w).sum(0)

    inputs = [torch.randn(5, 5), torch.randn(5, 5)]
    gm = graph(fn, inputs)
    plan = lower_triton.plan_lowering(gm, "all")
    assert [p.region.names for p in plan.regions] == [["exp"]]
    gm = lower_triton.apply_lowering(gm, plan)
    assert list(gm.graph.nodes)[-1].op == "output"
    FileCheck().check("dsgraph_triton").check("aten.mm").check("aten.mm").check("aten.sum").check("return").run(gm.code)
    fresh = [torch.randn(5, 5), torch.randn(5, 5)]
    for got, want in zip(outputs_of(gm, fresh), fn(*fresh)):
        assert rel_err(got, want) <= 1e-5


def test_an_injected_compile_failure_leaves_the_region_with_a_warning():
    def fn(x, y):
        return torch.sigmoid(x) * 3, (y @ y).tanh() + 1

    inputs = [torch.randn(4, 7), torch.randn(7, 7)]
    gm = graph(fn, inputs)
    plan = lower_triton.plan_lowering(gm, "all")
    assert len(plan.regions) == 2
    with pytest.warns(DsgraphLoweringWarning, match="region 0 .* is left to Inductor: .*injected compile failure"):
        gm = lower_triton.apply_lowering(gm, plan, fail_regions={0})
    assert plan.regions[0].status.startswith("left to Inductor") and plan.regions[1].status == "lowered"
    code = gm.code
    assert "aten.sigmoid" in code and "aten.tanh" not in code and code.count("dsgraph_triton") == 1
    assert plan.stats()["fallbacks"] == 1
    fresh = [torch.randn(4, 7), torch.randn(7, 7)]
    for got, want in zip(outputs_of(gm, fresh), fn(*fresh)):
        assert rel_err(got, want) <= 1e-5


def test_kernel_sources_one_file_per_lowered_kernel():
    gm = graph(block, make_inputs())
    plan = lower_triton.plan_lowering(gm, "all")
    before = lower_triton.kernel_sources(plan)
    lower_triton.apply_lowering(gm, plan)
    after = lower_triton.kernel_sources(plan)
    name = plan.regions[0].kernel
    assert list(after) == [f"{name}.py"] and before == after
    assert after[f"{name}.py"].startswith(f"# {name}: reduction kernel")


def test_refusals_say_why():
    gm = graph(lambda x: torch.exp(x) + 1, [torch.randn(3, 4)])
    assert lower_triton.refusal(gm, inductor=False) is None
    why = lower_triton.refusal(gm, inductor=True)
    assert "opaque ops" in why and "wrap_triton does not trace interpreted kernels" in why
    assert lower_triton.refusal(gm, inductor=True, opaque=True) is None


def test_run_reports_stats_and_hands_sources_to_the_dump_hook():
    from dsgraph.pass_api import CompileConfig, PassContext
    from dsgraph.pass_api import validate_options
    from dsgraph.compile.pipeline import parse

    gm = graph(block, make_inputs())
    config = CompileConfig(validate_options({"inductor": False}), parse("lower_triton{select=all}"))
    ctx = PassContext(config, "forward", "c000_forward")
    ctx.args = {"select": "all"}
    ctx._current_pass = "lower_triton"  # as the manager sets it while the pass runs
    result = lower_triton.run(gm, ctx)
    assert result.changed and result.stats["lowered"] == 1
    assert list(ctx.dump_files) == [f"{result.stats['kernels'][0]}.py"]
    assert "@triton.jit" in next(iter(ctx.dump_files.values()))


def test_kernels_go_to_inductor_as_user_defined_triton_kernels():
    """The GPU path's graph, built on the CPU: with Triton's interpreter off for this one
    kernel, each dsgraph_triton op is traced into ``triton_kernel_wrapper_mutation`` with
    symbolic sizes read from the tensors and the exact strides Inductor must keep. (Running
    it needs a GPU: tests/gpu/test_lowering_gpu.py.)"""
    import triton
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    from dsgraph.lowering.inductor import to_user_kernels

    def fn(x, w, slot):
        y = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x * w  # a signature no other test compiles: this kernel is not interpreted
        slot.copy_(slot + y * 0.125)
        return F.silu(y)

    gm = graph(fn, [torch.randn(4, 6, 40), torch.randn(40), torch.randn(4, 6, 40)], mode="symbolic")
    plan = lower_triton.plan_lowering(gm, "all")
    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = False
    try:
        lower_triton.apply_lowering(gm, plan, check=False)  # cannot run without a GPU
        assert to_user_kernels(gm) == 1
    finally:
        triton.knobs.runtime.interpret = old
    code = gm.code
    assert "dsgraph_triton" not in code
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_mutation]
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    assert kernel.fn.__name__ == plan.regions[0].kernel
    kwargs = node.kwargs["kwargs"]
    # sizes come from the graph's tensors, not constants; the slot is written in place
    assert kwargs["N"].target is torch.ops.aten.sym_size.int
    assert kwargs["out1_ptr"].name == "slot_1" and kwargs["in2_ptr"].name == "slot_1"
    # exact strides for Inductor (it would otherwise only keep the stride order)
    _, eager_kwargs = node.meta["eager_input_vals"]
    assert set(eager_kwargs["kwargs"]) >= {"in0_ptr", "out0_ptr", "out1_ptr"}
    out = gm.graph.output_node().args[0]
    assert out.target is torch.ops.aten.empty_strided.default  # the output the kernel writes (not empty_permuted: Inductor refuses it here)


def test_static_sizes_go_to_inductor_as_the_fast_entry_points():
    """With static sizes the traced launch is the one a GPU run makes: a one-tile reduction
    (its BLOCK_N a constant of the launch) and a flat pointwise kernel, autotuned by
    Inductor over their own configs."""
    import triton
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    from dsgraph.lowering.inductor import to_user_kernels

    def fn(x, w, y):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * x * w  # a signature no other test compiles
        return r, torch.sigmoid(y) * 0.375 - y  # y: another shape, its own region

    gm = graph(fn, [torch.randn(4, 6, 40), torch.randn(40), torch.randn(5, 33)])
    plan = lower_triton.plan_lowering(gm, "all")
    assert len(plan.regions) == 2
    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = False
    try:
        lower_triton.apply_lowering(gm, plan, check=False)  # cannot run without a GPU
        assert to_user_kernels(gm) == 2
    finally:
        triton.knobs.runtime.interpret = old
    launched = {}
    for node in gm.graph.nodes:
        if node.target is torch.ops.higher_order.triton_kernel_wrapper_mutation:
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            launched[kernel.fn.__name__] = (kernel, node.kwargs["kwargs"], node.kwargs["grid"])
    names = {p.kernel for p in plan.regions}
    assert set(launched) == {f"{n}_tile" for n in names if n.startswith("dsg_red")} | \
        {f"{n}_flat" for n in names if n.startswith("dsg_pw")}
    for name, (kernel, kwargs, grids) in launched.items():
        if name.endswith("_tile"):
            assert kwargs["BLOCK_N"] == 64 and kwargs["N"] == 40 and kwargs["D1"] == 1
            assert all(set(c.kwargs) == {"BLOCK_M", "ROWS"} for c in kernel.configs)
            # one grid per config: 24 rows in programs of BLOCK_M * ROWS
            assert [tuple(g) for g in grids] == \
                [(-(-24 // (c.kwargs["BLOCK_M"] * c.kwargs["ROWS"])), 1, 1) for c in kernel.configs]
        else:
            assert kwargs["NUMEL"] == 5 * 33 and all(set(c.kwargs) == {"BLOCK"} for c in kernel.configs)


def test_getitem_results_follow_the_region_outputs():
    gm = graph(block, make_inputs())
    plan = lower_triton.plan_lowering(gm, "all")
    gm = lower_triton.apply_lowering(gm, plan)
    fused = next(n for n in gm.graph.nodes if "dsgraph_triton" in str(n.target))
    getitems = [u for u in fused.users if u.target is operator.getitem]
    assert sorted(u.args[1] for u in getitems) == [0, 1]
    assert all(u.meta["val"].shape == fused.meta["val"][u.args[1]].shape for u in getitems)
