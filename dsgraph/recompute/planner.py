"""plan_checkpoint: which activations to save under a memory budget, and the partition.

1. ``JointGraph``: forward/backward split, free and random values.
2. The stock partition (Inductor's min-cut), and its peak by ``StepModel`` for the
   executor that will run the graphs (``"inductor"`` or ``"fx"``). A budget it meets
   changes nothing: the stock partition is returned as Inductor's partitioner made it.
3. ``candidate_cuts``: cheap cuts anywhere in the forward (``cuts``); ``Intervals``: the
   keep / cheap / recompute options of every run of up to ``MAX_SPAN`` segments.
4. ``measure_terms``: the peak model's terms, from exact evaluations of uniform plans.
5. ``pareto_dp``: the frontier (model peak, recomputation time) over all plans.
6. Candidates, fixed before the budget is looked at: every uniform plan evaluated in 4,
   a uniform ``cheap`` plan with its first r intervals recomputed for every r
   (``search.prefix_mixes``), and up to ``MAX_CANDIDATES`` frontier points spread over the
   frontier (the smallest ones always), each evaluated exactly; a descent from the smallest
   of them at its peak (``search.descend``), neighbouring options of that plan joined into
   longer recomputed intervals than the DP's (``search.join``), and that plan made cheaper
   where its exact peak does not rise (``search.relax``). The plan is the fastest candidate whose exact peak plus ``margin``
   fits the budget.
7. Ops with faster forms that need more workspace (the chunked loss with fewer chunks) take
   the fastest one whose exact peak stays within the budget less a slack
   (``workspace_fit``; ``refit=False`` keeps every call as traced).

Monotone: the candidates and their exact peaks do not depend on the budget, and the
choice is the fastest candidate that fits, so a smaller budget never gets a larger
predicted peak. Honest errors: a budget no candidate meets raises ``BudgetError`` with
``smallest_feasible``, the smallest exact peak among the candidates (asking for that
budget gives that plan), and ``lower_bound``, a peak no partition of the graph goes
below, with what sets it (``bounds``).
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from typing import Sequence

from torch.fx import GraphModule, Node

from .. import compat
from ..analysis.cost_model import PERSISTENT_RNUMEL, CostModel, DeviceRates, recompute_rates
from ..analysis.inductor_ops import EXTERN, REDUCTION
from ..analysis.inductor_reductions import reduced_elements
from ..analysis.lifetimes import bytes_of, storage_key, storage_nbytes
from ..analysis.step_model import FX, INDUCTOR, StepModel, StepPeak
from ..errors import BudgetError
from ..units import format_bytes
from .bounds import LowerBound, lower_bound
from .cuts import candidate_cuts
from .joint import JointGraph
from .light_forward import lighten_forward
from .model import Evaluated, PlanEvaluator, measure_terms
from .options import POLICIES, Intervals, Option, is_expensive
from .partition import closure, partition, saved_names
from .solver import Point, pareto_dp
from .search import Candidate, descend, join, prefix_mixes, relax, spread
from .workers import Workers, default_workers
from .workspace_fit import Refit, apply_refits, fit_workspaces, refit_target

MAX_SPAN = 3  # longest run of segments one option covers (terms measured per length)
MAX_CANDIDATES = 16  # frontier points evaluated exactly besides the uniform plans
MAX_DESCENT_STEPS = 8  # changes to the smallest plan, each at the interval where its peak is
MAX_RELAXED = 4  # the smallest plan's dearest intervals tried with cheaper options
MAX_JOINS = 3  # cuts of the smallest plan that neighbouring options may be joined across


@dataclass
class SavedTensor:
    name: str
    nbytes: int
    why: str


@dataclass
class Region:
    segment: str  # "3", or "3-5" for an option over several segments
    policy: str
    nodes: list[str]
    flops: int
    seconds: float


@dataclass
class CheckpointPlan:
    budget: int
    predicted_peak: int  # the chosen partition's peak for the executor, plus the margin
    stock_peak: int  # the stock partition's peak for the executor
    recompute_seconds: float  # CostModel time of everything the partition recomputes
    saved: list[SavedTensor]
    regions: list[Region]  # recomputed regions (intervals not kept as stock)
    candidates: list[tuple[str, int, float]]  # (name, exact peak, seconds) of every candidate
    segments: int
    solver_seconds: float
    analysis_seconds: float
    evaluations: int
    executor: str = INDUCTOR
    lower_bound: LowerBound | None = None
    model_peak: int = 0  # the DP's prediction of the chosen plan (0: not a DP point)
    extra_external: int = 0  # bytes alive through the step besides the primals (the gradient pool)
    margin: int = 0  # bytes planned below the budget (a second compile)
    margin_capped: bool = False  # the margin asked for left no plan: the smallest plan, margin cut
    # no plan the planner found peaks lower: planning again below the budget (a second
    # compile's margin) can only give a plan of this peak again
    smallest: bool = False
    inductor_peak: int | None = None  # the step's peak by Inductor's plans, once compiled
    refits: list[Refit] = field(default_factory=list)  # calls run in a faster form within the peak
    forward: GraphModule | None = field(default=None, repr=False)
    backward: GraphModule | None = field(default=None, repr=False)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    @property
    def frontier(self) -> list[tuple[int, float]]:
        return [(peak, sec) for _, peak, sec in self.candidates]

    def stats(self) -> dict:
        return {
            "budget": self.budget, "predicted_peak": self.predicted_peak, "stock_peak": self.stock_peak,
            "executor": self.executor, "lower_bound": self.lower_bound.nbytes if self.lower_bound else None,
            "model_peak": self.model_peak, "saved_bytes": self.saved_bytes,
            "recompute_ms": round(self.recompute_seconds * 1e3, 3), "segments": self.segments,
            "recomputed_segments": len(self.regions), "candidates": len(self.candidates),
            "solver_ms": round(self.solver_seconds * 1e3, 1), "evaluations": self.evaluations,
            "analysis_s": round(self.analysis_seconds, 3), "margin": self.margin,
            "margin_capped": self.margin_capped, "smallest": self.smallest, "inductor_peak": self.inductor_peak,
            "refits": "; ".join(r.describe() for r in self.refits),
        }

    def text(self) -> str:
        bound = self.lower_bound.describe() if self.lower_bound else "-"
        lines = [
            "# checkpoint plan", "",
            f"budget {format_bytes(self.budget)} ({self.budget} B); predicted peak ({self.executor}) before "
            f"{format_bytes(self.stock_peak)}, after {format_bytes(self.predicted_peak - self.margin)}"
            + (f" (+ margin {self.margin} B)" if self.margin else ""),
            f"lower bound of any partition: {bound}",
            f"recomputation {self.recompute_seconds * 1e3:.3f} ms (CostModel); {self.segments} segments, "
            f"{len(self.regions)} recomputed regions; solver {self.solver_seconds * 1e3:.1f} ms, "
            f"{self.evaluations} plans evaluated, {self.analysis_seconds:.2f} s in all",
            "", "## saved tensors", "", "| name | bytes | why |", "|---|---|---|",
        ]
        lines += [f"| {s.name} | {s.nbytes} | {s.why} |" for s in self.saved]
        lines += ["", "## recomputed regions", "", "| segment | policy | nodes | FLOPs | ms |", "|---|---|---|---|---|"]
        for r in self.regions:
            names = ", ".join(r.nodes[:12]) + (f", ... ({len(r.nodes)} nodes)" if len(r.nodes) > 12 else "")
            lines.append(f"| {r.segment} | {r.policy} | {names} | {r.flops} | {r.seconds * 1e3:.4f} |")
        if self.refits:
            lines += ["", "## calls in a faster form within the plan's peak", ""]
            lines += [f"- {r.describe()}" for r in self.refits]
        lines += ["", "## candidates (exact peak B, recomputation ms)", ""]
        lines += [f"- {name}: {peak} B, {sec * 1e3:.4f} ms" for name, peak, sec in self.candidates]
        return "\n".join(lines) + "\n"


def external_bytes(joint: JointGraph) -> int:
    """Primals (parameters, buffers, inputs), each storage once: they exist for the whole step."""
    return bytes_of([p for p in joint.primals if p.meta.get("val") is not None])


def stock_saved(gm: GraphModule, joint_inputs, kwargs: dict) -> set[str]:
    """Names of what Inductor's own partitioner saves (run on a copy: it edits its input)."""
    _, bw = compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)
    return set(saved_names(bw))


