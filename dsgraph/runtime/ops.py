"""Custom ops dsgraph puts into graphs.

``dsgraph::mm_into_(out, a, b)``: a weight gradient written into its gradient-pool slot by
the matmul itself. Inductor does not lower ``aten.mm.out`` ("out= ops aren't yet
supported"), and a ``copy_`` of an ``mm`` result into a slot costs its own kernel, because
an extern matmul's output has a fixed layout; as a mutating custom op Inductor calls it
with the slot in place, one kernel, like the ``mm`` it replaces.

Whether the slot starts the step empty is known only at run time (``.grad`` was None, or
holds gradients to accumulate into), so the op asks the pool: empty slots get
``mm(a, b, out=slot)``; others ``slot += a @ b``, as autograd accumulates (one rounding of
the product, then the add; an ``addmm`` epilogue could round differently).

``dsgraph::addmm_into_(out, bias, a, b)``: the same for a gradient ``bias + a @ b`` (a tied
weight: the embedding's scatter plus the head's matmul), which stock Inductor computes as one
``addmm``. Empty slots get ``addmm(bias, a, b, out=slot)``, the kernel stock runs; others
``slot += addmm(bias, a, b)``, the gradient computed as stock does and then accumulated.

``dsgraph::bucket_ready_(bucket, slots)``: does nothing at run time. An all-reduce bucket is
a view of the gradient pool that the backward receives as a graph input of its own, next to
one input per slot (``dsgraph.passes.allreduce``); Inductor does not know that they alias.
A kernel that reads the bucket (the per-bucket epilogue: ``bucket * 1/world``, the bf16 cast
for the wire) must run after every write of its slots: this op reads the slots and declares
a write of the bucket, so Inductor orders it after the slots' writers and every later
reader of the bucket after it. It launches nothing (an extern call of an empty function).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("dsgraph::mm_into_", mutates_args=("out",))
def mm_into_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    from .pool import MANAGER

    if MANAGER.starts_empty(out):
        torch.mm(a, b, out=out)
    else:
        out.add_(torch.mm(a, b))


@mm_into_.register_fake
def _mm_into_fake(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None


MM_INTO = torch.ops.dsgraph.mm_into_.default


@torch.library.custom_op("dsgraph::addmm_into_", mutates_args=("out",))
def addmm_into_(out: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    from .pool import MANAGER

    if MANAGER.starts_empty(out):
        torch.addmm(bias, a, b, out=out)
    else:
        out.add_(torch.addmm(bias, a, b))


@addmm_into_.register_fake
def _addmm_into_fake(out: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None


ADDMM_INTO = torch.ops.dsgraph.addmm_into_.default


@torch.library.custom_op("dsgraph::bucket_ready_", mutates_args=("bucket",))
def bucket_ready_(bucket: torch.Tensor, slots: list[torch.Tensor]) -> None:
    return None  # an ordering edge only: see the module docstring


@bucket_ready_.register_fake
def _bucket_ready_fake(bucket: torch.Tensor, slots: list[torch.Tensor]) -> None:
    return None


BUCKET_READY = torch.ops.dsgraph.bucket_ready_.default
