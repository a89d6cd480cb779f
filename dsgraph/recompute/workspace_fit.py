"""An op's fastest form that keeps the plan's peak: the chunked loss's chunk count, after planning.

``chunk_loss`` sizes its chunks before the joint graph exists, from the budget alone (one
chunk's buffers within ``BUDGET_SHARE`` of it). Where the chosen plan peaks elsewhere (in a
recomputing backward, say) the op's step has room: fewer, larger chunks use it, and they are
faster (longer GEMMs, fewer launches, one pass over the fp32 weight-gradient accumulator per
chunk). An op's workspace is live at its own step only (``StepModel``), so the plan's peak
with another form is exact from the plan's live curve: the live bytes at each step where the
op runs, less its workspace there, plus the other form's. ``fit_workspaces`` takes, for
each op with registered choices (``analysis.workspace.register_workspace_choices``), the
first (fastest) whose bytes keep every such step at or below ``target``, the plan's own peak:
the predicted peak does not move, so the budget, the monotone choice of plans and the
post-compile check are as they were. No evaluation is run.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule, Node

from ..analysis.step_model import StepModel, StepPeak
from ..analysis.workspace import WorkspaceChoice, workspace_choices


@dataclass(frozen=True)
class Refit:
    node: str  # the joint graph's node
    before: int  # workspace bytes at its steps, before and after (the largest step's)
    after: int
    choice: WorkspaceChoice

    def describe(self) -> str:
        return f"{self.node}: {self.choice.label} (workspace {self.before} -> {self.after} B)"


def fit_workspaces(model: StepModel, peak: StepPeak, target: int) -> list[Refit]:
    """The ops of ``peak``'s plan to run in another form, each the fastest whose workspace keeps
    every step of the plan at or below ``target``."""
    live = list(peak.live)
    light = frozenset(i for i in peak.recomputed if i in model.variant_alloc)
    out = []
    for i in sorted(model.workspace):
        choices = workspace_choices(model.nodes[i])
        if not choices:
            continue
        steps = [(k, graph == "forward" and i in light) for k, (graph, j) in enumerate(peak.steps) if j == i]
        if not steps:
            continue
        current = {k: model.variant_workspace[i] if lit else model.workspace[i] for k, lit in steps}
        for choice in choices:
            new = {k: choice.light_nbytes if lit else choice.nbytes for k, lit in steps}
            if all(live[k] - current[k] + new[k] <= target for k in current):
                for k in current:
                    live[k] += new[k] - current[k]
                out.append(Refit(model.nodes[i].name, max(current.values()), max(new.values()), choice))
                break
    return out


def rewrite_node(node: Node, choice: WorkspaceChoice) -> None:
    """``node`` calls the form ``choice`` is, its recorded fake arguments too (Inductor's layout
    constraint for custom ops reads them)."""
    node.args = choice.rewrite(tuple(node.args))
    if "eager_input_vals" in node.meta:
        fake_args, fake_kwargs = node.meta["eager_input_vals"]
        node.meta["eager_input_vals"] = (choice.rewrite(tuple(fake_args)), fake_kwargs)


def apply_refits(refits: list[Refit], graphs: list[GraphModule]) -> list[Refit]:
    """Rewrite the calls named in ``refits`` in ``graphs`` (a joint graph, or the forward and
    backward a partition made from it: they keep the joint graph's names). Returns the refits
    applied (a call not found keeps its form, and with it the peak as planned)."""
    by_name = {r.node: r for r in refits}
    applied: dict[str, Refit] = {}
    for gm in graphs:
        touched = False
        for node in gm.graph.nodes:
            refit = by_name.get(node.name) if node.op == "call_function" else None
            if refit is not None:
                rewrite_node(node, refit.choice)
                applied[refit.node] = refit
                touched = True
        if touched:
            gm.recompile()
    return [r for r in refits if r.node in applied]
