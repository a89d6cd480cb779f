"""Operator schemas, tags and storages: facts read from torch's operator registry.

``OpOverload`` and ``op._schema`` are private attributes of torch's operator objects; every
read of them goes through here. Checked on torch 2.11 (GPU) and 2.13 (CPU).
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

OpOverload = torch._ops.OpOverload
HigherOrderOperator = torch._ops.HigherOrderOperator

# CUDA's flash-attention and cuDNN-attention backwards (the same names and schemas on torch
# 2.11 to 2.14): ATen ops whose leading underscore is torch's, not a private attribute; named
# here like every other underscored torch name the project reads
FLASH_ATTENTION_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
CUDNN_ATTENTION_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default


def is_op(target: Any) -> bool:
    """An aten/prims/custom operator overload (not a Python callable or higher-order op)."""
    return isinstance(target, OpOverload)


def op_schema(op: Any) -> Any:
    """The ``FunctionSchema`` of an operator overload."""
    return op._schema


def writes(arg: Any) -> bool:
    """Does this schema argument say the op writes it (``Tensor(a!)``)?"""
    return arg.alias_info is not None and arg.alias_info.is_write


def storage_ref(t: torch.Tensor) -> Hashable | None:
    """A hashable identity of ``t``'s storage, fake or real, equal for all views of it; None
    for tensors without a storage (some subclasses)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(t.untyped_storage())
    except Exception:
        return None


def contiguous_strides(shape) -> tuple[int, ...]:
    from torch._prims_common import make_contiguous_strides_for

    return tuple(make_contiguous_strides_for(shape))


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    return bool(torch._prims_common.is_non_overlapping_and_dense_or_false(t))


def out_variant(op: Any) -> Any:
    """The ``out=`` overload of a functional op (``aten.mm.default`` -> ``aten.mm.out``), or
    None: the same other arguments (names, types, defaults, keyword-only or not), one
    keyword-only ``Tensor(a!)`` argument per returned tensor, returning them in order.

    Read from the schemas, not from ``torch._library._out_variant.to_out_variant``: on
    torch 2.11 that finds no out variant for ``aten.add.Tensor`` or ``aten.mm.default``.
    """
    schema = op._schema
    if schema.name.endswith("_") or any(writes(a) for a in schema.arguments):
        return None  # in-place, or out= itself
    returns = schema.returns
    if not returns or any(str(r.type) != "Tensor" for r in returns):
        return None
    wanted = _non_out_args(schema)
    packet = getattr(getattr(torch.ops, op.namespace), schema.name.split("::")[1])
    for name in packet.overloads():
        candidate = getattr(packet, name)
        cs = candidate._schema
        outs = [a for a in cs.arguments if writes(a)]
        if len(outs) != len(returns) or len(cs.returns) != len(outs) or _non_out_args(cs) != wanted:
            continue
        if not all(a.kwarg_only and str(a.type) == "Tensor" for a in outs):
            continue
        if all(r.alias_info is not None and set(r.alias_info.before_set) == set(a.alias_info.before_set)
               for r, a in zip(cs.returns, outs)):
            return candidate
    return None


def _non_out_args(schema: Any) -> list:
    return [(a.name, str(a.type), a.default_value, a.kwarg_only) for a in schema.arguments if not writes(a)]


