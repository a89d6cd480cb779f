"""inductor_model: Inductor's buffer plan of a graph, emulated from the FX graph alone.

The checkpoint planner weighs thousands of partitions that Inductor has not compiled; it
needs Inductor's plan of each in milliseconds. This module replays the decisions Inductor's
graph lowering makes node by node (torch/_inductor/graph.py ``run_node``, ir.py
``StorageBox``, lowering.py; torch 2.11 to 2.13), on integer ids:

- a pointwise op is an unrealized expression: a set of loads (buffer, index) and of ops;
  a consumer inlines it. Views stay views of what they view;
- an expression is *realized* (written to a buffer) when a kernel Inductor does not
  generate reads it (matmuls, convolutions, attention, fallback kernels:
  ``needs_realized_inputs`` and ``fallbacks``), when it is a graph output, when a reduction
  or a scatter is made of it (the op itself is a buffer; its inputs are fused into it),
  and by the store-or-recompute rules for reuse: with more than one user,
  ``should_realize_on_reuse`` (on CPU any of exp, log, sigmoid, tanh among its ops; more
  than ``realize_opcount_threshold`` ops; more than ``realize_reads_threshold`` loads),
  ``has_exceeded_max_reads`` (more than ``realize_acc_reads_threshold`` loads), and more
  than 100 ops. An expression realized because a later node needs it is computed there,
  right before that node: its loads keep their buffers alive until then;
- a buffer lives from the kernel that writes it to the last kernel that loads it (an
  expression inlined into several kernels is read by each); graph outputs outlive the
  graph; a pointwise or reduction kernel writes into a buffer of the same size that it
  loads element for element and whose last use it is (Inductor's in-place reuse), a
  donated graph input included;
- ``cat`` on CPU is a concat kernel: its unrealized inputs are computed into the output.

- the scheduler: vertical and horizontal fusion groups (``_fuse``: buffers a group both
  writes and reads alone become kernel-local, never allocated) and its
  ``reorder_for_peak_memory`` over the fused kernels (``_reorder_for_peak_memory``).

Held against Inductor's real plans on the zoo (``dsgraph.recompute.truth``,
tests/e2e/test_checkpoint_zoo.py).

``emulate(graph)`` takes an ``EmulatedGraph`` (node ids in execution order, their inputs,
user counts, outputs) and returns the plan's steps and buffers as ``InductorRun``.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.fx import Node

from .. import compat

from .lifetimes import is_view, tensor_values

# what each node is for Inductor
PLACEHOLDER, VIEW, POINTWISE, REDUCTION, EXTERN, MUTATE, CAT, SCATTER, GETITEM, NONE = range(10)

_REDUCTIONS = {"sum", "mean", "amax", "amin", "var_mean", "var", "prod", "any", "all", "argmax", "argmin",
               "max", "min", "std", "logsumexp", "norm", "linalg_vector_norm"}
_SCATTERS = {"_unsafe_masked_index_put_accumulate", "index_put", "_unsafe_index_put", "scatter", "scatter_add",
             "scatter_reduce", "index_add", "embedding_dense_backward", "index_reduce"}
# lowered to a template or an extern kernel call although not a fallback (their lowering
# realizes the inputs itself): matmuls and convolutions
_TEMPLATES = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_int_mm", "_scaled_mm", "_addmm_activation", "convolution",
              "_convolution", "convolution_backward", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_flex_attention", "flex_attention"}
_HEAVY = {"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"}
_MUTATING = {"copy_"}
# element-moving ops: an output read through one of them is not read at its own index
MOVES = {"slice", "select", "narrow", "as_strided", "permute", "transpose", "t", "expand", "flip", "roll",
         "diagonal", "unfold", "repeat", "index", "_unsafe_index", "gather", "constant_pad_nd", "cat",
         "slice_scatter", "select_scatter", "embedding"}


def op_name(node: Node) -> str:
    """The op's name without overload (``mm``), or the callable's name."""
    target = node.target
    if compat.is_op(target):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


@functools.lru_cache(maxsize=1)
def _registries():
    return compat.inductor_registries()


@dataclass(frozen=True)
class Rules:
    """The thresholds Inductor's lowering uses; they differ between CPU and GPU."""

    cpu: bool
    opcount: int  # realize_opcount_threshold (CPU: realize_cpu_opcount_threshold)
    reads: int  # realize_reads_threshold: loads above which a reused expression is stored
    acc_reads: int  # realize_acc_reads_threshold (CPU: realize_cpu_acc_reads_threshold)
    pointwise_cat_inputs: int  # GPU: a cat of at most this many inputs is pointwise
    unroll: int  # unroll_reductions_threshold: shorter reductions become pointwise
    keep_half_addmm: bool = False  # keep_addmm_fused_for_half_dtypes

    @staticmethod
    def for_device(device_type: str) -> "Rules":
        return Rules(**compat.inductor_rules(device_type))


