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

from . import compat
from .analysis.library_memory import blas_workspace_bytes
from .analysis.plan import fx_plan
from .analysis.step import saved_bytes, stage_timelines
from .analysis.timeline import Interval, MemoryTimeline, TimelineEntry
from .compile.backend import dsgraph_backend
from .pass_api import validate_options
from .report import capture
from .report.capture import CapturedCompile
from .runtime.pool import pool_tensors
from .testing import loss_of


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


def external_intervals(
    tensors: list[tuple[str, torch.Tensor]], dynamo_inputs: list[tuple[Any, Any]] = ()
) -> list[Interval]:
    """One interval per distinct storage among the given tensors (tied parameters and views
    count once); a tensor Dynamo saw as a graph input gets its symbolic size."""
    # ``dynamo_inputs`` holds weak references (capture.py); the tensors here are alive
    exprs = {id(example): fn for ref, fn in dynamo_inputs if ref is not None and (example := ref()) is not None}
    seen, out = set(), []
    for label, t in tensors:
        key = compat.storage_ref(t)
        if key in seen:
            continue
        seen.add(key)
        nbytes = t.untyped_storage().nbytes()
        out.append(Interval(label, nbytes, 0, 0, exprs.get(id(t))))
    return out


def step_external(captured: CapturedCompile, tensors: list[tuple[str, torch.Tensor]]) -> list[Interval]:
    """Everything outside the compiled graphs' plans that is live through the step: the
    given start-of-step tensors, and the CUDA BLAS workspaces when the step runs GEMMs on
    CUDA (they are in every peak the allocator reports and in no graph's plan)."""
    external = external_intervals(tensors, captured.dynamo_inputs)
    fw_gm = (captured.stages.get("forward") or captured.stages.get("inference")).after
    library = blas_workspace_bytes(fw_gm, threads=2 if "backward" in captured.stages else 1)
    if library:
        external.append(Interval("CUDA BLAS workspaces", library, 0, 0))
    return external


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


def step_timelines(captured: CapturedCompile, external: list[Interval], which: str = "after") -> dict[str, MemoryTimeline]:
    """The whole-step timelines of one captured compile: "fx" (and "inductor" when it ran);
    ``which="before"``: the FX timeline of the graphs before dsgraph's passes."""
    return stage_timelines(captured.stages, captured.saved_names, external, which)


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
        explanation = compat.explain(model, *inputs)
    except Exception as e:  # explain itself failed: still say what we know
        return f"torch._dynamo.explain failed: {e}"
    lines = [f"torch._dynamo.explain: {explanation.graph_count} graphs, {explanation.graph_break_count} graph breaks"]
    for i, r in enumerate(explanation.break_reasons[:5], 1):
        frame = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        where = f" at {frame.filename}:{frame.lineno}" if frame is not None else ""
        reason = " ".join(str(r.reason).split()) or "(torch gave no reason)"
        lines.append(f"  break {i}{where}: {reason[:300]}")
    if explanation.graph_count > explanation.graph_break_count + 1:
        lines.append("  more graphs than breaks: parts of the model compile on their own "
                     "(torch.utils.checkpoint regions, torch.compiler.disable, nested compiled functions)")
    return "\n".join(lines)


def memory_profile(model: torch.nn.Module, *inputs: Any, **options: Any) -> MemoryProfile:
    """Compile ``model`` with dsgraph, run one forward+backward of ``model(*inputs)`` (a
    non-scalar output is reduced with ``.sum()``) and predict the step's peak memory.

    The model must compile to one graph. Parameters, buffers and ``.grad`` are left as they
    were. ``torch._dynamo.mark_dynamic`` on the inputs is honoured (``peak_expr``).
    """
    validate_options(options)
    grads, buffers = _snapshot(model)
    start_state = step_start_tensors(model, inputs, kept_grads=True)  # before the step adds any
    compiled = torch.compile(model, backend=_fresh_backend(), options=dict(options) or None)
    try:
        with capture.capture() as cap:
            loss = loss_of(compiled(*inputs))
            loss.backward()
    finally:
        _restore(model, grads, buffers)
    compiles = [c for c in cap.compiles if c.fallback is None]
    if len(compiles) != 1 or "backward" not in compiles[0].stages:
        raise ValueError(
            f"dsgraph.memory_profile needs the model to compile to one graph with a backward (no graph break); "
            f"got {len(compiles)} compiled graphs. {_graph_break_message(model, inputs)}"
        )
    captured = compiles[0]
    start = time.perf_counter()
    # the pool may first be allocated by this step's backward: it exists at later steps' starts
    external = step_external(captured, start_state + pool_tensors(model.parameters()))
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
    def dsgraph_profile_backend(gm, example_inputs, **kwargs):
        return dsgraph_backend(gm, example_inputs, **kwargs)

    return dsgraph_profile_backend
