"""DSGRAPH_TEST_FAIL_PASS for every single-process pass (allreduce, which needs ranks:
test_fail_pass_dist.py), each switched on by its own options.

- ``fallback="inductor"``: one DsgraphFallbackWarning naming the pass, every graph of that
  compile (pre_grad / joint / forward / backward) recorded as a stock compile, and one
  training step equal to eager's within the fp32 rule. A multi-stage pass also fails in its
  later stage only (``<pass>@backward``): the forward was already compiled with the pass's
  assumptions (grad_pool's partition hands the parameters to the backward, lower_triton's
  kernels, arena's buffer), and the fallback must recompile it too.
- ``fallback="error"``: the compile raises, naming the pass.

Graphs go through CPU Inductor, except for arena and lower_triton, whose rewrites serve FX
execution here (arena is FX-only; lower_triton through CPU Inductor only as opaque calls).
"""

import copy
import dataclasses

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.compile import registry
from dsgraph.compile.backend import make_config
from dsgraph.errors import PassFailure, find_cause
from dsgraph.testing import check_training_step, fp32_exact

from faults_common import fallback_warnings, fresh_lm, lm_batch, triton_interpreter


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    options: dict
    stages: tuple  # stages injected one at a time: None = the pass's first stage
    interpreter: bool = False


CASES = {
    "lifetimes": Case("lifetimes", {}, (None, "backward")),
    "reorder_for_memory": Case("reorder_for_memory", {"pipeline": "lifetimes,reorder_for_memory"}, (None, "backward")),
    "chunk_loss": Case("chunk_loss", {"chunk_loss": True}, (None,)),
    "checkpoint": Case("checkpoint", {"memory_budget": "64MiB", "chunk_loss": False}, (None,)),
    "grad_pool": Case("grad_pool", {"grad_pool": True}, (None, "backward")),
    "lower_triton": Case("lower_triton", {"inductor": False, "grad_pool": True, "lower_triton": True},
                         (None, "backward"), interpreter=True),
    "arena": Case("arena", {"inductor": False, "arena": True}, (None, "backward")),
}
DIST_ONLY = {"allreduce"}  # needs a process group: test_fail_pass_dist.py


def test_every_pass_has_a_case():
    """A pass added to the registry without a fault case fails here."""
    assert set(registry.CANONICAL_ORDER) == set(CASES) | DIST_ONLY


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_options_enable_the_pass(name):
    config = make_config(dsgraph.validate_options(CASES[name].options), {})
    assert config.pipeline.get(name) is not None, str(config.pipeline)


def test_the_lower_triton_case_lowers_a_region():
    """Without a failure its options lower TinyLM's pooled gradient of the elementwise
    parameter (the case is not vacuous)."""
    with triton_interpreter():
        check_training_step(fresh_lm(1), lm_batch(1), {**CASES["lower_triton"].options, "fallback": "error"})
    stats = [p.stats for r in dsgraph.reports() for p in r.passes if p.name == "lower_triton"]
    assert sum(s["lowered"] for s in stats) >= 1, stats


def _injected(case: Case, stage):
    return case.name if stage is None else f"{case.name}@{stage}"


FALLBACK = [(n, s) for n in sorted(CASES) for s in CASES[n].stages]


def two_steps(fn):
    losses = []
    for seed in (1, 2):
        loss = fn(*lm_batch(seed))
        loss.backward()
        losses.append(loss.detach())
    return losses


def rel_err(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


@pytest.mark.e2e
@pytest.mark.parametrize("name,stage", FALLBACK, ids=[f"{n}@{s or 'first'}" for n, s in FALLBACK])
def test_fallback_warns_naming_the_pass_and_the_steps_are_eager(name, stage, monkeypatch, tmp_path):
    """Two steps accumulating into .grad, against eager's two steps (fp32 rule): whatever the
    pass set up before failing (a partition, runtime wrappers, pool slots) is gone."""
    case = CASES[name]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", _injected(case, stage))
    model = fresh_lm(1)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="dsgraph", options={**case.options, "fallback": "inductor"})
    with fp32_exact(), fallback_warnings() as messages, (triton_interpreter() if case.interpreter else _nothing()):
        losses = two_steps(compiled)
        ref_losses = two_steps(ref)
    assert len(messages) == 1, messages
    assert f"dsgraph pass '{name}' failed" in messages[0] and _injected(case, stage) in messages[0]
    for got, want in zip(losses, ref_losses):
        assert rel_err(got, want) <= 1e-5
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-5, n
    reports = dsgraph.reports()
    kinds = sorted(r.kind for r in reports)
    assert {"joint", "forward", "backward"} <= set(kinds), kinds
    # forward and backward together: no graph of the compile kept a pass
    assert all(r.fallback and r.pipeline == "" and not r.passes for r in reports), \
        [(r.kind, r.pipeline, r.fallback) for r in reports]
    assert dsgraph.grad_pool(model) is None  # no gradient-pool views handed out
    assert all(p.grad._base is None for p in model.parameters())  # plain gradients, as eager's


@pytest.mark.parametrize("name", sorted(CASES))
def test_fallback_error_raises_naming_the_pass(name, monkeypatch, tmp_path):
    case = CASES[name]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", name)
    compiled = torch.compile(fresh_lm(2), backend="dsgraph", options={**case.options, "fallback": "error"})
    with (triton_interpreter() if case.interpreter else _nothing()), \
            pytest.raises(BackendCompilerFailed, match=f"dsgraph pass '{name}' failed") as info:
        compiled(*lm_batch(2)).backward()
    failure = find_cause(info.value, PassFailure)
    assert failure is not None and failure.pass_name == name
    assert dsgraph.reports() == []  # nothing was published as compiled


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