@dataclass
class OpInfo:
    kind: int
    own_ops: int = 1
    heavy: bool = False
    nbytes: tuple[int, ...] = ()  # bytes of each output tensor (numel * itemsize), in order
    nontrivial: bool = True  # more than one element: a load of it has a non-constant index
    moves: bool = False  # a view that moves elements (permute, slice, ...)
    multi: bool = False  # returns a tuple (its getitems take the elements)
    dtypes: tuple = ()  # dtype of each output tensor
    loop: int = 0  # elements its kernel iterates over (a reduction: its input's)
    numel: int = 0  # elements of its (largest) output
    name: str = ""  # the op's name (``mm``, ``add``)
    realizes_inputs: bool = False  # Inductor's needs_realized_inputs: users store what they read

    @property
    def bytes(self) -> int:
        return self.nbytes[0] if self.nbytes else 0


def classify(node: Node, rules: Rules) -> OpInfo:
    """What Inductor makes of one FX node, from its op and fake value."""
    val = node.meta.get("val")
    vals = tensor_values(val)
    nbytes = tuple(int(_numel(t)) * t.element_size() for _, t in vals)
    info = _classify(node, rules, val, vals, nbytes)
    info.dtypes = tuple(t.dtype for _, t in vals)
    info.name = op_name(node) if node.op == "call_function" else ""
    info.loop = info.numel = max((_numel(t) for _, t in vals), default=0)
    if info.kind == REDUCTION:
        info.loop = max([_numel(a.meta["val"]) for a in node.all_input_nodes
                         if isinstance(a.meta.get("val"), torch.Tensor)] + [info.loop])
    return info


def _classify(node: Node, rules: Rules, val, vals, nbytes) -> OpInfo:
    multi = isinstance(val, (tuple, list))
    nontrivial = any(_numel(t) > 1 for _, t in vals)
    if node.op in ("placeholder", "get_attr"):
        return OpInfo(PLACEHOLDER, 0, nbytes=nbytes, nontrivial=nontrivial)
    if node.op != "call_function":
        return OpInfo(NONE)
    if node.target is operator.getitem:
        return OpInfo(GETITEM, 0, nbytes=nbytes, nontrivial=nontrivial)
    target = node.target
    if not compat.is_op(target):
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi)
    name = op_name(node)
    lowerings, fallbacks, needs_realized = _registries()
    realizing = target in needs_realized
    if name in _MUTATING:
        return OpInfo(MUTATE, nbytes=nbytes)
    if is_view(node):
        return OpInfo(VIEW, 0, nbytes=nbytes, nontrivial=nontrivial, moves=name in MOVES, multi=multi)
    if target in fallbacks or realizing or target not in lowerings or name in _TEMPLATES:
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi, realizes_inputs=realizing)
    if name in _REDUCTIONS:
        numel_in = max((_numel(a.meta["val"]) for a in node.all_input_nodes
                        if isinstance(a.meta.get("val"), torch.Tensor)), default=1)
        numel_out = max((_numel(t) for _, t in vals), default=1)
        rnumel = numel_in // max(numel_out, 1)
        if not (rnumel <= 1 or (rnumel < rules.unroll and numel_out != 1)):
            return OpInfo(REDUCTION, nbytes=nbytes, nontrivial=nontrivial, multi=multi)
        # a reduction over a few elements is unrolled into a pointwise expression
    if name in _SCATTERS:
        return OpInfo(SCATTER, nbytes=nbytes, nontrivial=nontrivial)
    if name == "cat":
        count = len(node.args[0]) if node.args and isinstance(node.args[0], (list, tuple)) else 1
        if rules.cpu or count > rules.pointwise_cat_inputs:
            return OpInfo(CAT, nbytes=nbytes, nontrivial=nontrivial)
    scalars = sum(1 for a in list(node.args) + list(node.kwargs.values())
                  if isinstance(a, (int, float)) and not isinstance(a, bool))
    return OpInfo(POINTWISE, 1 + min(scalars, 2), heavy=name in _HEAVY, nbytes=nbytes, nontrivial=nontrivial,
                  moves=name in MOVES, multi=multi)


def _numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= compat.size_hint(s)
    return n


