"""TensorLifetimes: which storage each tensor lives in, and from which node to which.

Keyed by storage, not by node: a view, a reshape, a getitem of a view-returning op and the
output of an in-place op all belong to the storage of their base and allocate nothing; the
storage lives until the last use of any of them. Aliasing comes from the op schemas
(``Tensor(a)`` returns a view of the argument annotated ``a``, ``Tensor(a!)`` writes it),
plus a short list of ops that alias without saying so in their schema.

Sizes use the size hints (fast); ``Storage.nbytes_expr()`` gives the sympy expression over
the graph's size symbols on demand.

Graph-local view of time: index ``i`` is the i-th node of the graph. A storage is live at
every index from ``first`` (its allocating node; -1 for graph inputs, which exist before
the first node) to ``last`` (its last use; ``len(nodes)`` for graph outputs and for inputs
that something outside the graph holds, such as parameters).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import sympy
import torch
from torch.fx import GraphModule, Node

from .. import compat
from .base import Analysis
from .ops import arg_value
from .sweep import live_per_step
from .workspace import workspace_bytes

# Ops that return (a view of) their input although their schema has no alias annotation.
_ALIAS_RE = re.compile(r"Tensor\((\w+)")
_ALIASING_WITHOUT_ANNOTATION = {"aten::_unsafe_view", "_c10d_functional::wait_tensor"}


def tensor_values(val: Any) -> list[tuple[int | None, torch.Tensor]]:
    """The tensors in a node's ``meta['val']``: [(None, t)] or [(i, t_i), ...] for tuples."""
    if isinstance(val, torch.Tensor):
        return [(None, val)]
    if isinstance(val, (tuple, list)):
        return [(i, v) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]
    return []


def _strided_numel(t: torch.Tensor, hint: Callable[[Any], Any]) -> Any:
    """Elements an allocation of this size and stride must hold (empty_strided's rule)."""
    sizes = [hint(s) for s in t.shape]
    strides = [hint(s) for s in t.stride()]
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(sizes, strides))


def storage_bytes(t: torch.Tensor) -> int:
    return int(_strided_numel(t, compat.size_hint)) * t.element_size()


def storage_bytes_expr(t: torch.Tensor) -> sympy.Expr:
    n = _strided_numel(t, compat.sym_expr)
    return sympy.expand(sympy.Integer(0) if n == 0 else n * t.element_size())


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements a tensor shows (its own numel), not of its storage."""
    numel = 1
    for s in t.shape:
        numel *= compat.size_hint(s)
    return numel * t.element_size()


@lru_cache(maxsize=None)
def _return_aliases(op: Any) -> tuple[str | None, ...]:
    """Per schema return: the name of the argument it aliases, or None."""
    schema = compat.op_schema(op)
    out = []
    printed = _printed_returns(schema)
    for ret, ret_text in zip(schema.returns, printed):
        target = None
        sets = _alias_sets(ret, ret_text)
        if sets:
            for arg in schema.arguments:
                if sets & _alias_sets(arg):
                    target = arg.name
                    break
        elif schema.name in _ALIASING_WITHOUT_ANNOTATION:
            target = schema.arguments[0].name
        out.append(target)
    return tuple(out)


def node_bytes(node: Node) -> int:
    """Bytes of the tensor(s) a node produces, as seen through the node (views included)."""
    return sum(tensor_bytes(t) for _, t in tensor_values(node.meta.get("val")))


def storage_key(node: Node):
    """What identifies the storage behind a node's value (its fake storage), so that views
    of one tensor count once; a node without a tensor storage is its own key."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        ref = compat.storage_ref(val)
        if ref is not None:
            return ("storage", ref)
    return ("node", node)


