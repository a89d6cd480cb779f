"""Generated Triton kernels against eager, run by Triton's interpreter on the CPU.

Triton's interpreter is switched on for this module by the ``triton_interpreter`` fixture
below (the same in each test_lowering_* module that runs kernels; tests/conftest.py is
shared and stays as it is).

Inputs are fresh random tensors per check with sizes that are not multiples of the
interpreter's tiles (16 and 8 columns, 2 or 4 rows); fp32 results must be within the fp32
rule of eager (relative norm error <= 1e-5), bf16/fp16 within the bf16 rule against fp64
(RMSE <= 2 * RMSE(eager) + 1e-3).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

from dsgraph.lowering import kernels, launch_layout
from dsgraph.lowering.check import rel_err
from dsgraph.lowering.codegen import kernel_arguments, render
from dsgraph.lowering.kernel_ir import region_ir
from dsgraph.lowering.regions import find_regions


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


def only_region(fn, *example, mode="fake"):
    gm = make_fx(fn, tracing_mode=mode)(*example)
    regions = find_regions(gm)
    assert len(regions) == 1, [str(r) for r in regions]
    region = regions[0]
    ir, binding = region_ir(region)
    return gm, region, binding, kernels.compile_kernel(ir)


def run_kernel(gm, region, binding, compiled, inputs):
    """The fn's outputs as the region kernel computes them (graph output order)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    value = dict(zip(placeholders, inputs))
    tensors = [value[p] for p in binding.params]
    scalars = [value[s] if s in value else _size_of(s, value) for s in binding.scalars]
    got = compiled.op(*tensors, *scalars)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    by_node = dict(zip(region.outputs, got))
    return [by_node[o] for o in graph_outputs(gm)]


def graph_outputs(gm):
    out = gm.graph.output_node().args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _size_of(node, value):
    """A sym_size node's value on the concrete inputs."""
    assert node.target is torch.ops.aten.sym_size.int, node.format_node()
    return value[node.args[0]].shape[node.args[1]]


def rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def check_close(fn, inputs, got, ref_fn=None):
    """All-fp32 computations: fp32 rule against eager. With bf16/fp16 inputs the kernel keeps
    fp32 between ops where eager rounds, so every float output gets the bf16 rule against
    fp64 (an fp32 output of bf16 math too; ``ref_fn``: the fp64 reference when ``fn`` casts
    to a low precision itself). Integers and bools: exact."""
    low = any(x.dtype in (torch.bfloat16, torch.float16) for x in inputs)
    want = fn(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got) == len(want)
    ref = None
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype in (torch.float32, torch.float64) and not low:
            assert rel_err(g, w) <= 1e-5, rel_err(g, w)
        elif w.is_floating_point():
            if ref is None:
                ref = (ref_fn or fn)(*[x.double() if x.is_floating_point() else x for x in inputs])
                ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            r = ref[i].double()
            assert rmse(g, r) <= 2 * rmse(w, r) + 1e-3, (rmse(g, r), rmse(w, r))
        else:
            assert torch.equal(g, w)


def pointwise_mix(x, y):
    a = F.gelu(x) + F.gelu(y, approximate="tanh")
    b = torch.sigmoid(a) * F.silu(x) - torch.tanh(y) / (torch.abs(x) + 1)
    c = torch.where(x > y, torch.exp(-b.abs()), torch.log(torch.abs(y) + 0.5))
    d = torch.clamp(c, -0.7, 0.9) + torch.relu(x) ** 2 + torch.rsqrt(torch.abs(b) + 1) + torch.sqrt(torch.abs(a))
    return d - (-x) ** 3 + torch.abs(y) ** 0.37 - 1 / (x * x + 1), x > 0.3


def test_pointwise_ops_fp32_match_eager():
    x, y = torch.randn(5, 37), torch.randn(5, 37)
    gm, region, binding, compiled = only_region(pointwise_mix, x, y)
    assert region.kind == "pointwise"
    x, y = torch.randn(5, 37) * 2, torch.randn(5, 37) * 2  # fresh inputs for the check
    check_close(pointwise_mix, [x, y], run_kernel(gm, region, binding, compiled, [x, y]))


