"""Reductions as Inductor lowers them, for the op counts of ``inductor_ops``: how many
elements each output combines, whether the reduced dimensions are the input's last ones
(the index it reads its input at), and the pointwise epilogues of mean and variance over
the reduction's buffer (lowering.py ``mean``, ``var_mean_helper_``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.fx import Node

from .. import compat

if TYPE_CHECKING:
    from .inductor_ops import Rules


def reduces_trailing_dims(node: Node) -> bool:
    """Does a reduction node reduce its input's last dimensions (or all of them)? Its
    ``dim`` argument is the second positional one or the ``dim`` keyword."""
    x = node.args[0] if node.args else None
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(val, torch.Tensor):
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    ndim = val.dim()
    if dims is None or ndim == 0:
        return True
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return False
    wanted = sorted(d % ndim for d in dims)
    return wanted == list(range(ndim - len(wanted), ndim))


def mean_epilogue(node: Node) -> tuple[int, frozenset]:
    """mean = sum / n: an index constant and a division, and a cast back when the input
    is half precision (the sum is in float32, lowering.py ``mean``)."""
    val = node.meta.get("val")
    half = isinstance(val, torch.Tensor) and val.dtype in (torch.float16, torch.bfloat16)
    return 1 + int(half), frozenset({("index", reduced_elements(node), torch.float32)})


def variance_epilogue(node: Node, rules: Rules) -> tuple[int, frozenset]:
    """The variance as a pointwise expression over its reduction's buffer
    (lowering.py ``var_mean_helper_``). Two-step (a sum of squared differences) when the
    reduction is short (``use_two_step_variance``): sum / index constant, one division.
    Welford otherwise: m2 / max(0, n - correction), with the constants correction, n and 0
    (a correction of 0 is the same constant as the 0): a subtraction, a maximum, a division."""
    correction = node.kwargs.get("correction")
    correction = 1 if correction is None else correction
    rnumel = reduced_elements(node)
    if two_step_variance(node, rnumel, rules):
        n = max(rnumel - correction, 0) if correction else rnumel
        return 1, frozenset({("index", n, torch.float32)})
    # as Inductor writes them: constant(correction), constant(n), constant(0) (a float
    # correction of 0.0 is not the integer 0)
    consts = {("constant", repr(v), torch.float32) for v in (correction, rnumel, 0)}
    return 3, frozenset(consts)


def two_step_variance(node: Node, rnumel: int, rules: Rules) -> bool:
    val = node.meta.get("val")
    out = val[0] if isinstance(val, (tuple, list)) else val
    if not isinstance(out, torch.Tensor) or numel(out) == 1:
        return False
    src = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], Node) else None
    half = isinstance(src, torch.Tensor) and src.dtype in (torch.float16, torch.bfloat16)
    if rules.cpu:
        return rnumel <= rules.two_step_variance
    if not half:
        return rnumel <= rules.two_step_generic
    # CUDA, half precision: short enough, not in the band left to Welford, not split
    # (the split is not modelled: a reduction this short is not split)
    return rnumel <= rules.two_step_variance and not (rules.unroll < rnumel < rules.two_step_min_numel)


def reduced_elements(node: Node) -> int:
    """Elements each output element of a reduction combines."""
    val = node.meta.get("val")
    outs = [v for v in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(v, torch.Tensor)]
    src = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], Node) else None
    if not outs or not isinstance(src, torch.Tensor):
        return 1
    return numel(src) // max(numel(outs[0]), 1)


def numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= compat.size_hint(s)
    return n
