"""``dsgraph.memory_profile``: the predicted memory of one training step.

Two predictions of the same step, both reported:

- ``fx``: the graphs as FX code would execute them (``inductor=False``), from dsgraph's
  own ``TensorLifetimes``;
- ``inductor``: the graphs as Inductor's final schedule executes them (fusion removes
  most intermediates), read from Inductor's scheduler.

``peak_bytes`` is the prediction for how the graphs will run: Inductor's with
``inductor=True`` (the default), FX's otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from . import profiling
from .analysis.fused_plan import fused_step
from .analysis.plan import GraphPlan, fx_plan
from .analysis.timeline import Interval, MemoryTimeline, TimelineEntry, stitch
from .pool import pool_tensors
from .profiling import CapturedCompile


@dataclass
class MemoryProfile:
    peak_bytes: int
    peak_expr: sympy.Expr
    peak_node: str  # "forward:addmm_3", "backward:mm_7", "start" or "end"
    saved_activation_bytes: int
    timeline: list[TimelineEntry]
    analysis_seconds: float
    executor: str  # the prediction peak_bytes comes from: "inductor" or "fx"
    fx_peak_bytes: int
    inductor_peak_bytes: int | None
    external_bytes: int  # parameters, buffers, inputs, kept gradients at the start
    timelines: dict[str, MemoryTimeline] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes, "peak_expr": str(self.peak_expr), "peak_node": self.peak_node,
            "saved_activation_bytes": self.saved_activation_bytes, "executor": self.executor,
            "fx_peak_bytes": self.fx_peak_bytes, "inductor_peak_bytes": self.inductor_peak_bytes,
            "external_bytes": self.external_bytes, "analysis_seconds": self.analysis_seconds,
        }


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def external_intervals(
    tensors: list[tuple[str, torch.Tensor]], dynamo_inputs: list[tuple[Any, Any]] = ()
) -> list[Interval]:
    """One interval per distinct storage among the given tensors (tied parameters and views
    count once); a tensor Dynamo saw as a graph input gets its symbolic size."""
    exprs = {id(example): fn for example, fn in dynamo_inputs if example is not None}
    seen, out = set(), []
    for label, t in tensors:
        key = _storage_key(t)
        if key in seen:
            continue
        seen.add(key)
        nbytes = t.untyped_storage().nbytes()
        out.append(Interval(label, nbytes, 0, 0, exprs.get(id(t))))
    return out


def step_start_tensors(model: torch.nn.Module, inputs, kept_grads: bool) -> list[tuple[str, torch.Tensor]]:
    """What exists on the device when a training step starts: parameters, buffers, tensor
    inputs, the gradients kept from earlier steps (``kept_grads``) and the gradient pool."""
    tensors = [(f"param:{n}", p) for n, p in model.named_parameters()]
    tensors += [(f"buffer:{n}", b) for n, b in model.named_buffers()]
    tensors += [(f"input:{i}", x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if kept_grads:
        tensors += [(f"grad:{n}", p.grad) for n, p in model.named_parameters() if p.grad is not None]
    tensors += pool_tensors(model.parameters())  # the pool persists across steps
    return tensors


def saved_bytes(plan: GraphPlan, saved_names: list[str]) -> int:
    saved = set(saved_names)
    return sum(b.nbytes for b in plan.blocks if saved & set(b.outputs))


def step_timelines(captured: CapturedCompile, external: list[Interval], which: str = "after") -> dict[str, MemoryTimeline]:
    """The whole-step timelines of one captured compile: "fx" (and "inductor" when it ran);
    ``which="before"``: the FX timeline of the graphs before dsgraph's passes."""
    return stage_timelines(captured.stages, captured.saved_names, external, which)


def inputs_external(fw_gm: torch.fx.GraphModule) -> list[Interval]:
    """What a forward graph receives (parameters, buffers, inputs; each storage once), as
    memory that exists for the whole step."""
    from .analysis.lifetimes import TensorLifetimes

    lifetimes = TensorLifetimes(fw_gm)
    return [Interval(f"input:{s.name}", s.nbytes, 0, 0, s.nbytes_expr) for s in lifetimes.storages if s.is_input]


def graph_inputs_external(stages: dict) -> list[Interval]:
    """Without the model at hand (dumps): what the forward receives stands for what exists
    at the start of the step."""
    fw = stages.get("forward") or stages.get("inference")
    return inputs_external(fw.after)


def inductor_timeline(fw: GraphPlan, bw: GraphPlan | None, bw_fx: GraphPlan | None, external: list[Interval],
                      saved_names: list[str]) -> MemoryTimeline:
    """The step by Inductor's own buffer plans of its forward and backward. Inductor's plan
    does not size the backward's inputs; they come from the backward's FX plan ``bw_fx``."""
    if bw is not None and bw_fx is not None:
        bw.input_bytes = dict(bw_fx.input_bytes)
        bw.input_expr = dict(bw_fx.input_expr)
    return stitch(fw, bw, external, saved_names)


