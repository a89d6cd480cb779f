"""Cuts: forward positions where the backward can restart recomputation, on any graph.

A cut at position ``p`` of the forward order (between forward nodes ``p-1`` and ``p``)
is crossed by every activation made before ``p`` that a node *attributed* at or after
``p`` reads: a forward node is attributed to its own position, a backward node to the
latest position among the forward values it reads (it runs in that part's backward).
Free values cross for nothing (``JointGraph.is_free``: primals, static and input-only
values, random masks that are saved anyway). Saving a cut's crossing set lets the
backward recompute everything after the cut, up to the next saved cut, from it; the
planner always saves the crossing set of a cut it uses, which makes the pieces between
cuts independent of each other.

Before/after, for ``x1 = x0 + f(x0); x2 = x1 + g(x1)`` (a residual pair)::

    positions:  ... f ... | add | ... g ... | add | loss
    crossing:          {x0}     {x1}          {x2}

``candidate_cuts`` keeps the cheap ones: every local minimum of the crossing bytes along
the forward (a plateau of equal sets or bytes once, at its last position), thinned to
``max_cuts`` by cost. No transformer blocks, residual streams or single tensors are assumed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from torch.fx import Node

from ..analysis.cost_model import node_flops
from ..analysis.lifetimes import storage_key, storage_nbytes
from .joint import JointGraph


@dataclass(frozen=True)
class Cut:
    position: int  # forward nodes before it: joint.forward[:position]
    crossing: tuple[Node, ...]  # activations crossing it (one node per storage), forward order
    nbytes: int  # their storage bytes


def attribution(joint: JointGraph) -> dict[Node, int]:
    """Forward node -> its position; backward node -> the latest position of a non-free
    forward value it reads (backward nodes reading none are absent)."""
    out: dict[Node, int] = dict(joint.position)
    for n in joint.gm.graph.nodes:
        if n not in joint.backward:
            continue
        reads = [joint.position[a] for a in n.all_input_nodes if a in joint.position and not joint.is_free(a)]
        if reads:
            out[n] = max(reads)
    return out


def crossing_intervals(joint: JointGraph) -> dict:
    """Per storage of a non-free activation: (first position after it is made, last
    position that needs it, a representative node, bytes). It crosses the cuts at
    positions ``first .. last``."""
    att = attribution(joint)
    spans: dict = {}
    for n in joint.forward:
        if joint.is_free(n) or n.op != "call_function":
            continue
        key = storage_key(n)
        need = max((att[u] for u in n.users if u in att), default=-1)
        made = joint.position[_producer(joint, n)] + 1
        if key in spans:
            first, last, node, nbytes = spans[key]
            spans[key] = (min(first, made), max(last, need), node, nbytes)
        else:
            spans[key] = (made, need, n, storage_nbytes(n))
    return {k: v for k, v in spans.items() if v[1] >= v[0] and v[3] > 0}


def _producer(joint: JointGraph, node: Node) -> Node:
    """The node whose run makes ``node``: a multi-output op for its getitems. A getitem
    placed after its op would otherwise open a cut between the two, crossed by neither
    output (max pooling's values and indices), that nothing after it can recompute from."""
    src = node.args[0] if node.target is operator.getitem and node.args else None
    return src if isinstance(src, Node) and src in joint.position else node


def all_cuts(joint: JointGraph) -> list[Cut]:
    """The cut at every forward position 1 .. len(forward) - 1, with its crossing set."""
    n = len(joint.forward)
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for key, (first, last, node, nbytes) in crossing_intervals(joint).items():
        starts.setdefault(first, []).append((key, node, nbytes))
        ends.setdefault(last + 1, []).append(key)
    live: dict = {}
    out = []
    for p in range(1, n):
        for key, node, nbytes in starts.get(p, ()):
            live[key] = (node, nbytes)
        for key in ends.get(p, ()):
            live.pop(key, None)
        nodes = tuple(sorted((v[0] for v in live.values()), key=joint.position.__getitem__))
        out.append(Cut(p, nodes, sum(v[1] for v in live.values())))
    return out


def candidate_cuts(joint: JointGraph, max_cuts: int = 96) -> list[Cut]:
    """Cheap cuts: local minima of the crossing bytes along the forward (``_valleys``),
    less those whose set holds a nearby cut's whole set, then the ``max_cuts`` cheapest,
    in forward order. Always includes the start (position 0,
    nothing crosses) and the end (everything made, nothing left to cross)."""
    n = len(joint.forward)
    # cuts crossed by nothing before the first activation is made (weight casts, masks)
    # or after the last is consumed are the start and the end themselves: dropped, so
    # that their 0 B is no neighbour the first and last real minima are compared with
    cuts = _trim_empty_ends([c for c in all_cuts(joint) if not _inside_an_op(joint, c.position)])
    if not cuts:
        return [Cut(0, (), 0), Cut(n, (), 0)]
    keep = _valleys(joint, cuts)
    # a cut whose crossing set holds a nearby cut's whole set and more is dominated: a plan
    # recomputing from it pays for the other one's tensors anyway (inside a residual block,
    # every cut also carries the block's input)
    sets = [frozenset(storage_key(x) for x in c.crossing) for c in keep]
    reach = max(2, n // 8)
    keep = [c for i, c in enumerate(keep)
            if not any(j != i and sets[j] and abs(o.position - c.position) <= reach and sets[j] < sets[i]
                       for j, o in enumerate(keep))]
    if len(keep) > max_cuts:
        chosen = sorted(sorted(keep, key=lambda c: (c.nbytes, c.position))[:max_cuts], key=lambda c: c.position)
        keep = chosen
    return [Cut(0, (), 0)] + keep + [Cut(n, (), 0)]


def _valleys(joint: JointGraph, cuts: list[Cut]) -> list[Cut]:
    """The last cut of each run of equal crossing sets (or equal bytes) whose bytes are at
    most both neighbouring runs' (a local minimum of the crossing bytes along the
    forward). Positional windows lost real minima near a cheaper one (a ResNet's first
    stage beside its max pooling's 16 KB cut)."""
    runs: list[Cut] = []
    for c in cuts:
        # a pointwise step (x, then relu(x) or its bf16 cast) crosses a new set of the same
        # bytes: such a plateau is one run too, its last cut recomputing least; an op with
        # FLOPs in between (the next layer's matmul) ends it, as each layer of a chain of
        # equal widths has its own cut
        if runs and (runs[-1].crossing == c.crossing
                     or (runs[-1].nbytes == c.nbytes and _no_flops_between(joint, runs[-1], c))):
            runs[-1] = c
        else:
            runs.append(c)
    keep: list[Cut] = []
    for i, c in enumerate(runs):
        if (i and c.nbytes > runs[i - 1].nbytes) or (i + 1 < len(runs) and c.nbytes > runs[i + 1].nbytes):
            continue
        if keep and keep[-1].crossing == c.crossing:
            keep[-1] = c  # the same set again after a dearer run in between: its last stands
        else:
            keep.append(c)
    return keep


def _no_flops_between(joint: JointGraph, a: Cut, b: Cut) -> bool:
    return all(node_flops(n) == 0 for n in joint.forward[a.position:b.position])


def _inside_an_op(joint: JointGraph, position: int) -> bool:
    """A cut between a multi-output op and one of its getitems: the outputs are all made
    when the op runs, so such a cut is the same moment as the one after the last getitem,
    but it splits the getitems it is crossed by from the op (a fused loss's gradients then
    cross a cut as if saved, and a plan recomputing the loss head cannot)."""
    if position >= len(joint.forward):
        return False
    node = joint.forward[position]
    return _producer(joint, node) is not node


def _trim_empty_ends(cuts: list[Cut]) -> list[Cut]:
    lo, hi = 0, len(cuts)
    while lo < hi and not cuts[lo].crossing:
        lo += 1
    while hi > lo and not cuts[hi - 1].crossing:
        hi -= 1
    return cuts[lo:hi]


def crossing_bytes(cut: Cut, exclude=frozenset()) -> int:
    """Bytes of the cut's crossing storages not in ``exclude`` (storage keys)."""
    return sum(storage_nbytes(n) for n in cut.crossing if storage_key(n) not in exclude)
