"""Workspace: memory an op allocates for itself while it runs, besides its outputs.

Most ops allocate exactly their outputs, and the memory analyses count those. An opaque op
that loops inside (dsgraph's chunked linear + cross-entropy) also holds temporaries for the
duration of its call: chunk buffers, casts, accumulators; so do CUDA's cuDNN and
flash-attention backwards (fp32 accumulators: ``analysis.attention_workspace``). The op's module registers a
function of its node here; ``TensorLifetimes``, ``fx_plan``, ``fused_plan`` and
``inductor_plan`` count the bytes as live at the op's step only::

    register_workspace(torch.ops.dsgraph.linear_cross_entropy_grads.default, fn)   # fn(node) -> bytes
    workspace_bytes(node)   # 0 for every other op

An op may also have other forms of the same call that trade workspace for speed (the chunked
loss with fewer, larger chunks: fewer GEMM launches, longer GEMMs, fewer passes over its fp32
weight-gradient accumulator). Its module registers them (``register_workspace_choices``);
once it has chosen its plan, the checkpoint planner takes the fastest one whose peak fits
(``recompute.workspace_fit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch.fx import Node

_WORKSPACE: dict[Any, Callable[[Node], int]] = {}


def register_workspace(op: Any, fn: Callable[[Node], int]) -> None:
    """``fn(node)``: bytes a call of ``op`` at ``node`` allocates besides its outputs."""
    _WORKSPACE[op] = fn


def workspace_bytes(node: Node) -> int:
    if node.op != "call_function":
        return 0
    try:
        fn = _WORKSPACE.get(node.target)
    except TypeError:  # an unhashable callable: not a registered op
        return 0
    return int(fn(node)) if fn is not None else 0


@dataclass(frozen=True)
class WorkspaceChoice:
    """Another form of an op call: the same outputs (values may round differently: the
    chunked loss regroups its sums by chunk, as any chunk count does), another workspace."""

    label: str  # "2 chunks of 4096 tokens"
    rewrite: Callable[[tuple], tuple]  # the call's arguments in this form, from the call's (nodes or fake values)
    nbytes: int  # its workspace at the node, as the node calls it
    light_nbytes: int  # its workspace in the node's lighter forward form (``forward_variants``), if any


_CHOICES: dict[Any, Callable[[Node], list[WorkspaceChoice]]] = {}


def register_workspace_choices(op: Any, fn: Callable[[Node], list[WorkspaceChoice]]) -> None:
    """``fn(node)``: the other forms of a call of ``op`` at ``node``, fastest first, each with
    more workspace than the call as it is (none: the call is already the fastest)."""
    _CHOICES[op] = fn


def workspace_choices(node: Node) -> list[WorkspaceChoice]:
    if node.op != "call_function":
        return []
    try:
        fn = _CHOICES.get(node.target)
    except TypeError:
        return []
    return list(fn(node)) if fn is not None else []


# ATen ops whose scratch is known are registered by their own modules, imported here so that
# every analysis that counts workspaces sees them
from . import attention_workspace as _registers  # noqa: E402

del _registers
