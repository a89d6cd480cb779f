"""Facts about the op a node calls, read from its schema and tags (one definition each).

- ``op_name``: the op's name without overload (``mm``);
- ``arg_value``: the value a node passes for a schema argument, positional or keyword;
- ``written_args``: the nodes an op writes (``Tensor(a!)`` arguments);
- ``is_random``: the op draws random numbers when it runs;
- ``is_mutating``: the op writes any argument.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from .. import compat


def op_name(node: Node) -> str:
    """The op's name without overload (``mm``), or the callable's name."""
    target = node.target
    if compat.is_op(target):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


def arg_value(node: Node, name: str) -> Any:
    """What ``node`` passes for the schema argument ``name`` (its default when omitted: None)."""
    for i, arg in enumerate(compat.op_schema(node.target).arguments):
        if arg.name == name:
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, arg.default_value)
    return None


def written_args(node: Node) -> list[Node]:
    """The nodes this node's op writes in place (its ``Tensor(a!)`` arguments)."""
    if node.op != "call_function" or not compat.is_op(node.target):
        return []
    out = []
    for i, arg in enumerate(compat.op_schema(node.target).arguments):
        if compat.writes(arg):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, Node):
                out.append(value)
    return out


def is_mutating(node: Node) -> bool:
    return node.op == "call_function" and compat.is_op(node.target) and compat.op_schema(node.target).is_mutable


# Ops tagged random that draw nothing when their dropout probability is 0: attention's
# ``dropout_p`` and ``native_dropout``'s ``p`` (it returns the input and a mask of ones).
# Other random ops (bernoulli, rand) draw, and advance the generator, whatever their values.
_DROPOUT_PROBABILITY = {"dropout_p": None, "p": "native_dropout"}


def is_random(node: Node) -> bool:
    """Draws random numbers: a ``nondeterministic_seeded`` op, unless it is a dropout whose
    probability is the constant 0. Recomputing or reordering a random op changes the
    numbers it or other random ops draw, so passes keep these in place."""
    target = node.target
    if node.op != "call_function" or not compat.is_op(target):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for arg in compat.op_schema(target).arguments:
        only_for = _DROPOUT_PROBABILITY.get(arg.name, False)
        if only_for is False or (only_for is not None and op_name(node) != only_for):
            continue
        value = arg_value(node, arg.name)
        return not (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)
    return True