def test_tanh_is_accurate_near_zero_and_far_out():
    x = torch.cat([torch.randn(50) * 1e-3, torch.randn(50) * 0.05, torch.randn(50) * 3, torch.randn(11) * 30])
    gm, region, binding, compiled = only_region(torch.tanh, torch.randn(161))
    got = run_kernel(gm, region, binding, compiled, [x])[0]
    assert rel_err(got, torch.tanh(x)) <= 1e-6
    # elementwise too, not only in norm: the small inputs are where the exp form cancels
    assert ((got - torch.tanh(x)).abs() <= 1e-6 * torch.tanh(x).abs() + 1e-7).all()


def ulps(got, want64):
    """|got - want| in units of the fp32 spacing at the exact value."""
    spacing = torch.from_numpy(np.spacing(want64.abs().float().numpy())).double()
    return (got.double() - want64).abs() / spacing


def test_erf_is_within_2_ulp_over_the_fp32_range():
    """fp32 erf is codegen's own (branch-free, ~18 instructions on sm_90 where libdevice's
    erff takes ~30): within 2 ulp of erf, as libdevice's erff is documented to be, on a dense
    grid over [-6, 6], tiny and subnormal magnitudes, and the special values."""
    tiny = torch.logspace(-38, 0, 100_000, dtype=torch.float64).float()
    x = torch.cat([torch.linspace(-6, 6, 2_000_001), tiny, -tiny, torch.randn(100_000) * 3,
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 4.0, 30.0, -1e30, float("inf"), -float("inf"), float("nan")])])
    gm, region, binding, compiled = only_region(torch.erf, torch.randn(8))
    assert "def _erf(x):" in compiled.source and "tl.math.erf" not in compiled.source
    (got,) = kernels.launch(compiled, [x], [], config=(65536, 1), form="flat")
    want = torch.erf(x.double())
    finite = ~torch.isnan(want)
    assert torch.isnan(got[~finite]).all()
    assert ulps(got[finite], want[finite]).max().item() <= 2.0
    assert torch.equal(got[x == 0], x[x == 0])  # signed zeros kept
    assert rel_err(got, torch.erf(x)) <= 1e-6


def test_fp64_erf_and_gelu_keep_libdevices_erf():
    for fn in (torch.erf, F.gelu):
        gm, region, binding, compiled = only_region(fn, torch.randn(8, dtype=torch.float64))
        assert "tl.math.erf(" in compiled.source and "def _erf(x):" not in compiled.source
        x = torch.randn(5, 33, dtype=torch.float64) * 3
        assert rel_err(compiled.op(x), fn(x)) <= 1e-12