def _held(joint: JointGraph, model: StepModel) -> set[Node]:
    """Values a recomputation writes to memory (extern and reduction outputs): what the
    fused cost model charges bytes for."""
    return {n for n in joint.forward if model.info[model.index[n]].kind in (EXTERN, REDUCTION)}


def looped_reductions(joint: JointGraph, model: StepModel) -> set[Node]:
    """Forward reductions over more elements per output than Inductor keeps in registers:
    recomputing one reads its inputs in a loop of its own (``CostModel.fused_seconds``)."""
    return {n for n in joint.forward if model.info[model.index[n]].kind == REDUCTION
            and reduced_elements(n) > PERSISTENT_RNUMEL}


def plan_checkpoint(
    gm: GraphModule, joint_inputs: Sequence[object], partition_kwargs: dict, budget: int,
    extra_external: int = 0, resolution: int | None = None, margin: int = 0, executor: str = INDUCTOR,
    rates: DeviceRates | None = None, lowered: bool = False, rates_source: str = "bandwidth",
    mixes: bool = True, pooled: frozenset[str] = frozenset(), handled: frozenset[str] = frozenset(),
    workers: int | None = None, refit: bool = True,
) -> CheckpointPlan:
    """``extra_external``: bytes alive through the step besides the graph's primals (the
    gradient pool). ``margin``: bytes to plan below the budget (a second compile, after
    Inductor's plan of the first overran it). ``executor``: ``"inductor"`` or ``"fx"``,
    what will run the graphs (the peaks are predicted for it). ``rates``: what
    recomputation is priced with (default: the H200's, with generated kernels at the
    bandwidth measured there for graphs on a GPU; ``lowered``: the recomputed chains will
    run as dsgraph's lowered kernels, priced at their measured bandwidth; ``rates_source``
    ``"profile"``: generated kernels, GEMMs and attention at what the H200's profile of a
    budgeted GPT-2 step measured, ``cost_model.H200_MEASURED``). ``mixes=False`` leaves out
    the ``search.prefix_mixes`` candidates (the search before session 10). ``pooled``: names of
    the gradient outputs the gradient pool takes, ``handled``: the primals the backward
    receives a handle on (both ``StepModel``). ``workers``: processes evaluating a search
    phase's plans side by side (``recompute.workers``; default ``default_workers()``, 1:
    all in this process); the plan is the same whatever the count. ``refit``: ops with a
    faster form that needs more workspace take it where the plan's peak allows
    (``workspace_fit``)."""
    if executor not in (INDUCTOR, FX):
        raise ValueError(f"executor must be 'inductor' or 'fx', not {executor!r}")
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    with _gc_paused(), contextlib.ExitStack() as stack:
        return _plan(gm, joint_inputs, partition_kwargs, budget, extra_external, resolution, margin, executor, rates,
                     lowered, rates_source, mixes, pooled, handled, workers, refit, stack)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off while planning: the planner allocates millions of
    small objects over a heap of FX graphs and fake tensors, and the collections this sets
    off took a quarter to a third of its time (24-layer GPT, CPU). Nothing the planner
    computes depends on it; what it leaves behind is collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan(gm: GraphModule, joint_inputs: Sequence[object], partition_kwargs: dict, budget: int, extra_external: int,
          resolution: int | None, margin: int, executor: str, rates: DeviceRates | None,
          lowered: bool, rates_source: str, mixes: bool,
          pooled: frozenset[str], handled: frozenset[str], workers: int, refit: bool,
          stack: contextlib.ExitStack) -> CheckpointPlan:
    start = time.perf_counter()
    static = list(partition_kwargs.get("static_lifetime_input_indices") or [])
    joint = JointGraph.build(gm, partition_kwargs["num_fwd_outputs"], static,
                             replays_inductor_random=executor == INDUCTOR)
    model = StepModel(gm, partition_kwargs["num_fwd_outputs"], static, external=external_bytes(joint) + extra_external,
                      pooled=pooled, handled=handled)
    by_name = {n.name: n for n in gm.graph.nodes}
    stock_peaks: list[StepPeak] = []

    def stock_meets_budget(names: list[str]) -> bool:
        stock_ids = [model.index[by_name[name]] for name in set(names) if name in by_name]
        stock_peaks.append(model.evaluate(stock_ids, executor, sink=False))
        return stock_peaks[0].peak + margin <= budget

    # Inductor's min-cut, run once: what it saves decides the stock peak, and its forward
    # and backward graphs are built only if the stock partition is the plan
    names, stock_graphs = compat.min_cut_partition_if(gm, joint_inputs, stock_meets_budget, **partition_kwargs)
    stock_names = set(names)
    stock = {n for n in joint.forward if n.name in stock_names}
    stock_peak = stock_peaks[0].peak
    if rates is None:
        rates = recompute_rates(model.device_type, lowered, rates_source)
    costs = CostModel(gm, rates, looped=looped_reductions(joint, model))
    held = _held(joint, model)
    fused = executor == INDUCTOR
    if stock_graphs is not None:
        stock_fw, stock_bw = stock_graphs
        refits, refit_peak = (fit_workspaces(model, stock_peaks[0], refit_target(stock_peak, budget, margin))
                              if refit else ([], stock_peak))
        apply_refits(refits, [stock_fw, stock_bw])  # Inductor's partition keeps the joint graph's names
        # as the step model priced it: an op the min-cut recomputes runs its lighter form
        lighten_forward(stock_fw)
        recomputed = [n for n in stock_bw.graph.nodes if n.op == "call_function" and n.name in by_name
                      and by_name[n.name] in joint.position]
        plan = CheckpointPlan(
            budget=budget, predicted_peak=refit_peak + margin, stock_peak=stock_peak,
            recompute_seconds=_seconds(costs, [by_name[n.name] for n in recomputed], held, fused),
            saved=_saved_tensors(joint, [by_name[n] for n in saved_names(stock_bw) if n in by_name], set()),
            regions=[], candidates=[("stock", stock_peak, 0.0)], segments=0, solver_seconds=0.0,
            analysis_seconds=time.perf_counter() - start, evaluations=1, executor=executor,
            extra_external=extra_external, margin=margin, forward=stock_fw, backward=stock_bw, refits=refits)
        return plan

    cuts = candidate_cuts(joint)
    intervals = Intervals(joint, cuts, stock, costs, held, fused=fused, max_len=MAX_SPAN)
    # forked here: the workers hold the step model as it is now (the stock plan evaluated)
    pool = stack.enter_context(Workers(model, executor, workers)) if workers > 1 else None
    evaluator = PlanEvaluator(joint, model, intervals, executor, pool)
    policies = tuple(p for p in POLICIES if p != "keep")
    rows, const, uniform = measure_terms(evaluator, policies, MAX_SPAN)
    t0 = time.perf_counter()
    terms = [[t for _, t in row] for row in rows]
    total = sum(max((t.saved for t in row), default=0) for row in terms) or 1
    points = pareto_dp(terms, const, resolution or max(1, total // 4096))
    solver_seconds = time.perf_counter() - t0

    def plan_of(point: Point) -> list[Option]:
        out, k = [], 0
        for i in point.choice:
            option = rows[k][i][0]
            out.append(option)
            k = option.stop
        return out

    candidates: list[Candidate] = []
    model_peaks: dict[int, int] = {}
    for result in uniform:
        candidates.append(_candidate(result, joint, costs, held, fused))
    # the prefix mixes and the frontier points depend only on the uniform plans: one batch
    mixed = prefix_mixes(intervals, candidates, uniform) if mixes else []
    spread_points = spread(points, MAX_CANDIDATES)
    frontier = [(plan_of(point), f"frontier {len(candidates) + len(mixed) + k}")
                for k, point in enumerate(spread_points)]
    results = evaluator.evaluate_many(mixed + frontier)
    for result in results[:len(mixed)]:
        candidates.append(_candidate(result, joint, costs, held, fused))
    for point, result in zip(spread_points, results[len(mixed):]):
        candidates.append(_candidate(result, joint, costs, held, fused))
        model_peaks[id(candidates[-1])] = point.peak
    # the composed model only steers the search: from the smallest plan evaluated, change
    # the option where its peak is, exactly (24-layer GPT, FX: the recompute-all
    # plan with its last interval, the loss head, saving its matmuls is 14% smaller)
    smallest_so_far = min(candidates, key=lambda c: (c.peak, c.seconds))
    improved = descend(evaluator, intervals, smallest_so_far.plan, MAX_DESCENT_STEPS)
    if improved.peak.peak < smallest_so_far.peak:
        candidates.append(_candidate(improved, joint, costs, held, fused))
    # ``improved`` is the smallest plan so far also when the descent found nothing smaller;
    # then options longer than the DP's, joined from it
    joined = join(evaluator, intervals, improved, MAX_JOINS, MAX_SPAN)
    if joined is not improved:
        candidates.append(_candidate(joined, joint, costs, held, fused))
    relaxed = relax(evaluator, intervals, joined, MAX_RELAXED)
    if relaxed is not joined:
        candidates.append(_candidate(relaxed, joint, costs, held, fused))
    stack.close()  # the last evaluation is done: the workers exit
    candidates.sort(key=lambda c: (c.seconds, c.peak, c.name))
    bound = lower_bound(joint, model, executor)
    fits = [c for c in candidates if c.peak + margin <= budget]
    capped = False
    if fits:
        chosen = fits[0]
    else:
        smallest = min(candidates, key=lambda c: (c.peak, c.seconds))
        if smallest.peak > budget:
            raise BudgetError(
                f"dsgraph memory budget {format_bytes(budget)} ({budget} bytes) is below the smallest plan the "
                f"checkpoint planner found for this graph ({executor} execution): the smallest feasible budget is "
                f"{smallest.peak} bytes ({format_bytes(smallest.peak)}); no partition of this graph peaks below "
                f"{bound.describe()}",
                smallest.peak, lower_bound=bound.nbytes, dominated_by=bound.term)
        # the margin of a second compile leaves no plan, but the smallest plan meets the
        # budget by the prediction: take it, with the margin cut to what it leaves
        chosen, capped, margin = smallest, True, budget - smallest.peak
    refits, refit_peak = (fit_workspaces(model, evaluator.cache[frozenset(chosen.saved)],
                                         refit_target(chosen.peak, budget, margin)) if refit else ([], chosen.peak))
    apply_refits(refits, [gm])  # the partition copies the joint graph's calls, as rewritten here
    fw, bw = partition(joint, chosen.saved, static)
    regions = []
    for option in chosen.plan:
        if option.policy != "keep" and option.recomputed:
            label = f"{option.start}" if option.length == 1 else f"{option.start}-{option.stop - 1}"
            regions.append(Region(label, option.policy, [n.name for n in option.recomputed], option.flops,
                                  option.seconds))
    cut_nodes = {n for option in chosen.plan for n in intervals.cuts[option.start].crossing}
    return CheckpointPlan(
        budget=budget, predicted_peak=refit_peak + margin, stock_peak=stock_peak, recompute_seconds=chosen.seconds,
        saved=_saved_tensors(joint, chosen.saved, cut_nodes), regions=regions,
        candidates=[(c.name, c.peak, c.seconds) for c in candidates], segments=intervals.segments,
        solver_seconds=solver_seconds, analysis_seconds=time.perf_counter() - start,
        evaluations=evaluator.evaluations + 1, executor=executor, lower_bound=bound,
        model_peak=model_peaks.get(id(chosen), 0), extra_external=extra_external, margin=margin,
        # a refit that raised the peak is undone by planning again below the budget
        margin_capped=capped, smallest=refit_peak <= min(c.peak for c in candidates), forward=fw, backward=bw,
        refits=refits)


def _seconds(costs: CostModel, nodes: list[Node], held: set[Node], fused: bool) -> float:
    return costs.fused_seconds(nodes, held) if fused else costs.seconds(nodes)


def _candidate(result: Evaluated, joint: JointGraph, costs: CostModel, held: set[Node], fused: bool) -> Candidate:
    recomputed = closure(joint, result.saved).recomputed
    return Candidate(result.name, result.peak.peak, _seconds(costs, recomputed, held, fused), result.plan,
                     result.saved)


def _saved_tensors(joint: JointGraph, saved: list[Node], cut_nodes: set[Node]) -> list[SavedTensor]:
    out = []
    first_of: dict = {}
    for node in saved:
        if node.op == "placeholder":
            continue
        key = storage_key(node)
        if key in joint.primal_storages:
            continue  # a view of a parameter or input: no memory of its own
        if key in first_of:
            out.append(SavedTensor(node.name, 0, f"view of {first_of[key]}"))
            continue
        first_of[key] = node.name
        if node in joint.random:
            why = "random: never recomputed"
        elif node in cut_nodes:
            why = "crosses a cut"
        elif is_expensive(node):
            why = "output of an expensive op (FLOPs)"
        else:
            why = "saved by the stock partition"
        out.append(SavedTensor(node.name, storage_nbytes(node), why))
    return out
