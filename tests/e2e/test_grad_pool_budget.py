"""The checkpoint planner's predictions with the gradient pool against Inductor's compiled
plans (CPU Inductor): with the pool the backward writes the parameters' gradients into
their slots and receives a handle on each parameter (``compile.partition_edit``), both of
which the emulation of Inductor models (``StepModel(pooled=..., handled=...)``)."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgraph
from dsgraph import compat
from dsgraph.errors import BudgetError, DsgraphBudgetWarning, find_cause
from dsgraph.passes import checkpoint

from models import ResNet18


class _PatchEncoder(nn.Module):
    """A small vision transformer: a patch convolution, two encoder layers, a head."""

    def __init__(self, d=64):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 8, 8)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x, y):
        t = self.patch(x).flatten(2).transpose(1, 2)
        return F.cross_entropy(self.head(self.enc(t).mean(1)), y)


def _pooled_prediction(model, inputs):
    torch._dynamo.reset()
    dsgraph.clear_reports()
    torch.compile(model, backend="dsgraph", options={"memory_budget": 2**40, "grad_pool": True})(*inputs).backward()
    joint = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    return joint["checkpoint_predicted_peak"], joint["checkpoint_inductor_peak"]


class _WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(4)], nn.Linear(512, 1))

    def forward(self, x):
        return self.body(x).sum()


@pytest.mark.e2e
def test_a_budget_with_the_pool_counts_the_gradients_once():
    """Found on the H200 (vit_b_16: predicted 1.10 GB against a compiled plan of 0.80 GB):
    with the pool the planner counted each parameter's gradient twice, in the pool and as
    a backward output held to the end of the step. On a model whose peak is its gradients
    (parameters 4.2 MB, a batch of 4) that was +49% (12,630,044 against 8,482,856 B); the
    gradients a matmul or a fused kernel writes into their slot now take no buffer of
    their own, a fallback's output lives to its copy (``StepModel(pooled=...)``)."""
    torch.manual_seed(0)
    predicted, compiled = _pooled_prediction(_WideMLP(), (torch.randn(4, 512),))
    assert compiled <= predicted <= 1.03 * compiled, (predicted, compiled)


@pytest.mark.e2e
def test_a_budget_with_the_pool_predicts_the_compiled_plan():
    """The checkpoint planner's prediction with the gradient pool against Inductor's compiled
    plans (CPU, the budget loose): within 3%. Without the pool the same model is predicted
    to 256 bytes. With the pool it was 5,696,700 against 5,386,644 B (+5.8%; +7.0% before
    the gradients were counted once), from three things the pooled backward does that the
    emulation did not (session 11): the slots are graph inputs Inductor's peak estimate
    frees after their last reader, so its ``reorder_for_peak_memory`` ran an FFN's
    weight-gradient ``mm_into_`` before the input gradient's mm and freed the saved
    activation it reads first (+260,096 B), and the loss head's gradients, computed in
    place into saved buffers, were held to the end (+2,600 B); the parameters' handles keep the convolution
    weight out of the layout optimization's saved channels-last copy (+49,152 B); on a CPU
    a pooled bias gradient's sum is still a buffer (-1,792 B). Now exact: 5,386,644 B.
    (Session 12: 256 B low once a pooled gradient's end was set on the scheduled clock,
    until the CPU's vertical fusion into a group with a reduction was held to outer-loop
    fusion, ``inductor_scheduler._other_outer_loop``.)"""
    torch.manual_seed(0)
    predicted, compiled = _pooled_prediction(_PatchEncoder(), (torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))))
    assert compiled <= predicted <= 1.03 * compiled, (predicted, compiled)


@pytest.mark.e2e
@pytest.mark.parametrize("model_inputs", ["wide_mlp", "patch_encoder"])
def test_with_the_pool_the_lower_bound_is_below_the_smallest_plan(model_inputs):
    """The BudgetError's lower bound is a peak no partition goes below, so it is at most the
    smallest plan's. With the pool it counted every gradient twice, once in the pool's
    buffer (in the step's external bytes) and once as a gradient the backward returns
    (session 11, found on a ResNet-18 on CPU: "no partition peaks below 128.05 MiB" under a
    smallest feasible budget of 101.60 MiB)."""
    torch.manual_seed(0)
    if model_inputs == "wide_mlp":
        model, inputs = _WideMLP(), (torch.randn(4, 512),)
    else:
        model, inputs = _PatchEncoder(), (torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,)))
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(model, backend="dsgraph", options={"memory_budget": 1, "grad_pool": True,
                                                         "fallback": "error"})(*inputs).backward()
    error = find_cause(info.value, BudgetError)
    assert error is not None, info.value
    assert error.lower_bound is not None and error.lower_bound <= error.smallest_feasible, str(error)


class _ResidualConvNet(nn.Module):
    """A stem and four residual conv + BatchNorm + ReLU blocks (64 channels) and a head."""

    def __init__(self, c=64, n=4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 2, 1, bias=False)
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 3, 1, 1, bias=False) for _ in range(n))
        self.norms = nn.ModuleList(nn.BatchNorm2d(c) for _ in range(n))
        self.head = nn.Linear(c, 10)

    def forward(self, x, y):
        x = self.stem(x)
        for conv, norm in zip(self.convs, self.norms):
            x = x + F.relu(norm(conv(x)))
        return F.cross_entropy(self.head(x.mean((2, 3))), y)


