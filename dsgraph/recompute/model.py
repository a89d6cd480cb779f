"""The peak model's terms, measured by simulating the step for each uniform plan.

For each policy (every segment ``keep``, every segment ``cheap``, every segment ``full``)
the joint graph is partitioned and the whole step simulated with ``fused_plan`` (Inductor's
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

from ..analysis.fused_plan import fused_plan
from ..analysis.timeline import Interval, MemoryTimeline, stitch
from .joint import JointGraph
from .partition import partition
from .segments import POLICIES, Segment, bytes_of
from .solver import Terms, charges


@dataclass
class Simulation:
    saved: list[str]  # what the backward receives (primals excluded)
    timeline: MemoryTimeline
    forward: GraphModule
    backward: GraphModule

    @property
    def peak(self) -> int:
        return self.timeline.peak_bytes


def backward_saved_names(bw: GraphModule) -> list[str]:
    return [n.name for n in bw.graph.nodes
            if n.op == "placeholder" and not n.name.startswith(("primals", "tangents"))]


def external_bytes(joint: JointGraph) -> int:
    """Primals (parameters, buffers, inputs): they exist for the whole step."""
    return bytes_of([p for p in joint.primals if p.meta.get("val") is not None])


def simulate(joint: JointGraph, saved: list[Node], static_input_indices, external: int) -> Simulation:
    fw, bw = partition(joint, saved, static_input_indices)
    names = backward_saved_names(bw)
    donated = set(names)
    timeline = stitch(
        fused_plan(fw), fused_plan(bw, donated=donated.__contains__),
        [Interval("start of step", external, 0, 0)], names,
    )
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
        fw = [seg_of_pos(joint.position[a]) for a in n.all_input_nodes if a in joint.position]
        if fw:
            out[n] = max(fw)
            continue
        bw = [out[a] for a in n.all_input_nodes if out.get(a) is not None]
        out[n] = min(bw) if bw else None
    return {n.name: s for n, s in out.items()}


def measure_terms(joint: JointGraph, prefix: Segment, segments: list[Segment], static_input_indices,
                  external: int, spans: dict | None = None) -> tuple[list[list[Terms]], int, dict[str, Simulation], bool]:
    """Terms of every option at every segment position: the segment's own options, then
    the spans starting there (``spans``), in that order."""
    seg_of_pos = _segment_of_position(segments)
    by_name = {n.name: n for n in joint.gm.graph.nodes}
    bw_seg = _backward_segments(joint, seg_of_pos)
    m = len(segments)
    found: list[dict[int, list[int]]] = [dict() for _ in segments]  # option -> [F, R]
    const = external
    sims: dict[str, Simulation] = {}
    first_in = bool(prefix.options) and prefix.options[0].saves_out
    rows = [[Terms(o.own_bytes, 0, 0, o.seconds, seg.carried_bytes, o.saves_in, o.saves_out) for o in seg.options]
            for seg in segments]
    for policy in POLICIES:
        chosen = [seg.options.index(seg.option(policy) or seg.options[0]) for seg in segments]
        saved = list(prefix.options[0].saved) if prefix.options else []
        for seg, i in zip(segments, chosen):
            saved += seg.options[i].saved
        sim = simulate(joint, saved, static_input_indices, external)
        sims[policy] = sim
        per_seg = charges(rows, tuple(chosen), first_in)
        before = [0]
        for b in per_seg:
            before.append(before[-1] + b)  # before[k]: saved by segments < k
        fw_peak = [None] * m
        bw_peak = [None] * m
        current = m  # the backward starts with the last segment
        for entry in sim.timeline.entries:
            if entry.graph == "forward":
                node = by_name.get(entry.node)
                k = seg_of_pos(joint.position[node]) if node in joint.position else -1
                if k < 0:
                    const = max(const, entry.live_bytes)
                else:
                    fw_peak[k] = max(fw_peak[k] or 0, entry.live_bytes)
            elif entry.graph == "backward":
                node = by_name.get(entry.node)
                k = seg_of_pos(joint.position[node]) if node in joint.position else bw_seg.get(entry.node)
                if k is not None:
                    current = min(current, k)
                if current < 0:
                    const = max(const, entry.live_bytes)
                else:
                    c = min(current, m - 1)
                    bw_peak[c] = max(bw_peak[c] or 0, entry.live_bytes)
            else:
                const = max(const, entry.live_bytes)
        for k, i in enumerate(chosen):
            if segments[k].options[i].policy != policy:
                continue  # an option's terms come from the simulation of its own policy
            f = (fw_peak[k] - before[k]) if fw_peak[k] is not None else 0
            r = (bw_peak[k] - before[k + 1]) if bw_peak[k] is not None else 0
            old = found[k].get(i)
            found[k][i] = [f, r] if old is None else [max(old[0], f), max(old[1], r)]
    terms = []
    for k, row in enumerate(rows):
        terms.append([dataclasses.replace(t, forward=found[k].get(i, (0, 0))[0], backward=found[k].get(i, (0, 0))[1])
                      for i, t in enumerate(row)])
    for a, row in enumerate(terms):
        row.extend(span_terms(span, segments, terms) for span in (spans or {}).get(a, ()))
    return terms, const, sims, first_in


def span_terms(span, segments: list[Segment], terms: list[list[Terms]]) -> Terms:
    """A span's terms composed from its segments' measured ones. Forward: its first
    boundary tensor plus the largest ``full`` forward term of its segments. Backward: while
    segment k of the span runs backward, the span's recomputed activations of segments
    a..k are live again, as if kept: the largest over k of their ``keep`` charges plus
    segment k's ``keep`` backward term."""
    a, b, opt = span.start, span.stop, span.option
    carried = segments[a].carried_bytes
    forward = carried + max(_term(segments[k], terms[k], "full").forward for k in range(a, b))
    backward, live, prev_out = 0, 0, False
    for k in range(a, b):
        keep = _term(segments[k], terms[k], "keep")
        live += keep.saved if k == a else keep.charge(prev_out)
        prev_out = keep.saves_out
        backward = max(backward, live + keep.backward)
    return Terms(opt.own_bytes, forward, backward, opt.seconds, carried, True, opt.saves_out, b - a)


def _term(segment: Segment, row: list[Terms], policy: str) -> Terms:
    option = segment.option(policy) or segment.options[0]
    return row[segment.options.index(option)]
