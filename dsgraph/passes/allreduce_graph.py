"""The allreduce pass's graph rewrite: bucket inputs, each bucket's scale (and cast) and
collective after its last slot write, the waits where the plan puts them. The plan itself,
and why it is built so, are in ``dsgraph.passes.allreduce``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.runtime.ops import BUCKET_READY

if TYPE_CHECKING:
    from dsgraph.passes.allreduce import Bucket, BucketPlan

TAG = "dsgraph_pool_epilogue"  # node.meta key lower_triton's tagged selection takes (dsgraph.lowering.regions.TAGS)


# -- the rewrite ---------------------------------------------------------------------------------


def add_bucket_inputs(gm: GraphModule, plan: BucketPlan, fake_mode) -> tuple[list[Node], list[torch.Tensor]]:
    """Placeholders ``dsgraph_bucket_k`` (1-D views of the pool buffer) before the slot inputs:
    ``DataParallelBackward`` appends the bucket views before the pool's wrapper appends the
    slot views. Returns the placeholders and their fake example inputs."""
    first_slot = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("dsgraph_grad_"))
    inputs, fakes = [], []
    for b in plan.buckets:
        with gm.graph.inserting_before(first_slot):
            node = gm.graph.placeholder(f"dsgraph_bucket_{b.index}")
        with fake_mode:
            node.meta["val"] = torch.empty(b.numel, device=b.key[0], dtype=b.key[1])
        inputs.append(node)
        fakes.append(node.meta["val"])
    return inputs, fakes


class _RecordVals(torch.fx.Interpreter):
    def run_node(self, n: Node):
        out = super().run_node(n)
        n.meta["val"] = out
        return out


def _call(graph: torch.fx.Graph, fake_mode, target, *args, **kwargs) -> Node:
    """A new node with its fake value (computed on the inputs' own fakes, so aliases alias)."""
    node = graph.call_function(target, args, kwargs)
    fake_args = compat.tree_map(lambda a: a.meta["val"] if isinstance(a, Node) else a, args)
    with fake_mode:
        node.meta["val"] = target(*fake_args, **kwargs)
    return node


def _all_reduce_subgraph(bucket_fake: torch.Tensor, group: str, fake_mode) -> GraphModule:
    """``all_reduce_(bucket, "sum", group)``: the body of the ``control_deps`` that issues an
    uncompressed bucket."""
    graph = torch.fx.Graph()
    bucket_in = graph.placeholder("bucket")
    graph.output(graph.call_function(compat.all_reduce_op(), (bucket_in, "sum", group)))
    sub = GraphModule(torch.nn.Module(), graph)
    with fake_mode:
        _RecordVals(sub).run(bucket_fake)  # on the bucket's own fake: the result aliases it
    return sub


def _issue_after(gm: GraphModule, b: Bucket, bucket_in: Node, deps: tuple[Node, ...], after: Node, group: str,
                 fake_mode) -> Node:
    """``control_deps(deps, all_reduce_)(bucket)`` right after ``after``: an uncompressed
    bucket's collective, which runs after the latest writer of every node in ``deps``."""
    graph = gm.graph
    sub = _all_reduce_subgraph(bucket_in.meta["val"], group, fake_mode)
    attr = f"dsgraph_issue_{b.index}"
    setattr(gm, attr, sub)
    with graph.inserting_after(after):
        get = graph.get_attr(attr)
    with graph.inserting_after(get):
        issued = graph.call_function(compat.control_deps_op(), (deps, get, bucket_in))
    issued.meta["val"] = sub.graph.output_node().args[0].meta["val"]
    return issued


def _memory_order_flat(graph: torch.fx.Graph, fake_mode, t: Node) -> Node:
    """``t``'s elements as a 1-D view in the order they sit in memory (a slot's layout may
    be a permuted one), i.e. as the bucket view sees them."""
    val = t.meta["val"]
    perm = sorted(range(val.dim()), key=lambda d: -int(val.stride()[d]))
    if perm != list(range(val.dim())):
        t = _call(graph, fake_mode, torch.ops.aten.permute.default, t, perm)
    return _call(graph, fake_mode, torch.ops.aten.view.default, t, [val.numel()])


def _bucket_epilogue(gm: GraphModule, b: Bucket, bucket_in: Node, slots: list[Node], after: Node, scale: float,
                     group: str, fake_mode) -> Node:
    """One bucket's epilogue as one pass over its view, right after ``after`` (the write of
    its last slot), and its issue; returns the node the wait waits on."""
    graph = gm.graph
    with graph.inserting_after(after):
        ready = _call(graph, fake_mode, BUCKET_READY, bucket_in, list(slots))
    with graph.inserting_after(ready):
        scaled = _call(graph, fake_mode, torch.ops.aten.mul.Tensor, bucket_in, scale)
    scaled.meta[TAG] = True
    if b.compressed:
        with graph.inserting_after(scaled):
            wire = _call(graph, fake_mode, torch.ops.prims.convert_element_type.default, scaled, b.wire_dtype)
        wire.meta[TAG] = True
        with graph.inserting_after(wire):
            return _call(graph, fake_mode, compat.all_reduce_op(), wire, "sum", group)
    with graph.inserting_after(scaled):
        back = _call(graph, fake_mode, torch.ops.aten.copy_.default, bucket_in, scaled)
    back.meta[TAG] = True
    # the bucket among the dependencies: after its epilogue, its last write
    return _issue_after(gm, b, bucket_in, tuple(slots) + (bucket_in,), back, group, fake_mode)


def apply_buckets(gm: GraphModule, plan: BucketPlan, group: str, fake_mode) -> GraphModule:
    """Scale each slot after its last write, issue every bucket after the node that writes its
    last slot, wait for it where the plan says; the bucket inputs must be there
    (``add_bucket_inputs``).

    Uncompressed: ``slot *= 1/world`` in place (Inductor fuses it into the kernel that writes
    the slot; a matmul slot gets its own pointwise kernel), then ``control_deps(slots,
    all_reduce_)(bucket)``: the collective, an extern kernel Inductor never fuses, runs after
    the latest writer of every slot, which is its scale. (Scaling the bucket view inside the
    ``control_deps`` instead would be a pointwise kernel that Inductor 2.13 fuses with a slot's
    writer: its fusion check reads the weak dependency as a read-then-mutate of one buffer.)
    Compressed: the bucket is rebuilt in the wire dtype from the slots themselves,
    ``cat(convert(slot * 1/world) in memory order, zeros for the alignment padding)``, which
    Inductor computes straight into the one wire buffer; the all-reduce depends on it by data
    flow, and after the wait ``bucket.copy_(wire)`` writes the average into the pool.

    ``plan.epilogue == "bucket"``: instead, after the bucket's last slot write,
    ``bucket_ready_(bucket, slots)`` then one pass over the bucket view, ``bucket * 1/world``
    written back in place (uncompressed) or cast to the wire dtype (compressed), its nodes
    tagged ``dsgraph_pool_epilogue`` (``_bucket_epilogue``)."""
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    scale = 1.0 / plan.world_size
    issued_nodes = []
    for b in plan.buckets:
        bucket_in = by_name[f"dsgraph_bucket_{b.index}"]
        slots = [by_name[name] for name in b.slots]
        if plan.epilogue == "bucket":
            issued = _bucket_epilogue(gm, b, bucket_in, slots, by_name[b.issue_after], scale, group, fake_mode)
        elif not b.compressed:
            last = None
            for slot, writer in zip(slots, b.written_by):
                with graph.inserting_after(by_name[writer]):
                    scaled = _call(graph, fake_mode, torch.ops.aten.mul_.Scalar, slot, scale)
                if writer == b.issue_after:
                    last = scaled
            issued = _issue_after(gm, b, bucket_in, tuple(slots), last, group, fake_mode)
        else:
            parts, at = [], b.start
            with graph.inserting_before(by_name[b.issue_after].next):
                for offset, slot in sorted(zip(b.offsets, slots), key=lambda item: item[0]):
                    if offset > at:  # alignment padding: zeros on the wire, zeros back in the pool
                        parts.append(_call(graph, fake_mode, torch.ops.aten.full.default, [offset - at], 0.0,
                                           dtype=b.wire_dtype, device=b.key[0], pin_memory=False))
                    scaled = _call(graph, fake_mode, torch.ops.aten.mul.Tensor, slot, scale)
                    cast = _call(graph, fake_mode, torch.ops.prims.convert_element_type.default, scaled, b.wire_dtype)
                    parts.append(_memory_order_flat(graph, fake_mode, cast))
                    at = offset + slot.meta["val"].numel()
                wire = parts[0] if len(parts) == 1 else _call(graph, fake_mode, torch.ops.aten.cat.default, parts)
                issued = _call(graph, fake_mode, compat.all_reduce_op(), wire, "sum", group)
        issued.name = f"dsgraph_issued_{b.index}"
        issued_nodes.append((b, bucket_in, issued))
    for b, bucket_in, issued in issued_nodes:
        with graph.inserting_before(by_name[b.wait_before] if b.wait_before != "output" else graph.output_node()):
            waited = graph.call_function(compat.wait_tensor_op(), (issued,))
            waited.meta["val"] = issued.meta["val"]
            if b.compressed:
                back = graph.call_function(torch.ops.aten.copy_.default, (bucket_in, waited))
                back.meta["val"] = bucket_in.meta["val"]
    graph.lint()
    return gm
