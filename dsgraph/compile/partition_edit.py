"""Edits of a partitioned forward/backward pair that the driver makes for passes.

``pass_inputs_to_backward``: the backward receives a handle on some forward inputs
(parameters), as saved values, so that at run time it knows which tensors this call was for.
AOTAutograd hands the forward's saved outputs to the backward positionally (forward outputs
``[user outputs..., saved tensors..., saved symints...]``, backward inputs ``[saved
symints..., saved tensors..., tangents...]``, checked on torch 2.13), so the handles are put
first among the saved tensors of both graphs.

The handle is ``as_strided(input, [1, *shape], [numel, *strides], offset)``, a view of the
whole input with one leading dimension, not the input itself: Inductor's layout
optimization (a graph with a convolution) gives a saved 4-D input that a convolution reads
channels-last strides by copying it, and every later reader reads the copy
(``analysis/inductor_layout.py``); a copy does not say which parameter it came from. An
``as_strided`` reader exempts the input from that conversion (``GraphLowering.run_node``:
``is_input_for_as_strided``), and a 5-D value is not converted itself (the rule takes 4-D
values only), so Inductor returns the handle as a view of the input
(``reinterpret_tensor``), sharing its storage: the runtime matches it to the parameter by
storage (``runtime.pool._views_of``). Not ``alias`` or ``view`` to the same shape: Inductor
removes those (``remove_noop_ops``). Side effect, measured on CPU: the convolution weights
the backward receives stay in their own layout (the convolutions copy them where they need
channels last). A view of an input held by the caller for the whole step costs no memory;
arithmetic is unchanged.
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
    last = out_node.prev
    for i in sorted(set(indices)):
        node = fw_inputs[i]
        name = f"dsgraph_handle_{node.name}"
        if name in by_name:
            raise RuntimeError(f"backward already has a value named {name}")
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise RuntimeError(f"pass_to_backward: forward input {node.name} is not a tensor")
        with fw.graph.inserting_after(last):
            size, stride = [1, *val.shape], [max(val.numel(), 1), *val.stride()]
            handle = fw.graph.create_node("call_function", torch.ops.aten.as_strided.default,
                                          (node, size, stride, val.storage_offset()), name=name)
        last = handle
        handle.meta = {"val": torch.as_strided(val, size, stride, val.storage_offset())}
        # before the first saved tensor: the new ones go first, in index order
        with bw.graph.inserting_before(first):
            placeholder = bw.graph.placeholder(handle.name)
        if placeholder.name != handle.name:
            raise RuntimeError(f"backward already has a value named {handle.name}")
        placeholder.meta = dict(handle.meta)
        names[i] = placeholder.name
        added.append(handle)
    if not added:
        return names
    out_node.args = (tuple(outputs[:num_fwd_outputs] + added + outputs[num_fwd_outputs:]),)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return names
