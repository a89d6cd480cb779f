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

The backward receives the computed buffers so (AOTAutograd lays the saved inputs out by
the forward's output strides): a ``convolution_backward`` reading one in a backward
without layout optimization computes channels-last gradients and copies a weight that
arrives contiguous (a gradient pool's handle) to match (``inductor_model.emulate``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.fx import Node

from .. import compat

# find_nodes_prefer_channels_last does not let a preference pass through these
_NO_PROPAGATION = (torch.ops.aten.bmm.default,)


def dense_4d(node: Node) -> bool:
    """A 4-D dense tensor with static strides: a graph output ``run_node`` can give
    channels-last strides."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return False
    # symbolic sizes are not decided here; int() of a SymInt would guard on it and
    # specialize a dynamic graph
    if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
        return False
    return compat.non_overlapping_and_dense(val)


def copied_to_channels_last(node: Node) -> bool:
    """Whether a graph input ``node`` that Inductor gives channels-last strides is copied:
    a 4-D dense tensor whose significant strides (sizes above 1) are not already
    channels last (``require_strides``: ``significant_strides_equal``)."""
    if not dense_4d(node):
        return False
    val = node.meta["val"]
    sizes, strides = [int(s) for s in val.shape], [int(s) for s in val.stride()]
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


def channels_last_copies(inputs: Sequence[int], outputs: set[int], copied: Sequence[bool], user_visible: frozenset,
                         prefer: set[int]) -> list[int]:
    """The graph inputs of one graph with layout optimization that Inductor copies to
    channels last: outputs, not user visible, ``copied`` (``copied_to_channels_last``) and
    in ``prefer`` (``prefer_channels_last``), in input order."""
    return [i for i in inputs if i in outputs and copied[i] and i not in user_visible and i in prefer]


def channels_last_outputs(order: Sequence[int], outputs: set[int], dense: Sequence[bool], user_visible: frozenset,
                          prefer: set[int]) -> list[int]:
    """The computed outputs of one graph with layout optimization that ``run_node`` gives
    channels-last strides (4-D dense, not user visible, in ``prefer``): the saved
    activations of a CNN's forward, which the backward receives so."""
    return [i for i in order if i in outputs and dense[i] and i not in user_visible and i in prefer]
