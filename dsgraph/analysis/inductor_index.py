"""The index at which an expression reads each value, for Inductor's op counter.

Inductor's ``inner_fn_opcount`` runs a pointwise node's loader under a CSE handler
(``OpCounterCSE``): an op is counted once per distinct (op, arguments), a load once per
distinct (buffer, index). An expression read at two indices (a slice and its neighbour, a
position compared with the transposed positions, the few elements of an unrolled
reduction) is evaluated twice and counted twice, unless both indices are the same
expression, which Inductor sees after sympy simplification (two paths through different
views that land on the same element are one load).

The emulation sees the same by numbers: an index map is a function from the flat index
of the node being lowered to the flat index of the value read (row-major over the FX
shape: a layout does not change which element is read), evaluated on sample points of
the root's index space. Two maps that agree on every sample are one map. A step is one
FX edge's map (a view, a broadcast, a slice_scatter's shift, one element of an unrolled
reduction); a map is a chain of steps, kept canonical by its fingerprint. Indirect
indexing (``index``, ``gather``, ``embedding``) reads at data: an opaque step, distinct for
each edge.
"""

from __future__ import annotations

import operator
from typing import Callable, Sequence

import numpy as np
import torch
from torch.fx import Node

from .. import compat

_SAMPLES = 512  # sample points of a large index space (all points of a small one)
_EXACT = 4096


class Step:
    """One edge's index map: consumer flat indices -> producer flat indices (``fn``), or
    ``fn is None`` for an indirect read (opaque: distinct from every other step)."""

    __slots__ = ("fn", "out_numel", "key")

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray] | None, out_numel: int, key=None):
        self.fn, self.out_numel, self.key = fn, out_numel, key


class IndexMaps:
    """Canonical ids of index maps (chains of steps), shared by every emulation of one
    graph: compositions are memoized, so a planner's thousands of partitions pay once."""

    def __init__(self):
        self.chains: list[tuple] = [()]  # by map id; id 0 is not used (None: the identity)
        self._ids: dict = {}
        self._memo: dict = {}

    def compose(self, step: Step | None, mid: int | None) -> int | None:
        """The map of reading, through ``step``, a value its producer reads at map ``mid``
        (None: at its own index)."""
        if step is None:
            return mid
        key = (step, mid)
        if key in self._memo:
            return self._memo[key]
        chain = (step,) + (self.chains[mid] if mid is not None else ())
        fp = _fingerprint(chain)
        if fp is None:
            got = None  # every element read at its own index: the identity
        else:
            got = self._ids.get(fp)
            if got is None:
                got = len(self.chains)
                self.chains.append(chain)
                self._ids[fp] = got
        self._memo[key] = got
        return got


def _fingerprint(chain: tuple) -> tuple:
    n = chain[0].out_numel
    if n <= _EXACT:
        idx = np.arange(n, dtype=np.int64)
    else:
        rng = np.random.default_rng(n)
        idx = np.concatenate([[0, n - 1], rng.integers(0, n, _SAMPLES)]).astype(np.int64)
    start = idx
    for k, step in enumerate(chain):
        if step.fn is None:  # indirect: what follows is read at data, not at an index
            return (n, id(step), idx.tobytes(), tuple(id(s) for s in chain[k + 1:]))
        idx = step.fn(idx)
    if np.array_equal(idx, start):
        return None
    return (n, idx.tobytes())


# -- steps of FX edges ---------------------------------------------------------------

def _shape(v) -> tuple[int, ...]:
    return tuple(int(compat.size_hint(s)) for s in v.shape)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _unravel(flat: np.ndarray, shape: Sequence[int]) -> list[np.ndarray]:
    coords = []
    for s in reversed(shape):
        s = max(s, 1)
        coords.append(flat % s)
        flat = flat // s
    return coords[::-1]


def _ravel(coords: Sequence[np.ndarray], shape: Sequence[int]) -> np.ndarray:
    flat = np.zeros_like(coords[0]) if coords else np.zeros(1, dtype=np.int64)
    for c, s in zip(coords, shape):
        flat = flat * s + c
    return flat


def _coord_step(out: tuple, inp: tuple, f: Callable[[list], list], key) -> Step:
    """A step from a function of the consumer's coordinates to the producer's."""
    if not inp:
        return Step(lambda flat: np.zeros_like(flat), _numel(out), key)
    return Step(lambda flat: _ravel(f(_unravel(flat, out)), inp), _numel(out), key)


