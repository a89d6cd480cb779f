"""Workspace: memory an op allocates for itself while it runs, besides its outputs.

Most ops allocate exactly their outputs, and the memory analyses count those. An opaque op
that loops inside (dsgraph's chunked linear + cross-entropy) also holds temporaries for the
duration of its call: chunk buffers, casts, accumulators; so do CUDA's cuDNN and
flash-attention backwards (fp32 accumulators: ``analysis.attention_workspace``). The op's module registers a
function of its node here; ``TensorLifetimes``, ``fx_plan``, ``fused_plan`` and
``inductor_plan`` count the bytes as live at the op's step only::

    register_workspace(torch.ops.dsgraph.linear_cross_entropy_grads.default, fn)   # fn(node) -> bytes
    workspace_bytes(node)   # 0 for every other op
"""

from __future__ import annotations

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


# ATen ops whose scratch is known are registered by their own modules, imported here so that
# every analysis that counts workspaces sees them
from . import attention_workspace as _registers  # noqa: E402

del _registers