@dataclass
class EmulatedGraph:
    """One graph as Inductor lowers it: ``order`` (node ids in execution order, graph
    inputs excluded), ``inputs`` (ids of graph inputs, which are buffers), ``ins[i]`` (the
    ids node i reads, in argument order), ``users[i]`` (how many distinct nodes of this
    graph read node i, the output included), ``realizing_users[i]`` (a user of node i is a
    ``needs_realized_inputs`` op), ``outputs`` (ids the graph returns), ``donated``
    (inputs whose buffer the graph may write into once they are dead),
    ``getitem_index[i]`` (which element of a multi-output node a getitem takes)."""

    order: Sequence[int]
    inputs: Sequence[int]
    ins: Sequence[Sequence[int]]
    users: Sequence[int]
    outputs: Sequence[int]
    info: Sequence[OpInfo]
    getitem_index: dict
    realizing_users: Sequence[bool]
    donated: frozenset = frozenset()
    pointwise_users: Sequence[bool] = ()  # every user of node i is pointwise (through views)


@dataclass
class Buffer:
    nbytes: int
    dtype: object
    start: int  # kernel step that writes it (-1: a graph input)
    end: int  # last kernel step that reads it (-1: never read)
    node: int  # the node whose value it holds
    output: bool = False  # outlives the graph
    input: bool = False
    reused_by: int = -1  # another buffer written into this one (in-place reuse)
    removed: bool = False  # kernel-local after fusion: never allocated
    planned: tuple = ()  # (start, end, bytes) as Inductor's peak estimate sees it (before fusion and reuse)
    planned_bytes: int = 0  # its bytes before fusion made it kernel-local
    kernel: int = -1  # the kernel that writes it


@dataclass
class InductorRun:
    kernels: list[int]  # per step: the node whose realization (or extern call) it is
    kinds: list[int] = field(default_factory=list)  # per step: what the kernel is (POINTWISE, EXTERN, ...)
    buffers: list[Buffer] = field(default_factory=list)
    input_last: dict = field(default_factory=dict)  # graph input id -> last step reading it (-1: none)
    output_buffers: dict = field(default_factory=dict)  # output node id -> buffer index


class _Expr:
    """An unrealized pointwise expression: its loads ((buffer, index key)), the nodes
    inlined into it (their ops counted once, as Inductor's op counter CSEs them), whether
    any op is "heavy" (the CPU realize-on-reuse rule), loads with a non-constant index."""

    __slots__ = ("loads", "nodes", "ops", "heavy", "nontrivial")

    def __init__(self, loads: frozenset, nodes: frozenset, ops: int, heavy: bool, nontrivial: int):
        self.loads, self.nodes, self.ops, self.heavy, self.nontrivial = loads, nodes, ops, heavy, nontrivial