def broadcast(out: tuple, inp: tuple) -> Step | None:
    """Reading ``inp`` broadcast to ``out`` (an ``expand``, or a pointwise op's own
    broadcasting of its inputs): size-1 dimensions read element 0."""
    if out == inp:
        return None
    lead = len(out) - len(inp)
    if lead < 0:
        return None  # not a broadcast (a reshape): the same flat element

    def f(c):
        return [c[lead + d] if inp[d] != 1 or out[lead + d] == 1 else np.zeros_like(c[0]) for d in range(len(inp))]
    return _coord_step(out, inp, f, ("broadcast", out, inp))


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def shift(out: tuple, inp: tuple, dim: int, start: int, step: int = 1) -> Step:
    """``producer[dim] = start + step * consumer[dim]`` (a slice; with a negative start, a
    slice_scatter's source or a cat's later input)."""
    def f(c):
        c = list(c)
        c[dim] = start + step * c[dim]
        return c
    return _coord_step(out, inp, f, ("shift", out, inp, dim, start, step))


def view_steps(node: Node) -> Step | None:
    """The step of a view node from its input (None: the same flat element, a reshape)."""
    name = node.target.overloadpacket.__name__ if compat.is_op(node.target) else ""
    if node.target is operator.getitem or not node.args or not isinstance(node.args[0], Node):
        return None
    src = node.args[0].meta.get("val")
    val = node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
        return None
    inp, out = _shape(src), _shape(val)
    args = node.args
    if name in ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "alias", "flatten", "unflatten",
                "_reshape_alias", "view_as", "lift_fresh", "detach"):
        return None
    if name == "expand":
        return broadcast(out, inp)
    if name in ("permute", "transpose", "t"):
        rank = len(inp)
        if name == "permute":
            dims = [_dim(d, rank) for d in args[1]]
        else:
            dims = list(range(rank))
            if rank >= 2:
                a, b = (_dim(args[1], rank), _dim(args[2], rank)) if name == "transpose" else (0, 1)
                dims[a], dims[b] = dims[b], dims[a]
        inverse = [0] * rank
        for k, d in enumerate(dims):
            inverse[d] = k
        return _coord_step(out, inp, lambda c: [c[inverse[d]] for d in range(rank)], ("permute", out, tuple(dims)))
    if name in ("slice", "narrow"):
        rank = len(inp)
        dim = _dim(args[1] if len(args) > 1 else 0, rank)
        if name == "narrow":
            start, step = int(compat.size_hint(args[2])), 1
        else:
            start = args[2] if len(args) > 2 and args[2] is not None else 0
            start = int(compat.size_hint(start))
            start = max(start + inp[dim], 0) if start < 0 else min(start, inp[dim])
            step = int(args[4]) if len(args) > 4 else 1
        if start == 0 and step == 1:
            return shift(out, inp, dim, 0) if out != inp else None
        return shift(out, inp, dim, start, step)
    if name == "select":
        rank = len(inp)
        dim = _dim(args[1], rank)
        index = int(compat.size_hint(args[2]))
        index = index + inp[dim] if index < 0 else index

        return drop(out, inp, dim, index)
    return Step(None, _numel(out), ("opaque", node.name))  # as_strided, diagonal, unfold, ...


def drop(out: tuple, inp: tuple, dim: int, index: int) -> Step:
    """``producer = consumer`` with coordinate ``index`` inserted at ``dim`` (a select; a
    select_scatter's source)."""
    def fn(flat):
        c = _unravel(flat, out)
        c.insert(dim, np.full_like(flat, index))
        return _ravel(c, inp)
    return Step(fn, _numel(out), ("select", out, inp, dim, index))


def coords(out: tuple, inp: tuple, f: Callable[[list], list], key) -> Step:
    """A step given as a function of coordinates (the pointwise lowerings that move)."""
    return _coord_step(out, inp, f, key)


def opaque(node: Node, arg: int) -> Step:
    val = node.meta.get("val")
    n = _numel(_shape(val)) if isinstance(val, torch.Tensor) else 1
    return Step(None, n, ("indirect", node.name, arg))
