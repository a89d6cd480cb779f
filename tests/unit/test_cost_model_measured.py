"""H200_MEASURED: recomputation priced from session 9's H200 profile of the 2.94 GiB GPT-2 plan
(dsgraph.analysis.cost_model; docs/BENCHMARKS.md, session 10). The rates give back the
device time the profile measured for the plan's recomputed GEMMs and attention forwards,
through the same FLOP formulas the cost model uses on graphs, and charge a GEMM's or an
attention's memory traffic once (inside its kernel's time)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from dsgraph.analysis import cost_model as cm
from dsgraph.analysis.cost_model import H200, H200_CALIBRATED, H200_MEASURED, CostModel, DeviceRates


def _calls(gm, word):
    return [n for n in gm.graph.nodes if n.op == "call_function" and word in str(n.target)]


def test_the_rates_give_back_the_profiled_gemm_and_attention_time():
    """The plan's recomputed GEMMs (GPT-2-small's projections at 16 x 1024 tokens, bf16) and
    attention forwards, as graph nodes on fake tensors, cost what the profile measured."""
    def gemms(x, w_qkv, w_proj, w_fc):
        return x @ w_qkv, x @ w_proj, x @ w_fc

    with FakeTensorMode():
        x = torch.empty(16384, 768, dtype=torch.bfloat16)
        ws = [torch.empty(768, n, dtype=torch.bfloat16) for n in (2304, 768, 3072)]
        gm = make_fx(gemms)(x, *ws)
        q = torch.empty(16, 12, 1024, 64, dtype=torch.bfloat16)
        attn = make_fx(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))(
            q, q, q)
    costs = CostModel(gm, H200_MEASURED)
    by_n = {n.meta["val"].shape[1]: n for n in _calls(gm, "mm")}
    counts = {n: c for _, n, _, c in cm.PROFILE_294_GEMMS}
    total = sum(costs.fused_seconds([by_n[n]], held={by_n[n]}) * counts[n] for n in counts)
    assert total == pytest.approx(cm.PROFILE_294_GEMM_S, rel=1e-9)
    # the bandwidth-priced rates the planner used charge the same GEMMs 1.7x what they took
    planned = CostModel(gm, H200_CALIBRATED)
    before = sum(planned.fused_seconds([by_n[n]], held={by_n[n]}) * counts[n] for n in counts)
    assert before / cm.PROFILE_294_GEMM_S > 1.5

    attention = CostModel(attn, H200_MEASURED)
    node = [n for n in _calls(attn, "attention") if n.target.overloadpacket.__name__ != "getitem"][0]
    one = attention.fused_seconds([node], held=set())
    assert one * cm.PROFILE_294_ATTENTION[0][4] == pytest.approx(cm.PROFILE_294_ATTENTION_S, rel=1e-9)


def test_efficiencies_are_physical():
    """Fitted, not chosen: GEMMs and attention below the matmul rate's peak, the memory-bound
    recomputation between the generated kernels' default (a third) and the copy bandwidth."""
    assert 0.7 < H200_MEASURED.compute_efficiency < 1.0
    assert 0.7 < H200_MEASURED.attention_efficiency < 1.0
    assert H200_CALIBRATED.memory_efficiency < H200_MEASURED.memory_efficiency < 1.0
    assert H200_MEASURED.flop_op_bytes is False and H200_CALIBRATED.flop_op_bytes is True


def test_without_flop_op_bytes_only_the_memory_bound_members_move_bytes():
    """A GEMM with a pointwise epilogue recomputed: its FLOPs at the GEMM rate, and bytes only
    for what the pointwise op reads from memory (the GEMM's output, held) and writes."""
    with FakeTensorMode():
        gm = make_fx(lambda a, b: (a @ b).relu())(torch.empty(256, 128), torch.empty(128, 64))
    mm, relu = _calls(gm, "mm")[0], _calls(gm, "relu")[0]
    rates = DeviceRates(memory_efficiency=0.5, compute_efficiency=0.8, flop_op_bytes=False)
    got = CostModel(gm, rates).fused_seconds([mm, relu], held={mm, relu})
    flops = 2 * 256 * 128 * 64
    expected = flops / rates.flop_rate(torch.float32) + 2 * 256 * 64 * 4 / rates.memory_rate
    assert got == pytest.approx(expected, rel=1e-12)
    # charging the GEMM's traffic too: its inputs and its output on top
    charged = CostModel(gm, DeviceRates(memory_efficiency=0.5, compute_efficiency=0.8)).fused_seconds(
        [mm, relu], held={mm, relu})
    extra = (256 * 128 + 128 * 64) * 4 / rates.memory_rate  # a and b read (mm's output counted once)
    assert charged == pytest.approx(expected + extra, rel=1e-12)


def a_flops(gm, nodes):
    return all(CostModel(gm).costs[n].flops > 0 for n in nodes)


def test_attention_efficiency_applies_to_attention_only():
    with FakeTensorMode():
        q = torch.empty(2, 3, 64, 16)
        gm = make_fx(lambda q, w: (torch.nn.functional.scaled_dot_product_attention(q, q, q), q @ w))(
            q, torch.empty(16, 16))
    attention = [n for n in _calls(gm, "attention") if n.target.overloadpacket.__name__ != "getitem"][0]
    mm = [n for n in gm.graph.nodes if n.op == "call_function"
          and getattr(getattr(n.target, "overloadpacket", None), "__name__", "") in ("mm", "bmm")]
    assert mm and a_flops(gm, mm)
    base = DeviceRates(compute_efficiency=0.5, flop_op_bytes=False)
    split = DeviceRates(compute_efficiency=0.5, attention_efficiency=0.25, flop_op_bytes=False)
    a, b = CostModel(gm, base), CostModel(gm, split)
    assert b.costs[attention].seconds == pytest.approx(2 * a.costs[attention].seconds, rel=1e-12)
    for n in mm:
        assert b.costs[n].seconds == a.costs[n].seconds


