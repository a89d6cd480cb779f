"""reorder_for_memory on small graphs: the plan, the code, the peak, and numerics."""

import importlib

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

import dsgraph
from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.report.reports import GraphReport
from dsgraph.pass_api import CompileConfig, PassContext
from dsgraph.compile import registry
from dsgraph.compile.manager import run_passes
from dsgraph.compile.pipeline import parse
from dsgraph.testing import check_training_step

reorder = importlib.import_module("dsgraph.passes.reorder_for_memory")

N = 1000  # floats per temporary: 4000 bytes


def fan_out(x):
    a, b, c = x.exp(), x.sin(), x.cos()
    return a.sum() + b.sum() + c.sum()


def trace(fn, *shapes):
    return make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])


def test_plan_interleaves_temporaries_with_their_reductions():
    gm = trace(fan_out, (N,))
    lt = TensorLifetimes(gm)
    plan = reorder.plan_reorder(gm, lt)
    assert plan.order[:2] == ["exp", "sum_1"] and plan.order[2:4] == ["sin", "sum_2"]
    # input (4000) + three temporaries (12000) + a scalar, versus one temporary at a time
    assert plan.peak_before == 4 * N * 4 + 4
    assert plan.peak_after == 2 * N * 4 + 4 * 2
    assert plan.improves and plan.moved > 0


def test_predicted_peak_of_the_plan_is_what_the_reordered_graph_has():
    gm = trace(fan_out, (N,))
    plan = reorder.plan_reorder(gm, TensorLifetimes(gm))
    reorder.apply_reorder(gm, plan)
    gm.recompile()
    assert TensorLifetimes(gm).peak()[0] == plan.peak_after
    FileCheck().check("exp").check("sum_1").check("sin").check("sum_2").check("cos").check("sum_3").run(gm.code)


def test_graph_left_alone_when_nothing_improves():
    def chain(x):
        return x.exp().sin().cos().sum()

    gm = trace(chain, (N,))
    ctx = PassContext(CompileConfig(dsgraph.validate_options({}), parse("reorder_for_memory")), "forward", "c000_forward")
    ctx.gm = gm
    before = gm.code
    result = reorder.run(gm, ctx)
    assert not result.changed and result.stats["moved"] == 0 and gm.code == before


def test_random_ops_and_mutations_keep_their_order():
    def f(x, buf):
        r1 = torch.rand(N)
        big = x.exp()
        r2 = torch.randn(N)
        s = big.sum()
        t = buf.sum()  # reads buf before the mutation
        buf.add_(1)  # must stay after t and before u
        u = buf.sum()
        return s + r1.sum() + r2.sum() + t + u

    gm = trace(f, (N,), (N,))
    plan = reorder.plan_reorder(gm, TensorLifetimes(gm))
    order = plan.order
    assert order.index("rand") < order.index("randn")
    assert order.index("sum_2") < order.index("add_") < order.index("sum_3")


def test_through_the_pass_manager_and_stats():
    gm = trace(fan_out, (N,))
    cfg = CompileConfig(dsgraph.validate_options({}), parse("lifetimes,reorder_for_memory"))
    ctx = PassContext(cfg, "forward", "c000_forward")
    report = GraphReport("c000", "forward", str(cfg.pipeline), False)
    run_passes(gm, ctx, registry.stage_passes(cfg.pipeline, "forward"), report)
    stats = report.passes[1].stats
    assert report.passes[1].changed and stats["peak_after_bytes"] < stats["peak_before_bytes"]


class Wide(torch.nn.Module):
    """Backward needs every branch's saved activation; the branches are independent."""

    def __init__(self):
        super().__init__()
        self.branches = torch.nn.ModuleList(torch.nn.Linear(31, 63) for _ in range(4))

    def forward(self, x):
        outs = [torch.tanh(b(x)) for b in self.branches]
        return sum(o.exp().mean() for o in outs)


def test_gradients_bitwise_equal_without_the_pass():
    torch.manual_seed(0)
    check_training_step(Wide(), torch.randn(17, 31), {"inductor": False, "pipeline": "lifetimes,reorder_for_memory"},
                        reference={"inductor": False, "pipeline": "lifetimes"}, bitwise=True)
    changed = {r.kind for r in dsgraph.reports() for p in r.passes if p.name == "reorder_for_memory" and p.changed}
    assert changed == {"forward", "backward"}  # the comparison is not vacuous