def emulate(g: EmulatedGraph, rules: Rules) -> InductorRun:
    info = g.info
    run = InductorRun([])
    buffers = run.buffers
    reads: list[set] = []  # per kernel step: (buffer, key) it loads
    state: dict[int, tuple] = {}

    def new_buffer(node: int, nbytes: int, step: int, element: int = 0) -> int:
        dtypes = info[node].dtypes
        buffers.append(Buffer(nbytes, dtypes[element] if element < len(dtypes) else None, step, -1, node, kernel=step))
        return len(buffers) - 1

    for i in g.inputs:
        b = new_buffer(i, info[i].bytes, -1)
        buffers[b].input = True
        state[i] = ("buf", b)

    def resolve(i: int) -> tuple:
        """("buf", b) | ("view", b, key) | ("expr", expr, owner) | ("multi", ...) | ("none",)"""
        st = state.get(i)
        if st is None:
            return ("none",)
        if st[0] == "vexpr":
            r = resolve(st[1])
            if r[0] in ("buf", "view"):
                return ("view", r[1], i)
            return r
        if st[0] == "expr":
            return ("expr", st[1], i)
        return st

    def loads_of(j: int) -> frozenset:
        r = resolve(j)
        if r[0] == "buf":
            return frozenset({(r[1], None)})
        if r[0] == "view":
            return frozenset({(r[1], r[2])})
        if r[0] == "expr":
            return r[1].loads
        return frozenset()

    def kernel(node: int, loaded, kind: int | None = None) -> int:
        run.kernels.append(node)
        run.kinds.append(info[node].kind if kind is None else kind)
        reads.append(set(loaded))
        return len(run.kernels) - 1

    def realize(owner: int) -> None:
        st = state.get(owner)
        if st is None or st[0] != "expr":
            return
        step = kernel(owner, st[1].loads, POINTWISE)
        state[owner] = ("buf", new_buffer(owner, info[owner].bytes, step))

    def realize_input(j: int) -> None:
        r = resolve(j)
        if r[0] == "expr":
            realize(r[2])

    def combine(i: int, args: Sequence[int]) -> _Expr:
        loads: frozenset = frozenset()
        nodes = {i}
        heavy = info[i].heavy
        for j in args:
            r = resolve(j)
            if r[0] == "expr":
                e = r[1]
                loads = loads | e.loads
                nodes |= e.nodes
                heavy = heavy or e.heavy
            elif r[0] == "buf":
                loads = loads | {(r[1], None)}
            elif r[0] == "view":
                loads = loads | {(r[1], r[2])}
        ops = sum(info[n].own_ops for n in nodes) + len(loads)
        nontrivial = sum(1 for b, _ in loads if info[buffers[b].node].nontrivial)
        return _Expr(loads, frozenset(nodes), ops, heavy, nontrivial)

    output_set = set(g.outputs)
    absorbed, addmms = _addmm_patterns(g, rules)

    def after_lowering(i: int) -> None:
        """``GraphLowering.run_node``'s store-or-recompute rules for node i's result."""
        r = resolve(i)
        if r[0] != "expr":
            return
        e, owner = r[1], r[2]
        users = g.users[i]
        if users > 1:
            if g.realizing_users[i] and e.nontrivial > 1:  # realize_hint
                return realize(owner)
            if i in output_set and not (len(e.loads) == 0 and e.ops <= rules.opcount):
                return realize(owner)
            if (rules.cpu and e.heavy) or e.ops > rules.opcount or len(e.loads) > rules.reads:
                return realize(owner)  # should_realize_on_reuse
        if (len(e.loads) > rules.acc_reads or e.ops > rules.opcount) and e.nontrivial > 1:
            return realize(owner)  # has_exceeded_max_reads, then realize_hint
        if e.ops > 100:
            realize(owner)

    for i in g.order:
        op = info[i]
        args = g.ins[i]
        kind = op.kind
        if kind == GETITEM:
            st = state.get(args[0], ("none",)) if args else ("none",)
            if st[0] == "multi":
                b = st[1].get(g.getitem_index.get(i, 0))
                state[i] = ("buf", b) if b is not None else ("none",)
            elif args:
                state[i] = ("vexpr", args[0]) if resolve(args[0])[0] == "expr" else _view_state(resolve(args[0]), i)
            continue
        if kind == VIEW:
            r = resolve(args[0]) if args else ("none",)
            if r[0] == "expr":
                state[i] = ("vexpr", args[0])
                after_lowering(i)
            else:
                state[i] = _view_state(r, i if op.moves else None)
            continue
        if i in absorbed:  # an mm the post-grad pass folds into the add after it (addmm)
            state[i] = ("none",)
            continue
        if i in addmms:
            mm, inp = addmms[i]
            args = list(g.ins[mm]) + [inp]
            kind = EXTERN
        if kind == POINTWISE:
            state[i] = ("expr", combine(i, args))
            after_lowering(i)
            continue
        if kind in (REDUCTION, SCATTER, CAT, MUTATE):
            loaded: set = set()
            for j in args:
                loaded |= loads_of(j)
            step = kernel(i, loaded)
            if kind == MUTATE:  # written into its first argument: no buffer of its own
                r = resolve(args[0]) if args else ("none",)
                state[i] = _view_state(r, None)
            elif op.multi:
                state[i] = ("multi", {k: new_buffer(i, nb, step, k) for k, nb in enumerate(op.nbytes)})
            else:
                state[i] = ("buf", new_buffer(i, op.bytes, step))
            continue
        # extern and fallback kernels: their inputs are stored first, their outputs are buffers
        for j in args:
            realize_input(j)
        loaded = set()
        for j in args:
            loaded |= loads_of(j)
        step = kernel(i, loaded, EXTERN)
        if op.multi:
            state[i] = ("multi", {k: new_buffer(i, nb, step, k) for k, nb in enumerate(op.nbytes)})
        elif op.nbytes:
            state[i] = ("buf", new_buffer(i, op.bytes, step))
        else:
            state[i] = ("none",)

    # graph outputs are stored at the end of lowering, in order
    for o in g.outputs:
        realize_input(o)
    for o in g.outputs:
        r = resolve(o)
        if r[0] in ("buf", "view") and r[1] is not None:
            buffers[r[1]].output = True
            run.output_buffers[o] = r[1]
    position = list(range(len(run.kernels)))  # where each kernel runs once fused groups are placed
    original = [b.nbytes for b in buffers]
    for b in buffers:
        b.planned_bytes = b.nbytes
    _fuse_local(run, reads, g, position)
    for k, b in enumerate(buffers):
        if b.start >= 0:
            b.start = position[b.start]
    for step, loaded in enumerate(reads):
        at = position[step]
        for b, _ in loaded:
            if buffers[b].end < at:
                buffers[b].end = at
    for b in buffers:
        if b.start >= 0 and b.end < b.start and b.end >= 0:
            b.end = b.start
    for b, nbytes in zip(buffers, original):
        b.planned = (b.start, b.end, nbytes)
    _reuse_in_place(run, reads, g, position)
    _reuse_pool(run, g)
    for b in buffers:
        if b.input:
            run.input_last[b.node] = b.end
    return run


