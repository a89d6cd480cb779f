"""torch.compile(backend="dsgraph") end to end. Most checks run the graphs as FX code
(inductor=False); the ones marked e2e go through CPU Inductor (seconds per compile)."""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.errors import DsgraphFallbackWarning
from dsgraph.testing import check_training_step

from models import MLP, TinyGPT, gpt_batch
from passes_for_tests import registered


def test_entry_point_works_in_a_fresh_interpreter_without_import():
    code = textwrap.dedent("""
        import sys, torch
        m = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh())
        out = torch.compile(m, backend="dsgraph", options={"inductor": False})(torch.randn(4, 5))
        out.sum().backward()
        assert m[0].weight.grad is not None
        print("ok", "dsgraph" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "True"]  # torch loaded it through the entry point


def test_bad_option_is_reported_at_first_compile_with_the_key():
    compiled = torch.compile(MLP(), backend="dsgraph", options={"budget": "1GiB"})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(3, 13))
    assert "unknown dsgraph option 'budget'" in str(info.value) and "memory_budget" in str(info.value)


def test_float_budget_through_torch_compile():
    compiled = torch.compile(MLP(), backend="dsgraph", options={"memory_budget": 0.5})
    with pytest.raises(BackendCompilerFailed, match="must be bytes"):
        compiled(torch.randn(3, 13))


def test_unknown_pass_in_env_pipeline(monkeypatch):
    monkeypatch.setenv("DSGRAPH_PIPELINE", "lifetimes,magic")
    with pytest.raises(BackendCompilerFailed, match="unknown dsgraph pass 'magic'"):
        torch.compile(MLP(), backend="dsgraph")(torch.randn(3, 13))


def test_default_pipeline_fx_matches_eager_on_gpt():
    torch.manual_seed(0)
    result = check_training_step(TinyGPT(), gpt_batch(), {"inductor": False})
    assert result.ok and len(result.rows) == 1 + len(list(TinyGPT().parameters()))
    kinds = [r.kind for r in dsgraph.reports()]
    assert kinds == ["joint", "forward", "backward"]
    assert all(r.pipeline == "lifetimes" for r in dsgraph.reports())


def test_lifetimes_pass_does_not_change_gradients_bitwise():
    torch.manual_seed(1)
    check_training_step(TinyGPT(), gpt_batch(seed=1), {"inductor": False},
                        reference={"inductor": False, "pipeline": ""}, bitwise=True)


def test_forward_only_and_no_grad_calls():
    torch.manual_seed(2)
    model = MLP()
    x = torch.randn(4, 13)
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False})
    with torch.no_grad():
        y = compiled(x)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-6)
    assert [r.kind for r in dsgraph.reports()] == ["inference"]
    y2 = compiled(x)  # grad enabled: recompiles for training; never call backward
    torch.testing.assert_close(y2, model(x), rtol=1e-5, atol=1e-6)
    assert [r.kind for r in dsgraph.reports()][-2:] == ["forward", "backward"]  # backward not lazy


def test_dynamic_shapes():
    torch.manual_seed(3)
    model = MLP()
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False}, dynamic=True)
    for batch in (5, 9):
        x = torch.randn(batch, 13)
        compiled(x).sum().backward()
    fw = [r for r in dsgraph.reports() if r.kind == "forward"]
    assert len(fw) == 1 and fw[0].memory["peak_bytes"] > 0


def test_reports_to_dict():
    torch.compile(MLP(), backend="dsgraph", options={"inductor": False})(torch.randn(3, 13)).sum().backward()
    d = dsgraph.reports()[1].to_dict()
    assert d["kind"] == "forward" and d["passes"][0]["name"] == "lifetimes"
    assert d["memory"]["saved_bytes"] > 0 and d["memory"]["peak_bytes"] > d["memory"]["saved_bytes"]
    table = dsgraph.report_table()
    assert "lifetimes" in table and "_backward" in table


# --- failure policy ----------------------------------------------------------------------

def test_backward_failure_reverts_forward_too():
    torch.manual_seed(4)
    with registered(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_training_step(MLP(), torch.randn(5, 13), {"inductor": False, "pipeline": "lifetimes,t_boom"})
    messages = [str(w.message) for w in caught if issubclass(w.category, DsgraphFallbackWarning)]
    assert len(messages) == 1
    assert "'t_boom'" in messages[0] and "this graph is not for me" in messages[0]
    assert "passes before it: lifetimes" in messages[0]
    graphs = [r for r in dsgraph.reports() if r.fallback]
    assert sorted(r.kind for r in graphs) == ["backward", "forward", "joint"]
    assert all(not r.passes and r.pipeline == "" for r in graphs)  # forward is stock too


def test_fallback_warns_once_per_failure(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "lifetimes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in (5, 6):
            torch.manual_seed(seed)
            check_training_step(MLP(), torch.randn(5, 13), {"inductor": False})
    fallback = [w for w in caught if issubclass(w.category, DsgraphFallbackWarning)]
    assert len(fallback) <= 1  # a failure seen before in this process is not repeated
    assert all(r.fallback for r in dsgraph.reports())


def test_fallback_error_raises(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "lifetimes")
    compiled = torch.compile(MLP(), backend="dsgraph", options={"inductor": False, "fallback": "error"})
    with pytest.raises(BackendCompilerFailed, match="dsgraph pass 'lifetimes' failed"):
        compiled(torch.randn(3, 13))


def test_option_errors_are_not_hidden_by_fallback():
    compiled = torch.compile(MLP(), backend="dsgraph", options={"fallback": "inductor", "memory_budget": 0.5})
    with pytest.raises(BackendCompilerFailed, match="budgets are bytes, not fractions"):
        compiled(torch.randn(3, 13))


# --- through CPU Inductor ----------------------------------------------------------------

@pytest.mark.e2e
def test_empty_pipeline_is_bitwise_stock_inductor():
    torch.manual_seed(7)
    check_training_step(TinyGPT(), gpt_batch(seed=7), {"pipeline": ""}, reference="inductor", bitwise=True)


@pytest.mark.e2e
def test_default_pipeline_through_inductor_matches_eager():
    torch.manual_seed(8)
    check_training_step(TinyGPT(), gpt_batch(seed=8), {})


@pytest.mark.e2e
def test_fallback_through_inductor_with_dropout(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "lifetimes")
    torch.manual_seed(9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DsgraphFallbackWarning)
        check_training_step(MLP(dropout=0.5), torch.randn(6, 13), {})
    assert {r.kind for r in dsgraph.reports() if r.fallback} == {"joint", "forward", "backward"}
