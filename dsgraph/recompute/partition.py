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

from torch.fx import GraphModule, Node

from .. import compat
from .joint import JointGraph


@dataclass
class Closure:
    saved: list[Node]  # every forward value the backward receives, primals included, graph order
    recomputed: list[Node]  # forward nodes the backward computes again, graph order
    forced: list[Node]  # random nodes saved because they cannot be recomputed


def closure(joint: JointGraph, saved: Iterable[Node]) -> Closure:
    """What the backward needs when it receives exactly ``saved`` (plus primals and tangents)."""
    keep = set(saved)
    recomputed: set[Node] = set()
    forced: set[Node] = set()
    primals_needed: set[Node] = set()
    stack = list(joint.backward_reads)
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
        if n in joint.random:
            forced.add(n)  # a multi-output random op is reached through its (random) getitems
            continue
        recomputed.add(n)
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
    everything = sorted(keep | forced | primals_needed, key=order.__getitem__)
    # a kept node nothing in the backward reaches is not sent (it would only cost memory)
    reached = seen
    everything = [n for n in everything if n in reached]
    return Closure(everything, sorted(recomputed, key=order.__getitem__), sorted(forced, key=order.__getitem__))


def partition(joint: JointGraph, saved: Iterable[Node], static_input_indices) -> tuple[GraphModule, GraphModule]:
    """Forward and backward modules of ``joint.gm`` that pass exactly ``saved`` between them
    (extended by ``closure``: primals the backward reads, random nodes it cannot recompute)."""
    plan = closure(joint, saved)
    return compat.extract_partition(joint.gm, plan.saved, joint.num_fwd_outputs, static_input_indices)
