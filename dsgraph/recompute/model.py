"""The dynamic program's peak model: per interval option, what is live besides what earlier
options saved, measured by evaluating whole plans with ``StepModel``.

A plan's peak is bounded, per interval ``k`` with ``S_k`` the bytes saved by the options
before it and ``c_k`` its own charge (``Intervals.charge``), by

    S_k + F_k          while k runs forward
    S_k + c_k + R_k    while k's backward runs (later intervals' saved values are freed)

``F`` and ``R`` come from exact evaluations (``StepModel.evaluate``) of *uniform* plans:
every interval of one policy and length side by side at one offset, ``keep`` elsewhere;
each clock step belongs to the forward or backward window of the segment it works on
(``windows``). Plans mixing options are then predicted by composing terms; the planner
evaluates the plans it may choose exactly, so the model only steers the search.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from torch.fx import Node

from ..analysis.step_model import StepModel, StepPeak
from .joint import JointGraph
from .options import Intervals, Option
from .partition import closure
from .solver import Terms


@dataclass
class Evaluated:
    name: str
    plan: list[Option]
    saved: list[Node]  # the backward's saved values (closure applied)
    peak: StepPeak


class PlanEvaluator:
    """Exact peaks of plans (lists of options), cached by their saved set. ``workers``
    (``recompute.workers``): where the plans of ``evaluate_many`` are evaluated side by side."""

    def __init__(self, joint: JointGraph, model: StepModel, intervals: Intervals, executor: str, workers=None):
        self.joint = joint
        self.model = model
        self.intervals = intervals
        self.executor = executor
        self.workers = workers
        self.cache: dict[frozenset, StepPeak] = {}
        self.evaluations = 0

    def saved(self, plan: list[Option]) -> list[Node]:
        return closure(self.joint, self.intervals.saved_of(plan)).saved

    def evaluate(self, plan: list[Option], name: str = "") -> Evaluated:
        return self.evaluate_many([(plan, name)])[0]

    def evaluate_many(self, plans: list[tuple[list[Option], str]]) -> list[Evaluated]:
        """``evaluate`` of each (plan, name), in order; the plans not in the cache are
        evaluated together (by the workers, if any)."""
        saved = [self.saved(plan) for plan, _ in plans]
        keys = [frozenset(s) for s in saved]
        todo: dict[frozenset, list[Node]] = {}
        for key, s in zip(keys, saved):
            if key not in self.cache and key not in todo:
                todo[key] = s
        if todo:
            index = self.model.index
            id_lists = [[index[n] for n in s] for s in todo.values()]
            if self.workers is not None:
                peaks = self.workers.evaluate(id_lists)
            else:
                peaks = [self.model.evaluate(ids, self.executor) for ids in id_lists]
            for key, peak in zip(todo, peaks):
                self.cache[key] = peak
            self.evaluations += len(todo)
        return [Evaluated(name, plan, s, self.cache[key]) for (plan, name), s, key in zip(plans, saved, keys)]


def _step_segments(joint: JointGraph, model: StepModel, peak: StepPeak, cut_positions: list[int], segments: int):
    """Per clock step of ``peak``: ("forward" | "backward" | "outside", the segment whose
    window holds it (None outside), live bytes)."""
    att: dict[int, int] = {}
    for node, pos in joint.position.items():
        # a free value (a constant such as iota, a view of a parameter) computed again in
        # the backward belongs to no segment: at its forward position it would pull the
        # backward's window back to the first segment
        if not joint.is_free(node):
            att[model.index[node]] = pos
    for node in joint.backward:
        reads = [joint.position[a] for a in node.all_input_nodes if a in joint.position and not joint.is_free(a)]
        if reads:
            att[model.index[node]] = max(reads)

    def segment(pos: int) -> int:
        return min(max(bisect.bisect_right(cut_positions, pos) - 1, 0), segments - 1)

    forward_at = 0
    backward_at = segments - 1
    for (graph, node), live in zip(peak.steps, peak.live):
        if graph == "forward":
            if node in att:
                forward_at = max(forward_at, segment(att[node]))
            yield "forward", forward_at, live
        elif graph == "backward":
            if node in att:
                backward_at = min(backward_at, segment(att[node]))
            yield "backward", backward_at, live
        else:
            yield "outside", None, live


def windows(joint: JointGraph, model: StepModel, peak: StepPeak, cut_positions: list[int], segments: int):
    """Largest live bytes in each segment's forward and backward window, and outside
    every window (the start and end of the step)."""
    fw = [0] * segments
    bw = [0] * segments
    const = 0
    for kind, seg, live in _step_segments(joint, model, peak, cut_positions, segments):
        if kind == "forward":
            fw[seg] = max(fw[seg], live)
        elif kind == "backward":
            bw[seg] = max(bw[seg], live)
        else:
            const = max(const, live)
    return fw, bw, const


def peak_segment(joint: JointGraph, model: StepModel, peak: StepPeak, cut_positions: list[int],
                 segments: int) -> int | None:
    """The segment whose forward or backward window holds the peak step (None: the peak
    is outside every window)."""
    for step, (_, seg, _) in enumerate(_step_segments(joint, model, peak, cut_positions, segments)):
        if step == peak.peak_step:
            return seg
    return None


def uniform_plan(intervals: Intervals, policy: str, length: int, offset: int) -> list[Option]:
    """Options of ``policy`` and ``length`` side by side from segment ``offset``; single
    ``keep`` segments before and after."""
    plan = []
    k = 0
    m = intervals.segments
    while k < m:
        if k >= offset and k + length <= m:
            plan.append(intervals.option(policy, k, k + length))
            k += length
        else:
            plan.append(intervals.option("keep", k, k + 1))
            k += 1
    return plan


def measure_terms(evaluator: PlanEvaluator, policies: tuple[str, ...], max_len: int):
    """Terms of every option (policy, start, length) from uniform plans. Returns
    ``(rows, const, evaluated)``: ``rows[k]`` the options starting at segment k as
    (Option, Terms), the constant floor, and every plan evaluated (candidates too)."""
    intervals = evaluator.intervals
    joint, model = evaluator.joint, evaluator.model
    m = intervals.segments
    positions = [c.position for c in intervals.cuts]
    found: dict[tuple[str, int, int], Terms] = {}
    const = model.external
    evaluated: list[Evaluated] = []
    kinds = [("keep", 1)] + [(p, length) for p in policies if p != "keep" for length in range(1, max_len + 1)]
    plans = [(uniform_plan(intervals, policy, length, offset), f"{policy}{length}+{offset}", policy)
             for policy, length in kinds for offset in range(length if policy != "keep" else 1)]
    results = evaluator.evaluate_many([(plan, name) for plan, name, _ in plans])
    for (plan, _, policy), result in zip(plans, results):
        evaluated.append(result)
        fw, bw, floor = windows(joint, model, result.peak, positions, m)
        const = max(const, floor)
        before = 0
        for option in plan:
            charge = intervals.charge(option)
            key = (option.policy, option.start, option.stop)
            covered = range(option.start, option.stop)
            if key not in found or option.policy == policy:
                found[key] = Terms(charge, max(fw[j] for j in covered) - before,
                                   max(bw[j] for j in covered) - before - charge, option.seconds,
                                   length=option.length)
            before += charge
    rows: list[list[tuple[Option, Terms]]] = [[] for _ in range(m)]
    for (policy, start, stop), terms in found.items():
        rows[start].append((intervals.option(policy, start, stop), terms))
    for row in rows:
        row.sort(key=lambda ot: (ot[0].length, ot[0].policy))
    return rows, const, evaluated
