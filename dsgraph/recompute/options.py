"""What an interval between two cuts can save, and what that costs in recomputation.

The forward between two chosen cuts ``a < b`` (an *interval*) takes one of these options;
the crossing sets of both cuts are saved whatever the option (``cuts``), so an interval's
backward reads nothing from other intervals but what their cuts hold:

- ``keep``: what the stock partition (Inductor's min-cut) saves there;
- ``cheap``: the outputs of ops with FLOPs (matmuls, convolutions, attention) the stock
  partition saves there, and the row statistics it saves (a looped reduction's result, or
  a pointwise op of one no larger: the softmax's row maximum and log-sum, a few KiB that
  take a pass over the logits to recompute); the cheap ops between them are recomputed (a
  min-cut that weighs bytes against FLOPs, at its FLOP-heavy end);
- ``recompute``: nothing; the backward recomputes the interval from cut ``a``.

Random values are saved whatever the option (``closure``). Each option's recomputation
time is the cost of what ``closure`` recomputes inside the interval when the rest of the
forward is available (``CostModel``, fused as Inductor runs it, or node by node as FX
runs it).

Before/after, for an interval holding ``h = gelu(x @ w)``::

    keep:       saves x@w (and whatever stock saves)      recomputes gelu
    cheap:      saves x@w                                  recomputes gelu
    recompute:  saves nothing (x is the cut's)             recomputes x@w, gelu
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import Node

from ..analysis.cost_model import CostModel, node_flops
from ..analysis.lifetimes import bytes_of, is_view, storage_key
from .cuts import Cut
from .joint import JointGraph
from .partition import closure

POLICIES = ("keep", "cheap", "recompute")


@dataclass
class Option:
    policy: str
    start: int  # cut indices [start, stop)
    stop: int
    inner: list[Node]  # what the option saves inside the interval, besides the cut sets
    recomputed: list[Node] = field(default_factory=list)
    seconds: float = 0.0
    flops: int = 0

    @property
    def length(self) -> int:
        return self.stop - self.start


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


class Intervals:
    """Options of every interval of up to ``max_len`` consecutive cuts."""

    def __init__(self, joint: JointGraph, cuts: list[Cut], stock_saved: set[Node], costs: CostModel,
                 held: set[Node], fused: bool = True, max_len: int = 4):
        self.joint = joint
        self.cuts = cuts
        self.stock = stock_saved
        self.costs = costs
        self.held = held
        self.fused = fused
        self.max_len = max_len
        forward = joint.forward
        self.members = [forward[cuts[k].position:cuts[k + 1].position] for k in range(len(cuts) - 1)]
        self._options: dict[tuple[str, int, int], Option] = {}

    @property
    def segments(self) -> int:
        return len(self.cuts) - 1

    def nodes(self, start: int, stop: int) -> list[Node]:
        return [n for k in range(start, stop) for n in self.members[k]]

    def option(self, policy: str, start: int, stop: int) -> Option:
        key = (policy, start, stop)
        if key not in self._options:
            self._options[key] = self._make(policy, start, stop)
        return self._options[key]

    def _make(self, policy: str, start: int, stop: int) -> Option:
        inside = self.nodes(start, stop)
        # random values are saved by ``closure`` when they cannot be drawn again, not by
        # the stock partition's choice (its masks, where the backward can draw them again
        # from their seeds through Inductor)
        stock = [n for n in inside if n in self.stock and n not in self.joint.random]
        if policy == "keep":
            inner = stock
        elif policy == "cheap":
            inner = [n for n in stock if is_expensive(n) or self._row_statistic(n)]
        else:
            inner = []
        option = Option(policy, start, stop, inner)
        inside_set = set(inside)
        available = set(self.joint.forward) - inside_set
        ends = set(self.cuts[start].crossing) | set(self.cuts[stop].crossing)
        local = closure(self.joint, set(inner) | ends | available)
        option.recomputed = [n for n in local.recomputed if n in inside_set]
        option.flops = sum(self.costs.costs[n].flops for n in option.recomputed)
        option.seconds = (self.costs.fused_seconds(option.recomputed, self.held) if self.fused
                          else self.costs.seconds(option.recomputed))
        return option

    def _row_statistic(self, node: Node, depth: int = 4) -> bool:
        """A looped reduction's result, or a pointwise op of one no larger (the softmax's row
        maximum and log-sum): bytes a row's worth smaller than the pass over the row that
        recomputing it takes (``CostModel.looped``), so ``cheap`` saves it as well."""
        size = bytes_of([node])
        for _ in range(depth):
            if node in self.costs.looped:
                return size <= bytes_of([node])
            inputs = [a for a in node.all_input_nodes if a.op == "call_function"]
            if len(inputs) != 1:
                return False
            node = inputs[0]
        return False

    def saved_of(self, plan: list[Option]) -> list[Node]:
        """What a plan (options covering every segment, in order) saves, before
        ``closure`` adds the primals and random values the backward needs."""
        saved: list[Node] = []
        for option in plan:
            saved += self.cuts[option.start].crossing
            saved += option.inner
        return list(dict.fromkeys(saved))

    def charge(self, option: Option) -> int:
        """Bytes an option adds to what earlier options save: its inner values and what
        crosses its end cut but not its start cut (made inside it), each storage once."""
        exclude = self.joint.primal_storages | {storage_key(n) for n in self.cuts[option.start].crossing}
        new = list(self.cuts[option.stop].crossing) + option.inner
        return bytes_of([n for n in new if not self.joint.is_free(n) or n in self.stock], exclude)
