"""The partition's forward calls an op's lighter form where the backward recomputes it.

``analysis.forward_variants``: an op whose forward call returns elements only the backward
needs (the fused loss op's gradients) can run in a lighter form when those elements are not
saved: the backward's recomputed call makes them. ``lighten_forward`` rewrites such calls in
a forward graph the checkpoint partition made; the step model prices the same plan with the
same forms (``StepModel.evaluate``), the cost model its recomputation net of what the
forward no longer computes. Arithmetic: the lighter form's outputs are bitwise those of the
full call (registered only for ops where that holds), and the backward's recomputed call
is the full op on the same inputs.
"""

from __future__ import annotations

import operator

from torch.fx import GraphModule

from ..analysis.forward_variants import forward_variant


def lighten_forward(fw: GraphModule) -> int:
    """Rewrite the calls of ``fw`` whose used elements the lighter form returns; returns how
    many. The lighter form returns one tensor, its first kept element, which replaces the
    getitems of that element."""
    changed = 0
    for node in list(fw.graph.nodes):
        variant = forward_variant(node)
        if variant is None:
            continue
        users = list(node.users)
        if not users or not all(u.target is operator.getitem and u.args[1] in variant.kept for u in users):
            continue
        if len(variant.kept) != 1:
            continue  # a lighter form returning several elements is not needed yet
        with fw.graph.inserting_before(node):
            light = fw.graph.call_function(variant.target, variant.args(node.args))
        light.meta = dict(node.meta)
        vals = node.meta.get("val")
        if isinstance(vals, (list, tuple)):
            light.meta["val"] = vals[variant.kept[0]]
        light.meta.pop("tensor_meta", None)
        if "eager_input_vals" in node.meta:
            # Inductor's layout constraint for custom ops normalizes these by the target's
            # schema: the lighter form's own arguments
            fake_args, fake_kwargs = node.meta["eager_input_vals"]
            light.meta["eager_input_vals"] = (variant.args(fake_args), fake_kwargs)
        for u in users:
            u.replace_all_uses_with(light)
            fw.graph.erase_node(u)
        fw.graph.erase_node(node)
        changed += 1
    if changed:
        fw.graph.lint()
        fw.recompile()
    return changed
