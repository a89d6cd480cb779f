"""lower_triton on a CUDA GPU: Triton compiles the generated kernels for real (no
interpreter), and through Inductor they run as user-defined Triton kernels. Skipped without
CUDA; run on the H200 with ``python -m pytest -q tests/gpu/test_lowering_gpu.py``."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import dsgraph
from dsgraph.lowering import kernels, launch_layout
from dsgraph.lowering.check import rel_err
from dsgraph.lowering.kernel_ir import region_ir
from dsgraph.lowering.kernels import DsgraphLoweringWarning
from dsgraph.lowering.regions import find_regions
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.testing import check_training_step, fp32_exact

pytestmark = pytest.mark.gpu

CFG = GPTConfig(vocab=509, seq=96, layers=2, heads=4, dim=128)


def as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def layer_norm_gelu(x, w, b):
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, correction=0)
    y = (xf - mean) * torch.rsqrt(var + 1e-5) * w + b
    return F.gelu(y).to(x.dtype), F.gelu(y, approximate="tanh").to(x.dtype), mean


def softmax_rms(x, w):
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    r = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return (e / e.sum(-1, keepdim=True)).to(x.dtype), r.to(x.dtype), torch.var(xf, -1)


def pointwise(x, y):
    return torch.where(x > y, torch.sigmoid(x) * F.silu(x * y), torch.tanh(x - y)) + torch.clamp(x, -0.5, 0.7) ** 3


CASES = [
    (layer_norm_gelu, lambda d: [torch.randn(3, 129, 1000, device="cuda", dtype=d) * 2,
                                 torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")]),
    (softmax_rms, lambda d: [torch.randn(257, 5001, device="cuda", dtype=d) * 3, torch.randn(5001, device="cuda")]),
    (pointwise, lambda d: [torch.randn(2001, 777, device="cuda", dtype=d).t(), torch.randn(777, 1, device="cuda", dtype=d)]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_generated_kernels_match_eager_on_cuda(fn, make, dtype):
    example = make(dtype)
    gm = make_fx(fn, tracing_mode="fake")(*example)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    compiled = kernels.compile_kernel(ir)
    assert not kernels.interpreting()
    inputs = make(dtype)  # fresh
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    got = compiled.op(*[inputs[placeholders.index(p)] for p in binding.params])
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    by_node = dict(zip(region.outputs, got))
    outputs = as_list(gm.graph.output_node().args[0])
    with fp32_exact():
        want = as_list(fn(*inputs))
    ref = as_list(fn(*[x.double() for x in inputs])) if dtype != torch.float32 else want
    assert len(outputs) == len(want) == len(ref)
    for node, w, r in zip(outputs, want, ref):
        g = by_node[node]
        assert g.dtype == w.dtype and g.shape == w.shape
        if dtype == torch.float32:
            assert rel_err(g, w) <= 1e-5, node.name
        else:
            assert rmse(g, r) <= 2 * rmse(w, r) + 1e-3, node.name


def _forms_that_apply(compiled, tensors):
    full, outs = launch_layout.allocate_outputs(compiled.ir, tensors)
    forms = []
    for form in compiled.forms:
        try:
            launch_layout.launch_plan(compiled.ir, tensors, outs, full, [], form)
        except ValueError:
            continue
        forms.append(form)
    return forms


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_every_entry_point_matches_eager_on_cuda(fn, make):
    """Each entry point that can take the inputs (one-tile / general here; the flat form:
    test_bf16_conversion_on_cuda_gives_eagers_bits), compiled for the GPU, against eager
    (fp32 rule), on the cases' own layouts and on contiguous copies."""
    example = make(torch.float32)
    gm = make_fx(fn, tracing_mode="fake")(*example)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    compiled = kernels.compile_kernel(ir)
    assert compiled.target == "gpu" and "# target: gpu" in compiled.source
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = as_list(gm.graph.output_node().args[0])
    ran = set()
    for inputs in (make(torch.float32), [x.contiguous() for x in make(torch.float32)]):
        tensors = [inputs[placeholders.index(p)] for p in binding.params]
        with fp32_exact():
            want = as_list(fn(*inputs))
        for form in _forms_that_apply(compiled, tensors):
            got = dict(zip(region.outputs, kernels.launch(compiled, tensors, [], form=form)))
            for node, w in zip(outputs, want):
                assert rel_err(got[node], w) <= 1e-5, (form, node.name)
            ran.add(form)
    # layer_norm_gelu: 1000 columns fit one tile; softmax_rms: 5001 do not; pointwise reads a
    # per-row input (y: [777, 1]), which the flat form cannot index
    assert ran == {"layer_norm_gelu": {"tile", "general"}, "softmax_rms": {"general"},
                   "pointwise": {"general"}}[fn.__name__], ran


def test_bf16_conversion_on_cuda_gives_eagers_bits():
    """On the GPU the kernel converts fp32 -> bf16 with the hardware's round-to-nearest-even
    (cvt.rn.bf16 in the PTX, no bit operations in the source): eager's bits for ties, inf,
    huge and subnormal values, in both pointwise entry points."""
    def fn(x):
        y = x * 3
        return y.to(torch.bfloat16), (y.to(torch.bfloat16).float() + 1).to(torch.bfloat16)

    x = torch.randn(7, 45) * torch.logspace(-20, 20, 45)
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e38, 2.0 ** -130, -0.0])
    x[1, :4] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 1.0078125 + 2 ** -8]) / 3
    x = x.cuda()
    gm = make_fx(fn, tracing_mode="fake")(x)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    compiled = kernels.compile_kernel(ir)
    assert "bitcast" not in compiled.source and 'fp_downcast_rounding="rtne"' in compiled.source
    want = fn(x)
    outputs = as_list(gm.graph.output_node().args[0])
    for form in ("flat", "general"):
        got = dict(zip(region.outputs, kernels.launch(compiled, [x], [], form=form)))
        for node, w in zip(outputs, want):
            g = got[node]
            keep = ~torch.isnan(w)
            assert torch.equal(g.view(torch.int16)[keep], w.view(torch.int16)[keep]), form
            assert torch.equal(torch.isnan(g), torch.isnan(w))
    jit = compiled.jit("flat")
    ptx = [k.asm["ptx"] for cache in jit.device_caches.values() for k in cache[0].values()]
    assert ptx and all("cvt.rn.bf16" in p for p in ptx)