def _addmm_patterns(g: EmulatedGraph, rules: Rules) -> tuple[set[int], dict[int, tuple[int, int]]]:
    """Inductor's post-grad pass rewrites ``add(mm(a, b), c)`` into ``addmm(c, a, b)``
    (one extern kernel writes the sum; ``c`` must be in memory), when the mm has no other
    user, ``c`` has the mm's dtype, and not on a GPU where every user of the sum is
    pointwise (``is_valid_addmm_fusion``, ``should_prefer_unfused_addmm``).
    Returns (the folded mms, add -> (mm, c))."""
    info = g.info
    absorbed: set[int] = set()
    addmms: dict[int, tuple[int, int]] = {}
    for i in g.order:
        if info[i].name != "add" or len(g.ins[i]) != 2:
            continue
        if not rules.cpu and (not g.pointwise_users or g.pointwise_users[i]):
            continue
        a, b = g.ins[i]
        for mm, inp in ((a, b), (b, a)):
            if (info[mm].name == "mm" and mm not in absorbed and g.users[mm] == 1 and mm != inp
                    and info[inp].dtypes[:1] == info[mm].dtypes[:1] and info[inp].numel <= info[mm].numel):
                absorbed.add(mm)
                addmms[i] = (mm, inp)
                break
    return absorbed, addmms


def _view_state(r: tuple, key) -> tuple:
    if r[0] == "buf":
        return ("view", r[1], key) if key is not None else ("buf", r[1])
    if r[0] == "view":
        return ("view", r[1], key if key is not None else r[2])
    return ("none",)


_FUSIBLE = (POINTWISE, REDUCTION)


MAX_FUSION = 64  # config.max_fusion_size; also the horizontal fusion distance (are_long_distant_nodes)


