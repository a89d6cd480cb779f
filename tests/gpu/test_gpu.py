"""The same contract on a CUDA GPU (run on an H200 with torch 2.11; skipped without CUDA)."""

import copy
import re
import warnings

import pytest
import torch

import dsgraph
from dsgraph.errors import DsgraphFallbackWarning
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.testing import check_training_step, fp32_exact, loss_of

pytestmark = pytest.mark.gpu

CFG = GPTConfig(vocab=509, seq=96, layers=2, heads=4, dim=128)


def model_and_inputs(seed=0):
    torch.manual_seed(seed)
    return GPT(CFG).cuda(), gpt_inputs(CFG, 3, "cuda", seed=seed)


@pytest.fixture
def deterministic():
    """Embedding backward accumulates with atomics on CUDA: repeated token ids make two runs
    of the same stock Inductor graph differ in the last bit. Bitwise comparisons need
    deterministic kernels on both sides."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def test_empty_pipeline_is_bitwise_stock_inductor_on_cuda(deterministic):
    model, inputs = model_and_inputs(1)
    check_training_step(model, inputs, {"pipeline": ""}, reference="inductor", bitwise=True)


def test_default_pipeline_matches_eager_fp32_on_cuda():
    model, inputs = model_and_inputs(2)
    check_training_step(model, inputs, {})
    assert [r.kind for r in dsgraph.reports()] == ["joint", "forward", "backward"]


def test_fx_execution_matches_eager_on_cuda():
    model, inputs = model_and_inputs(3)
    check_training_step(model, inputs, {"inductor": False})


def _grads_under(fn, model, inputs, dtype):
    for p in model.parameters():
        p.grad = None
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        loss = loss_of(fn(*inputs))
    loss.backward()
    return [p.grad.double() for p in model.parameters()]


def _rmse(a, b):
    return float(torch.sqrt(torch.mean((a - b) ** 2)))


def test_bf16_autocast_meets_inductors_accuracy_rule():
    """RMSE(dsgraph, fp64) <= 2 * RMSE(eager, fp64) + 1e-3 per gradient (DESIGN.md)."""
    model, inputs = model_and_inputs(4)
    ref64 = copy.deepcopy(model).double()
    with fp32_exact():
        g64 = _grads_under(ref64, ref64, inputs, None)
        eager = copy.deepcopy(model)
        g_eager = _grads_under(eager, eager, inputs, torch.bfloat16)
        ours = copy.deepcopy(model)
        g_ours = _grads_under(torch.compile(ours, backend="dsgraph"), ours, inputs, torch.bfloat16)
    for (name, _), a, e, r in zip(model.named_parameters(), g_ours, g_eager, g64):
        assert _rmse(a, r) <= 2 * _rmse(e, r) + 1e-3, name


def test_fallback_on_cuda(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "lifetimes")
    model, inputs = model_and_inputs(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DsgraphFallbackWarning)  # warned once per process
        check_training_step(model, inputs, {})
    assert {r.kind for r in dsgraph.reports() if r.fallback} == {"joint", "forward", "backward"}


def _kernel_calls(code: str) -> list[str]:
    calls = [line.strip() for line in code.split("def call(")[1].splitlines()]
    return [c for c in calls if re.match(r"(triton_\w+\.run|extern_kernels\.|torch\.ops\.)", c)]


def test_pooled_backward_kernels_against_stock_on_cuda():
    """Target: no more kernels than stock. Every Linear weight is written by its matmul
    (``mm_into_``), the tied token table by one ``addmm_into_`` (stock runs one ``addmm``
    there), the position table's scatter adds straight into its slot, and every other
    gradient's add is fused into its producer."""
    from torch._inductor.utils import run_and_get_code

    counts = {}
    for name, options in (("stock", {"pipeline": ""}), ("pooled", {"grad_pool": True})):
        torch._dynamo.reset()
        model, inputs = model_and_inputs(6)
        compiled = torch.compile(model, backend="dsgraph", options=options)
        _, codes = run_and_get_code(lambda: compiled(*inputs).backward())
        counts[name] = _kernel_calls(codes[-1])
    assert not any(r.fallback for r in dsgraph.reports())  # else both sides would be stock
    assert any("dsgraph_grad_" in c for c in counts["pooled"])
    matmuls = [c for c in counts["pooled"] if c.startswith("torch.ops.dsgraph.mm_into_")]
    assert len(matmuls) == 4 * CFG.layers  # qkv, proj, up, down of every block
    assert any(c.startswith("torch.ops.dsgraph.addmm_into_") for c in counts["pooled"])
    assert len(counts["pooled"]) <= len(counts["stock"]), counts


