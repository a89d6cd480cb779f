"""Generated kernels compiled for an H100/H200 (sm_90) on the CPU: Triton compiles for a named
CUDA target without a device (ptxas and nvdisasm come with its wheel), so what the GPU runs
can be read here. Sizes are the benchmark's (meta tensors: no memory). These check the
code's shape -- vector loads and stores, no integer division left, the hardware bf16
conversion, fewer instructions than the alternatives -- not its speed (benchmarks/lowering.py
on the GPU measures that)."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dsgraph.lowering import asm, kernels
from dsgraph.lowering.codegen import render
from dsgraph.lowering.kernel_ir import region_ir
from dsgraph.lowering.regions import find_regions

BF16 = torch.bfloat16


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def region_of(fn, *example):
    gm = make_fx(fn, tracing_mode="fake")(*example)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return ir, [example[placeholders.index(p)] for p in binding.params]


def gelu(x):
    xf = x.float()
    return (xf * 0.5 * (1 + torch.erf(xf * 0.7071067811865476))).to(BF16)


def layer_norm(x, w, b):
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return ((xf - mean) * rstd * w + b).to(BF16), mean, rstd


def test_flat_pointwise_kernel_moves_16_byte_vectors_without_division():
    ir, tensors = region_of(gelu, meta(32, 1024, 3072, dtype=BF16))
    for config in kernels.GPU_CONFIGS["flat"]:
        k = asm.compile_for_cuda(ir, tensors, config=config)
        assert k.form == "flat" and k.name == f"{ir.name}_flat"
        assert k.vector_loads >= 1 and k.scalar_loads == 0, config
        assert k.vector_stores >= 1 and k.scalar_stores == 0, config
        assert k.int_divisions == 0
        assert k.bf16_conversions >= 1  # cvt.rn.bf16x2.f32: the hardware conversion


def test_hardware_bf16_conversion_costs_fewer_instructions_than_the_bit_form():
    ir, tensors = region_of(gelu, meta(32, 1024, 3072, dtype=BF16))
    gpu = asm.compile_for_cuda(ir, tensors, config=(1024, 4))
    bits = asm.compile_for_cuda(ir, tensors, config=(1024, 4), source="interpreter")
    assert bits.bf16_conversions == 0 and gpu.bf16_conversions >= 1
    assert gpu.per_element < bits.per_element
    assert gpu.instructions < bits.instructions


def test_one_tile_layer_norm_reads_vectors_and_has_no_row_division():
    ir, tensors = region_of(layer_norm, meta(16, 1024, 4096, dtype=BF16), meta(4096), meta(4096))
    for block_m, warps in [(1, 4), (1, 8), (1, 16)]:
        k = asm.compile_for_cuda(ir, tensors, config=(block_m, warps))
        assert k.form == "tile" and k.per_thread == 4096 / (32 * warps)
        assert k.vector_loads >= 3 and k.scalar_loads == 0  # x (bf16), w and b (fp32)
        assert k.vector_stores >= 1  # the normalized row; mean and rstd are one value per row
        assert k.int_divisions == 0  # leading dims merged: D1 = 1, the % and // folded away
        # every global load is issued before the reductions' first barrier (w and b too)
        first_barrier = next(i for i, o in enumerate(k.opcodes) if o.startswith("BAR"))
        assert all(i < first_barrier for i, o in enumerate(k.opcodes) if o.startswith("LDG"))
        assert k.spills == 0


def sass_lines(k, opcode):
    return [line for line in k.sass.splitlines() if asm.SASS_LINE.match(line) and f" {opcode}" in line]


def test_one_tile_layer_norm_loads_w_and_b_once_per_program_for_every_config():
    """Every config the GPU autotuner tries: no spills; x read once (a tile's loads issued
    before the barriers of the reductions that wait for them: the first tile's before the
    loop, the next tile's before the current tile's first barrier); w and b (the same for
    every row) loaded once per program, as many loads whatever the rows per tile and tiles
    per program; N == BLOCK_N is a constant: no column mask, x's loads unpredicated."""
    ir, tensors = region_of(layer_norm, meta(16, 1024, 4096, dtype=BF16), meta(4096), meta(4096))
    assert [l.cols_only for l in ir.loads] == [False, True, True]
    for block_m, rows, warps in kernels.tile_configs(4096):
        k = asm.compile_for_cuda(ir, tensors, config=(block_m, rows, warps))
        assert k.spills == 0, (block_m, rows, warps)
        per_thread = 4096 // (32 * warps)  # columns of a row one thread holds
        x_loads = block_m * per_thread * 2 // 16  # 16-byte vectors of bf16
        w_and_b = 2 * per_thread * 4 // 16  # fp32
        ldg = sass_lines(k, "LDG")
        assert len(ldg) == x_loads * (2 if rows > 1 else 1) + w_and_b, (block_m, rows, warps)
        assert all(".128" in line for line in ldg)
        if rows == 1:
            assert k.executed == k.instructions
            first_barrier = next(i for i, o in enumerate(k.opcodes) if o.startswith("BAR"))
            assert all(i < first_barrier for i, o in enumerate(k.opcodes) if o.startswith("LDG"))
            assert not any("@" in line.split("LDG")[0] for line in ldg)  # no mask at all
        else:
            (first, last), = asm.loop_bodies(k.sass)
            assert k.executed == k.instructions + (rows - 1) * (last - first + 1)
            body = k.opcodes[first:last + 1]
            assert sum(o.startswith("LDG") for o in body) == x_loads  # the next tile's x, nothing else
            first_barrier = next(i for i, o in enumerate(body) if o.startswith("BAR"))
            assert all(i < first_barrier for i, o in enumerate(body) if o.startswith("LDG"))
            assert sum(o.startswith("LDG") for o in k.opcodes[:first]) == x_loads + w_and_b