def test_strided_and_broadcast_inputs():
    def fn(xt, bias, row, scalar, mid):
        # xt transposed (strided), bias [N], row [M, 1], a 0-d tensor, and a [B, 1, N] input
        h = ((mid + xt) * bias + row) * scalar
        return torch.sigmoid(h)

    make = lambda: [torch.randn(37, 5).t(), torch.randn(37), torch.randn(5, 1), torch.randn(()), torch.randn(3, 1, 37)]
    gm, region, binding, compiled = only_region(fn, *make())
    ir = compiled.ir
    spaces = {binding.params[l.param].name: l.space for l in ir.loads}
    assert spaces == {"xt_1": "full", "bias_1": "full", "row_1": "row", "scalar_1": "row", "mid_1": "full"}
    inputs = make()
    assert not inputs[0].is_contiguous()
    check_close(fn, inputs, run_kernel(gm, region, binding, compiled, inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes(dtype):
    def fn(x, w):
        h = F.gelu(x * w + 0.25) - torch.tanh(x)
        return h, (h * 3).to(torch.float32)

    make = lambda: [torch.randn(3, 7, 45).to(dtype), torch.randn(45).to(dtype)]
    gm, region, binding, compiled = only_region(fn, *make())
    inputs = make()
    got = run_kernel(gm, region, binding, compiled, inputs)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    check_close(fn, inputs, got)


def layer_norm(x, w, b):
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd * w + b, mean, rstd


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def unbiased_var_and_sums(x):
    return torch.var(x, -1, keepdim=True), x.sum(-1), (x * 2).mean(-1)


@pytest.mark.parametrize("fn,make", [
    (layer_norm, lambda: [torch.randn(3, 5, 41) * 2 + 1, torch.randn(41), torch.randn(41)]),
    (rms_norm, lambda: [torch.randn(7, 41), torch.randn(41)]),
    (softmax, lambda: [torch.randn(2, 3, 5, 43) * 3]),
    (unbiased_var_and_sums, lambda: [torch.randn(9, 40) + 3]),
])
def test_reductions_fp32(fn, make):
    gm, region, binding, compiled = only_region(fn, *make())
    assert region.kind == "reduction"
    inputs = make()
    check_close(fn, inputs, run_kernel(gm, region, binding, compiled, inputs))


@pytest.mark.parametrize("form,block_n", [("tile", None), ("tile", (2, 3)), ("tile", (1, 4)), ("tile", (4, 2)),
                                          ("general", 64), ("general", 16), ("general", 8)])
def test_each_reduction_form_agrees_with_eager(form, block_n):
    """A reduction kernel has two entry points: the one-tile kernel (BLOCK_N =
    next_power_of_2(N) from the launcher, every input read once; BLOCK_M rows per tile, ROWS
    tiles per program, each loading the next one's rows) and the general kernel, which takes
    the one-tile branch when N <= BLOCK_N and loops per level of reductions otherwise. Here
    each runs with a fixed config (N = 37: one tile at 64, 3 and 5 chunks at 16 and 8; for
    the one-tile kernel (BLOCK_M, ROWS) whose last program ends past the last row)."""
    for fn, make in [(layer_norm, lambda: [torch.randn(3, 5, 37) * 2 + 1, torch.randn(37), torch.randn(37)]),
                     (softmax, lambda: [torch.randn(4, 37) * 3]),
                     (unbiased_var_and_sums, lambda: [torch.randn(6, 37) + 3])]:
        gm, region, binding, compiled = only_region(fn, *make())
        inputs = make()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if form == "tile":
            config = (2, 1) if block_n is None else (*block_n, 1)
        else:
            config = (2, block_n, 1)
        got = kernels.launch(compiled, [inputs[placeholders.index(p)] for p in binding.params], [],
                             config=config, form=form)
        by_node = dict(zip(region.outputs, got))
        check_close(fn, inputs, [by_node[o] for o in graph_outputs(gm)])
    assert "if N <= BLOCK_N:" in compiled.source and "for start in range(0, N, BLOCK_N):" in compiled.source
    assert f"def {compiled.name}_tile(" in compiled.source


def test_launcher_picks_the_one_tile_form_up_to_the_widest_tile():
    gm, region, binding, compiled = only_region(softmax, torch.randn(4, 37))
    for n, form, block_n in [(37, "tile", 64), (1, "tile", 1), (launch_layout.MAX_TILE_N, "tile", launch_layout.MAX_TILE_N),
                             (launch_layout.MAX_TILE_N + 1, "general", None)]:
        x = torch.empty(3, n, device="meta")
        full, outs = launch_layout.allocate_outputs(compiled.ir, [x])
        plan = launch_layout.launch_plan(compiled.ir, [x], outs, full, [])
        assert (plan.form, plan.block_n) == (form, block_n), n
    x = torch.randn(3, 9)
    assert rel_err(compiled.op(x), softmax(x)) <= 1e-6 and compiled.last[0] == "tile"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reductions_low_precision_with_fp32_compute(dtype):
    """As autocast graphs have them: the low-precision input upcast, normalized, cast back."""
    def norms(x, w, b, low, high):
        y, mean, rstd = layer_norm(x.to(high), w, b)
        return y.to(low), softmax(x.to(high)).to(low), rstd

    def fn(x, w, b):
        return norms(x, w, b, dtype, torch.float32)

    def reference(x, w, b):
        return norms(x, w, b, torch.float64, torch.float64)

    make = lambda: [torch.randn(4, 3, 50).to(dtype), torch.randn(50), torch.randn(50)]
    gm = make_fx(fn, tracing_mode="fake")(*make())
    regions = find_regions(gm)
    # the layer norm and the softmax read the same upcast: one region
    assert len(regions) == 1 and regions[0].kind == "reduction"
    ir, binding = region_ir(regions[0])
    compiled = kernels.compile_kernel(ir)
    inputs = make()
    check_close(fn, inputs, run_kernel(gm, regions[0], binding, compiled, inputs), reference)


def test_reduction_of_transposed_input():
    make = lambda: [torch.randn(41, 6).t()]
    gm, region, binding, compiled = only_region(softmax, *make())
    inputs = make()
    assert inputs[0].stride() == (1, 6)
    check_close(softmax, inputs, run_kernel(gm, region, binding, compiled, inputs))


def test_dynamic_sizes_one_kernel_serves_two_sizes():
    def fn(x, w):
        y, mean, rstd = layer_norm(x, w, w)
        return y * x.shape[-1], rstd

    gm, region, binding, compiled = only_region(fn, torch.randn(3, 5, 41), torch.randn(41), mode="symbolic")
    assert any(isinstance(s, torch.SymInt) for s in region.full_shape)
    assert len(binding.scalars) == 1  # x.shape[-1] is an argument, not a constant
    for shape in [(2, 7, 33), (5, 3, 50)]:
        inputs = [torch.randn(*shape), torch.randn(shape[-1])]
        check_close(fn, inputs, run_kernel(gm, region, binding, compiled, inputs))
    for size in ("41", "33", "50"):
        assert size not in compiled.source
    # the same region traced at another size is the same kernel
    _, _, _, again = only_region(fn, torch.randn(2, 9, 17), torch.randn(17), mode="symbolic")
    assert again is compiled


def test_static_sizes_are_not_constants_either():
    _, _, _, a = only_region(softmax, torch.randn(3, 41))
    _, _, _, b = only_region(softmax, torch.randn(6, 23))
    assert a is b and "41" not in a.source and "23" not in a.source


def test_source_reads_well():
    gm, region, binding, compiled = only_region(layer_norm, torch.randn(3, 5, 41), torch.randn(41), torch.randn(41))
    src = compiled.source
    assert compiled.target == "interpreter" and src == render(compiled.ir, "interpreter")  # deterministic
    compile(src, "kernel.py", "exec")  # parses
    (FileCheck().check("# ops: var_mean").check(f"# entry points: {compiled.name}_tile, {compiled.name} ")
     .check("# target: interpreter").check("def _add(a, b):").check("def _max(a, b):")
     # the one-tile kernel: N a constexpr; w and b (the same for every row) read once per
     # program, then ROWS tiles, each loading the next one's x before its reductions
     .check(f"def {compiled.name}_tile(").check("N: tl.constexpr").check("BLOCK_M: tl.constexpr")
     .check("ROWS: tl.constexpr").check("col_mask = cols < N").check_not("for start in range")
     .check("# the same for every row: read once per program")
     .check("tl.load(tl.broadcast_to(in1_ptr + cols * in1_s2, (BLOCK_M, BLOCK_N))")
     .check("tl.load(tl.broadcast_to(in2_ptr + cols * in2_s2, (BLOCK_M, BLOCK_N))")
     .check("r_first = tl.minimum(rows_first, M - 1)").check("v0_in = tl.load(in0_ptr + in0_row_first")
     .check("for step in range(ROWS):").check("row_mask = rows < M").check("if ROWS > 1:")
     .check("v0_in = tl.load(in0_ptr + in0_row_next").check("mask=next_mask & col_mask)")
     .check("v1 = tl.reduce(t_v1, 1, _add)").check("/ N  # mean")
     .check("tl.store(out2_ptr")
     # the general kernel: the same tile behind a runtime branch, then the loops
     .check(f"def {compiled.name}(").check("if N <= BLOCK_N:").check("v1 = tl.reduce(t_v1, 1, _add)")
     .check("else:").check("# loop 1 of 3").check("for start in range(0, N, BLOCK_N):").check("acc0_")
     .check("tl.reduce(acc0_").check(", 1, _add)").check("/ N  # mean").check("tl.store(out0_ptr + out0_row")
     .check("# loop 2 of 3").check("# loop 3 of 3").check('eviction_policy="evict_first"')
     .check("tl.store(out2_ptr").run(src))
    assert src.count("for start in range(0, N, BLOCK_N):") == 3
    # the one-tile kernel's first tile and next tiles, the general kernel's tile and loops
    assert src.count("tl.load(in0_ptr") == 6
    assert 'eviction_policy="evict_last"' in src  # the first loops keep the row cached
    # only Triton builtins: triton.language's @jit helpers are not interpreted unless the
    # interpreter was on when triton was imported
    for helper in ("tl.sum(", "tl.max(", "tl.sigmoid(", "tl.zeros(", "tl.cdiv("):
        assert helper not in src


def test_pointwise_source_has_a_flat_and_a_general_entry_point():
    gm, region, binding, compiled = only_region(lambda x, y: torch.exp(x) * y, torch.randn(3, 41), torch.randn(3, 41))
    (FileCheck().check(f"def {compiled.name}_flat(").check("NUMEL,").check("BLOCK: tl.constexpr")
     .check("start = tl.program_id(0).to(tl.int64) * BLOCK").check("offs = tl.arange(0, BLOCK)")
     .check("tl.load(in0_ptr + start + offs, mask=mask").check("tl.store(out0_ptr + start + offs")
     .check(f"def {compiled.name}(").check("BLOCK_M: tl.constexpr").check("cols * in0_s1").run(compiled.source))
    assert "_s0" not in compiled.source.split(f"def {compiled.name}(")[0]  # no strides in the flat form


def test_nan_propagates_like_eager():
    def fn(x):
        return x.amax(-1, keepdim=True), torch.relu(x), torch.clamp(x, -0.5, 0.5), torch.maximum(x, x * 0.5)

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(6, 19))
    regions = find_regions(gm)
    # the pointwise ops read x as the amax does: one kernel, stores in the amax's loop
    assert len(regions) == 1 and regions[0].kind == "reduction"
    x = torch.randn(6, 19)
    x[1, 3] = float("nan")
    x[4, 18] = float("nan")
    want = fn(x)
    for region in regions:
        ir, binding = region_ir(region)
        compiled = kernels.compile_kernel(ir)
        got = compiled.op(x)
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        outputs = graph_outputs(gm)
        for node, g in zip(region.outputs, got):
            w = want[outputs.index(node)]
            assert torch.equal(torch.isnan(g), torch.isnan(w)), node.name
            assert rel_err(g, w) <= 1e-6


def test_integer_and_bool_inputs():
    def fn(i, b, x):
        return torch.where(b, i * 0.5, x), i > 2, (i + 3) * 2

    make = lambda: [torch.randint(-5, 6, (4, 21)), torch.rand(4, 21) > 0.5, torch.randn(4, 21)]
    gm = make_fx(fn, tracing_mode="fake")(*make())
    regions = find_regions(gm)
    inputs = make()
    want = fn(*inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = graph_outputs(gm)
    seen = 0
    for region in regions:
        ir, binding = region_ir(region)
        compiled = kernels.compile_kernel(ir)
        got = compiled.op(*[inputs[placeholders.index(p)] for p in binding.params])
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        for node, g in zip(region.outputs, got):
            w = want[outputs.index(node)]
            assert g.dtype == w.dtype
            assert torch.equal(g, w) if not w.is_floating_point() else rel_err(g, w) <= 1e-6
            seen += 1
    assert seen == 3


def test_empty_and_single_element_rows():
    for shape in [(0, 7), (5, 1), (1, 1)]:
        _, region, binding, compiled = only_region(softmax, torch.randn(*shape))
        x = torch.randn(*shape)
        got = compiled.op(x)
        assert got.shape == x.shape
        if x.numel():
            assert rel_err(got, softmax(x)) <= 1e-6


def test_bf16_rounding_is_bitwise_eagers():
    """fp32 -> bf16 rounds to nearest even. Under the interpreter (whose own conversion
    truncates) the kernel does it on the bits; these are eager's bits: ties, NaN, inf, huge
    and subnormal values, in both entry points (flat and general)."""
    def fn(x):
        y = x * 3
        return y.to(torch.bfloat16), (y.to(torch.bfloat16).float() + 1).to(torch.bfloat16)

    x = torch.randn(7, 45) * torch.logspace(-20, 20, 45)
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e38, 2.0 ** -130, -0.0])
    x[1, :4] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 1.0078125 + 2 ** -8]) / 3
    gm, region, binding, compiled = only_region(fn, torch.randn(7, 45))
    for form in ("flat", "general"):
        got = kernels.launch(compiled, [x], [], form=form)
        by_node = dict(zip(region.outputs, got))
        for g, w in zip([by_node[o] for o in graph_outputs(gm)], fn(x)):
            assert torch.equal(g.view(torch.int16)[~torch.isnan(w)], w.view(torch.int16)[~torch.isnan(w)]), form
            assert torch.equal(torch.isnan(g), torch.isnan(w))
    (FileCheck().check("# target: interpreter").check("def _round_bf16(x):").check("bits = x.to(tl.uint32, bitcast=True)")
     .check("def _to_bf16(x):").check("bitcast=True)").run(compiled.source))
    # a value the graph rounds to bf16 and stores as bf16 is converted once, from fp32
    assert "_to_bf16(v1)" in compiled.source and "_round_bf16(v1)" in compiled.source


