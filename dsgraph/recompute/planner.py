"""plan_checkpoint: which activations to save under a memory budget, and the partition.

1. ``JointGraph``: forward/backward split, boundaries, random nodes.
2. The stock partition (Inductor's min-cut) gives the ``keep`` option of every segment.
3. ``build_segments``: per segment, the keep / cheap / full options (saved bytes,
   recomputation time from ``CostModel``).
4. ``measure_terms``: the peak model's terms from three simulated uniform plans.
5. ``pareto_dp``: the frontier (model peak, recomputation time) over all plans. It does
   not depend on the budget.
6. Selection: the stock partition when its simulated peak is within the budget; otherwise
   the first frontier point, in order of increasing time, whose predicted peak
   ``max(model peak + gap, simulated peak of that exact partition)`` is within the budget.
   ``gap`` is how far the model errs low at a few frontier points fixed before the budget
   is looked at (``_model_gap``): it lets the search skip points that would fail.

Monotone by construction: a budget below the stock peak gets a predicted peak below it;
among those, for a smaller budget the chosen point comes no earlier on the
frontier, and its predicted peak is at most that budget; if the larger budget's choice
also fits the smaller budget both choose it. So a smaller budget never gives a larger
predicted peak. (The search simulates at most MAX_SIMULATIONS points; past that the
smallest plan is taken, the same for every budget.) A budget no point meets raises
``BudgetError`` with the smallest feasible budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from torch.fx import GraphModule, Node

from .. import compat
from ..analysis.cost_model import CostModel
from ..analysis.lifetimes import storage_key, storage_nbytes
from ..errors import BudgetError
from ..units import format_bytes
from .joint import JointGraph
from .model import Simulation, external_bytes, measure_terms, simulate
from .partition import closure, saved_names
from .segments import Segment, build_segments, build_spans, is_expensive, options_by_position
from .solver import Point, evaluate, pareto_dp

MAX_SIMULATIONS = 64  # frontier points checked by simulation before giving up on a budget
REFERENCE_POINTS = 6  # frontier points simulated to measure how far the model errs low


@dataclass
class SavedTensor:
    name: str
    nbytes: int
    why: str


@dataclass
class Region:
    segment: str  # "3", or "3-6" for a span
    policy: str
    nodes: list[str]
    flops: int
    seconds: float


@dataclass
class CheckpointPlan:
    budget: int
    predicted_peak: int  # max(model + model_gap, simulated) of the chosen partition
    model_peak: int
    model_gap: int  # bytes the model was found to err low by (0 when the stock partition fits)
    simulated_peak: int
    stock_peak: int  # simulated peak of the stock partition (nothing extra recomputed)
    recompute_seconds: float  # CostModel time of everything the partition recomputes
    saved: list[SavedTensor]
    regions: list[Region]  # recomputed regions (segments not kept as stock)
    frontier: list[tuple[int, float]]  # (model peak, seconds) of the whole frontier
    segments: int
    solver_seconds: float
    analysis_seconds: float
    simulations: int
    extra_external: int = 0  # bytes alive through the step besides the primals (the gradient pool)
    margin: int = 0  # bytes planned below the budget (a second compile)
    margin_capped: bool = False  # the margin asked for left no plan: the smallest plan, margin cut
    inductor_peak: int | None = None  # the step's peak by Inductor's plans, once compiled
    forward: GraphModule | None = field(default=None, repr=False)
    backward: GraphModule | None = field(default=None, repr=False)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    def stats(self) -> dict:
        return {
            "budget": self.budget, "predicted_peak": self.predicted_peak, "stock_peak": self.stock_peak,
            "model_peak": self.model_peak, "model_gap": self.model_gap, "simulated_peak": self.simulated_peak,
            "saved_bytes": self.saved_bytes, "recompute_ms": round(self.recompute_seconds * 1e3, 3),
            "segments": self.segments, "recomputed_segments": len(self.regions),
            "frontier_points": len(self.frontier), "solver_ms": round(self.solver_seconds * 1e3, 1),
            "simulations": self.simulations, "margin": self.margin, "margin_capped": self.margin_capped,
            "inductor_peak": self.inductor_peak,
        }

    def text(self) -> str:
        lines = [
            "# checkpoint plan", "",
            f"budget {format_bytes(self.budget)} ({self.budget} B); predicted peak before "
            f"{format_bytes(self.stock_peak)}, after {format_bytes(self.predicted_peak)} "
            f"(model {self.model_peak} B + gap {self.model_gap} B, simulated {self.simulated_peak} B)",
            f"recomputation {self.recompute_seconds * 1e3:.3f} ms (CostModel); {self.segments} segments, "
            f"{len(self.regions)} recomputed; solver {self.solver_seconds * 1e3:.1f} ms, "
            f"{self.simulations} simulations",
            "", "## saved tensors", "", "| name | bytes | why |", "|---|---|---|",
        ]
        lines += [f"| {s.name} | {s.nbytes} | {s.why} |" for s in self.saved]
        lines += ["", "## recomputed regions", "", "| segment | policy | nodes | FLOPs | ms |", "|---|---|---|---|---|"]
        for r in self.regions:
            names = ", ".join(r.nodes[:12]) + (f", ... ({len(r.nodes)} nodes)" if len(r.nodes) > 12 else "")
            lines.append(f"| {r.segment} | {r.policy} | {names} | {r.flops} | {r.seconds * 1e3:.4f} |")
        lines += ["", "## frontier (model peak B, recomputation ms)", ""]
        lines += [f"- {peak} B, {sec * 1e3:.4f} ms" for peak, sec in self.frontier]
        return "\n".join(lines) + "\n"


def stock_saved(gm: GraphModule, joint_inputs, kwargs: dict) -> set[str]:
    """Names of what Inductor's own partitioner saves (run on a copy: it edits its input)."""
    _, bw = compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)
    return set(saved_names(bw))