def _fuse_local(run: InductorRun, reads: list[set], g: EmulatedGraph, position: list[int]) -> None:
    """The scheduler's fusion, as far as memory goes. Pointwise and reduction kernels fuse
    with a producer they read element for element over a compatible loop (the same
    elements; a reduction's input or output for its epilogue), and with kernels of the same
    loop that read a buffer they read (horizontal fusion, within ``MAX_FUSION`` kernels),
    as long as the group stays acyclic (no member depends on another through a kernel
    outside it: ``will_fusion_create_cycle``) and within ``MAX_FUSION`` kernels. A group
    runs once everything its members read from outside is ready (``position``). A stored
    result only its own group reads is kernel-local: never allocated
    (``remove_kernel_local_buffers``)."""
    buffers = run.buffers
    info = g.info
    kinds = run.kinds
    n = len(run.kernels)
    readers: dict[int, list[tuple[int, object]]] = {}
    for step, loaded in enumerate(reads):
        for b, key in loaded:
            readers.setdefault(b, []).append((step, key))
    deps = [{buffers[b].start for b, _ in reads[k] if buffers[b].start >= 0 and buffers[b].start != k} for k in range(n)]
    parent = list(range(n))
    members: dict[int, list[int]] = {k: [k] for k in range(n)}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def group_acyclic(ra: int, rb: int) -> bool:
        """Would the merged group depend on itself through another group?"""
        low = min(min(members[ra]), min(members[rb]))
        start = {find(d) for r in (ra, rb) for m in members[r] for d in deps[m]} - {ra, rb}
        seen: set[int] = set()
        stack = [q for q in start if max(members[q]) > low]
        while stack:
            q = stack.pop()
            if q in seen:
                continue
            seen.add(q)
            if len(seen) > 4 * MAX_FUSION:
                return False  # too far to tell cheaply: do not fuse
            for d in {find(d) for m in members[q] for d in deps[m]}:
                if d in (ra, rb):
                    return False
                if d != q and d not in seen and max(members[d]) > low:
                    stack.append(d)
        return True

    def try_union(a: int, b: int) -> bool:
        ra, rb = find(a), find(b)
        if ra == rb:
            return True
        merged = members[ra] + members[rb]
        if len(merged) > MAX_FUSION or not group_acyclic(ra, rb):
            return False
        if len(members[ra]) < len(members[rb]):
            ra, rb = rb, ra
        parent[rb] = ra
        members[ra] = merged
        del members[rb]
        return True

    def loop_of(k: int) -> int:
        return info[run.kernels[k]].loop if kinds[k] == REDUCTION else info[run.kernels[k]].numel

    # vertical: a producer with the readers that can take its result element for element
    for b_index, b in enumerate(buffers):
        if b.input or b.start < 0 or kinds[b.start] not in _FUSIBLE:
            continue
        producer = info[run.kernels[b.start]]
        for step, key in readers.get(b_index, ()):
            if (key is None and kinds[step] in _FUSIBLE and step != b.start
                    and _compatible(producer, info[run.kernels[step]], kinds[b.start], kinds[step])):
                try_union(b.start, step)
    # horizontal: kernels of one loop that read a common buffer, not too far apart
    for b_index, rs in readers.items():
        fusible = sorted({step for step, _ in rs if kinds[step] in _FUSIBLE})
        for a, c in zip(fusible, fusible[1:]):
            if c - a <= MAX_FUSION and loop_of(a) == loop_of(c):
                try_union(a, c)
    # kernel-local buffers
    for b_index, b in enumerate(buffers):
        if b.input or b.output or b.start < 0 or b.nbytes == 0 or kinds[b.start] not in _FUSIBLE:
            continue
        rs = readers.get(b_index)
        if rs and all(key is None and find(step) == find(b.start) for step, key in rs):
            b.nbytes = 0
            b.removed = True
    # where each group runs: the scheduler's topological sort visits kernels in order and
    # places a group where it meets its first member, after the groups it needs
    placed: set[int] = set()
    order: list[int] = []
    for k in range(n):
        root = find(k)
        if root in placed:
            continue
        stack = [(root, False)]
        visiting: set[int] = set()
        while stack:
            r, ready = stack.pop()
            if r in placed:
                continue
            if ready:
                placed.add(r)
                order.append(r)
                continue
            if r in visiting:
                continue  # a cycle the fusion checks missed: place it where it is met
            visiting.add(r)
            stack.append((r, True))
            needed = sorted({find(d) for m in members[r] for d in deps[m]} - placed - {r} - visiting, reverse=True)
            stack.extend((q, False) for q in needed)
    order = _reorder_for_peak_memory(order, members, find, reads, run, g)
    for at, root in enumerate(order):
        for m in members[root]:
            position[m] = at


def _reorder_for_peak_memory(order: list[int], members: dict, find, reads: list[set], run: InductorRun,
                             g: EmulatedGraph) -> list[int]:
    """Inductor's ``reorder_for_peak_memory`` on the fused kernels: the scheduler's order,
    a least-peak-memory-first greedy order, a breadth-first and a depth-first one; the
    order of least estimated peak wins (the first of equals). The estimate counts every
    buffer a fused kernel writes (before fusion removes any) and the freeable inputs."""
    buffers = run.buffers
    index = {root: k for k, root in enumerate(order)}
    size = {root: 0 for root in order}
    writes: dict[int, int] = {}  # buffer -> its group
    for k, b in enumerate(buffers):
        if b.input or b.kernel < 0:
            continue
        root = find(b.kernel)
        writes[k] = root
        size[root] += b.planned_bytes
    preds: dict[int, set[int]] = {root: set() for root in order}
    succs: dict[int, set[int]] = {root: set() for root in order}
    pred_buffers: dict[int, set[int]] = {root: set() for root in order}
    buffer_succs: dict[int, set[int]] = {}
    for root in order:
        for m in members[root]:
            for b, _ in reads[m]:
                src = writes.get(b)
                if src == root:
                    continue
                if src is None and not (buffers[b].input and buffers[b].node in g.donated):
                    continue  # not freeable: no memory to track
                pred_buffers[root].add(b)
                buffer_succs.setdefault(b, set()).add(root)
                if src is not None:
                    preds[root].add(src)
                    succs[src].add(root)
    outputs = {k for k, b in enumerate(buffers) if b.output and k in writes}
    freeable = {b for b in buffer_succs if writes.get(b) is None}
    bsize = {k: buffers[k].planned_bytes for k in list(writes) + list(freeable)}

    def estimate(candidate: list[int]) -> int:
        at = {root: k for k, root in enumerate(candidate)}
        delta = [0] * (len(candidate) + 1)
        for b in freeable:
            delta[0] += bsize[b]
            delta[max(at[r] for r in buffer_succs[b]) + 1] -= bsize[b]
        for b, root in writes.items():
            start = at[root]
            delta[start] += bsize[b]
            if b in outputs:
                continue
            end = max((at[r] for r in buffer_succs.get(b, ())), default=start)
            delta[end + 1] -= bsize[b]
        peak = acc = 0
        for d in delta[:-1]:
            acc += d
            peak = max(peak, acc)
        return peak

    candidates = [order]
    for method in (_lpmf, _bfs, _dfs):
        candidates.append(method(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, outputs,
                                 freeable, writes))
    peaks = [estimate(c) for c in candidates]
    return candidates[peaks.index(min(peaks))]


