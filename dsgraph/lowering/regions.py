"""Regions of an aten graph that one Triton kernel can compute.

A region is a set of supported nodes (``op_table.classify``) joined along producer ->
consumer edges, over one iteration space: a *full* shape F whose last dimension N may be
reduced. Every member is *full* (shape F), a *row* value (shape F[:-1] + [1], what a
keepdim reduction gives) or a *rownk* value (shape F[:-1], a reduction without keepdim)::

    var_mean(x, [2], keepdim=True) -> getitem (var, row), getitem_1 (mean, row)
    add(getitem, 1e-5) -> rsqrt          row values: computed once per row
    sub(x, getitem_1) -> mul(sub, rsqrt) -> mul(w) -> add(b)        full values

is one region (layer norm): F = x.shape; outputs ``getitem_1``, ``rsqrt`` and the final add.

Regions are grown greedily in graph order, a node joining the regions of its producers
when the result is still valid:

- one iteration space (reductions over the same F; members full, row or rownk of it; a
  full op reads full or row members, a row op row members, a reduction a full one);
- convex: no path leaves the region and comes back (the region becomes one node);
- no side effect inside its span: between its first and last member no node outside it
  mutates, draws random numbers or is otherwise effectful, so the fused node can take the
  place of the last member and the pure nodes between that read its outputs move after it;
- a ``copy_(dst, src)`` member (a gradient-pool slot written by the kernel) has no users,
  and nothing outside the region reads ``dst`` inside the span.

An unsupported op ends a region; nothing here fails on an unknown op. Which regions are
lowered is the caller's choice (``SELECTORS``): those holding a node dsgraph's passes
produced (tagged), every region ("all"), or those recomputing forward values in a backward.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat

from .op_table import OpMatch, classify

# node.meta keys that mark nodes a dsgraph pass produced (set by the passes that make them)
TAGS = ("dsgraph_recomputed", "dsgraph_pool_epilogue")
# placeholders through which the grad_pool pass hands the pool's slots to the backward
POOL_SLOT_PREFIX = "dsgraph_grad_"


def _val(node):
    return node.meta.get("val") if isinstance(node, Node) else None


def _shape(node: Node) -> tuple | None:
    val = _val(node)
    if isinstance(val, torch.Tensor):
        return tuple(val.shape)
    if isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return tuple(val[0].shape)  # var_mean: both outputs have one shape
    return None


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(compat.statically_equal(x, y) for x, y in zip(a, b))


@dataclass
class Region:
    nodes: list[Node]  # graph order
    matches: dict[Node, OpMatch]
    full_shape: tuple  # F (ints or SymInts)
    space: dict[Node, str]  # "full", "row", "rownk"
    inputs: list[Node] = field(default_factory=list)  # external tensors and SymInt scalars, first use first
    outputs: list[Node] = field(default_factory=list)  # members read outside the region, graph order
    writes: list[Node] = field(default_factory=list)  # copy_ members: the kernel stores into their dst

    @property
    def has_reduction(self) -> bool:
        return any(m.kind == "reduction" for m in self.matches.values())

    @property
    def kind(self) -> str:
        return "reduction" if self.has_reduction else "pointwise"

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def __str__(self) -> str:
        shape = "x".join(str(s) for s in self.full_shape) or "scalar"
        return (f"{self.kind} region over [{shape}]: {', '.join(self.names)}; inputs "
                f"{[n.name for n in self.inputs]}, outputs {[n.name for n in self.outputs]}"
                + (f", writes {[w.args[0].name for w in self.writes]}" if self.writes else ""))


@dataclass(frozen=True)
class _Domain:
    full_shape: tuple
    space: dict


def _domain(nodes: set[Node], matches: dict[Node, OpMatch]) -> _Domain | None:
    """The iteration space of a candidate region, or None when its members do not share one."""
    reductions = [n for n in nodes if matches[n].kind == "reduction"]
    if reductions:
        full = _shape(matches[reductions[0]].operands[0])
        if full is None or not full or any(not same_shape(_shape(matches[r].operands[0]), full) for r in reductions):
            return None
    else:
        first = min(nodes, key=lambda n: n.name)  # any member: all must agree
        full = _shape(matches[first].operands[1]) if matches[first].kind == "copy" else _shape(first)
        if full is None:
            return None
    row = full[:-1] + (1,) if full else None
    rownk = full[:-1] if full else None
    space: dict[Node, str] = {}
    for n in nodes:
        m = matches[n]
        if m.kind == "reduction":
            space[n] = "row" if m.keepdim else "rownk"
            continue
        if m.kind == "getitem":
            producer = matches.get(m.operands[0])
            if producer is None or m.operands[0] not in nodes:
                return None
            space[n] = "row" if producer.keepdim else "rownk"
            continue
        shape = _shape(m.operands[1]) if m.kind == "copy" else _shape(n)
        if shape is None:
            return None
        if same_shape(shape, full):
            space[n] = "full"
        elif reductions and same_shape(shape, row):
            space[n] = "row"
        elif reductions and same_shape(shape, rownk):
            space[n] = "rownk"
        else:
            return None
        if m.kind == "copy" and (space[n] != "full" or not same_shape(_shape(m.operands[0]), full)
                                 or m.operands[1] not in nodes):
            return None  # a write is fused with the op computing what it writes, or not lowered
    allowed = {"full": ("full", "row"), "row": ("row",), "rownk": ("rownk",)}
    for n in nodes:
        m = matches[n]
        if m.kind == "getitem":
            continue
        for x in m.operands:
            if not isinstance(x, Node):
                continue
            if x in nodes:
                if m.kind in ("reduction", "copy"):
                    ok = space[x] == "full"
                else:
                    ok = space[x] in allowed[space[n]]
                if not ok:
                    return None
            elif isinstance(_val(x), torch.Tensor):
                # a row value without keepdim does not broadcast against full ones the
                # way the row index does: only 0-d tensors meet it from outside
                if space[n] == "rownk" and m.kind == "pointwise" and _val(x).dim() != 0:
                    return None
                if m.kind == "reduction" and not same_shape(_shape(x), full):
                    return None
    return _Domain(full, space)


class _Grower:
    """Greedy region growth over one graph (positions, side effects, candidate checks)."""

    def __init__(self, gm: GraphModule):
        self.nodes = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.matches: dict[Node, OpMatch] = {}
        for n in self.nodes:
            m = classify(n)
            if m is not None:
                self.matches[n] = m
        self.effectful = [self.pos[n] for n in self.nodes if compat.has_side_effects(n)]

    def convex(self, cand: set[Node]) -> bool:
        hi = max(self.pos[n] for n in cand)
        frontier = [u for n in cand for u in n.users if u not in cand and self.pos[u] < hi]
        seen: set[Node] = set()
        while frontier:
            u = frontier.pop()
            if u in seen:
                continue
            seen.add(u)
            for w in u.users:
                if w in cand:
                    return False
                if self.pos[w] < hi:
                    frontier.append(w)
        return True

    def span_pure(self, cand: set[Node]) -> bool:
        lo = min(self.pos[n] for n in cand)
        hi = max(self.pos[n] for n in cand)
        i = bisect.bisect_left(self.effectful, lo)
        while i < len(self.effectful) and self.effectful[i] <= hi:
            if self.nodes[self.effectful[i]] not in cand:
                return False
            i += 1
        return True

    def writes_ok(self, cand: set[Node]) -> bool:
        lo = min(self.pos[n] for n in cand)
        hi = max(self.pos[n] for n in cand)
        dsts = set()
        for n in cand:
            if self.matches[n].kind != "copy":
                continue
            dst = n.args[0]
            if n.users or dst in cand or dst in dsts:
                return False
            dsts.add(dst)
            # every alias of dst (views of views ...), and who reads them inside the span
            aliases, stack = {dst}, [dst]
            while stack:
                for u in stack.pop().users:
                    if u not in aliases and compat.returns_alias(u):
                        aliases.add(u)
                        stack.append(u)
            for a in aliases:
                for u in a.users:
                    if u not in cand and lo <= self.pos[u] <= hi:
                        return False
        return True

    def valid(self, cand: set[Node]) -> _Domain | None:
        domain = _domain(cand, self.matches)
        if domain is None or not self.convex(cand) or not self.span_pure(cand) or not self.writes_ok(cand):
            return None
        return domain

    def grow(self) -> list[Region]:
        owner: dict[Node, int] = {}
        members: dict[int, set[Node]] = {}
        for rid, n in enumerate(self.nodes):
            m = self.matches.get(n)
            if m is None:
                continue
            members[rid] = {n}
            owner[n] = rid
            producers = [x for x in m.operands if isinstance(x, Node) and x in owner]
            if m.kind == "copy":
                producers = [x for x in producers if x is m.operands[1]]  # never through dst
            for p in dict.fromkeys(producers):
                other = owner[p]
                if other == owner[n]:
                    continue
                cand = members[other] | members[owner[n]]
                if self.valid(cand) is None:
                    continue
                mine = owner[n]
                for x in members.pop(mine):
                    owner[x] = other
                members[other] = cand
            if m.kind == "getitem" and owner[n] != owner.get(m.operands[0]):
                # a tuple element belongs with its producer or nowhere
                members.pop(owner.pop(n))
        self.merge_siblings(members, owner)
        regions = []
        for cand in members.values():
            domain = self.valid(cand) if len(cand) > 0 else None
            region = self._region(cand, domain) if domain is not None else None
            if region is not None:
                regions.append(region)
        regions.sort(key=lambda r: self.pos[r.nodes[0]])
        return regions

    def merge_siblings(self, members: dict[int, set[Node]], owner: dict[Node, int]) -> None:
        """Regions that read the same tensor and share an iteration space become one kernel
        that reads it once (``x > 0.3`` next to a chain over ``x``), when the union is still
        a valid region."""
        changed = True
        while changed:
            changed = False
            readers: dict[Node, list[int]] = {}
            for rid in sorted(members):
                for n in members[rid]:
                    for x in n.all_input_nodes:
                        if x not in members[rid] and isinstance(_val(x), torch.Tensor):
                            if rid not in readers.setdefault(x, []):
                                readers[x].append(rid)
            for rids in readers.values():
                for i, a in enumerate(rids):
                    for b in rids[i + 1:]:
                        if a not in members or b not in members:
                            continue
                        cand = members[a] | members[b]
                        if self.valid(cand) is None:
                            continue
                        for x in members.pop(b):
                            owner[x] = a
                        members[a] = cand
                        changed = True

    def _region(self, cand: set[Node], domain: _Domain) -> Region | None:
        nodes = sorted(cand, key=self.pos.__getitem__)
        # a var_mean without both of its elements, or a lone getitem, is not a region
        for n in nodes:
            m = self.matches[n]
            if m.kind == "reduction" and m.name == "var_mean":
                if not n.users or any(u not in cand for u in n.users):
                    return None
        inputs: list[Node] = []
        for n in nodes:
            for x in self.matches[n].operands:
                if isinstance(x, Node) and x not in cand and x not in inputs:
                    inputs.append(x)
        outputs = [n for n in nodes if self.matches[n].kind not in ("copy",)
                   and not (self.matches[n].name == "var_mean")
                   and any(u not in cand for u in n.users)]
        writes = [n for n in nodes if self.matches[n].kind == "copy"]
        if not outputs and not writes:
            return None  # nothing reads it: dead code, not ours to remove
        return Region(nodes, {n: self.matches[n] for n in nodes}, domain.full_shape,
                      {n: domain.space[n] for n in nodes}, inputs, outputs, writes)


def find_regions(gm: GraphModule) -> list[Region]:
    """Every maximal region of supported ops in ``gm``, in graph order."""
    return _Grower(gm).grow()


def acyclic(regions: list[Region], nodes: list[Node]) -> list[Region]:
    """The regions (in order) that can all become single nodes at once: each is convex on
    its own, but two together can close a cycle (A's output feeds B's input while B's
    output feeds A's, each through a member the other does not depend on). A region that
    would close one is left out."""
    kept: list[Region] = []
    group: dict[Node, int] = {}
    for region in regions:
        trial = dict(group)
        for n in region.nodes:
            trial[n] = len(kept)
        if _quotient_is_dag(nodes, trial):
            kept.append(region)
            group = trial
    return kept


def _quotient_is_dag(nodes: list[Node], group: dict[Node, int]) -> bool:
    key = {n: ("r", group[n]) if n in group else ("n", i) for i, n in enumerate(nodes)}
    succ: dict[tuple, set] = {k: set() for k in key.values()}
    indegree = {k: 0 for k in succ}
    for n in nodes:
        for a in n.all_input_nodes:
            if a in key and key[a] != key[n] and key[n] not in succ[key[a]]:
                succ[key[a]].add(key[n])
                indegree[key[n]] += 1
    ready = [k for k, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for s in succ[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    return seen == len(succ)


# ---- which regions to lower ------------------------------------------------------------

def _pool_slot(node: Node) -> bool:
    return node.op == "placeholder" and node.name.startswith(POOL_SLOT_PREFIX)


def _makes_inductor_store(user: Node, rules) -> bool:
    """Does Inductor store the value ``user`` reads? It does when ``user`` is the graph's
    output or an extern kernel (a matmul, attention, a fallback op: they read buffers), a
    mutation, a scatter or a concat kernel, looking through views. A pointwise or reduction
    user Inductor fuses with the value's producer, which then is never stored. An op with
    side effects (a collective such as ``all_reduce_``, which writes its input in place; a
    mutating custom op) reads a buffer, whatever the Inductor emulation calls it
    (``inductor_ops`` classifies ``_c10d_functional.all_reduce_`` as pointwise: it has a
    lowering of its own)."""
    from dsgraph.analysis import inductor_ops as ops

    if user.op != "call_function" or compat.has_side_effects(user):
        return True
    kind = ops.classify(user, rules).kind
    if kind in (ops.VIEW, ops.GETITEM):
        return any(_makes_inductor_store(u, rules) for u in user.users)
    return kind not in (ops.POINTWISE, ops.REDUCTION)


def writes_what_inductor_fuses(region: Region) -> bool:
    """Does the region's kernel store a full-size value that Inductor would not store? A
    member read outside the region only by pointwise or reduction ops is recomputed inside
    Inductor's kernels that read it; lowered, it is written and read back. Measured on the
    H200 (session 9, GPT-2-small at 2.94 GiB): the recomputed layer norms lowered alone wrote
    their normalized rows for the layer-norm backward, which Inductor's kernel recomputes
    from x (the step's lowered and Inductor kernels 7.62 ms against 7.15 ms without
    lowering), while the recomputed GELU, lowered with its backward, stores only the
    gradient its matmul reads (95.6 us against Inductor's 108.8). Row values (per-row
    statistics) are small and not counted."""
    from dsgraph.analysis.inductor_ops import Rules

    val = _val(region.nodes[0]) if region.nodes else None
    device = val.device.type if isinstance(val, torch.Tensor) else "cuda"
    rules = Rules.for_device(device)
    members = set(region.nodes)
    for out in region.outputs:
        if region.space.get(out) != "full":
            continue
        outside = [u for u in out.users if u not in members]
        if outside and not any(_makes_inductor_store(u, rules) for u in outside):
            return True
    return False


def tagged(region: Region) -> bool:
    """Regions dsgraph's own passes created: a member carries one of ``TAGS`` in its meta,
    or the region writes a gradient-pool slot and computes more than the accumulation;
    and the kernel stores nothing full-size that Inductor would fuse away
    (``writes_what_inductor_fuses``).

    A bare ``slot += g`` (``add`` + ``copy_``) is not taken: Inductor fuses it into the
    kernel that produces ``g``, where a kernel of its own would read ``g`` once more. With
    the gradient's pointwise producer, or a scale and cast after it, the region is one pass
    over memory where Inductor's stock fusion may need several."""
    if any(n.meta.get(tag) for n in region.nodes for tag in TAGS):
        return not writes_what_inductor_fuses(region)
    slots = {w.args[0] for w in region.writes if _pool_slot(w.args[0])}
    if not slots:
        return False
    accumulate = {w for w in region.writes} | {
        n for n in region.nodes
        if region.matches[n].name == "add" and any(x in slots for x in region.matches[n].operands)}
    return any(n not in accumulate for n in region.nodes) and not writes_what_inductor_fuses(region)


def recomputed(region: Region) -> bool:
    """Regions of a backward graph that recompute forward values: a member reads no tangent,
    directly or through other nodes (what the partition recomputes, whoever chose it)."""
    if not region.nodes:
        return False
    graph = region.nodes[0].graph
    tangent_side: set[Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder" and n.name.startswith("tangents"):
            tangent_side.add(n)
        elif any(a in tangent_side for a in n.all_input_nodes):
            tangent_side.add(n)
    if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes):
        return False  # not a backward graph
    return any(n not in tangent_side for n in region.nodes if region.matches[n].kind != "getitem")


def everything(region: Region) -> bool:
    return True


SELECTORS: dict[str, Callable[[Region], bool]] = {"tagged": tagged, "all": everything, "recomputed": recomputed}


def selector(select: str | Callable[[Region], bool]) -> Callable[[Region], bool]:
    if callable(select):
        return select
    if select not in SELECTORS:
        raise ValueError(f"lower_triton: select must be one of {sorted(SELECTORS)} or a callable, got {select!r}")
    return SELECTORS[select]
