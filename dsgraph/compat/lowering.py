"""What the Triton lowering needs from torch: op side effects and aliasing, static size
equality (running real kernels during a compile: ``fx.real_tensors``). Checked on torch 2.13 (CPU)."""

from __future__ import annotations

from typing import Any

import torch

from .ops import HigherOrderOperator


def has_side_effects(node: torch.fx.Node) -> bool:
    """Does running ``node`` do more than produce its value (mutates an input, draws random
    numbers, is an effectful or higher-order op)? ``Node.is_impure`` covers mutable schemas
    on 2.13; the schema is checked as well for releases where it did not."""
    if node.op != "call_function":
        return False
    if node.is_impure():
        return True
    target = node.target
    if isinstance(target, HigherOrderOperator):
        return True
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def returns_alias(node: torch.fx.Node) -> bool:
    """Is the op's output a view of one of its inputs (``view``, ``permute``, ``expand``,
    ...)? Read from the schema's alias annotation."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    info = schema.returns[0].alias_info
    return info is not None and not info.is_write


def statically_equal(a: Any, b: Any) -> bool:
    """``a == b`` for ints or SymInts when it holds for every value of the symbols, without
    adding a guard."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))
