"""Whole-step timelines of compiled graphs: the forward and backward as each executor runs them.

Three predictions of the same step, from the graphs dsgraph handed to the backend compiler:

- ``fx``: the graphs as FX code executes them (``inductor=False``), from ``TensorLifetimes``;
- ``fused``: Inductor's plan predicted from FX before Inductor compiles (``fused_plan``; what
  the checkpoint planner sees);
- ``inductor``: Inductor's own buffer plan of its final schedule, when it compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule

from .fused_plan import fused_step
from .lifetimes import TensorLifetimes
from .plan import GraphPlan, fx_plan
from .timeline import Interval, MemoryTimeline, stitch


@dataclass
class StageGraphs:
    before: GraphModule | None  # the graph dsgraph received
    after: GraphModule  # the graph after dsgraph's passes
    inductor: GraphPlan | None = None  # Inductor's schedule of ``after``


def inputs_external(fw_gm: GraphModule) -> list[Interval]:
    """What a forward graph receives (parameters, buffers, inputs; each storage once), as
    memory that exists for the whole step."""
    lifetimes = TensorLifetimes(fw_gm)
    return [Interval(f"input:{s.name}", s.nbytes, 0, 0, s.nbytes_expr) for s in lifetimes.storages if s.is_input]


def graph_inputs_external(stages: dict[str, StageGraphs]) -> list[Interval]:
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


def saved_names(bw: GraphModule) -> list[str]:
    """Values the backward receives from the forward (all its inputs but the tangents)."""
    return [n.name for n in bw.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]


def saved_bytes(plan: GraphPlan, saved_names: list[str]) -> int:
    """Bytes of the forward's blocks that the backward receives."""
    saved = set(saved_names)
    return sum(b.nbytes for b in plan.blocks if saved & set(b.outputs))


def stage_timelines(stages: dict[str, StageGraphs], saved_names: list[str], external: list[Interval],
                    which: str = "after") -> dict[str, MemoryTimeline]:
    """{"fx", "fused", and "inductor" when Inductor compiled}: the step's timelines from the
    graphs of one compile; ``which="before"``: of the graphs before dsgraph's passes (no
    "inductor": Inductor compiled only the graphs after them)."""
    fw = stages.get("forward") or stages.get("inference")
    bw = stages.get("backward")
    if fw is None:
        raise ValueError("no forward graph was captured")
    fw_gm = fw.after if which == "after" else fw.before
    bw_gm = (bw.after if which == "after" else bw.before) if bw is not None else None
    bw_fx = fx_plan(bw_gm) if bw_gm is not None else None
    out = {"fx": stitch(fx_plan(fw_gm), bw_fx, external, saved_names)}
    out["fused"] = fused_step(fw_gm, bw_gm, external, saved_names)
    if which == "after" and fw.inductor is not None and (bw is None or bw.inductor is not None):
        out["inductor"] = inductor_timeline(fw.inductor, bw.inductor if bw is not None else None, bw_fx,
                                            external, saved_names)
    return out
