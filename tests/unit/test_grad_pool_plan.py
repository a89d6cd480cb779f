"""The grad_pool plan on a real backward graph: which output is which parameter, in what
order, and which gradients a matmul writes itself."""

import importlib

import pytest
import torch

from dsgraph.report.capture import capture as capture_compiles
from dsgraph.compile.session import graph_params

from models import MLP

grad_pool = importlib.import_module("dsgraph.passes.grad_pool")


def captured_backward(model=None, inputs=None):
    torch.manual_seed(0)
    model = model or MLP()
    inputs = inputs or (torch.randn(5, 13),)
    seen = {}

    def backend(gm, example_inputs, **kwargs):
        seen["params"] = graph_params(gm)
        from dsgraph.compile.backend import dsgraph_backend

        return dsgraph_backend(gm, example_inputs, **kwargs)

    with capture_compiles() as cap:
        torch.compile(model, backend=backend, options={"inductor": False, "pipeline": ""})(*inputs).sum().backward()
    return model, cap.compiles[0].stages["backward"].before, seen["params"]


def test_plan_maps_outputs_to_parameters_in_production_order():
    model, bw, params = captured_backward()
    plan = grad_pool.plan_pool(bw, params)
    by_param = {id(p): n for n, p in model.named_parameters()}
    names = [by_param[id(e.slot.param())] for e in plan.entries]
    # the backward computes the last layer's gradients first
    assert names.index("fc2.weight") < names.index("fc1.weight")
    assert set(names) == {n for n, _ in model.named_parameters()}
    how = {by_param[id(e.slot.param())]: e.how for e in plan.entries}
    assert how == {"fc1.weight": "mm_into", "fc2.weight": "mm_into", "fc1.bias": "copy",
                   "fc2.bias": "copy", "norm.weight": "copy", "norm.bias": "copy"}
    assert "mm_into" in str(plan)


def test_plan_refuses_outputs_it_cannot_match():
    _, bw, params = captured_backward()
    with pytest.raises(ValueError, match="cannot tell which output"):
        grad_pool.plan_pool(bw, params[:-1])
    wrong = [torch.nn.Parameter(torch.randn(2, 2)) if p is not None else None for p in params]
    with pytest.raises(ValueError, match="does not match parameter"):
        grad_pool.plan_pool(bw, wrong)


def test_embedding_gradients_write_their_slot_through_inductor_only():
    """The tied token table's gradient (embedding scatter + head matmul) becomes one
    ``addmm_into_``; the position table's scatter adds straight into its slot. Both change the
    order of float additions when the slot already holds gradients, so with ``inductor=False``
    (where the pool is bitwise) they stay plain adds into the slot."""
    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    cfg = GPTConfig(vocab=67, seq=16, layers=1, heads=2, dim=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    _, bw, params = captured_backward(model, gpt_inputs(cfg, 2))
    by_param = {id(p): n for n, p in model.named_parameters()}
    for inductor, tok, pos in ((True, "addmm_into", "scatter_into"), (False, "copy", "copy")):
        plan = grad_pool.plan_pool(bw, params, inductor=inductor)
        how = {by_param[id(e.slot.param())]: e.how for e in plan.entries}
        assert (how["tok.weight"], how["pos.weight"]) == (tok, pos), how
        assert [e.overwrites for e in plan.entries] == [e.how in ("mm_into", "addmm_into") for e in plan.entries]
