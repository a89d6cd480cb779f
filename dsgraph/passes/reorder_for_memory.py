"""reorder_for_memory: reorder nodes to lower the graph's predicted peak.

A list scheduler over the data dependencies: among the nodes whose inputs are ready it
runs next the one that adds the fewest live bytes (bytes it allocates minus bytes of the
storages it is the last reader of), ties broken by the original order. That consumes saved
activations early in a backward, frees early and allocates late. Before/after::

    a = x.exp(); b = x.sin(); c = x.cos()        a = x.exp(); sa = a.sum()
    sa = a.sum(); sb = b.sum(); sc = c.sum()  ->  b = x.sin(); sb = b.sum() ...
    (three big temporaries live at once)          (one at a time)

What never moves relative to each other: nodes with side effects (mutations, collectives,
anything not a plain aten op), random ops (so random streams are drawn in the same order),
and the readers of a storage relative to a mutation of that storage. The new order is kept
only if its predicted peak (``TensorLifetimes``) is lower; otherwise the graph is left
untouched. Arithmetic is unchanged: gradients stay bitwise equal.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.analysis.sweep import live_per_step
from dsgraph.analysis.ops import is_mutating, is_random, written_args
from dsgraph.pass_api import PassContext, PassResult, PassSpec

SPEC = PassSpec(
    name="reorder_for_memory",
    handles_mutation=True,  # storage-aware: views and in-place ops are understood
    stages=("forward", "backward", "inference"),
    reads=("TensorLifetimes",),
    doc="reorders nodes to lower the predicted peak",
)


@dataclass
class ReorderPlan:
    order: list[str]  # names of the movable nodes, in their new order
    peak_before: int
    peak_after: int
    moved: int  # nodes whose position changed

    @property
    def improves(self) -> bool:
        return self.peak_after < self.peak_before

    def __str__(self) -> str:
        return (f"ReorderPlan(peak {self.peak_before} -> {self.peak_after} bytes, "
                f"{self.moved} of {len(self.order)} nodes moved)")


def _is_ordered(node: Node) -> bool:
    """Nodes that keep their relative order: side effects, randomness, collectives, unknowns."""
    target = node.target
    if node.op != "call_function":
        return node.op != "get_attr"
    if target is operator.getitem:
        return False
    if not compat.is_op(target):
        return True  # higher-order ops and Python callables: assume the worst
    if is_mutating(node) or is_random(node):
        return True
    return target.namespace in ("_c10d_functional", "c10d_functional", "_dtensor", "prims_collectives")


def _dependencies(lifetimes: TensorLifetimes, movable: list[Node]) -> dict[Node, set[Node]]:
    position = {n: i for i, n in enumerate(movable)}
    deps: dict[Node, set[Node]] = {n: {m for m in n.all_input_nodes if m in position} for n in movable}
    previous_ordered = None
    for n in movable:
        if _is_ordered(n):
            if previous_ordered is not None:
                deps[n].add(previous_ordered)
            previous_ordered = n
    # a mutation stays after every earlier reader of its storage and before every later one
    readers: dict[int, list[Node]] = {}
    for n in movable:
        for m in n.all_input_nodes:
            s = lifetimes.storage_of.get(m)
            if s is not None:
                readers.setdefault(s.id, []).append(n)
    for n in movable:
        for arg in written_args(n):
            s = lifetimes.storage_of.get(arg)
            if s is None:
                continue
            for r in readers.get(s.id, []):
                if r is n:
                    continue
                if position[r] < position[n]:
                    deps[n].add(r)
                else:
                    deps[r].add(n)
    return deps


def plan_reorder(gm: GraphModule, lifetimes: TensorLifetimes) -> ReorderPlan:
    nodes = lifetimes.nodes
    movable = [n for n in nodes if n.op not in ("placeholder", "output")]
    deps = _dependencies(lifetimes, movable)
    users: dict[Node, list[Node]] = {n: [] for n in movable}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    # storages each node reads, and how many unscheduled readers each storage has
    reads: dict[Node, set[int]] = {}
    remaining: dict[int, int] = {}
    for n in movable:
        ids = {lifetimes.storage_of[m].id for m in n.all_input_nodes if m in lifetimes.storage_of}
        reads[n] = ids
        for sid in ids:
            remaining[sid] = remaining.get(sid, 0) + 1
    storages = lifetimes.storages
    freeable = {s.id for s in storages if not s.is_output and not (s.is_input and s.held)}
    index = {n: i for i, n in enumerate(movable)}

    def score(n: Node) -> int:
        frees = sum(storages[sid].nbytes for sid in reads[n] if remaining[sid] == 1 and sid in freeable)
        return lifetimes.allocated_by(n) - frees

    waiting = {n: len(ds) for n, ds in deps.items()}
    version = {n: 0 for n in movable}
    heap = [(score(n), index[n], 0, n) for n in movable if waiting[n] == 0]
    heapq.heapify(heap)
    ready = {n for n in movable if waiting[n] == 0}
    readers_of: dict[int, list[Node]] = {}
    for n in movable:
        for sid in reads[n]:
            readers_of.setdefault(sid, []).append(n)
    order: list[Node] = []
    done: set[Node] = set()
    while heap:
        _, _, v, n = heapq.heappop(heap)
        if n in done or v != version[n]:
            continue
        done.add(n)
        ready.discard(n)
        order.append(n)
        for sid in reads[n]:
            remaining[sid] -= 1
            if remaining[sid] == 1:  # its last reader now frees it: rescore that reader
                for r in readers_of[sid]:
                    if r in ready and r not in done:
                        version[r] += 1
                        heapq.heappush(heap, (score(r), index[r], version[r], r))
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.add(u)
                heapq.heappush(heap, (score(u), index[u], version[u], u))
    assert len(order) == len(movable), "dependency cycle in reorder_for_memory"
    peak_before = lifetimes.peak()[0]
    peak_after = _peak_of_order(gm, lifetimes, order)
    moved = sum(1 for a, b in zip(order, movable) if a is not b)
    return ReorderPlan([n.name for n in order], peak_before, peak_after, moved)


def _peak_of_order(gm: GraphModule, lifetimes: TensorLifetimes, order: list[Node]) -> int:
    """Peak live bytes if the movable nodes ran in ``order`` (same storages, new indices)."""
    head = [n for n in lifetimes.nodes if n.op == "placeholder"]
    sequence = head + order + [gm.graph.output_node()]
    position = {n: i for i, n in enumerate(sequence)}
    n_total = len(sequence)
    intervals = []
    for s in lifetimes.storages:
        start = 0 if s.is_input else position[s.root]
        if s.is_output or (s.is_input and s.held):
            stop = n_total - 1
        else:
            readers = [position[u] for m in s.members for u in m.users if u in position]
            if s.index is not None:  # an element of a multi-output node: its tuple holds it
                readers += [position[u] for u in s.root.users if u in position]
            stop = max(readers, default=start)
        intervals.append((start, stop, s.nbytes))
    return max(live_per_step(n_total, intervals), default=0)


def apply_reorder(gm: GraphModule, plan: ReorderPlan) -> GraphModule:
    by_name = {n.name: n for n in gm.graph.nodes}
    cursor = [n for n in gm.graph.nodes if n.op == "placeholder"][-1] if any(
        n.op == "placeholder" for n in gm.graph.nodes) else None
    for name in plan.order:
        node = by_name[name]
        if cursor is None:
            gm.graph.output_node().prepend(node)
        else:
            cursor.append(node)
        cursor = node
    return gm


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    lifetimes: TensorLifetimes = ctx.analysis(TensorLifetimes)
    plan = plan_reorder(gm, lifetimes)
    stats = {"peak_before_bytes": plan.peak_before, "peak_after_bytes": plan.peak_after, "moved": plan.moved}
    if not plan.improves or plan.moved == 0:
        stats["peak_after_bytes"] = plan.peak_before
        stats["moved"] = 0
        return PassResult(gm, changed=False, stats=stats)
    return PassResult(apply_reorder(gm, plan), changed=True, stats=stats)

