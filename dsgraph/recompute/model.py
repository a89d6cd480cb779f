"""The peak model's terms, measured by simulating the step for each uniform plan.

For each policy (every segment ``keep``, every segment ``cheap``, every segment ``full``)
and for each span length and offset (spans of that length side by side), the joint graph
is partitioned and the whole step simulated with ``fused_plan`` (Inductor's
fusion rule of thumb) and ``stitch``. Each step of the simulation belongs to one segment's
forward or backward window; what is live in a window besides the saved activations of the
segments still alive is that option's ``F`` or ``R`` term (``solver.Terms``). For a uniform
plan the model then gives exactly the simulated peak; mixed plans are predicted from the
same terms and checked by simulating the chosen plan. An option's terms come from the
simulation of its own policy (a segment without a ``cheap`` option keeps in that
simulation, but its ``keep`` terms are the ``keep`` simulation's).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from ..analysis.fused_plan import fused_step
from ..analysis.lifetimes import bytes_of
from ..analysis.timeline import Interval, MemoryTimeline
from .joint import JointGraph
from .partition import partition, saved_names
from .segments import POLICIES, Segment, options_by_position
from .solver import Terms, charges


@dataclass
class Simulation:
    saved: list[str]  # what the backward receives from the forward (primals included)
    timeline: MemoryTimeline
    forward: GraphModule
    backward: GraphModule

    @property
    def peak(self) -> int:
        return self.timeline.peak_bytes


def external_bytes(joint: JointGraph) -> int:
    """Primals (parameters, buffers, inputs): they exist for the whole step."""
    return bytes_of([p for p in joint.primals if p.meta.get("val") is not None])


def simulate(joint: JointGraph, saved: list[Node], static_input_indices, external: int) -> Simulation:
    fw, bw = partition(joint, saved, static_input_indices)
    names = saved_names(bw)
    timeline = fused_step(fw, bw, [Interval("start of step", external, 0, 0)], names)
    return Simulation(names, timeline, fw, bw)


def _segment_of_position(segments: list[Segment]):
    starts = [s.start for s in segments]

    def seg(pos: int) -> int:
        i = bisect.bisect_right(starts, pos) - 1
        return i  # -1: the prefix

    return seg


def _backward_segments(joint: JointGraph, seg_of_pos) -> dict[str, int | None]:
    """Which segment each backward node works for: the latest segment whose forward values
    it reads, else the earliest segment among the backward values it reads."""
    out: dict[Node, int | None] = {}
    for n in joint.gm.graph.nodes:
        if n not in joint.backward:
            continue
        # static inputs (weight transposes, masks) sit before every segment: they say nothing
        fw = [seg_of_pos(joint.position[a]) for a in n.all_input_nodes if a in joint.position and a not in joint.static]
        if fw:
            out[n] = max(fw)
            continue
        bw = [out[a] for a in n.all_input_nodes if out.get(a) is not None]
        out[n] = min(bw) if bw else None
    return {n.name: s for n, s in out.items()}


def _plans(segments: list[Segment], spans: dict) -> list[tuple[str, tuple, list[tuple[int, int]]]]:
    """The simulated plans: one per policy (every segment at that option, or ``keep`` when
    it has none) and, for each kind of span (policy and length), spans of that kind side by
    side from the first segment whose span of that kind no plan holds yet, ``keep``
    elsewhere, until every span is in a plan (a kind every segment has takes one plan per
    offset; a ``span-cheap`` exists only where a span holds an expensive op, and a fixed
    offset would skip some). Each plan is (name, the kind of option it measures: ``_kind``,
    path of (segment, option index))."""
    plans = []
    for policy in POLICIES:
        plans.append((policy, (policy, 1), [(k, seg.options.index(seg.option(policy) or seg.options[0]))
                                            for k, seg in enumerate(segments)]))
    kinds = sorted({(sp.option.policy, sp.stop - sp.start) for row in spans.values() for sp in row})
    for policy, length in kinds:
        pending = {k for k in spans if _span_index(segments, spans, k, policy, length) is not None}
        while pending:
            first = min(pending)
            path, k = [], 0
            while k < len(segments):
                index = _span_index(segments, spans, k, policy, length) if k >= first else None
                if index is not None:
                    path.append((k, index))
                    pending.discard(k)
                    k += length
                else:
                    path.append((k, segments[k].options.index(segments[k].option("keep") or segments[k].options[0])))
                    k += 1
            plans.append((f"{policy}{length}+{first}", (policy, length), path))
    return plans


def _span_index(segments, spans, k, policy, length):
    for j, sp in enumerate(spans.get(k, ())):
        if sp.option.policy == policy and sp.stop - sp.start == length:
            return len(segments[k].options) + j
    return None


def _kind(option) -> tuple[str, int]:
    """What a simulated plan measures an option's terms for: its policy and length."""
    return option.policy, option.length