def test_gpu_source_uses_the_hardware_bf16_conversion():
    """The GPU source (what the kernel is compiled from where Triton targets a GPU) converts
    with the hardware's round-to-nearest-even (``cvt.rn.bf16``: tests/unit/
    test_lowering_asm.py compiles it), not with bit operations; everything else is the
    interpreter's source, line for line."""
    def fn(x, w):
        y = (x.float() * w).to(torch.bfloat16)
        return y, (y.float() + 1).to(torch.bfloat16)

    gm, region, binding, compiled = only_region(fn, torch.randn(4, 45, dtype=torch.bfloat16), torch.randn(45))
    gpu = render(compiled.ir, "gpu")
    assert gpu == render(compiled.ir, "gpu")  # deterministic per target
    (FileCheck().check("# target: gpu").check("def _round_bf16(x):")
     .check('return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)')
     .check("def _to_bf16(x):").check('return x.to(tl.bfloat16, fp_downcast_rounding="rtne")').run(gpu))
    assert "bitcast" not in gpu and "0x7FFF" not in gpu
    interp = compiled.source

    def without_helpers(src):
        lines = src.splitlines()
        kernel_start = next(i for i, l in enumerate(lines) if l.startswith(f"def {compiled.name}"))
        return [l for l in lines[kernel_start:]]

    assert without_helpers(gpu) == without_helpers(interp)
    with pytest.raises(ValueError, match="target must be one of"):
        render(compiled.ir, "cuda")


