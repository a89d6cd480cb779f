"""What Inductor will allocate: a GraphPlan read from Inductor's own final schedule.

Inductor fuses most intermediates into kernels, so the FX graph overstates its memory.
While a ``GraphCapture`` is active, every graph Inductor schedules is recorded (through
``torch._inductor.config._post_fusion_custom_pass``, which sees ``V.graph``). After the
compile, ``inductor_plan`` walks the scheduler's final node order (after Inductor's own
``reorder_for_peak_memory``) with the same rules the generated wrapper follows:

- a scheduled buffer allocates its storage when its kernel runs, unless fusion removed
  it (``removed_buffers``), it is a view, a mutation of another buffer, or a multi-output
  container; its ``MultiOutput`` children allocate, at the container's step: they are the
  tensors its op returns, so they exist while that op runs (with its workspace), not from
  the later steps that take them out of the tuple;
- it is freed after the node whose ``last_usage`` names it; graph outputs outlive the graph;
- buffers the wrapper reuses (``ReuseLine``: in-place kernels and its pool of freed
  buffers) are one block from the first allocation to the last use of the last reuser,
  because the wrapper keeps a freed buffer alive until it hands it out again.

Reading the plan needs the scheduler, so a compile served from Inductor's FX graph cache
has none: a capture turns that cache off while it is active.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import sympy

from .. import compat
from .plan import Block, GraphPlan
from .workspace import workspace_bytes

_ALLOCATING_LAYOUTS = ("FixedLayout", "FlexibleLayout", "CommBufferLayout")


class GraphCapture:
    """Records the top-level GraphLowering of each Inductor compile inside the context."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []

    @contextlib.contextmanager
    def active(self) -> Iterator["GraphCapture"]:
        def record(graph):
            if type(graph).__name__ == "GraphLowering" and all(g is not graph for g in self.graphs):
                self.graphs.append(graph)

        with compat.post_fusion_hook(record):
            yield self


def inductor_plan(graph: Any) -> GraphPlan:
    scheduler = graph.scheduler
    removed = set(graph.removed_buffers)
    renamed = set(getattr(scheduler, "mutation_real_name", {}))
    outputs = set(graph.get_output_names())
    graph_inputs = set(graph.graph_inputs)
    plan = GraphPlan("inductor", [])
    by_name: dict[str, Block] = {}
    counted: set = set()  # FX nodes whose workspace is counted (an op and its outputs share origins)
    container_step: dict[str, int] = {}  # multi-output kernels: the step their op runs at
    with compat.graph_handler(graph):
        for step, snode in enumerate(scheduler.nodes):
            plan.steps.append(snode.get_name())
            for origin in _origins(snode):
                if origin not in counted and (w := workspace_bytes(origin)):
                    counted.add(origin)
                    plan.blocks.append(Block(f"{origin.name}:workspace", w, step, step))
            for buf in snode.get_outputs():
                name = buf.get_name()
                if name in removed or name in renamed:
                    continue
                layout = buf.node.get_output_spec() if hasattr(buf.node, "get_output_spec") else buf.node.layout
                if type(layout).__name__ == "MultiOutputLayout":
                    container_step[name] = step
                if type(layout).__name__ not in _ALLOCATING_LAYOUTS:
                    continue
                expr = sympy.expand(layout.storage_size() * buf.node.get_dtype().itemsize)
                start = container_step.get(_container(buf.node), step)
                block = Block(name, compat.inductor_size_hint(expr), start, step, (lambda e=expr: e))
                by_name[name] = block
                plan.blocks.append(block)
            for name in snode.last_usage:
                if name in by_name and name not in outputs:
                    by_name[name].end = max(by_name[name].end or 0, step)
                elif name in graph_inputs:
                    plan.input_last_use[name] = max(plan.input_last_use.get(name, -1), step)
        for name in outputs:
            if name in by_name:
                by_name[name].end = None
        for name in graph_inputs:
            plan.input_last_use.setdefault(name, -1)
        _merge_reuses(graph, plan, by_name)
        _name_outputs(graph, by_name)
    return plan


def _container(node: Any) -> str | None:
    """The multi-output kernel a ``MultiOutput`` takes its tensor from (None for others)."""
    if type(node).__name__ != "MultiOutput" or not getattr(node, "inputs", None):
        return None
    parent = node.inputs[0]
    return parent.get_name() if hasattr(parent, "get_name") else None


def _origins(snode: Any) -> list:
    """The FX nodes a scheduled node was lowered from (an extern kernel: its op's node)."""
    node = getattr(snode, "node", None)
    origins = getattr(node, "origins", None) if node is not None else None
    return list(origins) if origins else []


def _merge_reuses(graph: Any, plan: GraphPlan, by_name: dict[str, Block]) -> None:
    """A reused buffer and its reuser are one block of memory.

    The reused buffer can be a graph input: AOTAutograd donates saved activations that only
    the backward reads, and Inductor writes backward results into them. The reuser then
    allocates nothing and the input's memory lives as long as the reuser (past the graph,
    ``len(plan.steps)``, when the reuser is a graph output).
    """
    lines = getattr(graph.wrapper_code, "lines", [])
    root: dict[str, str] = {}
    for line in lines:
        if type(line).__name__ != "ReuseLine":
            continue
        old, new = line.node.get_name(), line.reused_as.get_name()
        old = root.get(old, old)
        root[new] = old
        gone = by_name.get(new)
        if gone is None or gone not in plan.blocks:
            continue
        if old in by_name:
            keep = by_name[old]
            if keep is gone:
                continue
            keep.end = None if (keep.end is None or gone.end is None) else max(keep.end, gone.end)
            keep.outputs = keep.outputs + gone.outputs
            by_name[new] = keep
        elif old in plan.input_last_use:
            end = len(plan.steps) if gone.end is None else gone.end
            plan.input_last_use[old] = max(plan.input_last_use[old], end)
        else:
            continue
        plan.blocks.remove(gone)


def _name_outputs(graph: Any, by_name: dict[str, Block]) -> None:
    """Tie each block to the FX output names it backs (the FX output node's arguments)."""
    fx_out = graph.graph_outputs
    names = graph.orig_gm.graph.output_node().args[0] if hasattr(graph, "orig_gm") else None
    if names is None:
        return
    for ir_node, fx_node in zip(fx_out, names):
        if fx_node is None or not hasattr(fx_node, "name"):
            continue
        try:
            buf_name = ir_node.get_name()
        except Exception:
            continue
        block = by_name.get(buf_name)
        if block is not None:
            block.outputs = block.outputs + (fx_node.name,)

