"""Inductor's layout optimization as far as memory goes: the channels-last copies of graph
inputs that a forward saves for the backward.

With layout optimization on (``GraphLowering.decide_layout_opt``: a graph with a
convolution, on a CPU with mkldnn), ``GraphLowering.run_node`` gives every 4-D dense graph
output that is not user visible and that prefers channels last
(``find_nodes_prefer_channels_last``: a convolution, or a node one of whose users prefers
channels last) channels-last strides, through ``require_exact_strides``. A computed buffer
just takes those strides; a graph input has a fixed layout, so Inductor copies it, and
every later use in the graph (the convolution included) reads the copy. The forward then
returns the copy as the saved tensor: on the CNN of the zoo the input batch and every
convolution weight, 125,292 B that live from the forward's first kernel to their last use
in the backward (torch 2.13, the CNN's generated forward returns ``buf0`` .. ``buf9``,
``cpp_fused_add_copy__0``). Checked against torch 2.11 to 2.13 (``graph.py``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.fx import Node

from .. import compat

# find_nodes_prefer_channels_last does not let a preference pass through these
_NO_PROPAGATION = (torch.ops.aten.bmm.default,)


def copied_to_channels_last(node: Node) -> bool:
    """Whether a graph input ``node`` that Inductor gives channels-last strides is copied:
    a 4-D dense tensor whose significant strides (sizes above 1) are not already
    channels last (``require_strides``: ``significant_strides_equal``)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return False
    try:
        sizes = [int(s) for s in val.shape]
        strides = [int(s) for s in val.stride()]
    except (TypeError, ValueError):  # symbolic: not decided here
        return False
    if not compat.non_overlapping_and_dense(val):
        return False
    n, c, h, w = sizes
    wanted = [h * w * c, 1, w * c, c]
    return any(size > 1 and a != b for size, a, b in zip(sizes, strides, wanted))


def prefer_channels_last(order: Sequence[int], inputs: Sequence[int], users: Sequence[Sequence[int]],
                         is_convolution: Sequence[bool], targets: Sequence[object]) -> set[int]:
    """``find_nodes_prefer_channels_last``'s first pass over one graph (node ids; ``users``
    of the joint graph, restricted here to the graph's members): walking backwards, a
    convolution prefers channels last, and so does a node one of whose users does."""
    members = set(order) | set(inputs)
    found: set[int] = set()
    for i in reversed(list(inputs) + list(order)):
        if is_convolution[i]:
            found.add(i)
        elif targets[i] not in _NO_PROPAGATION and any(u in found for u in users[i] if u in members):
            found.add(i)
    return found


def channels_last_copies(order: Sequence[int], inputs: Sequence[int], outputs: set[int], copied: Sequence[bool],
                         user_visible: frozenset, users: Sequence[Sequence[int]], is_convolution: Sequence[bool],
                         targets: Sequence[object]) -> list[int]:
    """The graph inputs of one graph with layout optimization that Inductor copies to
    channels last: outputs, not user visible, ``copied`` (``copied_to_channels_last``) and
    preferring channels last, in input order."""
    wanted = [i for i in inputs if i in outputs and copied[i] and i not in user_visible]
    if not wanted:
        return []
    prefer = prefer_channels_last(order, inputs, users, is_convolution, targets)
    return [i for i in wanted if i in prefer]