def _plan(compiled, tensors, scalars=()):
    full, outs = launch_layout.allocate_outputs(compiled.ir, tensors)
    return launch_layout.launch_plan(compiled.ir, tensors, outs, full, list(scalars))


def test_flat_form_for_tensors_dense_in_one_layout_general_otherwise():
    def fn(x, y):
        return torch.sigmoid(x) * y

    gm, region, binding, compiled = only_region(fn, torch.randn(3, 5, 41), torch.randn(3, 5, 41))
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    assert _plan(compiled, [meta(3, 5, 41), meta(3, 5, 41)]).form == "flat"
    # every tensor transposed alike: still element i at offset i for all (the output follows
    # the graph's layout, which was contiguous: general)
    assert _plan(compiled, [meta(41, 5, 3).permute(2, 1, 0), meta(41, 5, 3).permute(2, 1, 0)]).form == "general"
    assert _plan(compiled, [meta(3, 5, 41), meta(41).expand(3, 5, 41)]).form == "general"  # a broadcast
    assert _plan(compiled, [meta(3, 5, 41), meta(3, 5, 82)[..., ::2]]).form == "general"  # gaps
    flat = _plan(compiled, [meta(3, 5, 41), meta(3, 5, 41)])
    assert flat.args[-1] == 3 * 5 * 41 and (flat.m, flat.n) == (1, 3 * 5 * 41)
    for form in ("flat", "general"):
        x, y = torch.randn(3, 5, 41), torch.randn(3, 5, 41)
        (got,) = kernels.launch(compiled, [x, y], [], form=form)
        assert rel_err(got, fn(x, y)) <= 1e-6, form
    with pytest.raises(ValueError, match="flat form"):
        kernels.launch(compiled, [torch.randn(3, 5, 41), torch.randn(41).expand(3, 5, 41)], [], form="flat")


