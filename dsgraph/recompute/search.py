"""The planner's search moves beyond the dynamic program, each independent of the budget
(so the choice among the candidates they give stays monotone): the recompute-then-cheap
mixes of a uniform plan, the frontier points spread by peak, the descent on the exact peak
from the smallest plan, its neighbouring options joined, and that plan relaxed where its peak does not rise. Split from
``planner``, which runs them in order and chooses among the candidates."""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Node

from .model import Evaluated, PlanEvaluator, peak_segment
from .options import POLICIES, Intervals, Option
from .solver import Point


@dataclass
class Candidate:
    name: str
    peak: int  # exact, for the executor
    seconds: float  # recomputation time of the whole plan
    plan: list[Option]
    saved: list[Node]


def prefix_mixes(intervals: Intervals, candidates: list[Candidate],
                 uniform: list[Evaluated]) -> list[tuple[list[Option], str]]:
    """Plans between a uniform ``cheap`` plan and the uniform ``recompute`` plan of the same
    tiling: the ``cheap`` plan with its first ``r`` intervals recomputed, for every ``r``. The
    tiling is the one on which going from ``cheap`` to ``recompute`` buys bytes at the least
    recomputation time per byte (exact peaks and prices of the two uniform plans). The
    composed peak model misses these plans (GPT-2-small at 16 x 1024, 2.94 GiB: five
    recomputed blocks with every other block cheap dominate the frontier point chosen before,
    docs/BENCHMARKS.md session 10). The first intervals' saved values live longest, so they
    are recomputed first. One exact evaluation per interval of the tiling; independent of
    the budget. Returns the plans with their names, to be evaluated."""
    def spans(result: Evaluated) -> tuple:
        return tuple((o.start, o.stop) for o in result.plan)

    def uniform_of(policy: str) -> dict:
        return {spans(r): (c, r) for c, r in zip(candidates, uniform)
                if any(o.policy == policy for o in r.plan) and all(o.policy in (policy, "keep") for o in r.plan)}

    cheap, recompute = uniform_of("cheap"), uniform_of("recompute")
    slopes = []
    for tiling, (c, r) in cheap.items():
        if tiling not in recompute:
            continue
        full, _ = recompute[tiling]
        if full.peak < c.peak:
            slopes.append(((full.seconds - c.seconds) / (c.peak - full.peak), c.name, r))
    if not slopes:
        return []
    _, _, base = min(slopes, key=lambda t: (t[0], t[1]))
    mixable = [i for i, o in enumerate(base.plan) if o.policy == "cheap"]
    out = []
    for r in range(1, len(mixable)):
        plan = list(base.plan)
        for i in mixable[:r]:
            plan[i] = intervals.option("recompute", plan[i].start, plan[i].stop)
        out.append((plan, f"recompute{r}+{base.name}"))
    return out


def descend(evaluator: PlanEvaluator, intervals: Intervals, plan: list[Option], steps: int) -> Evaluated:
    """Descent on the exact peak, directed by where the peak is: the interval whose window
    holds the plan's peak step takes the other option of the same span that lowers the
    peak most; repeated up to ``steps`` times, until no option of that interval helps.
    Two evaluations a step, whatever the graph's size. Independent of any budget, like the
    other candidates."""
    positions = [c.position for c in intervals.cuts]
    best = evaluator.evaluate(plan, "descent")
    for _ in range(steps):
        seg = peak_segment(evaluator.joint, evaluator.model, best.peak, positions, intervals.segments)
        if seg is None:
            break
        i = next(k for k, o in enumerate(best.plan) if o.start <= seg < o.stop)
        current, before = best.plan[i], best
        trials = [(best.plan[:i] + [intervals.option(policy, current.start, current.stop)] + best.plan[i + 1:],
                   "descent") for policy in POLICIES if policy != current.policy]
        for result in evaluator.evaluate_many(trials):
            if result.peak.peak < best.peak.peak:
                best = result
        if best is before:
            break
    return best