def _lpmf(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, outputs, freeable, writes):
    """``topological_sort_lpmf``: among the kernels ready to run, one whose outputs fit
    under the peak so far, freeing the most; else the smallest."""
    indegree = {r: len(preds[r]) for r in order}
    outdegree = {b: len(buffer_succs.get(b, ())) + (1 if b in outputs else 0) for b in bsize}
    to_free = {r: 0 for r in order}
    for r in order:
        for b in pred_buffers[r]:
            if outdegree.get(b) == 1:
                to_free[r] += bsize[b]
    for b, root in writes.items():
        if outdegree.get(b, 0) == 0:
            to_free[root] += bsize[b]
    live = sum(bsize[b] for b in freeable)
    out_memory = sum(bsize[b] for b in outputs)
    peak = max(live, out_memory)
    gap = peak - live
    ready = {r for r in order if indegree[r] == 0}
    schedule = []
    while ready:
        pick = min(ready, key=lambda r: (size[r] if size[r] > gap else 0, size[r] - to_free[r], index[r]))
        ready.remove(pick)
        schedule.append(pick)
        live += size[pick]
        peak = max(peak, live)
        live -= to_free[pick]
        gap = peak - live
        for s in succs[pick]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.add(s)
        for b in pred_buffers[pick]:
            outdegree[b] -= 1
            if outdegree[b] == 1:
                for s in buffer_succs.get(b, ()):
                    to_free[s] += bsize[b]
    return schedule if len(schedule) == len(order) else order


def _bfs(order, index, size, preds, succs, *_):
    """``topological_sort_bfs``: the ready kernel whose inputs were made earliest."""
    import heapq

    indegree = {r: len(preds[r]) for r in order}
    done: dict[int, int] = {}
    heap = [([], index[r], r) for r in order if indegree[r] == 0]
    heapq.heapify(heap)
    schedule = []
    while heap:
        _, _, pick = heapq.heappop(heap)
        done[pick] = len(schedule)
        schedule.append(pick)
        for s in succs[pick]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(heap, (sorted({done[p] for p in preds[s]}), index[s], s))
    return schedule if len(schedule) == len(order) else order


def _dfs(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, *_):
    """``topological_sort_dfs``: kernels visited by the bytes they touch, each after what it needs."""
    weight = {r: size[r] + sum(bsize[b] for b in pred_buffers[r]) for r in order}
    seen: set[int] = set()
    schedule = []
    for start in sorted(order, key=lambda r: (weight[r], index[r])):
        stack = [(start, False)]
        while stack:
            r, ready = stack.pop()
            if ready:
                schedule.append(r)
                continue
            if r in seen:
                continue
            seen.add(r)
            stack.append((r, True))
            for p in sorted(preds[r], key=lambda q: (weight[q], index[q]), reverse=True):
                if p not in seen:
                    stack.append((p, False))
    return schedule if len(schedule) == len(order) else order


def _compatible(producer: OpInfo, reader: OpInfo, producer_kind: int, reader_kind: int) -> bool:
    p_loop = producer.loop if producer_kind == REDUCTION else producer.numel
    r_loop = reader.loop if reader_kind == REDUCTION else reader.numel
    if p_loop == r_loop:
        return True
    # a reduction's result read by a pointwise epilogue over the reduction's input or output
    return producer_kind == REDUCTION and reader_kind == POINTWISE and r_loop in (producer.loop, producer.numel)