@pytest.mark.e2e
def test_with_the_pool_a_convolution_networks_smallest_plan_is_predicted():
    """With the pool and the smallest feasible budget, the prediction within 3% of Inductor's
    compiled plan (CPU): 1,809,032 predicted against 1,840,776 B compiled (-1.72%, session
    11), two errors that offset each other here and not on a ResNet-18 (the next test);
    exact since session 12 (1,776,264 B, a smaller plan; its stock plan, +4.5% before, is
    exact too). Session 14's cuts gave a plan recomputing the last blocks' inputs in the
    backward, predicted 7.0% low: their ``convolution_backward`` copies its weight to
    channels last for an input the backward computes, as for one that arrived channels last
    (1,775,752 B predicted and compiled)."""
    def joint_memory(budget):
        torch.manual_seed(0)
        model, inputs = _ResidualConvNet(), (torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,)))
        torch._dynamo.reset()
        dsgraph.clear_reports()
        torch.compile(model, backend="dsgraph", options={"memory_budget": budget, "grad_pool": True,
                                                         "fallback": "error"})(*inputs).backward()
        return [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory

    with pytest.raises(Exception) as info:
        joint_memory(1)
    smallest = find_cause(info.value, BudgetError).smallest_feasible
    memory = joint_memory(smallest)
    predicted, compiled = memory["checkpoint_predicted_peak"], memory["checkpoint_inductor_peak"]
    assert abs(predicted - compiled) <= 0.03 * compiled, (predicted, compiled)


def _stopped(e: BaseException | None) -> bool:
    """Was ``e`` raised by ``inductor_codegen_only`` (Inductor may wrap it)?"""
    for _ in range(20):
        if e is None or isinstance(e, compat.CodegenOnly):
            return e is not None
        e = e.__cause__ or e.__context__
    return False


@pytest.fixture
def plans_only(monkeypatch):
    """Inductor stops once its wrapper code is generated (``compat.inductor_codegen_only``:
    its buffer plan, which the budget check reads, is complete then) and the graphs run as
    FX code: the C++ compile of the kernels is most of a CPU compile's time."""
    original = compat.compile_fx_inner

    def compile_fx_inner(gm, example_inputs, **kwargs):
        fallback = compat.copy_graph_module(gm)
        try:
            with compat.inductor_codegen_only():
                return original(gm, example_inputs, **kwargs)
        except Exception as e:
            if not _stopped(e):
                raise
        return compat.boxed_fx(fallback)

    monkeypatch.setattr(compat, "compile_fx_inner", compile_fx_inner)


@pytest.mark.e2e
def test_with_the_pool_a_resnet18s_smallest_plan_is_predicted(plans_only, monkeypatch):
    """A pure-torch ResNet-18 (batch 4, 32x32) with the pool and the smallest feasible
    budget: predicted within 3% of Inductor's compiled plan. It was 106,537,236 against
    113,568,020 B (-6.2%; exact within 0.01% without the pool) and the pooled stock plan
    +2.1% (112,215,828 against 109,877,016 B), from two errors in the emulation (session 12,
    buffer by buffer at Inductor's peak):

    - the backward receives each convolution weight as a contiguous handle, and Inductor's
      ``convolution_backward`` lowering copies it to channels last for the input gradient
      (``require_channels_last`` with layout optimization, which a recomputed convolution
      turns on; without it ``require_stride_order`` to the input gradient's strides, which
      are channels last as the saved input is): a 147,456 B copy on the 64-channel layers
      at each such kernel, which the emulation did not make (``OpInfo.channels_last_args``);
    - a fallback's pooled weight gradient was held past its copy into the slot for as
      many steps as fusion had removed before it: ``into_slot`` set its end on the clock of
      the unfused kernels. On the small residual network above this hid the first error.

    Now 100,149,524 against 100,157,716 B (-0.01%), the stock plan 109,860,632 against
    109,877,016 B (-0.01%). The 8,192 B left are not the pool's (the plan without it errs
    by 6,148 B): the backward recomputes the 512-channel BatchNorms' statistics, whose
    mean over 4 elements Inductor stores (with the rsqrt, 2,048 B each) where the emulation
    inlines them; not traced further. Those bytes put the compiled plan over the budget, and
    the check would compile the same smallest plan again: one compile here (the check
    warns instead), the test's time is the compile."""
    monkeypatch.setattr(checkpoint, "MAX_COMPILES", 1)

    def joint_memory(budget):
        torch.manual_seed(0)
        model, inputs = ResNet18(), (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
        torch._dynamo.reset()
        dsgraph.clear_reports()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DsgraphBudgetWarning)
            torch.compile(model, backend="dsgraph", options={"memory_budget": budget, "grad_pool": True,
                                                             "fallback": "error"})(*inputs).backward()
        return [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory

    with pytest.raises(Exception) as info:
        joint_memory(1)  # refused in the joint stage: nothing is compiled
    smallest = find_cause(info.value, BudgetError).smallest_feasible
    memory = joint_memory(smallest)
    predicted, compiled = memory["checkpoint_predicted_peak"], memory["checkpoint_inductor_peak"]
    assert abs(predicted - compiled) <= 0.03 * compiled, (predicted, compiled)
