"""GraphPlan: one graph's memory events in its execution order, whoever executes it.

A plan lists the buffers the graph allocates (``Block``: bytes, step it is allocated,
step of its last use, or ``None`` when it is a graph output and outlives the graph) and,
for every graph input, the step of its last use. ``fx_plan`` builds it from the FX graph
(``TensorLifetimes``: what FX execution does); ``dsgraph.analysis.inductor_plan`` builds
it from Inductor's scheduled nodes. ``MemoryTimeline`` stitches a forward and a backward
plan into the whole training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import sympy
from torch.fx import GraphModule

from .lifetimes import TensorLifetimes
from .workspace import workspace_bytes


@dataclass(eq=False)
class Block:
    name: str
    nbytes: int
    start: int  # step that allocates it
    end: int | None  # step of its last use; None: a graph output, alive after the graph
    expr: Callable[[], sympy.Expr] | None = None  # its bytes over the size symbols, on demand
    outputs: tuple[str, ...] = ()  # FX names of the graph outputs it backs

    def bytes_expr(self) -> sympy.Expr:
        return self.expr() if self.expr is not None else sympy.Integer(self.nbytes)


@dataclass
class GraphPlan:
    executor: str  # "fx" or "inductor"
    steps: list[str]  # what runs at each step (FX node names, or Inductor kernel names)
    blocks: list[Block] = field(default_factory=list)
    input_last_use: dict[str, int] = field(default_factory=dict)  # placeholder -> step (-1: unused)
    input_bytes: dict[str, int] = field(default_factory=dict)
    input_expr: dict[str, Callable[[], sympy.Expr]] = field(default_factory=dict)


def fx_plan(gm: GraphModule) -> GraphPlan:
    """What FX execution of ``gm`` allocates and frees (views and in-place ops are free)."""
    lifetimes = TensorLifetimes(gm, held=lambda node: False)
    nodes = [n for n in lifetimes.nodes if n.op not in ("placeholder", "output")]
    step_of = {n: i for i, n in enumerate(nodes)}
    n_steps = len(nodes)
    plan = GraphPlan("fx", [n.name for n in nodes])
    output_args = set(gm.graph.output_node().all_input_nodes)
    for s in lifetimes.storages:
        if s.is_input:
            members = [m for m in s.members if m.op == "placeholder"]
            last = _last_step(s.last, lifetimes, step_of, n_steps)
            for m in members:
                plan.input_last_use[m.name] = last
                plan.input_bytes[m.name] = s.nbytes
                plan.input_expr[m.name] = s.nbytes_expr
            continue
        end = None if s.is_output else _last_step(s.last, lifetimes, step_of, n_steps)
        outputs = tuple(m.name for m in s.members if m in output_args)
        plan.blocks.append(Block(s.name, s.nbytes, step_of[s.root], end, s.nbytes_expr, outputs))
    plan.blocks += workspace_blocks(nodes, step_of)
    return plan


def workspace_blocks(nodes, step_of: dict) -> list[Block]:
    """The temporaries ops allocate for themselves (``dsgraph.analysis.workspace``), each
    live at its op's step only."""
    return [Block(f"{n.name}:workspace", w, step_of[n], step_of[n]) for n in nodes if (w := workspace_bytes(n))]


def _last_step(last: int, lifetimes: TensorLifetimes, step_of: dict, n_steps: int) -> int:
    """Map a TensorLifetimes index (placeholders and output included) to a step index."""
    if last < 0:
        return -1
    if last >= len(lifetimes.nodes) or lifetimes.nodes[last].op == "output":
        return n_steps - 1
    node = lifetimes.nodes[last]
    if node.op == "placeholder":
        return -1
    return step_of[node]
