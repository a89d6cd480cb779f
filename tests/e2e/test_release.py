"""A compiled model that its user deletes is freed by ``torch._dynamo.reset()`` and one
``gc.collect()``: its parameters and its gradient-pool buffer, also after the compiles that
go through an exception (a post-compile check asking for another compile, a pass failing
into the stock fallback). benchmarks/model_zoo.py found each of these still allocated."""

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

import dsgraph
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.runtime.pool import MANAGER, key_of

CFG = GPTConfig(vocab=64, seq=16, dim=32, layers=2, heads=2)
OPTIONS = {"memory_budget": 400_000, "grad_pool": True}


def _step(options):
    """Compile a GPT, one forward+backward; weak references to its parameters and to the
    gradient buffer; nothing of it survives this frame but what dsgraph or torch keep."""
    torch.manual_seed(0)
    model = GPT(CFG)
    compiled = torch.compile(model, backend="dsgraph", options=options)
    compiled(*gpt_inputs(CFG, 2)).backward()
    pool = MANAGER.pools.get(key_of(next(model.parameters())))
    buffer = weakref.ref(pool.grads) if pool is not None and pool.grads is not None else None
    return [weakref.ref(p) for p in model.parameters()], buffer


def _alive_after_reset_and_one_collect(refs):
    torch._dynamo.reset()
    gc.collect()
    return sum(r() is not None for r in refs)


def _in_a_fresh_interpreter(code: str) -> tuple[str, str]:
    """Run ``code`` (which prints the live parameter count and whether the pool's buffer
    was freed) in a fresh interpreter: the pool is one per (device, dtype) in a process, so a
    model another test left alive in the same worker would keep the buffer, rightly."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    alive, buffer_freed = run.stdout.split()[-2:]
    return alive, buffer_freed


@pytest.mark.parametrize("inductor", [False, True], ids=["fx", "inductor"])
def test_a_deleted_model_and_its_gradient_pool_are_freed(inductor):
    alive, buffer_freed = _in_a_fresh_interpreter(f"""
import tests.e2e.test_release as t
params, buffer = t._step({{**t.OPTIONS, "inductor": {inductor}}})
print(t._alive_after_reset_and_one_collect(params), buffer is not None and buffer() is None)
""")
    assert alive == "0"
    assert buffer_freed == "True"  # the pool's buffer went with the last parameter it served


def test_a_model_compiled_twice_after_a_post_compile_check_is_freed():
    """The checkpoint check asks for a second compile (as on the H200, where Inductor's plan
    overran the budget): the Recompile exception kept by the backend held the first
    compile's frames and the parameters among their inputs."""
    alive, buffer_freed = _in_a_fresh_interpreter("""
import tests.e2e.test_release as t
from dsgraph.pass_api.hooks import Recompile
from dsgraph.passes import checkpoint
check, asked = checkpoint.check_compiled, []

def overrun_once(plan, step, *args):
    if step.attempt == 1:
        asked.append(step.attempt)
        raise Recompile("checkpoint", 1000, "forced overrun", checkpoint.MAX_COMPILES)
    return check(plan, step, *args)

checkpoint.check_compiled = overrun_once
params, buffer = t._step({**t.OPTIONS, "inductor": False})
assert asked == [1], asked
print(t._alive_after_reset_and_one_collect(params), buffer is not None and buffer() is None)
""")
    assert alive == "0"
    assert buffer_freed == "True"


def test_a_model_compiled_stock_after_a_pass_failed_is_freed(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "checkpoint")
    with pytest.warns(dsgraph.DsgraphFallbackWarning):
        params, _ = _step({**OPTIONS, "inductor": False, "grad_pool": False})
    assert any(r.fallback for r in dsgraph.reports())
    assert _alive_after_reset_and_one_collect(params) == 0
