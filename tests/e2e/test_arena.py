"""arena=True end to end. With inductor=False the arena must not change arithmetic:
gradients bitwise equal to the same options without it. One test goes through CPU Inductor
(arena=True there is Inductor's own memory planning)."""

import copy
import warnings

import pytest
import torch

import dsgraph
from dsgraph.report.capture import capture as capture_compiles
from dsgraph.errors import DsgraphFallbackWarning
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.testing import check_training_step

from models import MLP

FX = {"inductor": False}
ARENA = {"inductor": False, "arena": True}
TINY = GPTConfig(vocab=67, seq=9, layers=2, heads=3, dim=24)


def arena_reports():
    return {r.kind: r.memory for r in dsgraph.reports() if "arena_tensors" in r.memory}


def test_mlp_gradients_bitwise_equal_without_arena():
    torch.manual_seed(0)
    check_training_step(MLP(), torch.randn(6, 13), ARENA, reference=FX, bitwise=True)
    figures = arena_reports()
    assert set(figures) == {"forward", "backward"}
    for f in figures.values():
        assert f["arena_tensors"] > 0
        assert f["arena_lower_bound_bytes"] <= f["arena_bytes"] < f["arena_unpacked_bytes"]


@pytest.mark.parametrize("debug", [False, True])
def test_gpt_gradients_bitwise_equal_without_arena(debug):
    torch.manual_seed(1)
    check_training_step(GPT(TINY), gpt_inputs(TINY, 3, seed=1), {**ARENA, "debug": debug},
                        reference=FX, bitwise=True)
    backward = arena_reports()["backward"]
    assert backward["arena_tensors"] > 50 and backward["arena_bytes"] < backward["arena_unpacked_bytes"] / 4
    # the attention backward has no out= variant on CPU: it keeps its own allocations
    assert backward["arena_skipped_ops"].get(
        "no out variant: aten._scaled_dot_product_flash_attention_for_cpu_backward.default", 0) > 0


def test_debug_from_the_environment_poisons_dead_regions(monkeypatch):
    monkeypatch.setenv("DSGRAPH_DEBUG", "1")
    torch.manual_seed(2)
    with capture_compiles() as cap:
        check_training_step(GPT(TINY), gpt_inputs(TINY, 2, seed=2), ARENA, reference=FX, bitwise=True)
    arena_compiles = [c for c in cap.compiles if "arena" in c.stages["forward"].after.code]
    assert len(arena_compiles) == 1
    code = arena_compiles[0].stages["backward"].after.code
    assert "arena_poison = torch.ops.aten.fill_.Scalar(arena, 255)" in code
    assert code.count("_poison = torch.ops.aten.fill_.Scalar(") > 50  # one per planned tensor


def test_arena_with_grad_pool_over_steps_with_different_data():
    torch.manual_seed(3)
    model = MLP()
    runs, planned = [], []
    for options in ({**ARENA, "grad_pool": True}, {**FX, "grad_pool": True}):
        m = copy.deepcopy(model)
        compiled = torch.compile(m, backend="dsgraph", options=options)
        g = torch.Generator().manual_seed(3)
        history = []
        for _ in range(3):
            compiled(torch.randn(5, 13, generator=g)).sum().backward()  # grads accumulate
            history.append([p.grad.clone() for p in m.parameters()])
        runs.append(history)
        planned.append(arena_reports().get("backward", {}).get("arena_tensors", 0))
        torch._dynamo.reset()
    assert planned[0] > 0  # the pooled backward (in-place adds into its slots) has an arena
    for with_arena, without in zip(*runs):
        assert all(torch.equal(a, b) for a, b in zip(with_arena, without))


def test_dynamic_batch_runs_one_graph_at_every_size_bitwise():
    torch.manual_seed(4)
    model = MLP()
    twin = copy.deepcopy(model)
    first = torch.randn(6, 13)
    torch._dynamo.mark_dynamic(first, 0)
    compiled = torch.compile(model, backend="dsgraph", options=ARENA)
    reference = torch.compile(twin, backend="dsgraph", options=FX)
    g = torch.Generator().manual_seed(4)
    with capture_compiles() as cap:
        compiled(first).sum().backward()
    assert "torch.sym_max" in cap.compiles[0].stages["backward"].after.code  # offsets computed at run time
    for x in [first] + [torch.randn(n, 13, generator=g) for n in (11, 2, 37)]:
        model.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
        a, b = compiled(x), reference(x)
        a.sum().backward()
        b.sum().backward()
        assert torch.equal(a, b)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters()))
    # one compile for every size: the arena's size and offsets are computed at run time
    assert [r.kind for r in dsgraph.reports() if "arena_tensors" in r.memory] == ["forward", "backward"]


def test_memory_profile_counts_the_arena_as_one_block():
    torch.manual_seed(5)
    model = GPT(TINY)
    profile = dsgraph.memory_profile(model, *gpt_inputs(TINY, 2, seed=5), **ARENA)
    figures = arena_reports()
    for graph in ("forward", "backward"):
        # one block per arena buffer (arena, arena_1, ...), the largest the arena's footprint
        blocks = [iv.nbytes for iv in profile.timelines["fx"].intervals if iv.label.startswith(f"{graph}:arena")]
        assert len(blocks) == figures[graph]["arena_buffers"] > 0
        assert max(blocks) == figures[graph]["arena_bytes"]
    # planned intermediates allocate nothing of their own in the prediction
    without = dsgraph.memory_profile(model, *gpt_inputs(TINY, 2, seed=5), **FX)
    gone = {iv.label for iv in without.timelines["fx"].intervals} - {iv.label for iv in profile.timelines["fx"].intervals}
    assert len(gone) >= figures["forward"]["arena_tensors"] + figures["backward"]["arena_tensors"]
    # segments keep the buffers from being held while saved activations pile up
    assert profile.fx_peak_bytes <= without.fx_peak_bytes * (1 + 1 / 32)


def test_segmented_arena_stays_near_the_peak_without_it():
    cfg = GPTConfig(vocab=1024, seq=128, layers=3, heads=4, dim=64)  # logits and activations dominate
    torch.manual_seed(8)
    model, inputs = GPT(cfg), gpt_inputs(cfg, 4, seed=8)
    with_arena = dsgraph.memory_profile(model, *inputs, **ARENA)
    without = dsgraph.memory_profile(model, *inputs, **FX)
    assert arena_reports()["backward"]["arena_buffers"] >= 1
    assert with_arena.fx_peak_bytes <= without.fx_peak_bytes * 1.05


def test_arena_failure_falls_back_to_stock(monkeypatch):
    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "arena")
    torch.manual_seed(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DsgraphFallbackWarning)
        check_training_step(MLP(), torch.randn(5, 13), ARENA)
    assert any("dsgraph pass 'arena' failed" in str(w.message) for w in caught)
    reports = dsgraph.reports()
    assert reports and all(r.fallback for r in reports) and not arena_reports()


@pytest.mark.e2e
def test_through_inductor_arena_turns_on_memory_planning(monkeypatch, tmp_path):
    import torch._inductor.config as iconfig
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(7)
    model = MLP()
    check_training_step(model, torch.randn(6, 13), {"arena": True})  # fp32 rule against eager
    x = torch.randn(4, 13)
    compiled = torch.compile(model, backend="dsgraph", options={"arena": True})
    with torch.no_grad():
        out, code = run_and_get_code(compiled, x)
        expected = model(x)
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    # torch 2.13 plans pools for inference graphs (not for training graphs)
    assert any("alloc_from_pool" in c for c in code)
    assert iconfig.memory_planning is False  # patched only inside dsgraph's compile
