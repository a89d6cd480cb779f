"""Region kernels as torch ops: the op's schema and fake implementation, the cache by
signature, the autotuner's configs, in-place writes, and the check against eager.

Kernels run under Triton's interpreter (the ``triton_interpreter`` fixture)."""

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from dsgraph.lowering import kernels
from dsgraph.lowering.check import KernelMismatch, check_region, rel_err
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


def region_kernel(fn, *example, mode="fake"):
    gm = make_fx(fn, tracing_mode=mode)(*example)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    return region, binding, kernels.compile_kernel(ir)


def norm_and_stats(x, w):
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    y = (x - mean) * torch.rsqrt(var + 1e-5) * w
    return y.to(torch.bfloat16), mean


def test_op_schema_and_name():
    region, binding, compiled = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(20))
    op = compiled.op
    # an interpreted kernel's op carries the suffix (a GPU kernel of the same region does not)
    assert op is getattr(torch.ops.dsgraph_triton, f"{compiled.name}_interpreted").default
    assert str(op._schema) == f"dsgraph_triton::{compiled.name}_interpreted(Tensor x0, Tensor x1) -> (Tensor, Tensor)"
    assert kernels.compiled_for_op(op) is compiled
    assert kernels.compiled_for_op(torch.ops.aten.add.Tensor) is None


def test_fake_implementation_gives_shapes_dtypes_and_strides_without_running():
    region, binding, compiled = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(20))
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        x = mode.from_tensor(torch.empty(4, 6, 33))
        w = mode.from_tensor(torch.empty(33))
        mean, y = compiled.op(x, w)  # outputs in graph order
    assert (tuple(y.shape), y.dtype, y.stride()) == ((4, 6, 33), torch.bfloat16, (198, 33, 1))
    assert (tuple(mean.shape), mean.dtype) == ((4, 6, 1), torch.float32)


def test_fresh_output_keeps_the_graphs_memory_order():
    """An output the graph had transposed is allocated transposed (users may view it)."""
    def fn(xt):
        return torch.exp(xt) * 2

    xt = torch.randn(23, 6).t()
    gm = make_fx(fn, tracing_mode="fake")(xt)
    (region,) = find_regions(gm)
    assert region.outputs[0].meta["val"].stride() == (1, 6)
    ir, binding = region_ir(region)
    compiled = kernels.compile_kernel(ir)
    x = torch.randn(23, 6).t()
    out = compiled.op(x)
    assert out.stride() == (1, 6)
    assert rel_err(out, fn(x)) <= 1e-6


def test_cache_is_by_signature_not_size():
    _, _, a = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(20))
    _, _, b = region_kernel(norm_and_stats, torch.randn(7, 2, 45), torch.randn(45))
    assert a is b
    # a weight [1, 1, N] is the broadcast [N] one (the same for every row, loaded once per
    # program); one of the full shape is another kernel (loaded per row), whose strides
    # serve any layout
    _, _, same = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(1, 1, 20))
    assert same is a
    _, _, full = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(3, 5, 20))
    assert full is not a and [l.cols_only for l in full.ir.loads] == [False, False]
    assert [l.cols_only for l in a.ir.loads] == [False, True]
    _, _, again = region_kernel(norm_and_stats, torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    assert again is full
    # the broadcast kernel reads w by column alone: a w that varies by row is refused
    x, w = torch.randn(3, 5, 20), torch.randn(20)
    mean, y = a.op(x, w)  # outputs in graph order
    assert rel_err(y.float(), norm_and_stats(x, w)[0].float()) <= 1e-2
    with pytest.raises(ValueError, match="varies by row"):
        a.op(x, torch.randn(3, 5, 20))
    # another dtype, a per-row weight (loaded once per row) or another constant: other kernels
    _, _, c = region_kernel(norm_and_stats, torch.randn(3, 5, 20, dtype=torch.float16), torch.randn(20))
    _, _, d = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(3, 5, 1))
    _, _, e = region_kernel(lambda x, w: norm_and_stats(x * 2, w), torch.randn(3, 5, 20), torch.randn(20))
    assert len({a.name, c.name, d.name, e.name}) == 4
    assert {a.name, c.name, d.name, e.name} <= set(kernels.cache_info().values())


def test_autotune_configs_are_small_under_the_interpreter():
    _, _, compiled = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(20))
    assert compiled.forms == ["tile", "general"]
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in compiled.configs("general")] == \
        [(m, n) for m, n, _ in kernels.INTERPRETER_CONFIGS["reduction"]]
    assert [c.kwargs for c in compiled.configs("tile", 64)] == \
        [{"BLOCK_M": m, "ROWS": rows} for m, rows, _ in kernels.INTERPRETER_CONFIGS["tile"]]
    assert any(rows > 1 for _, rows, _ in kernels.INTERPRETER_CONFIGS["tile"])  # the CPU tests run the loop
    x, w = torch.randn(5, 3, 37), torch.randn(37)
    compiled.op(x, w)
    # N = 37 fits one tile (BLOCK_N = 64, from the launcher): the autotuner picked one of
    # the tile configs for this (M, N) and reuses it
    form, tuner = compiled.last
    assert form == "tile" and tuner is compiled.tuners[("tile", 64)]
    assert len(tuner.cache) == 1
    assert next(iter(tuner.cache.values())) in tuner.configs