def test_fp32_erf_is_within_2_ulp_on_cuda():
    """codegen's fp32 erf compiled for the GPU (FMA contraction, ex2.approx): within 2 ulp of
    erf (fp64 reference), as libdevice's erff is documented to be."""
    import numpy as np

    tiny = torch.logspace(-38, 0, 100_000, dtype=torch.float64).float()
    x = torch.cat([torch.linspace(-6, 6, 2_000_001), tiny, -tiny, torch.randn(100_000) * 3,
                   torch.tensor([0.0, -0.0, 4.0, 30.0, float("inf"), -float("inf"), float("nan")])]).cuda()
    gm = make_fx(torch.erf, tracing_mode="fake")(x)
    (region,) = find_regions(gm)
    ir, binding = region_ir(region)
    compiled = kernels.compile_kernel(ir)
    assert "def _erf(x):" in compiled.source
    got = compiled.op(x).cpu().double()
    want = torch.erf(x.cpu().double())
    finite = ~torch.isnan(want)
    assert torch.isnan(got[~finite]).all()
    spacing = torch.from_numpy(np.spacing(want[finite].abs().float().numpy())).double()
    assert ((got[finite] - want[finite]).abs() / spacing).max().item() <= 2.0


def test_training_step_as_fx_code_on_cuda():
    torch.manual_seed(1)
    model = GPT(CFG).cuda()
    check_training_step(model, gpt_inputs(CFG, 3, "cuda", seed=1),
                        {"inductor": False, "pipeline": "lower_triton{select=all}"})


def lowering_stats():
    return [(r.kind, p.stats) for r in dsgraph.reports() for p in r.passes if p.name == "lower_triton"]


def test_training_step_through_inductor_as_user_defined_kernels():
    torch.manual_seed(2)
    model = GPT(CFG).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DsgraphLoweringWarning)  # no fallback, no opaque ops
        check_training_step(model, gpt_inputs(CFG, 3, "cuda", seed=2), {"pipeline": "lower_triton{select=all}"})
    stats = dict(lowering_stats())
    for kind in ("forward", "backward"):
        assert stats[kind]["lowered"] >= 3 and stats[kind]["user_kernels"] == stats[kind]["lowered"], stats


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(64, 1000))
        self.fc = nn.Linear(1000, 10)

    def forward(self, x):
        return self.fc(torch.tanh(x) * self.scale)


@pytest.mark.parametrize("inductor", [False, True])
def test_pool_slot_written_by_the_kernel_accumulates_like_eager(inductor):
    torch.manual_seed(3)
    model = Scaled().cuda()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": inductor, "grad_pool": True,
                                                                 "lower_triton": True})
    with fp32_exact():
        for step in range(3):
            x = torch.randn(64, 1000, device="cuda")
            compiled(x).sum().backward()
            ref(x).sum().backward()
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                assert rel_err(p.grad, q.grad) <= 1e-5, (step, name)
    stats = dict(lowering_stats())
    assert stats["backward"]["lowered"] == 1


def test_dynamic_batch_through_inductor():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(300, 1000), nn.GELU(), nn.LayerNorm(1000), nn.Linear(1000, 7)).cuda()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", dynamic=True, options={"pipeline": "lower_triton{select=all}"})
    with fp32_exact():
        for batch in (33, 130):
            x = torch.randn(batch, 300, device="cuda")
            for p, q in zip(model.parameters(), ref.parameters()):
                p.grad = q.grad = None
            out, want = compiled(x), ref(x)
            assert rel_err(out, want) <= 1e-5
            out.sum().backward()
            want.sum().backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                assert rel_err(p.grad, q.grad) <= 1e-5
    assert len([r for r in dsgraph.reports() if r.kind == "forward"]) == 1


def test_through_inductor_a_call_launches_the_kernel_alone():
    """The profiler (this torch's: CUDA kernels, their device time) on the benchmark's
    rms_norm at a smaller size: a call through Inductor with dsgraph launches dsgraph's kernel
    and nothing else (no copy or cast of its output), and stock Inductor's call its own kernel."""
    from benchmarks import lowering as bench

    case = next(c for c in bench.CASES if c.name == "rms_norm")
    x, w = torch.randn(4, 256, 4096, device="cuda", dtype=torch.bfloat16), torch.randn(4096, device="cuda")
    compiled = torch.compile(case.fn, backend="dsgraph", options={"pipeline": "lower_triton{select=all}"})
    stock = torch.compile(case.fn)
    with torch.no_grad():
        ref = case.fn(x.double(), w.double())
        assert rmse(compiled(x, w), ref) <= 2 * rmse(case.fn(x, w), ref) + 1e-3
        ours, theirs = bench.profile_calls(lambda: compiled(x, w), 5), bench.profile_calls(lambda: stock(x, w), 5)
    assert ours["kernels_per_call"] == 1 and ours["kernel_names"][0].startswith("dsg_red_"), ours
    assert ours["kernel_us"] > 0 and ours["profiled_calls"] == 5 and ours["cpu_us"] > 0, ours
    assert theirs["kernels_per_call"] == 1 and theirs["kernel_us"] > 0, theirs
