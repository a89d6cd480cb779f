"""Edits of a partitioned forward/backward pair that the driver makes for passes.

``pass_inputs_to_backward``: the backward receives some forward inputs (parameters) it
would not otherwise, as saved values. AOTAutograd hands the forward's saved outputs to the
backward positionally (forward outputs ``[user outputs..., saved tensors..., saved
symints...]``, backward inputs ``[saved symints..., saved tensors..., tangents...]``, checked
on torch 2.13), so the same inputs are put first among the saved tensors of both graphs. A forward input is held
by the caller for the whole step anyway, so saving it costs no memory; arithmetic is
unchanged.
"""

from __future__ import annotations

from typing import Iterable

import torch


def pass_inputs_to_backward(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, indices: Iterable[int],
                            num_fwd_outputs: int) -> dict[int, str]:
    """Make the backward receive the forward inputs at ``indices`` (positions among the
    forward's placeholders); returns {index: the backward placeholder's name}."""
    fw_inputs = [n for n in fw.graph.nodes if n.op == "placeholder"]
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in bw_inputs}
    out_node = fw.graph.output_node()
    outputs = list(out_node.args[0])
    added, names = [], {}
    # the first saved tensor (or the first tangent): the saved symints come before them
    first = next((n for n in bw_inputs if not isinstance(n.meta.get("val"), (int, torch.SymInt))),
                 next(iter(bw.graph.nodes)))
    for i in sorted(set(indices)):
        node = fw_inputs[i]
        names[i] = node.name
        if node.name in by_name:
            continue  # the partition sends it already
        # before the first saved tensor: the new ones go first, in index order
        with bw.graph.inserting_before(first):
            placeholder = bw.graph.placeholder(node.name)
        if placeholder.name != node.name:
            raise RuntimeError(f"backward already has a value named {node.name}")
        placeholder.meta = dict(node.meta)
        added.append(node)
    if not added:
        return names
    out_node.args = (tuple(outputs[:num_fwd_outputs] + added + outputs[num_fwd_outputs:]),)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return names