def storage_nbytes(node: Node) -> int:
    """Bytes of the whole storage behind a node's value (not only the part a view sees)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    try:
        return int(compat.size_hint(val.untyped_storage().nbytes()))
    except Exception:
        return tensor_bytes(val)


def bytes_of(nodes, exclude=frozenset()) -> int:
    """Bytes of the storages behind ``nodes``, each storage once, except the storages in
    ``exclude`` (a saved transpose of a weight is the weight: it costs nothing more)."""
    seen: dict = {}
    for n in nodes:
        key = storage_key(n)
        if key not in exclude:
            seen.setdefault(key, storage_nbytes(n))
    return sum(seen.values())


def is_view(node: Node) -> bool:
    """A node whose output aliases an input: a getitem, or an op whose schema returns an
    alias (``Tensor(a)``) and mutates nothing."""
    if node.target is operator.getitem:
        return True
    target = node.target
    return (compat.is_op(target) and not compat.op_schema(target).is_mutable
            and any(name is not None for name in _return_aliases(target)))


def _alias_sets(arg: Any, printed: str = "") -> set[str]:
    info = arg.alias_info
    if info is None:
        return set()
    if info.before_set:
        return set(info.before_set)
    # list returns such as split's "Tensor(a)[]" keep the set on the element type, which
    # the Python binding does not expose: read it from the printed schema
    m = _ALIAS_RE.search(printed)
    return {m.group(1)} if m else set()


def _printed_returns(schema: Any) -> list[str]:
    text = str(schema).rsplit(" -> ", 1)[1].strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return [t.strip() for t in text.split(",")]


@dataclass(eq=False)
class Storage:
    id: int
    root: Node  # the node that allocates it (a placeholder for graph inputs)
    index: int | None  # which element of a multi-output root, or None
    tensor: torch.Tensor  # the fake tensor of the allocation
    nbytes: int
    first: int
    last: int
    is_input: bool = False
    is_output: bool = False
    held: bool = False  # an input that something outside the graph keeps alive
    members: list[Node] = field(default_factory=list)

    def nbytes_expr(self) -> sympy.Expr:
        return storage_bytes_expr(self.tensor)

    @property
    def name(self) -> str:
        return self.root.name if self.index is None else f"{self.root.name}[{self.index}]"

    def __repr__(self) -> str:
        return f"Storage({self.name}, {self.nbytes} B, [{self.first}, {self.last}])"


def default_held(stage: str) -> Callable[[Node], bool]:
    """Which graph inputs outlive the graph.

    Forward and inference graphs receive parameters, buffers and user inputs, all held by
    the caller. A backward graph receives primals (held by the module or the caller) plus
    saved activations and tangents, which AOTAutograd hands over in a list the graph clears:
    those die at their last use in the backward. Inputs dsgraph adds (``dsgraph_*``, such as
    the gradient pool) are persistent buffers.
    """
    if stage == "backward":
        return lambda node: node.name.startswith(("primals", "dsgraph_"))
    return lambda node: True


class TensorLifetimes(Analysis):
    name = "TensorLifetimes"

    def __init__(self, gm: GraphModule, held: Callable[[Node], bool] | None = None):
        self.gm = gm
        self.nodes: list[Node] = list(gm.graph.nodes)
        self.index: dict[Node, int] = {n: i for i, n in enumerate(self.nodes)}
        self.storages: list[Storage] = []
        self.storage_of: dict[Node, Storage] = {}
        self._allocated: dict[Node, int] = {}
        # storages of multi-output nodes by (node, element index)
        self._elements: dict[tuple[Node, int], Storage] = {}
        held = held or (lambda node: True)
        self._build(held)
        self.live: list[int] = self._sweep()

    @classmethod
    def compute(cls, gm: GraphModule, ctx: Any) -> "TensorLifetimes":
        return cls(gm, default_held(ctx.stage))

    # -- construction ---------------------------------------------------------------------

    def _new(self, root: Node, index: int | None, t: torch.Tensor, first: int) -> Storage:
        s = Storage(len(self.storages), root, index, t, storage_bytes(t), first, first)
        self.storages.append(s)
        if first >= 0:
            self._allocated[root] = self._allocated.get(root, 0) + s.nbytes
        return s

    def _join(self, node: Node, storage: Storage) -> None:
        self.storage_of[node] = storage
        storage.members.append(node)

    def _build(self, held: Callable[[Node], bool]) -> None:
        end = len(self.nodes)
        fake_storage_owner: dict[Any, Storage] = {}
        for i, node in enumerate(self.nodes):
            if node.op == "output":
                for arg in node.all_input_nodes:
                    self._use(arg, end)
                    if arg in self.storage_of:
                        self.storage_of[arg].is_output = True
                continue
            for arg in node.all_input_nodes:
                self._use(arg, i)
            vals = tensor_values(node.meta.get("val"))
            if not vals:
                continue
            if node.op in ("placeholder", "get_attr"):
                t = vals[0][1]
                key = compat.storage_ref(t)
                existing = fake_storage_owner.get(key) if key is not None else None
                if existing is not None:  # an input that aliases an earlier input
                    self._join(node, existing)
                    continue
                s = self._new(node, None, t, -1)
                s.is_input = True
                s.held = node.op == "get_attr" or held(node)
                s.last = end if s.held else -1
                if key is not None:
                    fake_storage_owner[key] = s
                self._join(node, s)
                continue
            if node.op == "call_function" and node.target is operator.getitem:
                src, idx = node.args[0], node.args[1]
                element = self._elements.get((src, idx)) if isinstance(src, Node) else None
                if element is not None:
                    self._join(node, element)
                    continue
            aliases = self._aliases(node)
            if isinstance(node.meta.get("val"), torch.Tensor):
                target = aliases[0] if aliases else None
                if target is not None:
                    self._join(node, target)
                else:
                    self._join(node, self._new(node, None, vals[0][1], i))
            else:
                for idx, t in vals:
                    target = aliases[idx] if aliases and idx < len(aliases) else None
                    if target is None and aliases and len(aliases) == 1 and isinstance(node.meta["val"], list):
                        target = aliases[0]  # Tensor(a)[]: every element is a view
                    if target is None:
                        target = self._new(node, idx, t, i)
                    self._elements[(node, idx)] = target

    def _aliases(self, node: Node) -> list[Storage | None] | None:
        """For each return of the op, the storage it aliases (None: a fresh allocation)."""
        if node.op != "call_function":
            return None
        target = node.target
        if compat.is_op(target):
            result = []
            for name in _return_aliases(target):
                arg = arg_value(node, name) if name else None
                result.append(self.storage_of.get(arg) if isinstance(arg, Node) else None)
            # An op's schema is the truth: no annotation means a fresh allocation, even
            # when a pass copied an input's fake tensor into the new node's meta.
            return result
        # Other callables (higher-order ops, Python functions): trust the fake tensors when
        # the output shares an input's storage.
        out_vals = tensor_values(node.meta.get("val"))
        if len(out_vals) == 1 and out_vals[0][0] is None:
            key = compat.storage_ref(out_vals[0][1])
            for arg in node.all_input_nodes:
                arg_vals = tensor_values(arg.meta.get("val"))
                if key is not None and len(arg_vals) == 1 and compat.storage_ref(arg_vals[0][1]) == key:
                    return [self.storage_of.get(arg)]
        return None

    def _use(self, node: Node, at: int) -> None:
        storage = self.storage_of.get(node)
        if storage is not None:
            if storage.last < at:
                storage.last = at
            return
        # a multi-output node used directly (its getitems carry the real uses): keep all
        # its elements alive until then, as the tuple holds them
        for idx, _ in tensor_values(node.meta.get("val")):
            element = self._elements.get((node, idx))
            if element is not None and element.last < at:
                element.last = at

    def _sweep(self) -> list[int]:
        n = len(self.nodes)
        if n == 0:
            return []

        def interval(s: Storage) -> tuple[int, int, int]:
            if s.is_input and not s.held and s.last < 0:
                return 0, 0, s.nbytes  # an input nothing reads: it exists when the graph starts
            return s.first, s.last, s.nbytes

        # an op's own temporaries (dsgraph.analysis.workspace) are live at its node only
        transient = [(i, i, w) for i, node in enumerate(self.nodes) if (w := workspace_bytes(node))]
        return live_per_step(n, [*(interval(s) for s in self.storages), *transient])

    # -- queries --------------------------------------------------------------------------

    def node_bytes(self, node: Node) -> int:
        """Bytes of the tensor(s) the node produces, as seen through the node (views included)."""
        return node_bytes(node)

    def allocated_by(self, node: Node) -> int:
        """Bytes the node newly allocates (0 for views, in-place ops and inputs)."""
        return self._allocated.get(node, 0)

    def peak(self) -> tuple[int, Node | None]:
        if not self.live:
            return 0, None
        i = max(range(len(self.live)), key=self.live.__getitem__)
        return self.live[i], self.nodes[i]

    def saved_bytes(self, saved_names) -> int:
        """Bytes of this (forward) graph's own storages that the backward receives, each
        storage once, inputs not counted."""
        names = set(saved_names)
        storages = {self.storage_of[n].id: self.storage_of[n] for n in self.nodes
                    if n.name in names and n in self.storage_of}
        return sum(s.nbytes for s in storages.values() if not s.is_input)

    def live_at(self, node: Node) -> int:
        return self.live[self.index[node]]