def join(evaluator: PlanEvaluator, intervals: Intervals, base: Evaluated, joins: int, longer_than: int) -> Evaluated:
    """The smallest plan with neighbouring options joined into one recomputed interval of
    any length: the separator between them is no longer saved, and the backward recomputes
    both from the first one's start. The DP's options span at most ``MAX_SPAN`` segments,
    so a block with more cuts inside it than that cannot be recomputed whole from its
    input, as per-block checkpointing does (a vision transformer: its first block, with
    the patch embedding, is four segments; its smallest plan saved the block's attention
    output and the last block's output, 2.9% above per-block checkpointing through
    Inductor). Only joins longer than ``longer_than`` segments (the DP's span) are tried,
    the shorter ones being options of the DP already. Every single join is tried at once;
    the one that lowers the exact peak most is taken, then the others that lowered it, in
    that order, each kept if it lowers the peak further, up to ``joins`` in all (one
    evaluation per pair of options, ``2 * joins`` more at most); independent of any
    budget, like the other candidates."""
    plan = base.plan
    boundaries = [plan[i].stop for i in range(len(plan) - 1)
                  if plan[i + 1].stop - plan[i].start > longer_than
                  and not (plan[i].policy == plan[i + 1].policy == "keep")]
    results = evaluator.evaluate_many([(_joined(intervals, plan, {b}), "joined") for b in boundaries])
    lower = sorted((r.peak.peak, b) for b, r in zip(boundaries, results) if r.peak.peak < base.peak.peak)
    if not lower:
        return base
    best = next(r for b, r in zip(boundaries, results) if b == lower[0][1])
    removed = {lower[0][1]}
    for _, b in lower[1:2 * joins]:
        if len(removed) >= joins:
            break
        trial = evaluator.evaluate(_joined(intervals, plan, removed | {b}), "joined")
        if trial.peak.peak < best.peak.peak:
            best, removed = trial, removed | {b}
    return best


def _joined(intervals: Intervals, plan: list[Option], removed: set[int]) -> list[Option]:
    """``plan`` with the cuts in ``removed`` no longer separating its options: each run of
    options between them becomes one ``recompute`` option."""
    out, k = [], 0
    while k < len(plan):
        last = k
        while last < len(plan) - 1 and plan[last].stop in removed:
            last += 1
        out.append(plan[k] if last == k else intervals.option("recompute", plan[k].start, plan[last].stop))
        k = last + 1
    return out


def relax(evaluator: PlanEvaluator, intervals: Intervals, base: Evaluated, tries: int) -> Evaluated:
    """The smallest plan made cheaper where that costs no peak: its ``tries`` dearest
    intervals, dearest first, each take the cheapest other option of the same span whose
    exact peak is not above the plan's. The peak is at one place; an interval whose
    recomputation does not shape it is recomputed for nothing (a 24-layer GPT at per-block
    checkpointing's memory: the smallest plan recomputed the loss head, 1.7 ms priced,
    where keeping it lowers the peak too; the descent only changes the interval at the
    peak, and the composed model missed it). At most ``2 * tries`` evaluations; independent
    of any budget, like the other candidates."""
    best = base
    dearest = sorted(range(len(base.plan)), key=lambda k: -base.plan[k].seconds)[:tries]
    for k in dearest:
        current = best.plan[k]
        options = [intervals.option(p, current.start, current.stop) for p in POLICIES if p != current.policy]
        cheaper = sorted((o for o in options if o.seconds < current.seconds), key=lambda o: o.seconds)
        # the cheapest whose peak is not above is taken. Workers try the options together;
        # in this process they are tried one at a time, cheapest first, until one is taken
        # (evaluating the rest would be wasted work on the planning's critical path)
        trials = [(best.plan[:k] + [option] + best.plan[k + 1:], "relaxed") for option in cheaper]
        batch = max(len(trials), 1) if evaluator.workers is not None else 1
        for first in range(0, len(trials), batch):
            results = evaluator.evaluate_many(trials[first:first + batch])
            taken = next((r for r in results if r.peak.peak <= best.peak.peak), None)
            if taken is not None:
                best = taken
                break
    return best


def spread(points: list[Point], count: int) -> list[Point]:
    """Up to ``count`` frontier points: the smallest quarter of them, then spread evenly
    by peak over the rest (the same points whatever the budget)."""
    if len(points) <= count:
        return list(points)
    ordered = sorted(points, key=lambda p: p.peak)
    small = ordered[:count // 4]
    rest = ordered[count // 4:]
    step = len(rest) / (count - len(small))
    return small + [rest[int(i * step)] for i in range(count - len(small))]
