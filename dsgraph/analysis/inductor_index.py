"""The index at which an expression reads each value, for Inductor's op counter.

Inductor's ``inner_fn_opcount`` runs a pointwise node's loader under a CSE handler
(``OpCounterCSE``): an op is counted once per distinct (op, arguments), a load once per
distinct (buffer, index). An expression read at two indices (a slice and its neighbour, a
position compared with the transposed positions, the few elements of an unrolled
reduction) is evaluated twice and counted twice, unless both indices are the same
expression, which Inductor sees after sympy simplification (two paths through different
views that land on the same element are one load).

The emulation sees the same by numbers: an index map is a function from the coordinates
of the node being lowered to the coordinates of the value read (over the FX shapes: a
layout does not change which element is read), evaluated on sample points of the root's
index space and compared as row-major flat indices of the value read. Two maps that agree
on every sample are one map. A step is one FX edge's map (a view, a broadcast, a
slice_scatter's shift, one element of an unrolled reduction); a map is a chain of steps,
kept canonical by its fingerprint. Indirect indexing (``index``, ``gather``,
``embedding``) reads at data: an opaque step, distinct for each edge.

Steps carry coordinates, not flat indices, because Inductor's indices are expressions of
coordinates: a reshape maps each group of dimensions on its own
(``View._dynamic_reshape_indexer``: ``ModularIndexing`` of a split dimension, a sum for
merged ones), so a coordinate outside its dimension (a slice_scatter's source read where
the mask is off: ``j - 8`` for ``j < 8``) stays in that dimension. Through a flat index it
would borrow from the next dimension out, and two reads that are one expression to
sympy would look like two: Llama's rotary backward reads its sine table at ``j - 8`` and
``j + 8``, both ``ModularIndexing(j, 1, 8)`` through the table's (2, 8) expand, one read
and 13 ops fewer than counted by flat indices (torch 2.11 CPU and the GPU threshold of 30
ops: issue 12, session 28).
"""

from __future__ import annotations

import functools
import operator
from typing import Callable, Sequence

import numpy as np
import torch
from torch.fx import Node

from .. import compat

_SAMPLES = 512  # sample points of a large index space (all points of a small one)
_EXACT = 4096


class Step:
    """One edge's index map: consumer coordinates (over ``out``) -> producer coordinates
    (over ``inp``) (``fn``, on arrays of sample points), or ``fn is None`` for an indirect
    read (opaque: distinct from every other step)."""

    __slots__ = ("fn", "out", "inp", "key")

    def __init__(self, fn: Callable[[list], list] | None, out: tuple, inp: tuple, key=None):
        self.fn, self.out, self.inp, self.key = fn, tuple(out), tuple(inp), key

    @property
    def out_numel(self) -> int:
        return _numel(self.out)