def stage_timelines(stages: dict, saved_names: list[str], external: list[Interval], which: str = "after") -> dict[str, MemoryTimeline]:
    fw = stages.get("forward") or stages.get("inference")
    bw = stages.get("backward")
    if fw is None:
        raise ValueError("no forward graph was captured")
    fw_gm = fw.after if which == "after" else fw.before
    bw_gm = (bw.after if which == "after" else bw.before) if bw is not None else None
    bw_fx = fx_plan(bw_gm) if bw_gm is not None else None
    out = {"fx": stitch(fx_plan(fw_gm), bw_fx, external, saved_names)}
    # what the checkpoint planner predicts before Inductor compiles (fusion rule of thumb)
    out["fused"] = fused_step(fw_gm, bw_gm, external, saved_names)
    if which == "after" and fw.inductor is not None and (bw is None or bw.inductor is not None):
        out["inductor"] = inductor_timeline(fw.inductor, bw.inductor if bw is not None else None, bw_fx,
                                            external, saved_names)
    return out


def _snapshot(model: torch.nn.Module):
    grads = {p: (p.grad, p.grad.detach().clone() if p.grad is not None else None) for p in model.parameters()}
    buffers = {b: b.detach().clone() for b in model.buffers()}
    return grads, buffers


def _restore(model: torch.nn.Module, grads, buffers) -> None:
    with torch.no_grad():
        for p, (obj, values) in grads.items():
            if obj is not None:
                obj.copy_(values)
            p.grad = obj
        for b, values in buffers.items():
            b.copy_(values)


def _graph_break_message(model, inputs) -> str:
    try:
        explanation = torch._dynamo.explain(model)(*inputs)
        reasons = "; ".join(str(r.reason) for r in explanation.break_reasons[:3])
        return f"{explanation.graph_count} graphs, {explanation.graph_break_count} graph breaks: {reasons}"
    except Exception as e:  # explain itself failed: still say what we know
        return f"explain failed: {e}"


def memory_profile(model: torch.nn.Module, *inputs: Any, **options: Any) -> MemoryProfile:
    """Compile ``model`` with dsgraph, run one forward+backward of ``model(*inputs)`` (a
    non-scalar output is reduced with ``.sum()``) and predict the step's peak memory.

    The model must compile to one graph. Parameters, buffers and ``.grad`` are left as they
    were. ``torch._dynamo.mark_dynamic`` on the inputs is honoured (``peak_expr``).
    """
    from .options import validate_options
    from .testing import loss_of

    validate_options(options)
    grads, buffers = _snapshot(model)
    start_state = step_start_tensors(model, inputs, kept_grads=True)  # before the step adds any
    compiled = torch.compile(model, backend=_fresh_backend(), options=dict(options) or None)
    try:
        with profiling.capture() as cap:
            loss = loss_of(compiled(*inputs))
            loss.backward()
    finally:
        _restore(model, grads, buffers)
    compiles = [c for c in cap.compiles if c.fallback is None]
    if len(compiles) != 1 or "backward" not in compiles[0].stages:
        raise ValueError(
            f"dsgraph.memory_profile needs the model to compile to one graph with a backward; "
            f"got {len(compiles)} compiled graphs ({_graph_break_message(model, inputs)})"
        )
    captured = compiles[0]
    start = time.perf_counter()
    # the pool may first be allocated by this step's backward: it exists at later steps' starts
    external = external_intervals(start_state + pool_tensors(model.parameters()), captured.dynamo_inputs)
    timelines = step_timelines(captured, external)
    executor = "inductor" if "inductor" in timelines else "fx"
    chosen = timelines[executor]
    fw = captured.stages["forward"]
    plan = fw.inductor if executor == "inductor" else fx_plan(fw.after)
    peak = chosen.peak_entry
    profile = MemoryProfile(
        peak_bytes=chosen.peak_bytes,
        peak_expr=chosen.peak_expr(),
        peak_node=peak.graph if peak.graph in ("start", "end") else f"{peak.graph}:{peak.node}",
        saved_activation_bytes=saved_bytes(plan, captured.saved_names),
        timeline=chosen.entries,
        analysis_seconds=0.0,
        executor=executor,
        fx_peak_bytes=timelines["fx"].peak_bytes,
        inductor_peak_bytes=timelines["inductor"].peak_bytes if "inductor" in timelines else None,
        external_bytes=sum(iv.nbytes for iv in external),
        timelines=timelines,
    )
    profile.analysis_seconds = time.perf_counter() - start
    return profile


def _fresh_backend():
    """A backend object of its own, so Dynamo compiles afresh instead of reusing a compile
    of the same model made by an earlier torch.compile."""
    from .backend import dsgraph_backend

    def dsgraph_profile_backend(gm, example_inputs, **kwargs):
        return dsgraph_backend(gm, example_inputs, **kwargs)

    return dsgraph_profile_backend
