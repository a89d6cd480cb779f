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
backward runs; or (``span-cheap``) from that tensor and the outputs of its expensive ops.

Each option's saved bytes (per storage), recomputed nodes and recomputation time come from
``closure`` applied to the segment alone: everything outside it counts as available, and
the members that later forward nodes read count as needed (the later segments' options
count on them), so that the options of a plan, put together, recompute what they were
charged for.
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
    keeps = []
    for j, seg in enumerate(pieces):
        members = joint.forward[seg.start:seg.stop]
        out_carried = pieces[j + 1].carried if j + 1 < len(pieces) else None
        keeps.append(_stock_option(joint, stock, members, seg.carried, out_carried, costs))
    joint.keep_needs = _keep_needs(joint, pieces, keeps)
    for j, seg in enumerate(pieces):
        members = joint.forward[seg.start:seg.stop]
        out_carried = pieces[j + 1].carried if j + 1 < len(pieces) else None
        seg.carried_bytes = bytes_of([seg.carried], joint.primal_storages) if seg.carried is not None else 0
        seg.options.append(keeps[j])
        if seg.carried is None:
            continue
        wanted = {"cheap": [seg.carried] + _expensive_saved(members, stock_saved),
                  "full": [seg.carried]}
        seen_sets = [frozenset(keeps[j].saved)]
        for policy in POLICIES[1:]:
            option = _option(joint, policy, members, wanted[policy], seg.carried, out_carried, costs, j + 1)
            key = frozenset(option.saved)
            if key in seen_sets:
                continue  # same as a cheaper-to-describe option
            seen_sets.append(key)
            seg.options.append(option)
    return prefix, segments


def _expensive_saved(members: list[Node], stock_saved: set[Node]) -> list[Node]:
    """What ``cheap`` options keep besides their input: outputs of expensive ops that the
    stock partition saves."""
    return [n for n in members if n in stock_saved and is_expensive(n)]


def _keep_needs(joint: JointGraph, pieces: list[Segment], keeps: list[Option]) -> dict[Node, int]:
    """Activations a ``keep`` option counts on without saving them: values of an earlier
    segment that the stock partition recomputes there from (it recomputes across a
    boundary: an MLP's GELU from the previous segment's cast of the matmul output). Each
    such value -> the last piece (0: the prefix) whose keep counts on it."""
    out: dict[Node, int] = {}
    for j, (seg, keep) in enumerate(zip(pieces, keeps)):
        inside = set(joint.forward[seg.start:seg.stop])
        saved = set(keep.saved)
        for n in keep.recomputed:
            for a in n.all_input_nodes:
                if a not in inside and a not in saved and a in joint.position and a not in joint.static:
                    out[a] = max(out.get(a, -1), j)
    return out


@dataclass
class Span:
    start: int  # segment indices [start, stop)
    stop: int
    option: Option  # policy "span"


def _option(joint: JointGraph, policy: str, members: list[Node], wanted: list[Node], carried: Node | None,
            out_carried: Node | None, costs: CostModel, next_piece: int) -> Option:
    """``next_piece``: the piece after the option's last segment (pieces count the prefix
    as 0)."""
    inside = set(members)
    # Values outside count as available: each segment's options provide the values of
    # theirs that the backward reads. But a later segment's ``keep`` may count on a value
    # of this one without saving it (``_keep_needs``); this option must then provide it,
    # as if the backward read it. Without that, the plan's closure recomputes what no
    # option was charged for (on the H200, four matmuls of an MLP plan priced at 0.3 ms).
    needed = [n for n in members if joint.keep_needs.get(n, -1) >= next_piece]
    local = closure(joint, set(wanted) | (set(joint.forward) - inside), needed)
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


def build_spans(joint: JointGraph, segments: list[Segment], costs: CostModel, max_len: int = MAX_SPAN,
                stock_saved: set[Node] | None = None) -> dict[int, list[Span]]:
    """Spans by their first segment, two kinds: ``span`` recomputes everything in it from
    its first boundary tensor; ``span-cheap`` also saves the outputs of expensive ops the
    stock partition saves there (``cheap`` over several segments: where the boundaries fall
    between a matmul and the pointwise ops after it, as in an MLP under autocast, only a
    span can leave the matmul's bf16 input to be recomputed from the previous matmul's
    output). A ``span-cheap`` that saves nothing more than the ``span`` is left out."""
    out: dict[int, list[Span]] = {}
    for a, first in enumerate(segments):
        for b in range(a + 2, min(a + max_len, len(segments)) + 1):
            members = joint.forward[first.start:segments[b - 1].stop]
            out_carried = segments[b].carried if b < len(segments) else None
            expensive = _expensive_saved(members, stock_saved or set())
            for policy, wanted in (("span", [first.carried]), ("span-cheap", [first.carried] + expensive)):
                if policy == "span-cheap" and not expensive:
                    continue
                option = _option(joint, policy, members, wanted, first.carried, out_carried, costs, b + 1)
                option.length = b - a
                out.setdefault(a, []).append(Span(a, b, option))
    return out


def options_by_position(segments: list[Segment], spans: dict[int, list[Span]]) -> list[list[Option]]:
    """Every option starting at each segment: the segment's own, then its spans (the order
    the peak model's terms and the solver's choices index)."""
    return [seg.options + [sp.option for sp in spans.get(k, ())] for k, seg in enumerate(segments)]
