"""lower_triton end to end through torch.compile(backend="dsgraph"): the forward and backward
graphs run generated Triton kernels (Triton's interpreter, CPU), and the training step's
loss and gradients match eager within the fp32 rule.

Kernels run under Triton's interpreter (the ``triton_interpreter`` fixture). All but one
test use inductor=False; the last goes through CPU Inductor once, to show what it does
with the kernels on the CPU (it calls them as opaque ops)."""

import copy
import tempfile

import pytest
import torch
import torch.nn as nn

import dsgraph
from dsgraph.lowering.check import rel_err
from dsgraph.lowering.kernels import DsgraphLoweringWarning
from dsgraph.testing import check_training_step

from models import MLP, TinyBlock, TinyGPT, gpt_batch


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


def lowered(kind):
    """Kernels the lower_triton pass put into this process's graphs of ``kind``."""
    out = []
    for r in dsgraph.reports():
        if r.kind == kind:
            for p in r.passes:
                if p.name == "lower_triton":
                    out += p.stats.get("kernels", [])
    return out


def test_tiny_gpt_training_step_matches_eager():
    torch.manual_seed(3)
    check_training_step(TinyGPT(layers=1), gpt_batch(batch=2, seq=11, seed=3),
                        {"inductor": False, "pipeline": "lower_triton{select=all}"})
    # layer norms, GELU, residual adds and the loss's softmax: forward and backward kernels
    assert len(lowered("forward")) >= 3 and len(lowered("backward")) >= 3


def test_recomputed_selection_lowers_the_backwards_recomputation_only():
    torch.manual_seed(4)
    check_training_step(MLP(), torch.randn(6, 13), {"inductor": False, "pipeline": "lower_triton{select=recomputed}"})
    assert lowered("forward") == []
    assert len(lowered("backward")) >= 1  # the GELU the backward recomputes from fc1's output


class Scaled(nn.Module):
    """A parameter used elementwise: its gradient (g * tanh(x)) is pointwise, so the pooled
    backward's ``slot += g * tanh(x)`` is one region (the default selection takes it)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(5, 19))
        self.fc = nn.Linear(19, 3)

    def forward(self, x):
        return self.fc(torch.tanh(x) * self.scale)


def test_pool_epilogue_is_lowered_by_default_and_accumulates_like_eager():
    torch.manual_seed(5)
    model = Scaled()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False, "grad_pool": True,
                                                                 "lower_triton": True})
    for step in range(3):  # accumulate across steps, different data each step
        x = torch.randn(5, 19)
        compiled(x).sum().backward()
        ref(x).sum().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert rel_err(p.grad, q.grad) <= 1e-5, (step, name)
    kernels = lowered("backward")
    assert len(kernels) == 1  # the scale's slot written by the kernel; fc's grads stay stock
    report = next(r for r in dsgraph.reports() if r.kind == "backward")
    assert [p.name for p in report.passes] == ["lifetimes", "grad_pool", "lower_triton"]


def test_dynamic_batch_one_compile_serves_two_sizes():
    torch.manual_seed(6)
    model = MLP()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", dynamic=True,
                             options={"inductor": False, "pipeline": "lower_triton{select=all}"})
    for batch in (7, 12):
        x = torch.randn(batch, 13)
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = q.grad = None
        out = compiled(x)
        want = ref(x)
        assert rel_err(out, want) <= 1e-5
        out.sum().backward()
        want.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert rel_err(p.grad, q.grad) <= 1e-5
    forwards = [r for r in dsgraph.reports() if r.kind == "forward"]
    assert len(forwards) == 1 and lowered("forward")  # one compile, kernels for both sizes


def test_a_failing_kernel_falls_back_with_a_warning_and_the_step_stays_right():
    torch.manual_seed(7)
    with pytest.warns(DsgraphLoweringWarning, match="left to Inductor"):
        check_training_step(TinyBlock(), torch.randn(2, 7, 24),
                            {"inductor": False, "pipeline": "lower_triton{select=all,fail_regions=0}"})
    stats = [p.stats for r in dsgraph.reports() for p in r.passes if p.name == "lower_triton"]
    assert all(s["fallbacks"] == 1 for s in stats) and any(s["lowered"] >= 1 for s in stats)


@pytest.mark.e2e
def test_cpu_inductor_calls_the_kernels_as_opaque_ops(monkeypatch):
    """CPU Inductor accepts the ops but only as extern Python calls (wrap_triton does not
    trace interpreted kernels), so lower_triton refuses by default there; ``opaque=1``
    lowers anyway, and the step through Inductor still matches eager."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    torch.manual_seed(8)
    check_training_step(MLP(), torch.randn(6, 13), {"pipeline": "lower_triton{select=all,opaque=1}"})
    assert lowered("forward") and lowered("backward")