class IndexMaps:
    """Canonical ids of index maps (chains of steps), shared by every emulation of one
    graph: compositions are memoized, so a planner's thousands of partitions pay once."""

    def __init__(self):
        self.chains: list[tuple] = [()]  # by map id; id 0 is not used (None: the identity)
        self._ids: dict = {}
        self._memo: dict = {}
        self._then: dict = {}
        self._addresses: dict = {}

    def compose(self, step: Step | None, mid: int | None) -> int | None:
        """The map of reading, through ``step``, a value its producer reads at map ``mid``
        (None: at its own index)."""
        if step is None:
            return mid
        key = (step, mid)
        if key in self._memo:
            return self._memo[key]
        got = self._intern((step,) + (self.chains[mid] if mid is not None else ()))
        self._memo[key] = got
        return got

    def _intern(self, chain: tuple) -> int | None:
        """The id of ``chain``'s map: that of the first chain seen with its fingerprint
        (None: every element read at its own index, the identity)."""
        fp = _fingerprint(chain)
        if fp is None:
            return None
        got = self._ids.get(fp)
        if got is None:
            got = len(self.chains)
            self.chains.append(chain)
            self._ids[fp] = got
        return got

    def then(self, outer: int | None, inner: int | None) -> int | None:
        """The map of reading, at map ``outer``, a value that reads its own input at map
        ``inner`` (the two chains one after the other)."""
        if outer is None:
            return inner
        if inner is None:
            return outer
        key = (outer, inner)
        got = self._then.get(key, 0)
        if got != 0:
            return got
        got = self._intern(self.chains[outer] + self.chains[inner])
        self._then[key] = got
        return got

    def address(self, mid: int | None, shape: tuple, strides: tuple):
        """A hashable key of the memory offsets map ``mid`` reads in a tensor of ``shape``
        laid out with ``strides``: two maps with one key read one address at every index
        (Inductor sees one load). A map whose chain ends in another number of elements, or
        reads at data: its own id."""
        key = (mid, shape, strides)
        got = self._addresses.get(key, 0)
        if got != 0:
            return got
        chain = self.chains[mid] if mid is not None else ()
        got = mid
        shape = tuple(shape)
        if not chain or _numel(chain[-1].inp) == _numel(shape):
            root = chain[0].out if chain else shape
            idx = _samples(_numel(root))
            c, at, _ = _walk(chain, root, idx)
            if c is not None:
                if at != shape:  # a reshape left out of the chain
                    c = _regroup(c, at, shape, idx)
                flat = np.zeros_like(idx)
                for coord, stride in zip(c, strides):
                    flat = flat + coord * stride
                got = ("address", _numel(root), flat.tobytes())
        self._addresses[key] = got
        return got


def _samples(n: int) -> np.ndarray:
    if n <= _EXACT:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(n)
    return np.concatenate([[0, n - 1], rng.integers(0, n, _SAMPLES)]).astype(np.int64)


def _walk(chain: tuple, root: tuple, idx: np.ndarray):
    """The coordinates the sample points ``idx`` of ``root`` read through ``chain``:
    (coordinates, their shape, None), or at an indirect step (None, None, (coordinates
    before it, their shape, its position))."""
    c, shape = _unravel(idx, root), root
    for k, step in enumerate(chain):
        if step.out != shape:  # a reshape left out of the chain (an identity by flat index)
            c, shape = _regroup(c, shape, step.out, idx), step.out
        if step.fn is None:
            return None, None, (c, shape, k)
        c, shape = step.fn(c), step.inp
    return c, shape, None


def _fingerprint(chain: tuple) -> tuple:
    n = _numel(chain[0].out)
    idx = _samples(n)
    c, shape, stop = _walk(chain, chain[0].out, idx)
    if c is None:  # indirect: what follows is read at data, not at an index
        before, at, k = stop
        return (n, id(chain[k]), _ravel(before, at, idx).tobytes(), tuple(id(s) for s in chain[k + 1:]))
    flat = _ravel(c, shape, idx)
    if np.array_equal(flat, idx):
        return None
    return (n, flat.tobytes())


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


def _ravel(coords: Sequence[np.ndarray], shape: Sequence[int], like: np.ndarray) -> np.ndarray:
    """Row-major flat indices of ``coords`` (a scalar's: 0 at each sample of ``like``)."""
    flat = np.zeros_like(like)
    for c, s in zip(coords, shape):
        flat = flat * s + c
    return flat


def _coord_step(out: tuple, inp: tuple, f: Callable[[list], list], key) -> Step:
    """A step from a function of the consumer's coordinates to the producer's."""
    if not inp:
        return Step(lambda c: [], out, inp, key)
    return Step(f, out, inp, key)


@functools.lru_cache(maxsize=4096)
def _reshaper(out: tuple, inp: tuple) -> Step | None:
    return reshape(out, inp) if _numel(out) == _numel(inp) else None


def _regroup(c: list, shape: tuple, to: tuple, like: np.ndarray) -> list:
    """Coordinates over ``shape`` as a view of ``to`` reads them (Inductor's reshape
    indexer, ``reshape``): a chain drops a reshape whose map is the identity by flat index
    (``IndexMaps.compose``), yet a coordinate outside its dimension must stay in it."""
    step = _reshaper(shape, to)
    if step is None:
        return _unravel(_ravel(c, shape, like), to)
    return step.fn(c)