def test_gpu_configs_cover_inductors_for_the_benchmark_shapes():
    """What the autotuner tries on a GPU (no GPU needed to list them): one-tile reductions
    hold 1024 to 16384 elements per tile, several rows only when rows are short or to share
    what is the same for every row; for 4096 columns one row with 4, 8 or 16 warps
    (Inductor: one row, 16 warps), 2 or 4 rows with 8, and 8 tiles of one row or 4 of two
    per program; flat pointwise blocks of 1024 to 4096 with 8 or 16 elements per thread
    (Inductor: 1024 with 4 warps)."""
    _, _, compiled = region_kernel(norm_and_stats, torch.randn(3, 5, 20), torch.randn(20))
    compiled.target = "gpu"  # configs() reads only the target; nothing is compiled or run here
    try:
        wide = [(c.kwargs["BLOCK_M"], c.kwargs["ROWS"], c.num_warps) for c in compiled.configs("tile", 4096)]
        assert wide == [(1, 1, 4), (1, 1, 8), (1, 1, 16), (2, 1, 8), (4, 1, 8), (1, 8, 8), (2, 4, 8)]
        assert wide == kernels.tile_configs(4096)
        for block_n in (1, 16, 64, 256, 1024, 2048, 4096):
            configs = compiled.configs("tile", block_n)
            assert len(configs) == len({(c.kwargs["BLOCK_M"], c.kwargs["ROWS"], c.num_warps) for c in configs})
            for c in configs:
                elements = c.kwargs["BLOCK_M"] * block_n
                assert elements <= max(block_n, 16384) and (c.kwargs["BLOCK_M"] == 1 or elements >= 1024)
                assert elements // (32 * c.num_warps) <= 64  # elements per thread per tile
        flat = [(b, w) for b, w in kernels.GPU_CONFIGS["flat"]]
        assert (1024, 4) in flat and all(8 <= b // (32 * w) <= 16 for b, w in flat)
    finally:
        compiled.target = "interpreter"


def test_in_place_write_runs_once_and_has_one_config():
    def accumulate(slot, g):
        slot.copy_(slot + g * 0.5)
        return torch.tanh(g)

    region, binding, compiled = region_kernel(accumulate, torch.randn(4, 19), torch.randn(4, 19))
    for form in compiled.forms:
        assert len(compiled.configs(form)) == 1  # no timing runs that would add twice
    assert "Tensor(a1!) x1" in str(compiled.op._schema)  # the slot, written in place
    slot, g = torch.randn(4, 19), torch.randn(4, 19)
    before = slot.clone()
    args = [slot if n.name == "slot_1" else g for n in binding.params]
    out = compiled.op(*args)
    assert compiled.last[0] == "flat"
    assert rel_err(slot, before + g * 0.5) <= 1e-6
    assert rel_err(out, torch.tanh(g)) <= 1e-6


def test_check_accepts_the_right_kernel_and_rejects_a_wrong_one():
    region_a, binding_a, compiled_a = region_kernel(lambda x: torch.exp(x) + 1, torch.randn(4, 9))
    region_b, binding_b, compiled_b = region_kernel(lambda x: torch.sigmoid(x) + 1, torch.randn(4, 9))
    assert check_region(region_a, binding_a, compiled_a) <= 1e-6
    with pytest.raises(KernelMismatch, match="differs from eager"):
        check_region(region_b, binding_b, compiled_a)  # exp where sigmoid is wanted


def test_check_runs_every_entry_point_that_applies():
    """The launcher picks an entry point per call, so the check runs each one that can take
    the sample: a kernel whose general form alone is wrong is rejected although the flat
    form, which the op picks for the sample, is right."""
    import dataclasses
    import types

    region_a, _, compiled_a = region_kernel(lambda x: torch.exp(x) + 1, torch.randn(4, 9))
    region_b, binding_b, compiled_b = region_kernel(lambda x: torch.sigmoid(x) + 1, torch.randn(4, 9))
    module = types.SimpleNamespace(**{f"{compiled_b.name}_flat": compiled_b.jit("flat"),
                                      compiled_b.name: compiled_a.jit("general")})
    hybrid = dataclasses.replace(compiled_b, module=module, tuners={}, checked={})
    with pytest.raises(KernelMismatch, match="differs from eager"):
        check_region(region_b, binding_b, hybrid)
    assert check_region(region_b, binding_b, compiled_b) <= 1e-6


def test_injected_failure_raises_a_compile_error():
    region, binding, compiled = region_kernel(lambda x: torch.exp(x) * 3, torch.randn(4, 9))
    with pytest.raises(kernels.KernelCompileError, match="injected compile failure"):
        kernels.compile_kernel(compiled.ir, fail=True)


def test_kernel_source_file_is_written_where_triton_reads_it():
    _, _, compiled = region_kernel(lambda x: torch.exp(x) - 1, torch.randn(4, 9))
    path = os.path.join(kernels.kernel_dir(), f"{compiled.name}_interpreted.py")
    assert kernels.source_path(compiled.name, "interpreter") == path
    with open(path) as f:
        assert f.read() == compiled.source
    # the GPU source of the same kernel goes to its own file (the two differ)
    assert kernels.source_path(compiled.name, "gpu") == os.path.join(kernels.kernel_dir(), f"{compiled.name}.py")