def test_leading_dims_merge_when_every_tensor_walks_them_in_step():
    """Contiguous tensors and stride-0 broadcasts merge into one row index (D1 = 1: Triton
    compiles the % and // away); a tensor with a gap between rows keeps them apart, and the
    kernel indexes it right either way."""
    def fn(x, w, b):
        return layer_norm(x, w, b)[0]

    gm, region, binding, compiled = only_region(fn, torch.randn(3, 5, 41), torch.randn(41), torch.randn(41))
    x, w, b = torch.randn(3, 5, 41), torch.randn(41), torch.randn(41)
    gapped = torch.randn(3, 8, 41)[:, :5]  # rows of a batch 5 apart in 8: dims 0 and 1 do not merge
    for x_in, d1 in [(x, 1), (gapped, 5)]:
        plan = _plan(compiled, [x_in, w, b])
        args = dict(zip(kernel_arguments(compiled.ir, plan.form), plan.args))
        assert (plan.form, args["M"], args["N"], args["D1"]) == ("tile", 15, 41, d1)
        if d1 == 1:  # merged: one row stride per tensor (w and b broadcast: 0)
            assert (args["in0_s0"], args["in0_s1"], args["in1_s0"], args["out0_s0"]) == (41, 0, 0, 41)
        for form in ("tile", "general"):
            (got,) = kernels.launch(compiled, [x_in, w, b], [], form=form)
            assert rel_err(got, fn(x_in, w, b)) <= 1e-5, (form, d1)
