"""A compiled model that its user deletes is freed with its gradient-pool buffer: by one
``gc.collect()`` (as stock Inductor's is), also after ``torch._dynamo.reset()``, after the
compiles that go through an exception (a post-compile check asking for another compile, a
pass failing into the stock fallback) and with a graph break. benchmarks/model_zoo.py found
the first cases still allocated; the CI run found the graph break (a model of
test_grad_pool's graph-break test kept this file's pool buffer in the same xdist worker).

These run in the test process, after whatever tests the worker ran before: the pool is one
per (device, dtype) per process, so a pooled model any earlier test left alive keeps the
buffer. ``_no_pooled_model_alive`` checks that first and names the leftover, since the fault
is then the earlier test's (or dsgraph's, as it was: its compile state held the parameters
strongly, and Dynamo keeps a compiled graph with a graph break even through reset())."""

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import dsgraph
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.pass_api.hooks import Recompile
from dsgraph.passes import checkpoint
from dsgraph.runtime.pool import MANAGER, key_of

CFG = GPTConfig(vocab=64, seq=16, dim=32, layers=2, heads=2)
OPTIONS = {"memory_budget": 400_000, "grad_pool": True}


class Broken(nn.Module):
    """Two linears with a graph break between them: Dynamo compiles two graphs and installs
    a resume function in this module's globals, which torch 2.13's reset() leaves in place
    (and with it the first graph's compiled function, which closes over dsgraph's session)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(13, 17)
        self.b = nn.Linear(17, 5)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h).sum()


def _gpt():
    return GPT(CFG), [gpt_inputs(CFG, 2)]


def _broken():
    g = torch.Generator().manual_seed(0)
    return Broken(), [(torch.randn(n, 13, generator=g),) for n in (6, 6, 9)]  # 9: a recompile


def _no_pooled_model_alive():
    gc.collect()
    alive = [tuple(p.shape) for pool in MANAGER.pools.values() for s in pool.slots if (p := s.param()) is not None
             and not s.moved]
    assert not alive, (f"pooled parameters of an earlier test are still alive, shapes {alive}: a model kept "
                       "after its test (find who holds it: gc.get_referrers on them)")


def _step(options, make=_gpt):
    """Compile a model, forward+backward on each batch; weak references to its parameters
    and to the gradient buffer; nothing of it survives this frame but what dsgraph or torch
    keep."""
    torch.manual_seed(0)
    model, batches = make()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    for batch in batches:
        compiled(*batch).backward()
    pool = MANAGER.pools.get(key_of(next(model.parameters())))
    buffer = weakref.ref(pool.grads) if pool is not None and pool.grads is not None else None
    return [weakref.ref(p) for p in model.parameters()], buffer


def _alive_after(refs, reset=True):
    if reset:
        torch._dynamo.reset()
    gc.collect()
    return sum(r() is not None for r in refs)


@pytest.mark.parametrize("inductor", [False, True], ids=["fx", "inductor"])
def test_a_deleted_model_and_its_gradient_pool_are_freed(inductor):
    _no_pooled_model_alive()
    params, buffer = _step({**OPTIONS, "inductor": inductor})
    assert _alive_after(params) == 0
    assert buffer is not None and buffer() is None  # the pool's buffer went with the last parameter it served


@pytest.mark.parametrize("inductor", [False, True], ids=["fx", "inductor"])
def test_a_deleted_model_is_freed_without_dynamo_reset(inductor):
    """Dynamo keeps the compiled graph in its code cache until reset(); stock Inductor's
    holds no parameter, and neither may dsgraph's (its compile state held them all)."""
    _no_pooled_model_alive()
    params, buffer = _step({**OPTIONS, "inductor": inductor})
    assert _alive_after(params, reset=False) == 0
    assert buffer is not None and buffer() is None


def test_a_model_with_a_graph_break_is_freed():
    _no_pooled_model_alive()
    params, buffer = _step({"grad_pool": True, "inductor": False}, make=_broken)
    assert _alive_after(params) == 0
    assert buffer is not None and buffer() is None


def test_a_profiled_model_and_its_batch_are_freed_without_dynamo_reset():
    """dsgraph.memory_profile compiles under a capture, whose record of Dynamo's inputs held
    the real parameters and batch for as long as Dynamo's cache keeps the compiled graph."""
    _no_pooled_model_alive()

    def profile():
        torch.manual_seed(0)
        model, (batch,) = _gpt()
        dsgraph.memory_profile(model, *batch, **OPTIONS, inductor=False)
        return [weakref.ref(p) for p in model.parameters()], [weakref.ref(t) for t in batch]

    params, batch = profile()
    assert _alive_after(params, reset=False) == 0
    assert _alive_after(batch, reset=False) == 0


def test_a_model_compiled_twice_after_a_post_compile_check_is_freed(monkeypatch):
    """The checkpoint check asks for a second compile (as on the H200, where Inductor's plan
    overran the budget): the Recompile exception kept by the backend held the first
    compile's frames and the parameters among their inputs."""
    _no_pooled_model_alive()
    check, asked = checkpoint.check_compiled, []

    def overrun_once(plan, step, *args):
        if step.attempt == 1:
            asked.append(step.attempt)
            raise Recompile("checkpoint", 1000, "forced overrun", checkpoint.MAX_COMPILES)
        return check(plan, step, *args)

    monkeypatch.setattr(checkpoint, "check_compiled", overrun_once)
    params, buffer = _step({**OPTIONS, "inductor": False})
    assert asked == [1]
    assert _alive_after(params) == 0
    assert buffer is not None and buffer() is None


def test_a_model_compiled_stock_after_a_pass_failed_is_freed(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "checkpoint")
    with pytest.warns(dsgraph.DsgraphFallbackWarning):
        params, _ = _step({**OPTIONS, "inductor": False, "grad_pool": False})
    assert any(r.fallback for r in dsgraph.reports())
    assert _alive_after(params) == 0