def test_rates_from_json_read_the_new_fields(tmp_path):
    path = tmp_path / "rates.json"
    path.write_text('{"attention_efficiency": 0.6, "flop_op_bytes": false, "compute_efficiency": 0.9}')
    rates = DeviceRates.from_json(str(path))
    assert rates.attention_efficiency == 0.6 and rates.flop_op_bytes is False and rates.compute_efficiency == 0.9
    assert H200.attention_efficiency is None


def test_the_checkpoint_pass_takes_the_rates_it_prices_with():
    """``checkpoint{rates=profile}`` prices recomputation on a GPU with H200_MEASURED; the
    default stays the bandwidth rates; lowering keeps its own; a bad value is refused."""
    from dsgraph.analysis.cost_model import H200_LOWERED, recompute_rates
    from dsgraph.compile.pipeline import parse

    assert recompute_rates("cuda", False, "profile") is H200_MEASURED
    assert recompute_rates("cuda", False) is H200_CALIBRATED
    assert recompute_rates("cuda", True, "profile") is H200_LOWERED
    assert recompute_rates("cpu", False, "profile") is H200
    with pytest.raises(ValueError, match="rates"):
        recompute_rates("cuda", False, "guess")
    inv = parse("chunk_loss,lifetimes,checkpoint{budget=2GiB,rates=profile}").get("checkpoint")
    assert inv.arg("rates") == "profile"
    with pytest.raises(ValueError, match="rates"):
        parse("lifetimes,checkpoint{budget=2GiB,rates=fast}")


def test_the_planner_asks_for_the_rates_source_and_prices_with_it(monkeypatch):
    """``plan_checkpoint(rates_source=...)`` takes its rates from ``recompute_rates`` with that
    source, and its recomputation time is those rates' price of what it recomputes."""
    from tests.unit.test_checkpoint_plan import Chain, capture_joint
    from dsgraph.errors import BudgetError
    from dsgraph.recompute import planner

    torch.manual_seed(0)
    seen = capture_joint(Chain(), torch.randn(64, 24))
    gm, inputs, kwargs = seen["gm"], seen["inputs"], seen["kwargs"]
    asked = []

    def rates(device_type, lowered, source="bandwidth"):
        asked.append(source)
        return H200_MEASURED if source == "profile" else H200_CALIBRATED

    monkeypatch.setattr(planner, "recompute_rates", rates)
    with pytest.raises(BudgetError) as info:
        planner.plan_checkpoint(gm, inputs, kwargs, budget=1)
    stock = planner.plan_checkpoint(gm, inputs, kwargs, budget=1 << 40).stock_peak
    budget = (info.value.smallest_feasible + stock) // 2
    by = {}
    for source in ("bandwidth", "profile"):
        by[source] = planner.plan_checkpoint(gm, inputs, kwargs, budget=budget, rates_source=source)
    assert asked[-2:] == ["bandwidth", "profile"]
    assert all(p.regions and p.predicted_peak <= budget for p in by.values())
    # the measured rates charge no bytes for the recomputed matmuls: a cheaper price of any plan
    assert by["profile"].recompute_seconds < by["bandwidth"].recompute_seconds


def test_prefix_mixes_add_candidates_and_never_slow_a_plan():
    """The recompute-then-cheap candidates (``search.prefix_mixes``) are evaluated exactly
    like the others and only add choices: at every budget the plan with them is at least as
    fast as without, and within the budget; ``mixes=0`` leaves them out."""
    from tests.unit.test_checkpoint_plan import Chain, capture_joint
    from dsgraph.compile.pipeline import parse
    from dsgraph.errors import BudgetError
    from dsgraph.recompute.planner import plan_checkpoint

    torch.manual_seed(0)
    seen = capture_joint(Chain(width=24, depth=6), torch.randn(64, 24))
    gm, inputs, kwargs = seen["gm"], seen["inputs"], seen["kwargs"]
    stock = plan_checkpoint(gm, inputs, kwargs, budget=1 << 40).stock_peak
    with pytest.raises(BudgetError) as info:
        plan_checkpoint(gm, inputs, kwargs, budget=1)
    low = info.value.smallest_feasible
    named = False
    for i in range(1, 6):
        budget = stock - (stock - low) * i // 5
        with_mixes = plan_checkpoint(gm, inputs, kwargs, budget=budget)
        without = plan_checkpoint(gm, inputs, kwargs, budget=budget, mixes=False)
        assert with_mixes.predicted_peak <= budget and without.predicted_peak <= budget
        assert with_mixes.recompute_seconds <= without.recompute_seconds
        names = [c[0] for c in with_mixes.candidates]
        named |= any(n.startswith("recompute") and "+cheap" in n for n in names)
        assert not any("+cheap" in c[0] for c in without.candidates)
    assert named
    assert parse("lifetimes,checkpoint{budget=1GiB,mixes=0}").get("checkpoint").arg("mixes") == "0"
    with pytest.raises(ValueError, match="mixes"):
        parse("lifetimes,checkpoint{budget=1GiB,mixes=maybe}")
