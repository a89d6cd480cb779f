"""fused_plan: what Inductor will allocate, predicted from the FX graph before it compiles.

The checkpoint planner has to weigh partitions that Inductor has not compiled (and
compiling each candidate would take seconds), so it needs an FX-level prediction close to
Inductor's buffer plan. ``fx_plan`` counts every FX node (about twice Inductor's peak on a
transformer); this plan applies Inductor's fusion rule of thumb instead:

- pointwise ops (and the few gather-like ops Inductor lowers as pointwise loops) are
  inlined into their consumers and allocate nothing, unless their value must exist in
  memory: it is a graph output (a saved activation, a gradient), or a kernel Inductor does
  not generate (a matmul, attention, a convolution: "extern" ops) reads it;
- every other op (matmuls, attention, reductions, scatters) writes a buffer;
- views alias their base, as in ``fx_plan``.

Lifetimes are FX order's. The planner calibrates nothing against this plan: it is used to
compare candidate partitions with each other and to report the predicted peak; the
benchmark reports how far it is from what the H200 measured.
"""

from __future__ import annotations


import torch
from torch.fx import GraphModule, Node

from .. import compat
from .lifetimes import TensorLifetimes, is_view
from .ops import op_name
from .plan import Block, GraphPlan, workspace_blocks
from .timeline import Interval, MemoryTimeline, stitch

# ops Inductor lowers as (inlinable) pointwise loops although torch does not tag them so
_INLINED = {
    "embedding", "cat", "index", "gather", "constant_pad_nd", "clone", "_to_copy", "where", "full",
    "full_like", "zeros", "zeros_like", "ones", "ones_like", "iota", "scalar_tensor", "slice_scatter",
    "select_scatter", "inductor_random", "inductor_lookup_seed", "expand", "alias", "copy", "masked_fill",
    "convert_element_type", "fma", "_unsafe_index", "lift_fresh_copy",
}


_REDUCTIONS = {"sum", "mean", "amax", "amin", "var_mean", "var", "prod", "any", "all", "argmax", "argmin"}


def is_inlined(node: Node) -> bool:
    """Inductor can compute this node inside its consumers' kernels."""
    target = node.target
    if not compat.is_op(target):
        return False
    return torch.Tag.pointwise in target.tags or op_name(node) in _INLINED


def _extern_readers(node: Node, extern: set[Node]) -> bool:
    """Does an extern op read this node, directly or through views?"""
    stack, seen = list(node.users), set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in extern:
            return True
        if u.op == "call_function" and is_view(u):
            stack.extend(u.users)
    return False


