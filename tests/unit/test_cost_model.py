import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from dsgraph.analysis.cost_model import H200, CostModel


def trace(fn, *tensors):
    return make_fx(fn, tracing_mode="fake")(*tensors)


def by_target(gm, name):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target))


def test_matmul_flops_and_time():
    gm = trace(lambda a, b: torch.mm(a, b), torch.randn(64, 32), torch.randn(32, 16))
    cost = CostModel(gm).costs[by_target(gm, "mm")]
    assert cost.flops == 2 * 64 * 32 * 16
    assert cost.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4
    expected = cost.flops / H200.flop_rate(torch.float32) + cost.bytes / H200.bytes_per_s
    assert abs(cost.seconds - expected) < 1e-18


def test_bf16_matmuls_use_the_tensor_core_rate():
    a = torch.randn(128, 64, dtype=torch.bfloat16)
    gm = trace(lambda a: a @ a.t(), a)
    cost = CostModel(gm).costs[by_target(gm, "mm")]
    assert cost.flops == 2 * 128 * 64 * 128
    assert cost.seconds < cost.flops / H200.flop_rate(torch.float32)


def test_convolution_and_attention_have_flops():
    gm = trace(lambda x, w: F.conv2d(x, w), torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3))
    conv = CostModel(gm).costs[by_target(gm, "convolution")]
    assert conv.flops == 2 * (2 * 5 * 7 * 7) * 3 * 3 * 3
    q = torch.randn(2, 4, 16, 8)
    gm = trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, q.clone(), q.clone())
    attention = [c for n, c in CostModel(gm).costs.items() if "attention" in str(n.target)]
    assert attention and attention[0].flops > 0


def test_pointwise_ops_cost_bytes_and_views_cost_nothing():
    gm = trace(lambda x: (x.exp() + 1).view(-1), torch.randn(10, 10))
    costs = CostModel(gm).costs
    exp, view = by_target(gm, "exp"), by_target(gm, "view")
    assert costs[exp].flops == 0 and costs[exp].bytes == 2 * 100 * 4
    assert costs[view].bytes == 0 and costs[view].seconds == 0


def test_fused_recomputation_counts_only_tensors_in_memory():
    """A chain of pointwise ops recomputed by Inductor reads its input and writes its
    output once; as separate kernels each op reads and writes."""
    import torch.fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def chain(x):
        return (x * 2).sin().exp() + 1

    with FakeTensorMode():
        gm = make_fx(chain)(torch.empty(1024, 1024))
    costs = CostModel(gm)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    last = nodes[-1]
    fused = costs.fused_seconds(nodes, held={last})
    unfused = costs.seconds(nodes)
    one_pass = 2 * 1024 * 1024 * 4 / costs.rates.bytes_per_s  # read x, write the result
    assert fused == pytest.approx(one_pass)
    assert unfused == pytest.approx(len(nodes) * one_pass)


def test_calibration_fits_the_efficiencies_measured_kernels_reach():
    """Measured kernels that reach a third of the copy bandwidth and 70% of the matmul
    rate, plus a fixed launch cost, give those efficiencies back; the calibrated rates
    then price a recomputed pointwise op three times higher."""
    import dataclasses

    from dsgraph.analysis.cost_model import DeviceRates, KernelSample

    base = dataclasses.replace(H200, launch_s=3e-6)
    truth = dataclasses.replace(base, memory_efficiency=1 / 3, compute_efficiency=0.7)
    samples = []
    for nbytes, flops in ((3 << 27, 0), (7 << 25, 0), (5 << 26, 2 * 4096 ** 3), (3 << 25, 2 * 3072 * 4096 * 1024)):
        seconds = 3e-6 + nbytes / truth.memory_rate + flops / truth.flop_rate(torch.bfloat16)
        samples.append(KernelSample(nbytes, flops, seconds, torch.bfloat16))
    fitted = base.calibrate(samples)
    assert fitted.memory_efficiency == pytest.approx(1 / 3, rel=1e-9)
    assert fitted.compute_efficiency == pytest.approx(0.7, rel=1e-9)
    gm = trace(lambda x: x.exp(), torch.randn(31, 17))
    exp = by_target(gm, "exp")
    plain = CostModel(gm, base).costs[exp].seconds - 3e-6
    assert CostModel(gm, fitted).costs[exp].seconds - 3e-6 == pytest.approx(3 * plain, rel=1e-9)


def test_rates_from_json(tmp_path):
    from dsgraph.analysis.cost_model import DeviceRates

    path = tmp_path / "rates.json"
    path.write_text('{"memory_efficiency": 0.4, "launch_s": 2e-6, "flops_per_s": {"bfloat16": 7e14}}')
    rates = DeviceRates.from_json(str(path))
    assert rates.memory_efficiency == 0.4 and rates.launch_s == 2e-6
    assert rates.flop_rate(torch.bfloat16) == 7e14 and rates.flop_rate(torch.float32) == H200.flop_rate(torch.float32)


def _softmax_stats(x):
    """The log-softmax's row statistics as the joint graph has them (decomposed)."""
    m = x.amax(-1, keepdim=True)
    s = (x - m).exp().sum(-1, keepdim=True)
    return (x - m - s.log(),)


@pytest.mark.parametrize("row, looped", [(4096, True), (512, False)])
def test_a_looped_reduction_reads_its_row_once_more(row, looped):
    """Recomputing a softmax over rows wider than Inductor keeps in registers
    (``PERSISTENT_RNUMEL``): the row maximum and the sum of exponentials take one loop over
    the row (fused, as Inductor's online softmax), and the output a second; over rows it
    keeps in registers, one pass. The H200 profile of a 24-layer GPT: the recomputed
    statistics of its 50304-wide logits cost a second pass (0.60 ms), docs/BENCHMARKS.md
    session 21."""
    from dsgraph.analysis.cost_model import PERSISTENT_RNUMEL

    gm = trace(_softmax_stats, torch.empty(64, row))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    reductions = {n for n in nodes if "amax" in str(n.target) or "sum" in str(n.target)}
    assert (row > PERSISTENT_RNUMEL) is looped
    held = reductions | {nodes[-1]}
    plain = CostModel(gm).fused_seconds(nodes, held)
    got = CostModel(gm, looped=reductions if looped else frozenset()).fused_seconds(nodes, held)
    x_pass = 64 * row * 4 / CostModel(gm).rates.bytes_per_s
    stats = 2 * 64 * 4 / CostModel(gm).rates.bytes_per_s  # the two row statistics, [64, 1] each
    assert got - plain == pytest.approx(x_pass if looped else 0.0)
    # without the loop: x read and the output written once, each statistic's bytes once
    # (a tensor in memory counts once per group), a kernel per held value and one more
    assert plain == pytest.approx(2 * x_pass + stats + len(held) * CostModel(gm).rates.launch_s
                                  + (1 if set(nodes) - held else 0) * CostModel(gm).rates.launch_s)