def plan_checkpoint(
    gm: GraphModule, joint_inputs: Sequence[object], partition_kwargs: dict, budget: int,
    extra_external: int = 0, resolution: int | None = None, margin: int = 0,
) -> CheckpointPlan:
    """``extra_external``: bytes alive through the step besides the graph's primals (the
    gradient pool). ``margin``: bytes to plan below the budget (a second compile, after
    Inductor's plan of the first overran it)."""
    start = time.perf_counter()
    static = list(partition_kwargs.get("static_lifetime_input_indices") or [])
    joint = JointGraph.build(gm, partition_kwargs["num_fwd_outputs"], static)
    names = stock_saved(gm, joint_inputs, partition_kwargs)
    stock = {n for n in joint.forward if n.name in names}
    costs = CostModel(gm)
    prefix, segments = build_segments(joint, stock, costs)
    spans = build_spans(joint, segments, costs, stock_saved=stock)
    options_at = options_by_position(segments, spans)
    external = external_bytes(joint) + extra_external + margin
    terms, const, sims, first_in = measure_terms(joint, prefix, segments, static, external, spans)
    t0 = time.perf_counter()
    total = sum(max(t.saved + t.carried_in for t in row) for row in terms) or 1
    points = pareto_dp(terms, const, resolution or max(1, total // 2048), first_in)
    solver_seconds = time.perf_counter() - t0

    def saved_of(point: Point) -> list[Node]:
        saved = list(prefix.options[0].saved) if prefix.options else []
        for _, option in walk(options_at, point):
            saved += option.saved
        return saved

    cache: dict[tuple, Simulation] = {}

    def simulated(point: Point) -> Simulation:
        if point.choice not in cache:
            cache[point.choice] = simulate(joint, saved_of(point), static, external)
        return cache[point.choice]

    chosen, sim, gap, shift = None, None, 0, 0
    stock_choice = tuple(seg.options.index(seg.option("keep") or seg.options[0]) for seg in segments)
    stock_point = evaluate(terms, const, stock_choice, first_in)
    if max(stock_point.peak, sims["keep"].peak) <= budget:
        # the stock partition fits: change nothing (every cheaper-in-time plan the frontier
        # might hold differs from it by the model's noise, not by a real need)
        chosen, sim = stock_point, sims["keep"]
    else:
        gap = _model_gap(points, simulated)

    def predicted(point: Point) -> int:
        return max(point.peak + gap, simulated(point).peak)

    for point in points if chosen is None else ():
        if point.peak + gap > budget:
            continue
        if len(cache) >= MAX_SIMULATIONS:
            break
        if predicted(point) <= budget:
            chosen, sim = point, simulated(point)
            break
    smallest = None
    if chosen is None:
        # no frontier point checked fits (at most MAX_SIMULATIONS are checked): fall back
        # to the smallest plan among the points of least model peak (the same points
        # whatever the budget, so this stays monotone); the budget is infeasible only
        # when even that plan does not fit
        fallback = min(sorted(points, key=lambda p: p.peak)[:8], key=predicted)
        smallest = predicted(fallback) - margin  # the margin is planning slack, not the graph's need
        if smallest + margin <= budget:
            chosen, sim = fallback, simulated(fallback)
        elif smallest <= budget:
            # a second compile's margin leaves no plan, but the smallest plan meets the
            # budget by the prediction: take it, with the margin cut to what it leaves
            # (``margin_capped``: a further compile could not do better)
            chosen, sim = fallback, simulated(fallback)
            shift, margin = margin - (budget - smallest), budget - smallest
    if chosen is None:
        raise BudgetError(
            f"dsgraph memory budget {format_bytes(budget)} ({budget} bytes) is below what this graph needs "
            f"with everything recomputable recomputed; the smallest feasible budget is {smallest} bytes "
            f"({format_bytes(smallest)})",
            smallest,
        )
    # what the partition recomputes, all options together (the model's sum can differ by
    # weight casts an option counts on and no option saves, or that two options both count)
    recomputed = closure(joint, saved_of(chosen)).recomputed
    plan = _describe(chosen, sim, budget, joint, segments, options_at, sims["keep"], points, solver_seconds,
                     time.perf_counter() - start, len(cache), gap, extra_external, margin,
                     costs.fused_seconds(recomputed, joint.held), shift)
    plan.margin_capped = shift > 0
    return plan


def walk(options_at: list[list], point: Point):
    """(first segment index, option) along the plan a frontier point stands for."""
    pos = 0
    for i in point.choice:
        option = options_at[pos][i]
        yield pos, option
        pos += option.length


def _model_gap(points: list[Point], simulated) -> int:
    """How far the peak model errs low, measured at REFERENCE_POINTS frontier points spread
    from the fastest to the smallest (the same points whatever the budget). The model
    composes per-segment terms measured on uniform plans; a buffer that only some mixed
    plans make (transformers GPT-2's shifted-logits gradient, 0.7 GiB) escapes it."""
    if not points:
        return 0
    n = len(points)
    picks = sorted({round(i * (n - 1) / max(1, REFERENCE_POINTS - 1)) for i in range(REFERENCE_POINTS)})
    return max(0, max(simulated(points[i]).peak - points[i].peak for i in picks))


def _describe(point: Point, sim: Simulation, budget: int, joint: JointGraph, segments: list[Segment],
              options_at: list[list], stock: Simulation, points: list[Point], solver_seconds: float, seconds: float,
              simulations: int, gap: int, extra_external: int, margin: int, recompute_seconds: float,
              shift: int = 0) -> CheckpointPlan:
    """``shift``: bytes of margin the peaks were simulated with beyond ``margin`` (a capped
    margin), taken off every peak so that each one counts ``margin``."""
    steps = list(walk(options_at, point))
    carried = {segments[pos].carried for pos, option in steps if option.policy != "keep"}
    by_name = {n.name: n for n in joint.gm.graph.nodes}
    saved = []
    first_of: dict = {}
    for name in sim.saved:
        node = by_name.get(name)
        if node is None:
            continue
        if node in joint.random:
            why = "random: never recomputed"
        elif node in carried:
            why = "segment input"
        elif is_expensive(node):
            why = "output of an expensive op (FLOPs)"
        else:
            why = "saved by the stock partition"
        key = storage_key(node)
        if key in joint.primal_storages:
            continue  # a view of a parameter or input: no memory of its own
        if key in first_of:
            saved.append(SavedTensor(name, 0, f"view of {first_of[key]}"))
            continue
        first_of[key] = name
        saved.append(SavedTensor(name, storage_nbytes(node), why))
    regions = []
    for pos, opt in steps:
        if opt.policy != "keep" and opt.recomputed:
            label = f"{pos}" if opt.length == 1 else f"{pos}-{pos + opt.length - 1}"
            regions.append(Region(label, opt.policy, [n.name for n in opt.recomputed], opt.flops, opt.seconds))
    return CheckpointPlan(
        budget=budget, predicted_peak=max(point.peak + gap, sim.peak) - shift, model_peak=point.peak - shift,
        model_gap=gap, simulated_peak=sim.peak - shift, stock_peak=stock.peak - shift,
        recompute_seconds=recompute_seconds, saved=saved, regions=regions,
        frontier=[(p.peak - shift, p.seconds) for p in points],
        segments=len(segments), solver_seconds=solver_seconds, analysis_seconds=seconds,
        simulations=simulations, extra_external=extra_external, margin=margin, forward=sim.forward,
        backward=sim.backward,
    )