def materialized(gm: GraphModule) -> set[Node]:
    """Nodes whose output Inductor writes to memory (views excluded: they alias)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    outputs = set(gm.graph.output_node().all_input_nodes)
    # outputs through views still need the base in memory
    for o in list(outputs):
        base = o
        while base.op == "call_function" and is_view(base) and base.all_input_nodes:
            base = base.all_input_nodes[0]
            outputs.add(base)
    kernels = {n for n in nodes if not is_view(n) and not is_inlined(n)}
    # reductions fuse what they read; every other kernel needs its inputs in memory
    extern = {n for n in kernels if op_name(n) not in _REDUCTIONS}
    out = set(kernels)
    for n in nodes:
        if n in kernels or is_view(n):
            continue
        if n in outputs or _extern_readers(n, extern):
            out.add(n)
    return out


def fused_plan(gm: GraphModule, donated=lambda name: False) -> GraphPlan:
    """The FX graph's memory as Inductor would run it.

    A node that is inlined runs inside the kernel of its materialized consumer, so what it
    reads stays alive until that kernel. A pointwise kernel writes its output into an input
    whose last use it is when the sizes match (Inductor's in-place buffer reuse), including
    ``donated`` graph inputs (a backward's saved activations).
    """
    lifetimes = TensorLifetimes(gm, held=lambda node: False)
    mat = materialized(gm)
    nodes = [n for n in lifetimes.nodes if n.op not in ("placeholder", "output")]
    step_of = {n: i for i, n in enumerate(nodes)}
    end = len(nodes) - 1
    runs_at: dict[Node, int] = {}
    for n in reversed(nodes):  # where n's computation really happens
        if n in mat:
            runs_at[n] = step_of[n]
            continue
        steps = [end if u.op == "output" else runs_at.get(u, step_of.get(u, end)) for u in n.users]
        runs_at[n] = max(steps) if steps else step_of[n]

    def last_use(members) -> int:
        steps = [-1]
        for m in members:
            for u in m.users:
                steps.append(end if u.op == "output" else runs_at[u])
        return max(steps)

    plan = GraphPlan("fused", [n.name for n in nodes])
    output_args = set(gm.graph.output_node().all_input_nodes)
    free_at: dict[int, list] = {}  # step -> storages whose last use it is (reuse candidates)
    for s in lifetimes.storages:
        if s.is_input:
            last = last_use(s.members)
            for m in s.members:
                if m.op == "placeholder":
                    plan.input_last_use[m.name] = last
                    plan.input_bytes[m.name] = s.nbytes
                    plan.input_expr[m.name] = s.nbytes_expr
                    if donated(m.name) and last >= 0:
                        free_at.setdefault(last, []).append(("input", m.name, s.nbytes, set(s.members)))
            continue
        if s.root not in mat:
            continue
        stop = None if s.is_output else last_use(s.members)
        outputs = tuple(m.name for m in s.members if m in output_args)
        block = Block(s.name, s.nbytes, step_of[s.root], stop, s.nbytes_expr, outputs)
        reuse = None
        if is_inlined(s.root) or op_name(s.root) in _REDUCTIONS:
            for cand in free_at.get(block.start, ()):
                if cand[2] == block.nbytes and _reads_in_place(s.root, cand[3], mat):
                    reuse = cand
                    break
        if reuse is not None:
            free_at[block.start].remove(reuse)
            kind, owner, _, members = reuse
            members = members | set(s.members)
            if kind == "input":  # the input's storage now holds this block until its end
                plan.input_last_use[owner] = end if stop is None else max(stop, plan.input_last_use[owner])
                if stop is not None:
                    free_at.setdefault(stop, []).append(("input", owner, block.nbytes, members))
                continue
            owner.end = stop
            owner.outputs = owner.outputs + outputs
            if stop is not None:
                free_at.setdefault(stop, []).append(("block", owner, block.nbytes, members))
            continue
        plan.blocks.append(block)
        if stop is not None and not outputs:
            free_at.setdefault(stop, []).append(("block", block, block.nbytes, set(s.members)))
    plan.blocks += workspace_blocks(nodes, step_of)
    return plan


# ops after which an element is no longer read at the index it is written at: Inductor
# writes a kernel's output into an input's buffer only when each element is read where it is
# written (equal dependency index and size)
_MOVES_ELEMENTS = {
    "slice", "slice_scatter", "select", "select_scatter", "narrow", "as_strided", "index", "_unsafe_index",
    "gather", "constant_pad_nd", "cat", "expand", "permute", "transpose", "t", "flip", "roll", "diagonal",
    "unfold", "repeat",
}


def _reads_in_place(root: Node, members: set[Node], mat: set[Node]) -> bool:
    """Does the kernel computing ``root`` read the storage ``members`` element for element,
    so that Inductor may write ``root`` into it? Walks the nodes fused into the kernel."""
    stack, seen = [(root, False)], set()
    found = False
    while stack:
        n, moved = stack.pop()
        if (n, moved) in seen:
            continue
        seen.add((n, moved))
        if n in members:
            if moved:
                return False
            found = True
            continue
        if n is not root and (n.op != "call_function" or (n in mat and not is_view(n))):
            continue  # another buffer (or input) read as it is: not this storage
        moves = op_name(n) in _MOVES_ELEMENTS if n.op == "call_function" else False
        stack.extend((a, moved or moves) for a in n.all_input_nodes)
    return found


def fused_step(fw: GraphModule, bw: GraphModule | None, external: list[Interval], saved_names: list[str]) -> MemoryTimeline:
    """The step's memory as Inductor would run its forward and backward. The backward may
    write into a saved activation's buffer once it is dead (the activations are handed to
    it), never into a primal's: the caller holds parameters and inputs."""
    donated = {n for n in saved_names if not n.startswith("primals")}
    bw_plan = fused_plan(bw, donated=donated.__contains__) if bw is not None else None
    return stitch(fused_plan(fw), bw_plan, external, saved_names)