def reshape(out: tuple, inp: tuple) -> Step | None:
    """A view of ``inp`` as ``out`` (view, reshape, unsqueeze, squeeze, ...) as Inductor's
    ``View._dynamic_reshape_indexer`` indexes it: from the innermost dimensions out, an
    equal size passes its coordinate, consumer dimensions merged into one producer
    dimension sum, a consumer dimension split over producer ones is taken apart with
    ``ModularIndexing`` (floor division, then a floor modulo) each; a size-1 producer
    dimension reads 0. None: the same shape."""
    if out == inp:
        return None
    plan = _reshape_plan(out, inp)
    if plan is None:  # sizes that do not group (a zero-size dimension): by flat index
        return _coord_step(out, inp, lambda c: _unravel(_ravel(c, out, c[0] if c else np.zeros(1, np.int64)), inp),
                           ("reshape", out, inp))

    def f(c):
        got = []
        for p in plan:
            if p[0] == "zero":
                got.append(np.zeros_like(c[0]) if c else np.zeros(1, dtype=np.int64))
            elif p[0] == "sum":
                v = c[p[1][0]]
                for d in p[1][1:]:
                    v = v * out[d] + c[d]
                got.append(v)
            else:
                got.append((c[p[1]] // p[2]) % p[3])
        return got
    return _coord_step(out, inp, f, ("reshape", out, inp))


def _reshape_plan(out: tuple, inp: tuple) -> list | None:
    """``reshape``'s expression per producer dimension, outermost first: ("zero",),
    ("sum", consumer dims), ("mod", consumer dim, divisor, modulus); None where the sizes do
    not group as Inductor's indexer assumes."""
    plan: list = []  # innermost first
    new = list(range(len(out)))
    old = list(inp)
    while new and old:
        size_old = old.pop()
        d = new.pop()
        size_new = out[d]
        if size_old == 1:
            plan.append(("zero",))
            new.append(d)
        elif size_new == 1:
            old.append(size_old)
        elif size_new == size_old:
            plan.append(("sum", (d,)))
        elif size_new < size_old:
            dims = [d]
            while size_new < size_old:
                if not new:
                    return None
                d2 = new.pop()
                dims.insert(0, d2)
                size_new *= out[d2]
            if size_new != size_old:
                return None
            plan.append(("sum", tuple(dims)))
        else:
            divisor, modulus = 1, size_old
            plan.append(("mod", d, divisor, modulus))
            divisor *= modulus
            while size_new > size_old:
                if not old:
                    return None
                modulus = old.pop()
                plan.append(("mod", d, divisor, modulus))
                divisor *= modulus
                size_old *= modulus
            if size_new != size_old:
                return None
    if any(s != 1 for s in old) or any(out[d] != 1 for d in new):
        return None
    plan.extend(("zero",) for _ in old)
    plan.reverse()
    return plan


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
        return reshape(out, inp)
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
    return Step(None, out, inp, ("opaque", node.name))  # as_strided, diagonal, unfold, ...


def drop(out: tuple, inp: tuple, dim: int, index: int) -> Step:
    """``producer = consumer`` with coordinate ``index`` inserted at ``dim`` (a select; a
    select_scatter's source)."""
    def fn(c):
        c = list(c)
        c.insert(dim, np.full_like(c[0], index) if c else np.full(1, index, dtype=np.int64))
        return c
    return Step(fn, out, inp, ("select", out, inp, dim, index))


def coords(out: tuple, inp: tuple, f: Callable[[list], list], key) -> Step:
    """A step given as a function of coordinates (the pointwise lowerings that move)."""
    return _coord_step(out, inp, f, key)


def opaque(node: Node, arg: int) -> Step:
    val = node.meta.get("val")
    out = _shape(val) if isinstance(val, torch.Tensor) else ()
    return Step(None, out, (), ("indirect", node.name, arg))
