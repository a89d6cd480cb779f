"""The typed hooks through which a pass changes what the compile driver does.

The driver never names a pass: a pass that needs more than a graph rewrite registers one
of these on its ``PassContext``, and the driver runs whatever was registered.

- ``Partitioner`` (joint stage, ``ctx.set_partitioner``): decides the forward/backward
  partition in place of Inductor's min-cut (the checkpoint planner).
- ``PostCompileCheck`` (``ctx.add_post_compile_check``): runs once the forward and the
  backward are compiled, on a ``CompiledStep`` (the graphs and the buffer plans of the
  executor that will run them). It may raise ``Recompile`` to have the whole graph
  compiled again, handing the pass a value it reads back as ``ctx.carry`` (the budget check
  against Inductor's own plan).
- ``RuntimeWrapper`` (``ctx.register_runtime_wrapper``): wraps the compiled callable at
  run time (the gradient pool).
- ``GraphVariant`` (``ctx.add_variant``): a second graph for the same stage, compiled
  alongside the main one and chosen per call at run time (a backward without all-reduces
  for ``no_sync``). The passes after the one that adds it run on it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch.fx import GraphModule

from ..analysis.plan import GraphPlan

# (joint graph, joint inputs, **Inductor's partition keyword arguments) -> (forward, backward)
Partitioner = Callable[..., tuple[GraphModule, GraphModule]]

# A runtime wrapper takes the compiled callable (boxed: called with one list of inputs)
# and returns the callable to use instead.
RuntimeWrapper = Callable[[Callable[[list], Any]], Callable[[list], Any]]


@dataclass
class CompiledStep:
    """The forward and backward of one compile, as they will execute."""

    executor: str  # "inductor" or "fx"
    forward: GraphModule  # the final FX graphs handed to the backend compiler
    backward: GraphModule
    forward_plan: GraphPlan  # buffer plans as executed: Inductor's own, or FX's
    backward_plan: GraphPlan
    backward_fx_plan: GraphPlan  # FX's plan of the backward (sizes of its inputs)
    saved_names: list[str]  # what the backward receives from the forward
    attempt: int  # compiles of this graph so far, this one included
    # figures a check reports; the driver adds them to the joint graph's report
    figures: dict[str, Any] = field(default_factory=dict)


PostCompileCheck = Callable[[CompiledStep], None]


class Recompile(Exception):
    """Raised by a post-compile check: compile this graph again from Dynamo's graph.

    ``carry`` reaches the pass that registered the check as ``ctx.carry`` in the next
    compile. The driver compiles at most ``max_compiles`` times in all; the check sees
    ``step.attempt`` and must not ask again at the last one (it warns or accepts instead).
    """

    def __init__(self, pass_name: str, carry: Any, reason: str, max_compiles: int):
        super().__init__(f"dsgraph pass '{pass_name}' asks for another compile: {reason}")
        self.pass_name = pass_name
        self.carry = carry
        self.reason = reason
        self.max_compiles = max_compiles


@dataclass
class GraphVariant:
    name: str  # "no_sync"
    gm: GraphModule
    use_when: Callable[[], bool]  # asked at every call: True runs this variant
    after_pass: int  # passes of the stage after this index also rewrite the variant