def _reuse_in_place(run: InductorRun, reads: list[set], g: EmulatedGraph, position: list[int]) -> None:
    """A pointwise or reduction kernel writes its output into a buffer it loads element
    for element, of the same bytes, whose last use it is (Inductor's in-place update;
    donated graph inputs included). The two are then one block of memory."""
    buffers = run.buffers
    made_at: dict[int, list[int]] = {}
    for k, b in enumerate(buffers):
        if b.kernel >= 0:
            made_at.setdefault(b.kernel, []).append(k)
    root = list(range(len(buffers)))
    # a buffer is written over only by its one reader (``remaining_uses == 1``: fused
    # kernels count each member that reads it)
    reader_count: dict[int, int] = {}
    for loaded in reads:
        for b in {b for b, _ in loaded}:
            reader_count[b] = reader_count.get(b, 0) + 1

    def find(k: int) -> int:
        while root[k] != k:
            root[k] = root[root[k]]
            k = root[k]
        return k

    for step in sorted(range(len(run.kernels)), key=position.__getitem__):
        if run.kinds[step] not in (POINTWISE, REDUCTION, SCATTER, CAT):
            continue
        direct = {find(b) for b, key in reads[step] if key is None}
        moved = {find(b) for b, key in reads[step] if key is not None}
        at = position[step]
        for k in made_at.get(step, ()):
            out = buffers[k]
            for r in sorted(direct - moved):
                cand = buffers[r]
                if cand.end != at or cand.output or cand.nbytes != out.nbytes or r == k or cand.removed:
                    continue
                if reader_count.get(r, 0) > 1 and cand.reused_by < 0:
                    continue
                if cand.input and cand.node not in g.donated:
                    continue
                cand.reused_by = k
                cand.end, cand.output = out.end, out.output
                out.nbytes = 0
                root[k] = r
                direct.discard(r)
                break
    for node, k in list(run.output_buffers.items()):
        run.output_buffers[node] = find(k)


def _reuse_pool(run: InductorRun, g: EmulatedGraph) -> None:
    """The wrapper's buffer pool (``MemoryPlanningState``): a freed buffer goes into a pool
    keyed by its bytes and dtype and is not released; a later allocation of the same key
    takes the most recently freed one if holding it meanwhile keeps the graph's live bytes
    (Inductor's own estimate: buffers and freeable inputs, ``EfficientPeakEstimate``)
    within the graph's peak, or if it was freed by the step just before. The two are then
    one block, from the first allocation to the last use of the last holder."""
    buffers = run.buffers
    steps = len(run.kernels)
    if steps == 0:
        return
    # Inductor's estimate sees every scheduler buffer, those fusion later makes kernel-local
    # and those written in place included
    delta = [0] * (steps + 2)
    for b in buffers:
        start, end, nbytes = b.planned
        if nbytes == 0:
            continue
        if b.input:
            if b.node in g.donated and end >= 0:  # a freeable input: live until its last use
                delta[0] += nbytes
                delta[end + 1] -= nbytes
            continue
        delta[start] += nbytes
        if not b.output:
            delta[max(end, start) + 1] -= nbytes
    curve, acc = [], 0
    for d in delta[:steps]:
        acc += d
        curve.append(acc)
    overall = max(curve)
    allocated_at: dict[int, list[int]] = {}
    ending_at: dict[int, list[int]] = {}
    for k, b in enumerate(buffers):
        if b.input or b.nbytes == 0:
            continue
        allocated_at.setdefault(b.start, []).append(k)
        if not b.output:
            ending_at.setdefault(max(b.end, b.start), []).append(k)
    pool: dict[tuple, list[tuple[int, int]]] = {}  # (bytes, dtype) -> [(block, step freed after)]
    moved: dict[int, int] = {}
    for step in range(steps):
        for k in allocated_at.get(step, ()):
            b = buffers[k]
            stack = pool.get((b.nbytes, b.dtype))
            if not stack:
                continue
            root, freed = stack.pop()
            if freed + 1 == step or b.nbytes + max(curve[freed + 1:step], default=0) <= overall:
                for t in range(freed + 1, step):
                    curve[t] += b.nbytes
                r = buffers[root]
                r.end, r.output = b.end, b.output
                moved[k] = root
                if not b.output:
                    ending_at.setdefault(max(b.end, b.start), []).append(root)
                b.nbytes = 0
            else:
                stack.append((root, freed))
        for k in ending_at.get(step, ()):
            b = buffers[k]
            if b.nbytes == 0 or b.output or max(b.end, b.start) != step:
                continue  # taken over by another buffer, or its block now ends elsewhere
            pool.setdefault((b.nbytes, b.dtype), []).append((k, step))
    if moved:
        for node, out in list(run.output_buffers.items()):
            while out in moved:
                out = moved[out]
            run.output_buffers[node] = out
