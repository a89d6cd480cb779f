"""Segments of the forward between boundaries, and what each can save or recompute.

A segment is the forward between two consecutive boundaries (``JointGraph.boundaries``).
Each segment gets up to three options:

- ``keep``: save what the stock partition (Inductor's min-cut) saves there;
- ``cheap``: save the segment's input and the outputs of expensive ops (matmuls,
  attention: nodes with FLOPs) the stock partition saves; recompute the cheap ops
  (pointwise, normalisations) from them in backward;
- ``full``: save only the segment's input; recompute the whole segment.

A *span* of 2 to ``MAX_SPAN`` consecutive segments can also be recomputed from the tensor
entering its first segment alone (classic checkpointing with coarser boundaries): fewer
tensors saved, more recomputed, and all of the span's activations live again while its
backward runs.

Each option's saved bytes (per storage), recomputed nodes and recomputation time come from
``closure`` applied to the segment alone (everything outside it counts as available).
A saved node is charged to the option that saves it, except the boundary tensors: the
tensor entering segment k is charged once, to segment k, when segment k's option or
segment k-1's saves it (``Terms.charge``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import Node

from ..analysis.cost_model import CostModel, node_flops
from ..analysis.lifetimes import bytes_of, is_view, storage_key
from .joint import JointGraph
from .partition import closure

POLICIES = ("keep", "cheap", "full")
MAX_SPAN = 4  # longest run of segments recomputed from one boundary tensor


@dataclass
class Option:
    policy: str
    saved: list[Node]  # activations this option saves (random nodes included), graph order
    saved_bytes: int  # all of them (primal views excluded)
    recomputed: list[Node]
    seconds: float  # recomputation time, CostModel
    flops: int
    own_bytes: int = 0  # saved bytes besides the boundary tensors at the segment's two ends
    saves_in: bool = False  # saves the tensor entering the segment
    saves_out: bool = False  # saves the tensor entering the next segment
    length: int = 1  # segments covered (more than one: a span)


@dataclass
class Segment:
    index: int
    start: int  # forward positions [start, stop)
    stop: int
    carried: Node | None  # the tensor entering the segment (None: the prefix)
    options: list[Option] = field(default_factory=list)
    carried_bytes: int = 0

    def option(self, policy: str) -> Option | None:
        return next((o for o in self.options if o.policy == policy), None)


def is_expensive(node: Node) -> bool:
    """Computed by an op with FLOPs (a matmul, attention), seen through getitems and views."""
    seen = 0
    while node is not None and seen < 16:
        if node_flops(node) > 0:
            return True
        if node.op != "call_function" or not node.all_input_nodes:
            return False
        if is_view(node):
            node = node.all_input_nodes[0]
            seen += 1
            continue
        return False
    return False


def build_segments(joint: JointGraph, stock_saved: set[Node], costs: CostModel) -> tuple[Segment, list[Segment]]:
    """The prefix (before the first boundary, always ``keep``) and the segments."""
    bounds = joint.boundaries
    cuts = [0] + [pos for pos, _ in bounds] + [len(joint.forward)]
    carried = [None] + [node for _, node in bounds]
    pieces = []
    for i in range(len(cuts) - 1):
        if cuts[i + 1] > cuts[i]:
            pieces.append(Segment(i - 1, cuts[i], cuts[i + 1], carried[i]))
    prefix = pieces[0] if pieces and pieces[0].carried is None else Segment(-1, 0, 0, None)
    segments = [p for p in pieces if p.carried is not None]
    for k, seg in enumerate(segments):
        seg.index = k
    pieces = [prefix] + segments
    # ``keep`` is the stock partition seen segment by segment: what it saves and what it
    # recomputes there, taken from the whole graph's closure (the stock partition may
    # recompute across a boundary, e.g. an fp32 upcast of the logits from their bf16 matmul)
    stock = closure(joint, stock_saved)
    for j, seg in enumerate(pieces):
        members = joint.forward[seg.start:seg.stop]
        out_carried = pieces[j + 1].carried if j + 1 < len(pieces) else None
        seg.carried_bytes = bytes_of([seg.carried], joint.primal_storages) if seg.carried is not None else 0
        wanted = {"keep": [n for n in members if n in stock_saved]}
        if seg.carried is not None:
            wanted["cheap"] = [seg.carried] + [n for n in members if n in stock_saved and is_expensive(n)]
            wanted["full"] = [seg.carried]
        seen_sets = []
        for policy in POLICIES:
            if policy not in wanted:
                continue
            if policy == "keep":
                option = _stock_option(joint, stock, members, seg.carried, out_carried, costs)
            else:
                option = _option(joint, policy, members, wanted[policy], seg.carried, out_carried, costs)
            key = frozenset(option.saved)
            if key in seen_sets:
                continue  # same as a cheaper-to-describe option
            seen_sets.append(key)
            seg.options.append(option)
    return prefix, segments


@dataclass
class Span:
    start: int  # segment indices [start, stop)
    stop: int
    option: Option  # policy "span"


def _option(joint: JointGraph, policy: str, members: list[Node], wanted: list[Node], carried: Node | None,
            out_carried: Node | None, costs: CostModel) -> Option:
    inside = set(members)
    local = closure(joint, set(wanted) | (set(joint.forward) - inside))
    saved = [n for n in local.saved if (n in inside or n is carried) and n.op != "placeholder"]
    recomputed = [n for n in local.recomputed if n in inside]
    return _make_option(joint, policy, saved, recomputed, carried, out_carried, costs)


def _stock_option(joint: JointGraph, stock, members: list[Node], carried: Node | None,
                  out_carried: Node | None, costs: CostModel) -> Option:
    inside = set(members)
    saved = [n for n in stock.saved if (n in inside or n is carried) and n.op != "placeholder"]
    recomputed = [n for n in stock.recomputed if n in inside]
    return _make_option(joint, "keep", saved, recomputed, carried, out_carried, costs)


def _make_option(joint: JointGraph, policy: str, saved: list[Node], recomputed: list[Node], carried: Node | None,
                 out_carried: Node | None, costs: CostModel) -> Option:
    ends = {carried, out_carried} - {None}
    return Option(
        policy, saved, bytes_of(saved, joint.primal_storages), recomputed, costs.fused_seconds(recomputed, joint.held),
        sum(costs.costs[n].flops for n in recomputed),
        own_bytes=bytes_of([n for n in saved if n not in ends], joint.primal_storages | {storage_key(n) for n in ends}),
        saves_in=carried is not None and carried in saved,
        saves_out=out_carried is not None and out_carried in saved,
    )


def build_spans(joint: JointGraph, segments: list[Segment], costs: CostModel, max_len: int = MAX_SPAN) -> dict[int, list[Span]]:
    """Spans by their first segment: each recomputed in backward from its first boundary tensor."""
    out: dict[int, list[Span]] = {}
    for a, first in enumerate(segments):
        for b in range(a + 2, min(a + max_len, len(segments)) + 1):
            members = joint.forward[first.start:segments[b - 1].stop]
            out_carried = segments[b].carried if b < len(segments) else None
            option = _option(joint, "span", members, [first.carried], first.carried, out_carried, costs)
            option.length = b - a
            out.setdefault(a, []).append(Span(a, b, option))
    return out


def options_by_position(segments: list[Segment], spans: dict[int, list[Span]]) -> list[list[Option]]:
    """Every option starting at each segment: the segment's own, then its spans (the order
    the peak model's terms and the solver's choices index)."""
    return [seg.options + [sp.option for sp in spans.get(k, ())] for k, seg in enumerate(segments)]
