"""A Triton compile error in lowering, at the two real seams: the code generator emits a
kernel Triton cannot run, and Triton raises its own ``CompilationError`` when the kernel is
launched (Triton compiles at the first launch, which is where ``check_region`` meets it).
Either way the region stays with Inductor (or FX), a DsgraphLoweringWarning names it, the
rest of the pipeline still applies, and the step is eager's within the fp32 rule.

tests/unit/test_lowering_pass.py and test_lowering_compile.py already cover the
``fail_regions`` hook (a failure raised before any source is written); these go through
the generated source and Triton's launch. Kernels run under Triton's interpreter.
"""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from triton.compiler.errors import CompilationError

import dsgraph
from dsgraph.lowering import kernels
from dsgraph.lowering.kernels import DsgraphLoweringWarning
from dsgraph.testing import check_training_step

from faults_common import fresh_lm, lm_batch, triton_interpreter
from models import MLP


class OddChain(nn.Module):
    """A pointwise chain no other test lowers: the broken kernel this module's test leaves in
    the process's kernel cache is never handed to another test."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(11, 23), nn.Linear(23, 5)

    def forward(self, x):
        h = self.a(x)
        h = torch.sin(h) * 0.371 + torch.cos(h) * h  # one region under select=all
        return self.b(F.silu(h))


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    # kernels this process compiled and checked before (other test files) are checked again
    # here, so the injected launch failure meets them (restored afterwards)
    for compiled in kernels._CACHE.values():
        monkeypatch.setattr(compiled, "checked", {})
    with triton_interpreter():
        yield


def lowering_stats():
    return [p.stats for r in dsgraph.reports() for p in r.passes if p.name == "lower_triton"]


def lowering_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, DsgraphLoweringWarning)]


def test_codegen_emitting_a_kernel_triton_cannot_run(monkeypatch):
    real = kernels.render

    def broken(ir, where):
        source = real(ir, where)
        assert "tl.load(" in source
        return source.replace("tl.load(", "tl.lod(")  # no such Triton function

    monkeypatch.setattr(kernels, "render", broken)
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_training_step(OddChain(), torch.randn(6, 11),
                            {"inductor": False, "fallback": "error", "pipeline": "lifetimes,lower_triton{select=all}"})
    messages = lowering_warnings(caught)
    assert messages and all("is left to Inductor" in m and "lod" in m for m in messages), messages
    stats = lowering_stats()
    assert stats and all(s["lowered"] == 0 and s["fallbacks"] == s["selected"] >= 1 for s in stats), stats
    assert all(not r.fallback for r in dsgraph.reports())  # the pass itself did not fail


def _raise_compilation_error(*args, **kwargs):
    raise CompilationError(None, None, "out of resources: shared memory (injected)")


def test_triton_compilation_error_at_launch_with_the_pool(monkeypatch):
    """grad_pool's epilogues are the regions lower_triton takes by default (select=tagged):
    TinyLM's elementwise parameter gives one (``slot += g * h``)."""
    monkeypatch.setattr(kernels, "launch", _raise_compilation_error)
    model = fresh_lm(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_training_step(model, lm_batch(1),
                            {"inductor": False, "fallback": "error", "grad_pool": True, "lower_triton": True})
    messages = lowering_warnings(caught)
    assert messages and all("CompilationError" in m and "shared memory" in m for m in messages), messages
    stats = lowering_stats()
    assert stats and sum(s["fallbacks"] for s in stats) >= 1 and all(s["lowered"] == 0 for s in stats)
    # the pool still applies around the region left
    assert any(p.name == "grad_pool" and p.changed for r in dsgraph.reports() if r.kind == "backward" for p in r.passes)


def test_only_the_failing_region_is_left(monkeypatch):
    """One kernel fails its launch, the others are lowered and used."""
    real = kernels.launch
    failing = {}

    def launch(compiled, *args, **kwargs):
        failing.setdefault("name", compiled.name)
        if compiled.name == failing["name"]:
            raise CompilationError(None, None, "injected for one kernel")
        return real(compiled, *args, **kwargs)

    monkeypatch.setattr(kernels, "launch", launch)
    torch.manual_seed(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_training_step(MLP(), torch.randn(5, 13),
                            {"inductor": False, "fallback": "error", "pipeline": "lifetimes,lower_triton{select=all}"})
    messages = lowering_warnings(caught)
    assert messages and all(failing["name"] in m for m in messages)
    stats = lowering_stats()
    assert sum(s["lowered"] for s in stats) >= 1 and sum(s["fallbacks"] for s in stats) >= 1
    assert all(failing["name"] not in s["kernels"] for s in stats)


@pytest.mark.e2e
def test_through_cpu_inductor_the_region_goes_to_inductor(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "launch", _raise_compilation_error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_training_step(fresh_lm(3), lm_batch(3),
                            {"fallback": "error", "grad_pool": True, "lower_triton": True,
                             "pipeline": "lifetimes,grad_pool,lower_triton{opaque=1}"})
    assert lowering_warnings(caught)
    stats = lowering_stats()
    assert stats and all(s["lowered"] == 0 for s in stats) and sum(s["fallbacks"] for s in stats) >= 1
