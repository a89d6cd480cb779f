"""An op's fastest form that keeps the plan's peak: the chunked loss's chunk count, after planning.

``chunk_loss`` sizes its chunks before the joint graph exists, from the budget alone (one
chunk's buffers within ``BUDGET_SHARE`` of it). Where the chosen plan peaks elsewhere (in a
recomputing backward, say) the op's step has room: fewer, larger chunks use it, and they are
faster (longer GEMMs, fewer launches, one pass over the fp32 weight-gradient accumulator per
chunk). An op's workspace is live at its own step only (``StepModel``), so the plan's peak
with another form is exact from the plan's live curve: the live bytes at each step where the
op runs, less its workspace there, plus the other form's. ``fit_workspaces`` takes, for
each op with registered choices (``analysis.workspace.register_workspace_choices``), the
first (fastest) whose bytes keep every such step at or below ``target``. No evaluation is run.

The planner's target is the budget less ``REFIT_SLACK`` of it (and less a second compile's
margin), or the plan's own peak where that is higher: plans are discrete, and the one chosen
often peaks well under the budget (GPT-2-small at 2.94 GiB on an H100: 2.858 GB predicted
of 3.157 GB, at the loss op's step). The slack is for the step model's error against
Inductor's compiled plan, which the post-compile check holds to the budget (-0.99% to
+0.3% on the GPU zoo; the -0.99% is CUDA's split reductions, traced in BENCHMARKS.md
session 29 and not yet emulated): a refit that filled the budget to the byte would turn such an error
into a second compile. Monotone: the plan is chosen before, and the fastest form that fits
a smaller target is never faster than the one for a larger.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule, Node

from ..analysis.step_model import StepModel, StepPeak
from ..analysis.workspace import WorkspaceChoice, workspace_choices

REFIT_SLACK = 0.02  # of the budget, left for the step model's error (see above)


@dataclass(frozen=True)
class Refit:
    node: str  # the joint graph's node
    before: int  # workspace bytes at its steps, before and after (the largest step's)
    after: int
    choice: WorkspaceChoice

    def describe(self) -> str:
        return f"{self.node}: {self.choice.label} (workspace {self.before} -> {self.after} B)"


def refit_target(peak: int, budget: int, margin: int) -> int:
    """What the refitted plan may peak at: the budget less the slack and the margin, or the
    plan's own peak where that is higher (a refit never makes a plan's peak lower)."""
    return max(peak, budget - margin - int(budget * REFIT_SLACK))


def fit_workspaces(model: StepModel, peak: StepPeak, target: int) -> tuple[list[Refit], int]:
    """The ops of ``peak``'s plan to run in another form, each the fastest whose workspace keeps
    every step of the plan at or below ``target``; and the plan's peak with them."""
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
    return out, max(live)


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
    applied; every one must be (a call kept in its form would leave the peak as planned, but
    the plan's figures would say otherwise)."""
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
    missing = [r.node for r in refits if r.node not in applied]
    if missing:
        raise RuntimeError(f"workspace_fit: the calls {missing} are not in the partition's graphs")
    return refits
