"""How each pointwise op of the emulation reads its inputs: the index map of every input
(``OpInfo.maps``), for the ops that read elsewhere than at the broadcast of their own index
(indirect reads, scatters into a slice, padding, concatenation, unrolled reductions,
repeat, flip, embedding). Split from ``inductor_ops``, which classifies the ops and counts
their ops; the op counter's CSE keys its loads by these maps."""

from __future__ import annotations

import operator

import numpy as np
import torch
from torch.fx import Node

from .. import compat
from . import inductor_index as ix
from .inductor_reductions import reduced_elements

# an unrolled reduction combines its few elements with one op per element after the first
_UNROLLED = {"sum", "amax", "amin", "prod", "any", "all", "max", "min", "mean"}
# pointwise ops that reads a tensor argument at data (an indirect index): (op, argument)
_INDIRECT = {("index", 0), ("_unsafe_index", 0), ("gather", 0), ("embedding", 0)}


def scatter_slice(node: Node) -> tuple[int, int, int, int]:
    """A slice_scatter's (dim, start, end, step), normalised as ``slice`` does."""
    x = node.args[0].meta["val"]
    rank = x.dim()
    args = list(node.args) + [None] * (6 - len(node.args))
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", 0)
    dim = dim + rank if dim < 0 else dim
    size = int(compat.size_hint(x.shape[dim]))
    start = args[3] if args[3] is not None else node.kwargs.get("start")
    end = args[4] if args[4] is not None else node.kwargs.get("end")
    step = args[5] if args[5] is not None else node.kwargs.get("step", 1)
    start = 0 if start is None else int(compat.size_hint(start))
    end = size if end is None else int(compat.size_hint(end))
    start = max(start + size, 0) if start < 0 else min(start, size)
    end = max(end + size, 0) if end < 0 else min(end, size)
    return dim, start, end, int(step or 1)


def read_maps(node: Node, name: str, is_view: bool) -> tuple:
    """The index maps each input is read at (``OpInfo.maps``): ``name`` the op's, ``is_view``
    whether it is a view (read at its view steps)."""
    inputs = list(dict.fromkeys(node.all_input_nodes))
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or node.target is operator.getitem:
        return tuple((None,) for _ in inputs)
    if is_view:
        return ((ix.view_steps(node),),) + tuple((None,) for _ in inputs[1:])
    out = ix._shape(val)
    special = _moving_maps(node, name, out)
    maps = []
    for k, a in enumerate(inputs):
        if a in special:
            maps.append(tuple(special[a]))
            continue
        v = a.meta.get("val")
        maps.append((ix.broadcast(out, ix._shape(v)) if isinstance(v, torch.Tensor) else None,))
    return tuple(maps)


def _moving_maps(node: Node, name: str, out: tuple) -> dict:
    """Inputs a pointwise lowering reads elsewhere than at the broadcast of its own index."""
    args = node.args
    first = args[0] if args and isinstance(args[0], Node) else None
    src = ix._shape(first.meta["val"]) if first is not None and isinstance(first.meta.get("val"), torch.Tensor) else ()
    if first is not None and (name, 0) in _INDIRECT:
        return {first: [ix.opaque(node, 0)]}
    if name == "slice_scatter" and len(args) > 1 and isinstance(args[1], Node):
        dim, start, end, step = scatter_slice(node)
        shape = ix._shape(args[1].meta["val"])
        region = list(out)
        region[dim] = max((end - start + step - 1) // step, 0)
        region = tuple(region)

        def f(c, dim=dim, start=start, step=step):
            c = list(c)
            c[dim] = (c[dim] - start) // step
            return c
        moved = ix.coords(out, region, f, ("slice_scatter", out, dim, start, step))
        inner = ix.broadcast(region, shape)
        steps = [moved] if inner is None else [_chain(moved, inner)]
        return {args[1]: steps}
    if name == "select_scatter" and len(args) > 1 and isinstance(args[1], Node):
        rank = len(out)
        dim = args[2] + rank if args[2] < 0 else args[2]
        index = int(compat.size_hint(args[3]))
        index = index + out[dim] if index < 0 else index
        shape = ix._shape(args[1].meta["val"])
        return {args[1]: [ix.coords(out, shape, lambda c, d=dim: c[:d] + c[d + 1:], ("select_scatter", out, dim))]}
    if name == "constant_pad_nd" and first is not None:
        pad = list(args[1])
        rank = len(out)
        before = [0] * rank
        for k in range(len(pad) // 2):
            before[rank - 1 - k] = int(pad[2 * k])
        return {first: [ix.coords(out, src, lambda c: [c[d] - before[d] for d in range(rank)],
                                  ("pad", out, tuple(before)))]}
    if name == "cat" and first is None and args and isinstance(args[0], (list, tuple)):
        rank = len(out)
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        dim = dim + rank if dim < 0 else dim
        steps: dict = {}
        offset = 0
        for a in args[0]:
            shape = ix._shape(a.meta["val"])
            if len(shape) == rank:
                steps.setdefault(a, []).append(ix.shift(out, shape, dim, -offset))
                offset += shape[dim]
        return steps
    if name in _UNROLLED and first is not None and reduced_elements(node) > 1 and len(node.all_input_nodes) == 1:
        return {first: _unrolled_steps(node, out, src)}
    if name == "repeat" and first is not None:
        lead = len(out) - len(src)
        return {first: [ix.coords(out, src, lambda c: [c[lead + d] % src[d] for d in range(len(src))],
                                  ("repeat", out, src))]}
    if name == "flip" and first is not None:
        dims = {d + len(out) if d < 0 else d for d in args[1]}
        return {first: [ix.coords(out, src, lambda c: [out[d] - 1 - c[d] if d in dims else c[d]
                                                       for d in range(len(out))], ("flip", out, tuple(dims)))]}
    if name == "gather" and len(args) > 2 and isinstance(args[2], Node):
        return {}
    if name == "embedding" and len(args) > 1 and isinstance(args[1], Node):
        shape = ix._shape(args[1].meta["val"])
        return {args[1]: [ix.coords(out, shape, lambda c: c[:-1], ("embedding", out))]}
    return {}


def _unrolled_steps(node: Node, out: tuple, src: tuple) -> list:
    """One read of the input per element of an unrolled reduction."""
    rank = len(src)
    dims = node.args[1] if len(node.args) > 1 else None
    if dims is None or dims == []:
        dims = list(range(rank))
    dims = sorted({(d + rank if d < 0 else d) for d in ([dims] if isinstance(dims, int) else dims)})
    keep = len(out) == rank
    sizes = [src[d] for d in dims]
    steps = []
    for k in range(ix._numel(sizes)):
        picks = []
        for s in reversed(sizes):
            picks.append(k % s)
            k //= s
        picks = dict(zip(dims, reversed(picks)))

        def f(c, picks=picks):
            kept = iter(c if not keep else [c[d] for d in range(rank) if d not in picks])
            return [np.full_like(c[0] if c else np.zeros(1, dtype=np.int64), picks[d]) if d in picks else next(kept)
                    for d in range(rank)]
        steps.append(ix.coords(out, src, f, ("unroll", out, src, tuple(picks.items()))))
    return steps


def _chain(outer, inner):
    """Two steps as one."""
    return ix.Step(lambda c: inner.fn(outer.fn(c)), outer.out, inner.inp, ("chain", outer.key, inner.key))
