"""Partition a joint graph given the activations to save; the rest is recomputed in backward.

``closure`` says what a choice of saved activations implies: which forward nodes the
backward recomputes, which primals it reads, and which random nodes must be saved even so
(they are never recomputed). ``partition`` builds the forward and backward graphs with
torch's own extraction (the same one Inductor's min-cut partitioner ends with), so the
graphs differ from stock only in what is saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch.fx import GraphModule, Node

from .. import compat
from ..analysis.lifetimes import storage_nbytes
from ..analysis.step import saved_names  # noqa: F401  (re-exported: the planner's modules use it)
from .joint import JointGraph
from .light_forward import lighten_forward


@dataclass
class Closure:
    saved: list[Node]  # every forward value the backward receives, primals included, graph order
    recomputed: list[Node]  # forward nodes the backward computes again, graph order
    forced: list[Node]  # random nodes saved because they cannot be recomputed


def closure(joint: JointGraph, saved: Iterable[Node], also_needed: Iterable[Node] = ()) -> Closure:
    """What the backward needs when it receives exactly ``saved`` (plus primals and tangents).
    ``also_needed``: forward values the backward must have besides those it reads itself
    (a segment's option provides the values later segments recompute from)."""
    keep = set(saved)
    recomputed: set[Node] = set()
    forced: set[Node] = set()
    primals_needed: set[Node] = set()
    stack = list(joint.backward_reads) + list(also_needed)
    seen: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            if n not in joint.tangents:
                primals_needed.add(n)
            continue
        if n.op != "call_function" or n in keep:
            continue
        if n in joint.random and _save_random(joint, n):
            forced.add(n)  # a multi-output random op is reached through its (random) getitems
            continue
        recomputed.add(n)
        stack.extend(n.all_input_nodes)
    order = joint.order
    everything = sorted(keep | forced | primals_needed, key=order.__getitem__)
    # a kept node nothing in the backward reaches is not sent (it would only cost memory)
    reached = seen
    everything = [n for n in everything if n in reached]
    return Closure(everything, sorted(recomputed, key=order.__getitem__), sorted(forced, key=order.__getitem__))


def _save_random(joint: JointGraph, node: Node) -> bool:
    """Save this random node, or recompute it from its random inputs? Unreproducible ones
    are saved. Otherwise the smaller is saved: dropout's bool mask rather than the float
    random numbers it compares, but the mask rather than the float scale made from it. A
    reproducible input counts with what the backward holds to recompute it (Inductor's
    numbers from their seed: the mask is recomputed from the seed's 8 bytes)."""
    if node in joint.unreproducible:
        return True
    mine = storage_nbytes(node)
    for a in node.all_input_nodes:
        if a in joint.random:
            if not isinstance(a.meta.get("val"), torch.Tensor):
                return True  # an element of a multi-output random op (native_dropout's mask)
            theirs = _held_for(joint, a, {})
            if mine > theirs or (mine == theirs and a not in joint.unreproducible):
                return False
    return True


def _held_for(joint: JointGraph, node: Node, memo: dict) -> int:
    """Bytes the backward holds to have this random value: its own when it is saved, else
    what its random inputs need."""
    if node not in memo:
        mine = storage_nbytes(node)
        memo[node] = mine
        if node not in joint.unreproducible and not _save_random(joint, node):
            memo[node] = min(mine, sum(_held_for(joint, a, memo) for a in node.all_input_nodes if a in joint.random))
    return memo[node]


def partition(joint: JointGraph, saved: Iterable[Node], static_input_indices) -> tuple[GraphModule, GraphModule]:
    """Forward and backward modules of ``joint.gm`` that pass exactly ``saved`` between them
    (extended by ``closure``: primals the backward reads, random nodes it cannot recompute).
    Recomputation in the backward runs just before it is needed (``sink_recomputation``)."""
    plan = closure(joint, saved)
    fw, bw = compat.extract_partition(joint.gm, plan.saved, joint.num_fwd_outputs, static_input_indices)
    # the backward's copies of recomputed nodes keep their joint names: tag them, so that
    # later passes know what the planner chose to recompute (lower_triton's select=tagged)
    recomputed = {n.name for n in plan.recomputed}
    for n in bw.graph.nodes:
        if n.name in recomputed:
            n.meta["dsgraph_recomputed"] = True
    sink_recomputation(bw)
    lighten_forward(fw)
    return fw, bw


def sink_recomputation(bw: GraphModule) -> int:
    """Move each node of the backward that reads no tangent (recomputed forward values,
    constants) to just before its first user, so that a segment is recomputed when its
    backward runs, not all segments at the start of the backward. Order only: arithmetic
    is unchanged. Returns how many nodes moved."""
    nodes = list(bw.graph.nodes)
    gap = 1 << 20
    pos = {n: i * gap for i, n in enumerate(nodes)}
    tangent_side = {n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")}
    for n in nodes:
        if n.op == "call_function" and any(a in tangent_side for a in n.all_input_nodes):
            tangent_side.add(n)
    moved = 0
    for n in reversed(nodes):
        if n.op != "call_function" or n in tangent_side or not n.users or n.is_impure():
            continue
        first = min(n.users, key=pos.__getitem__)
        if first.op == "output" or first.prev is n:
            continue
        before = first.prev
        first.prepend(n)
        low = pos[before] if before in pos else pos[first] - gap
        if pos[first] - low < 2:  # no integer left between them: renumber the graph
            pos = {x: i * gap for i, x in enumerate(bw.graph.nodes)}
        else:
            pos[n] = (low + pos[first]) // 2
        moved += 1
    if moved:
        bw.graph.lint()
        bw.recompile()
    return moved
