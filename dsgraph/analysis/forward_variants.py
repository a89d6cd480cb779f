"""Lighter forms an op takes in the forward when the backward recomputes it.

``dsgraph::linear_cross_entropy_grads`` returns the loss and, computed in the same chunk loop,
the gradients of its inputs (three GEMMs). A plan that recomputes it in the backward does
not need those gradients in the forward, only the loss: there the op runs as
``dsgraph::linear_cross_entropy`` (one GEMM, no gradient buffers, a smaller workspace), and
the backward's recomputed call computes the gradients. Without this a plan that
recomputes the loss head ran all three GEMMs twice (a 24-layer GPT at per-block
checkpointing's memory, H200, session 12: 3.2 ms of its 13.3 ms of recomputation).

Registered by the op's owner (``runtime.linear_cross_entropy_cost``); used by the step
model (what the forward allocates), the cost model (what recomputing the op costs net of
what the forward no longer computes) and the checkpoint partition (the forward's call
rewritten: ``recompute.light_forward``). Elements are the op's tuple outputs by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch.fx import Node


@dataclass(frozen=True)
class ForwardVariant:
    target: Any  # the op the forward calls instead
    args: Callable[[tuple], tuple]  # its arguments, from the full op's (node args or fake values)
    kept: tuple[int, ...]  # the elements it still returns (its output is the first of them)
    workspace: Callable[[Node], int]  # its workspace bytes at that node
    flops: Callable[[Node], int]  # its FLOPs at that node


_VARIANTS: dict[Any, ForwardVariant] = {}


def register_forward_variant(op: Any, variant: ForwardVariant) -> None:
    _VARIANTS[op] = variant


def forward_variant(node: Node) -> ForwardVariant | None:
    if node.op != "call_function":
        return None
    try:
        return _VARIANTS.get(node.target)
    except TypeError:  # an unhashable callable: not a registered op
        return None