def test_one_tile_norms_issue_fewer_instructions_than_with_a_runtime_n():
    """H200 run of session 6 (N a run-time argument, a column mask): 20.1 SASS instructions
    per element for layer_norm at one row, 8 warps, 12.9 for rms_norm. N a constant folds
    the mask, its selects and zero fills; several rows per tile share w (and b)."""
    ln, ln_tensors = region_of(layer_norm, meta(16, 1024, 4096, dtype=BF16), meta(4096), meta(4096))
    rms, rms_tensors = region_of(lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)
                                                                       + 1e-6) * w).to(BF16),
                                 meta(16, 1024, 4096, dtype=BF16), meta(4096))
    assert asm.compile_for_cuda(ln, ln_tensors, config=(1, 1, 8)).per_element < 16
    assert asm.compile_for_cuda(ln, ln_tensors, config=(4, 1, 8)).per_element < 12
    assert asm.compile_for_cuda(rms, rms_tensors, config=(1, 1, 8)).per_element < 11


def test_unmerged_leading_dims_keep_their_division_merged_ones_do_not():
    """What merging leading dims buys: a batch whose rows sit apart in memory (a slice)
    keeps the integer % and // that unflatten the row index; a contiguous one has none."""
    ir, tensors = region_of(layer_norm, meta(16, 1024, 4096, dtype=BF16), meta(4096), meta(4096))
    gapped = meta(16, 2048, 4096, dtype=BF16)[:, :1024]
    merged = asm.compile_for_cuda(ir, tensors, config=(1, 8))
    apart = asm.compile_for_cuda(ir, [gapped] + tensors[1:], config=(1, 8))
    assert merged.int_divisions == 0 and apart.int_divisions >= 1
    assert merged.instructions < apart.instructions


@pytest.mark.parametrize("form", ["tile", "general"])
def test_softmax_forms_compile_with_vector_loads(form):
    def softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    ir, tensors = region_of(softmax, meta(16384, 4096))
    config = (1, 8) if form == "tile" else (1, 1024, 4)
    k = asm.compile_for_cuda(ir, tensors, config=config, form=form)
    assert k.vector_loads >= 1 and k.scalar_loads == 0 and k.scalar_stores == 0
    assert "max.NaN.f32" in k.ptx or "max.NaN.ftz.f32" in k.ptx  # amax propagates NaN in one instruction


def test_codegen_erf_costs_fewer_instructions_than_libdevices(monkeypatch):
    """GELU regions are compute-bound on sm_90 with libdevice's erff (a per-element choice
    of polynomial coefficients); codegen's own fp32 erf (within 2 ulp as well) computes
    both branches with constant coefficients."""
    from dsgraph.lowering import op_table

    ir, tensors = region_of(gelu, meta(32, 1024, 3072, dtype=BF16))
    ours = asm.compile_for_cuda(ir, tensors, config=(2048, 4))
    assert "def _erf(x):" in render(ir, "gpu")
    monkeypatch.setattr(op_table, "erf_function", lambda dtype: "tl.math.erf")
    libdevice_ir, _ = region_of(gelu, meta(32, 1024, 3072, dtype=BF16))
    assert libdevice_ir.name != ir.name  # another signature: another kernel
    theirs = asm.compile_for_cuda(libdevice_ir, tensors, config=(2048, 4))
    assert ours.per_element < theirs.per_element