def test_grad_pool_matches_eager_on_cuda():
    model, inputs = model_and_inputs(7)
    result = check_training_step(model, inputs, {"grad_pool": True, "fallback": "error"})
    assert result.ok
    assert any(p.name == "grad_pool" and p.changed for r in dsgraph.reports() for p in r.passes)


def test_grad_pool_under_bf16_autocast_on_cuda():
    """The benchmark's setting: weight gradients come out of bf16 matmuls and are converted,
    so they take the fused add-into-slot path."""
    model, inputs = model_and_inputs(8)
    compiled = torch.compile(model, backend="dsgraph", options={"grad_pool": True, "fallback": "error"})
    reference = copy.deepcopy(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        compiled(*inputs).backward()
        reference(*inputs).backward()
    pool = dsgraph.grad_pool(model)
    assert pool is not None and len(pool.slots) == len(list(model.parameters()))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        rel = float((p.grad - q.grad).norm() / q.grad.norm())
        assert rel < 2e-2, (name, rel)  # bf16 matmuls: Inductor and eager round differently


def _budget_error(model, inputs):
    """The smallest feasible budget of this model, from the error a 1-byte budget raises."""
    from torch._dynamo.exc import BackendCompilerFailed

    from dsgraph.errors import BudgetError, find_cause

    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed) as info:
        loss_of(torch.compile(model, backend="dsgraph", options={"memory_budget": 1, "fallback": "error"})(*inputs))
    e = find_cause(info.value, BudgetError)
    assert e is not None
    return e.smallest_feasible


def test_memory_budget_is_honoured_and_matches_eager_on_cuda():
    """Measured peak of a steady step within budget x 1.05; gradients within the fp32 rule.

    The model is sized so that activations fill the budget (gigabytes), and runs under bf16
    autocast as the benchmarks do. The budget covers what the allocator reports, the CUDA
    BLAS libraries' workspaces included (``analysis.library_memory``: 2 x 33 MiB on the
    H200). Session 8 traced this test's 5.3% overrun (``benchmarks.alloc_replay``) to those
    workspaces (66 MiB) and to the chunked loss's returned gradients (160 MiB), which
    Inductor's plan placed after the op that makes them. On the small test GPT the
    workspaces alone are 66 MiB against a budget of a few MB, so the small GPT checks
    gradients only. The report's ``checkpoint_inductor_peak`` (Inductor's own plan, checked
    by the session) must be within the budget too."""
    cfg = GPTConfig(vocab=32768, seq=1024, layers=4, heads=8, dim=1024)
    torch.manual_seed(2)
    model, inputs = GPT(cfg).cuda(), gpt_inputs(cfg, 8, "cuda", seed=2)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        smallest = _budget_error(model, inputs)
    budget = smallest * 3 // 2
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options={"memory_budget": budget, "fallback": "error"})
    for step in range(2):
        model.zero_grad(set_to_none=True)
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(compiled(*inputs))
        loss.backward()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    plan = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    facts = f"budget {budget}, measured {measured}, plan {plan}"
    assert measured <= budget * 1.05, facts
    assert plan["checkpoint_recomputed_segments"] > 0 and plan["checkpoint_predicted_peak"] <= budget, facts
    assert plan["checkpoint_inductor_peak"] <= budget, facts
    small, small_inputs = model_and_inputs(2)
    budget = _budget_error(small, small_inputs) * 11 // 10
    check_training_step(small, small_inputs, {"memory_budget": budget, "fallback": "error"})