def measure_terms(joint: JointGraph, prefix: Segment, segments: list[Segment], static_input_indices,
                  external: int, spans: dict | None = None) -> tuple[list[list[Terms]], int, dict[str, Simulation], bool]:
    """Terms of every option at every segment position: the segment's own options, then
    the spans starting there (``spans``), in that order. Each option's terms come from the
    simulated plan it belongs to natively (``_plans``): its policy's plan, or for a span
    the plan of spans of its length at its offset."""
    spans = spans or {}
    seg_of_pos = _segment_of_position(segments)
    by_name = {n.name: n for n in joint.gm.graph.nodes}
    bw_seg = _backward_segments(joint, seg_of_pos)
    m = len(segments)
    options_at = options_by_position(segments, spans)
    rows = [[Terms(o.own_bytes, 0, 0, o.seconds, seg.carried_bytes, o.saves_in, o.saves_out, o.length)
             for o in options_at[k]] for k, seg in enumerate(segments)]
    found: dict[tuple[int, int], tuple[int, int]] = {}
    const = external
    sims: dict[str, Simulation] = {}
    first_in = bool(prefix.options) and prefix.options[0].saves_out
    for name, kind, path in _plans(segments, spans):
        saved = list(prefix.options[0].saved) if prefix.options else []
        for k, i in path:
            saved += options_at[k][i].saved
        sim = simulate(joint, saved, static_input_indices, external)
        sims[name] = sim
        fw_peak, bw_peak, const = _window_peaks(sim, joint, by_name, seg_of_pos, bw_seg, m, const)
        before = 0
        for (k, i), charge in zip(path, charges(rows, tuple(i for _, i in path), first_in)):
            option = options_at[k][i]
            covered = range(k, k + option.length)
            if _kind(option) == kind:
                fws = [fw_peak[j] for j in covered if fw_peak[j] is not None]
                bws = [bw_peak[j] for j in covered if bw_peak[j] is not None]
                found[(k, i)] = (max(fws) - before if fws else 0, max(bws) - before - charge if bws else 0)
            before += charge
    terms = [[dataclasses.replace(t, forward=found.get((k, i), (0, 0))[0], backward=found.get((k, i), (0, 0))[1])
              for i, t in enumerate(row)] for k, row in enumerate(rows)]
    return terms, const, sims, first_in


def _window_peaks(sim: Simulation, joint: JointGraph, by_name, seg_of_pos, bw_seg, m: int, const: int):
    """Largest live bytes in each segment's forward and backward window; what falls in
    no segment's window (the prefix, the start and end of the step) raises ``const``."""
    fw_peak: list[int | None] = [None] * m
    bw_peak: list[int | None] = [None] * m
    current = m  # the backward starts with the last segment
    forward_at = -1  # the forward runs through the segments in order: the latest one reached
    for entry in sim.timeline.entries:
        if entry.graph == "forward":
            node = by_name.get(entry.node)
            if node in joint.position and node not in joint.static:
                forward_at = max(forward_at, seg_of_pos(joint.position[node]))
            if forward_at < 0:
                const = max(const, entry.live_bytes)
            else:
                fw_peak[forward_at] = max(fw_peak[forward_at] or 0, entry.live_bytes)
        elif entry.graph == "backward":
            node = by_name.get(entry.node)
            if node in joint.position:
                k = None if node in joint.static else seg_of_pos(joint.position[node])
            else:
                k = bw_seg.get(entry.node)
            if k is not None:
                current = min(current, k)
            if current < 0:
                const = max(const, entry.live_bytes)
            else:
                c = min(current, m - 1)
                bw_peak[c] = max(bw_peak[c] or 0, entry.live_bytes)
        else:
            const = max(const, entry.live_bytes)
    return fw_peak, bw_peak, const
