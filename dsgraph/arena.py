"""The arena (``arena=True``, ``inductor=False``): a graph's intermediates at offsets in buffers it plans.

Before/after (``mm`` dies at ``relu``, so ``mul`` reuses its bytes; 64-byte alignment)::

    mm = aten.mm.default(x, w)           arena = aten.empty.memory_format([384], dtype=torch.uint8, device=cpu)
    relu = aten.relu.default(mm)         arena_float32 = aten.view.dtype(arena, torch.float32)
    mul = aten.mul.Tensor(relu, 3)  ->   mm_in_arena = aten.as_strided.default(arena_float32, [5, 7], [7, 1], 0)
    return (mul.sum(),)                  mm = aten.mm.out(x, w, out=mm_in_arena)
                                         relu_in_arena = aten.as_strided.default(arena_float32, [5, 7], [7, 1], 48)
                                         relu = aten.relu.out(mm, out=relu_in_arena)
                                         mul_in_arena = aten.as_strided.default(arena_float32, [5, 7], [7, 1], 0)
                                         mul = aten.mul.out(relu, 3, out=mul_in_arena)
                                         ...

What is planned: storages (``TensorLifetimes``) that a node of the graph allocates and
that die inside it (not graph inputs, not graph outputs, not storages a view of which is an
output or is saved for the backward, not handed to ``set_``), whose node can write into a
given tensor: an op with an ``out=`` overload (``compat.out_variant``), or one of a few
factory and copy ops (``full``/``scalar_tensor``: ``fill_``; ``empty``/``empty_strided``:
the view itself; ``_to_copy``: ``copy_``). Everything else keeps its own allocation and is
counted in ``ArenaPlan.skipped``, by reason. Multi-output ops (``var_mean``,
``native_layer_norm``) are planned element by element; an element that is not planned (a
saved ``mean``) gets a fresh ``empty_strided`` to write into, where the op would have
allocated it.

Segments: one buffer held for the whole graph would sit next to everything else live at
every node: next to the activations a forward accumulates, next to all the saved
activations at the start of a backward. On GPT-2-small (fp32) on an H200 that raised the
peak by 23%. So a device's planned tensors are split in time into segments, one buffer
each, allocated before the segment's first tensor and freed (FX drops it) after its last
use, never two at once: a segment grows node by node while (most bytes live outside it at
one of its nodes) + (its packed size) stays within 1/32 of the graph's peak without the
arena, else it is cut where the fewest of its bytes are live across, and those tensors keep
their own allocations (``split_in_time``; ``split=False``: one buffer per device).

Packing a segment: each planned storage is an interval ``[allocating node, last use]``
(inclusive: an op's output never shares bytes with its inputs) of ``align``-rounded bytes.
Best fit in allocation order, on the size hints: each block goes into the smallest gap
between blocks live at the same time that holds it, else on top. Offsets are then sympy
expressions: ``offset(Y) = Max(offset(X) + size(X))`` over the blocks ``X`` live at the
same time as ``Y`` and below it at the hints. That is the least placement with the same
order, so at the hints it is at most best fit's, and because every pair of blocks that are
live at the same time keeps its order whatever the sizes, the offsets stay valid when a
dynamic graph runs at other sizes: no two live tensors ever share a byte. The buffer's size
is the Max of the block ends; sizes and offsets are emitted as integer arithmetic on the
graph's size symbols (static shapes: plain ints). With dynamic shapes, best fit and the
segments are chosen at the hints only.

Debug mode (``debug=True`` or ``DSGRAPH_DEBUG=1``): each buffer starts filled with 0xFF
bytes and every planned tensor's bytes are filled again right after its last use; an
all-ones pattern is a NaN in every floating format (fp64, fp32, fp16, bf16, fp8), -1 in
integers, so a read of a dead or never-written region shows up as NaN.

The graph then runs as FX code: FX drops each value after its last use, so a buffer is
freed when the last view of it dies, and ``TensorLifetimes`` (so ``dsgraph.memory_profile``
and the dumps) see each buffer as one block from its allocation to that point.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch
from torch.fx import GraphModule, Node
from torch.utils._sympy.functions import FloorDiv

from . import compat
from .analysis.lifetimes import Storage, TensorLifetimes, default_held, storage_bytes_expr, tensor_values
from .analysis.sweep import live_per_step
from .units import format_bytes

ALIGN = 64  # bytes: what CPU and CUDA caching allocators give each allocation
aten = torch.ops.aten
DEBUG_FILL = 255  # 0xFF bytes: NaN in every float dtype


# -- which nodes can write into the arena ---------------------------------------------------

@dataclass(frozen=True)
class Writer:
    """How a node writes its result into a tensor it is given."""

    kind: str  # "out" (the op's out= overload), "fill", "copy" or "view"
    op: Any = None  # the out= overload for "out"
    out_args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return str(self.op) if self.kind == "out" else {"fill": "fill_", "copy": "copy_", "view": "view"}[self.kind]


_FILL = {aten.full.default, aten.scalar_tensor.default}
_EMPTY = {aten.empty.memory_format, aten.empty_strided.default}
_SET = {getattr(aten.set_, o) for o in aten.set_.overloads()}
_COPY_KWARGS = {"dtype", "layout", "device", "pin_memory", "memory_format", "non_blocking"}


def writer_of(node: Node) -> Writer | None:
    """How ``node`` can write into a given tensor, or None."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return None
    if node.kwargs.get("pin_memory") or node.kwargs.get("layout") not in (None, torch.strided):
        return None
    if op in _FILL:
        return Writer("fill")
    if op in _EMPTY:
        return Writer("view")
    if op is aten._to_copy.default:
        return Writer("copy") if set(node.kwargs) <= _COPY_KWARGS else None
    out = compat.out_variant(op)
    if out is None:
        return None
    names = tuple(a.name for a in out._schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    return Writer("out", out, names)


# -- the plan -------------------------------------------------------------------------------

@dataclass
class ArenaSlot:
    node: str  # the node that allocates the tensor
    index: int | None  # which output of a multi-output node
    writer: str  # "aten.mm.out", "fill_", ...
    device: str
    dtype: torch.dtype
    nbytes: int  # at the size hints
    offset: int  # at the size hints
    start: int  # TensorLifetimes index of the allocating node
    end: int  # ... of its last use
    last_use: str  # name of the node at ``end``
    nbytes_expr: sympy.Expr
    offset_expr: sympy.Expr
    buffer: str = ""  # key of its ArenaBuffer in ArenaPlan.buffers

    @property
    def name(self) -> str:
        return self.node if self.index is None else f"{self.node}[{self.index}]"


@dataclass
class ArenaBuffer:
    key: str  # "cpu#0": device and segment
    device: str
    nbytes: int  # at the size hints
    nbytes_expr: sympy.Expr
    start: int  # TensorLifetimes indices of its first allocating node and last use
    end: int


@dataclass
class ArenaPlan:
    align: int
    slots: list[ArenaSlot] = field(default_factory=list)
    buffers: dict[str, ArenaBuffer] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)  # why an intermediate stays out -> count
    lower_bound: int = 0  # most aligned planned bytes live at one node: no packing needs less
    fx_peak: int | None = None  # the graph's peak live bytes with the arena applied (FX order)

    @property
    def arena_bytes(self) -> int:
        """The arena's footprint: per device its largest buffer (a device's buffers are never
        live at the same time), summed over devices."""
        largest: dict[str, int] = {}
        for b in self.buffers.values():
            largest[b.device] = max(largest.get(b.device, 0), b.nbytes)
        return sum(largest.values())

    @property
    def unpacked_bytes(self) -> int:
        """What the planned tensors' own allocations sum to."""
        return sum(s.nbytes for s in self.slots)

    def stats(self) -> dict[str, Any]:
        return {
            "arena_tensors": len(self.slots),
            "arena_buffers": len(self.buffers),
            "arena_bytes": self.arena_bytes,
            "arena_unpacked_bytes": self.unpacked_bytes,
            "arena_lower_bound_bytes": self.lower_bound,
            "arena_skipped": sum(self.skipped.values()),
            "arena_skipped_ops": dict(sorted(self.skipped.items())),
            **({"arena_fx_peak_bytes": self.fx_peak} if self.fx_peak is not None else {}),
        }

    def __str__(self) -> str:
        lines = [f"arena plan: {len(self.slots)} tensors, {format_bytes(self.arena_bytes)} "
                 f"(unpacked {format_bytes(self.unpacked_bytes)}), align {self.align}"]
        for b in self.buffers.values():
            lines.append(f"  buffer {b.key} [{b.start}, {b.end}]: {b.nbytes} B = {b.nbytes_expr}")
        for s in self.slots:
            lines.append(f"  {s.name:<24} {s.writer:<28} {str(s.dtype):<14} {s.nbytes:>10} B "
                         f"@ {s.buffer} {s.offset:<10} [{s.start}, {s.end}]")
        for why, n in sorted(self.skipped.items()):
            lines.append(f"  skipped {n} x {why}")
        return "\n".join(lines)


def graph_symbols(gm: GraphModule) -> dict[sympy.Symbol, tuple[Node, int | None, int]]:
    """Size symbols the graph can compute from its inputs: symbol -> (placeholder, dim or
    None for a SymInt input, hint)."""
    out: dict[sympy.Symbol, tuple[Node, int | None, int]] = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            expr = compat.sym_expr(val)
            if isinstance(expr, sympy.Symbol):
                out.setdefault(expr, (node, None, compat.size_hint(val)))
        elif isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                expr = compat.sym_expr(size)
                if isinstance(expr, sympy.Symbol):
                    out.setdefault(expr, (node, dim, compat.size_hint(size)))
    return out


def _computable(expr: sympy.Expr, symbols: dict) -> bool:
    """Can ``_Emitter`` turn this expression into integer arithmetic on graph values?"""
    if expr.is_Integer:
        return True
    if isinstance(expr, sympy.Symbol):
        return expr in symbols
    if isinstance(expr, (sympy.Add, sympy.Mul, FloorDiv, sympy.Max)):
        return all(_computable(a, symbols) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return expr.exp.is_Integer and int(expr.exp) > 0 and _computable(expr.base, symbols)
    return False


def _align(expr: sympy.Expr, align: int) -> sympy.Expr:
    if expr.is_Integer:
        return sympy.Integer(-(-int(expr) // align) * align)
    return align * FloorDiv(expr + (align - 1), align)


def _layout_computable(t: torch.Tensor, symbols: dict) -> bool:
    exprs = [*map(compat.sym_expr, t.shape), *map(compat.sym_expr, t.stride())]
    return all(_computable(e, symbols) for e in exprs)


def _node_writer(node: Node, symbols: dict) -> Writer | str:
    """The node's Writer, or why its outputs cannot be written into given tensors."""
    writer = writer_of(node)
    if writer is None:
        return f"no out variant: {node.target}"
    vals = node.meta.get("val")
    if not isinstance(vals, torch.Tensor):
        # each output needs a tensor to write into, planned or fresh
        tensors = tensor_values(vals)
        if writer.kind != "out" or len(tensors) != len(vals) or len(tensors) != len(writer.out_args):
            return f"outputs not all tensors: {node.target}"
        if not all(_layout_computable(t, symbols) for _, t in tensors):
            return "size not computable from graph inputs"
    return writer


def _why_not(s: Storage, writer: Writer | str, symbols: dict) -> str | None:
    """Why this intermediate storage cannot go into the arena (None: it can)."""
    if isinstance(writer, str):
        return writer
    t = s.tensor
    if t.layout != torch.strided or t.device.type == "meta" or s.nbytes == 0:
        return "not a strided tensor with bytes"
    if not _layout_computable(t, symbols):
        return "size not computable from graph inputs"
    if any(u.target in _SET for m in s.members for u in m.users):
        return "storage handed to set_"  # the other tensor would share its bytes
    return None


@dataclass(eq=False)
class ArenaBlock:
    slot: Any
    start: int
    end: int
    size: int  # aligned, at the hints
    size_expr: sympy.Expr
    offset: int = 0
    below: list["ArenaBlock"] = field(default_factory=list)  # live at the same time, lower


def best_fit(blocks: list[ArenaBlock]) -> None:
    """Place blocks at hint offsets: in allocation order (larger first at the same node),
    each in the smallest gap among the blocks live with it that holds it, else on top.
    Records for each block the blocks live at the same time that end below it."""
    for b in blocks:
        b.below = []
    live: list[ArenaBlock] = []
    for b in sorted(blocks, key=lambda b: (b.start, -b.size)):
        live = [p for p in live if p.end >= b.start]  # placed ones started no later than b
        best, cursor = None, 0
        for p in sorted(live, key=lambda p: p.offset):
            gap = p.offset - cursor
            if gap >= b.size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, p.offset + p.size)
        b.offset = best[1] if best is not None else cursor
        for p in live:
            if p.offset + p.size <= b.offset:
                b.below.append(p)
            else:
                p.below.append(b)
        live.append(b)


def symbolic_offsets(blocks: list[ArenaBlock]) -> tuple[dict[ArenaBlock, sympy.Expr], sympy.Expr, int]:
    """Offsets as expressions that keep best fit's order of every pair of blocks live at
    the same time (valid at any sizes); also the arena's size, as an expression and at the
    hints. Hint offsets are lowered to the expressions' values (never above best fit's)."""
    exprs: dict[ArenaBlock, sympy.Expr] = {}
    below = {b: set(b.below) for b in blocks}
    for b in sorted(blocks, key=lambda b: b.offset):
        # X below Z below b: Z's offset already covers X (fewer Max arguments)
        direct = [x for x in b.below if not any(x in below[z] for z in b.below)]
        if direct:
            b.offset = max(x.offset + x.size for x in direct)
            exprs[b] = sympy.Max(*[exprs[x] + x.size_expr for x in direct])
        else:
            b.offset, exprs[b] = 0, sympy.Integer(0)
    covered = {x for b in blocks for x in b.below}
    tops = [b for b in blocks if b not in covered]
    if not tops:
        return exprs, sympy.Integer(0), 0
    total = sympy.Max(*[exprs[b] + b.size_expr for b in tops])
    return exprs, total, max(b.offset + b.size for b in tops)


def split_in_time(blocks: list[ArenaBlock], live: list[int], bound: int) -> tuple[list[list[ArenaBlock]], list[ArenaBlock]]:
    """Cut the blocks' time span into segments, each packed into its own buffer, so that
    holding a segment's buffer over its whole span keeps the estimated live bytes of the
    graph (``live``: per node, without the arena) within ``bound``.

    Greedy in node order: the open segment grows one node at a time; its estimate is the
    most bytes live outside it at one of its nodes plus the most of its blocks live at one
    of its nodes (the least its buffer can be). Past ``bound``, it is cut after the node
    of the segment that the fewest of its block bytes live across; blocks live across a
    cut keep their own allocations. Returns (segments, blocks left out)."""
    if not blocks:
        return [], []
    by_start: dict[int, list[ArenaBlock]] = {}
    for b in blocks:
        by_start.setdefault(b.start, []).append(b)
    last = max(b.end for b in blocks)
    segments: list[list[ArenaBlock]] = []
    dropped: list[ArenaBlock] = []
    seg_start = min(by_start)

    def close(cut: int) -> None:
        members = [b for t in range(seg_start, cut + 1) for b in by_start.get(t, ())]
        segments.append([b for b in members if b.end <= cut])
        dropped.extend(b for b in members if b.end > cut)

    while True:
        active: list[ArenaBlock] = []
        crossing: list[int] = []  # per node of the segment: its block bytes live past that node
        most_outside = most_inside = 0
        cut = None
        for t in range(seg_start, last + 1):
            active += by_start.get(t, ())
            inside = sum(b.size for b in active)
            most_inside = max(most_inside, inside)
            most_outside = max(most_outside, live[t] - sum(b.slot.nbytes for b in active))
            active = [b for b in active if b.end > t]
            crossing.append(sum(b.size for b in active))
            if most_outside + most_inside > bound and t > seg_start:
                fewest = min(crossing[:-1])
                cut = seg_start + max(i for i, c in enumerate(crossing[:-1]) if c == fewest)
                break
        if cut is None:
            close(last)
            break
        close(cut)
        seg_start = cut + 1
    return [seg for seg in segments if seg], dropped


def _outside(segment: list[ArenaBlock], live: list[int]) -> int:
    """Most bytes live outside the segment's blocks at one node of its span."""
    start, end = min(b.start for b in segment), max(b.end for b in segment)
    inside = live_per_step(end + 1, ((b.start, b.end, b.slot.nbytes) for b in segment))
    return max(live[t] - inside[t] for t in range(start, end + 1))


def plan_arena(gm: GraphModule, align: int = ALIGN, split: bool = True,
               held: Callable[[Node], bool] | None = None) -> ArenaPlan:
    """Which intermediates go into the arena and at which offsets (see the module docstring).
    ``split=False``: one buffer per device for the whole graph. ``held``: which graph inputs
    outlive the graph (``default_held(stage)``; default all), for the live bytes that
    decide the segments."""
    lifetimes = TensorLifetimes(gm, held)
    symbols = graph_symbols(gm)
    plan = ArenaPlan(align)
    writers: dict[Node, Writer | str] = {}
    blocks: dict[str, list[ArenaBlock]] = {}
    for s in lifetimes.storages:
        if s.is_input or s.is_output or s.first < 0 or s.root.op != "call_function":
            continue
        node = s.root
        if node not in writers:
            writers[node] = _node_writer(node, symbols)
        why = _why_not(s, writers[node], symbols)
        if why is not None:
            plan.skipped[why] += 1
            continue
        t = s.tensor
        nbytes_expr = storage_bytes_expr(t)
        slot = ArenaSlot(node.name, s.index, writers[node].label, str(t.device), t.dtype, s.nbytes, 0,
                         s.first, s.last, lifetimes.nodes[s.last].name, nbytes_expr, sympy.Integer(0))
        size = -(-s.nbytes // align) * align
        blocks.setdefault(slot.device, []).append(ArenaBlock(slot, s.first, s.last, size, _align(nbytes_expr, align)))
    n = len(lifetimes.nodes)
    for device, group in blocks.items():
        # the graph's live bytes with these blocks rounded up to the alignment: cuts are for
        # what holding a buffer costs, not for the padding
        padding = live_per_step(n, ((b.start, b.end, b.size - b.slot.nbytes) for b in group))
        peak = max((x + p for x, p in zip(lifetimes.live, padding)), default=0)
        target = bound = peak + peak // 32
        for _ in range(4 if split else 1):
            segments, dropped = split_in_time(group, lifetimes.live, bound) if split else ([group], [])
            packed = []
            for segment in segments:
                best_fit(segment)
                packed.append(symbolic_offsets(segment))
            # the split estimates a buffer by the least packing can give; if best fit's
            # fragmentation still breaks the target, split again under a lower bound
            excess = max((_outside(segment, lifetimes.live) + size - target
                          for segment, (_, _, size) in zip(segments, packed)), default=0)
            if excess <= 0:
                break
            bound -= excess
        plan.skipped["live across an arena segment boundary"] += len(dropped)
        for k, (segment, (exprs, total, total_hint)) in enumerate(zip(segments, packed)):
            key = f"{device}#{k}"
            for b in segment:
                b.slot.offset, b.slot.offset_expr, b.slot.buffer = b.offset, exprs[b], key
            plan.buffers[key] = ArenaBuffer(key, device, total_hint, total, min(b.start for b in segment),
                                            max(b.end for b in segment))
            plan.slots += [b.slot for b in segment]
        kept = [b for segment in segments for b in segment]
        if kept:
            plan.lower_bound += max(live_per_step(len(lifetimes.nodes), ((b.start, b.end, b.size) for b in kept)))
    plan.skipped = Counter({k: v for k, v in plan.skipped.items() if v})
    plan.slots.sort(key=lambda s: (s.start, s.index or 0))
    return plan


# -- the rewrite ----------------------------------------------------------------------------

class _Emitter:
    """Integer arithmetic on the graph's size symbols as FX nodes, placed after the inputs."""

    def __init__(self, gm: GraphModule, symbols: dict):
        self.graph = gm.graph
        self.symbols = symbols
        self.cache: dict[sympy.Expr, Node] = {}
        self.anchor = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]

    def _node(self, target: Callable, args: tuple) -> Node:
        with self.graph.inserting_after(self.anchor):
            self.anchor = self.graph.create_node("call_function", target, args, name="arena_int")
        return self.anchor

    def __call__(self, expr: sympy.Expr) -> int | Node:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr in self.cache:
            return self.cache[expr]
        if isinstance(expr, sympy.Symbol):
            node, dim, _ = self.symbols[expr]
            out = node if dim is None else self._node(aten.sym_size.int, (node, dim))
        elif isinstance(expr, FloorDiv):
            out = self._node(operator.floordiv, (self(expr.args[0]), self(expr.args[1])))
        elif isinstance(expr, sympy.Pow):
            base = self(expr.base)
            out = base
            for _ in range(int(expr.exp) - 1):
                out = self._node(operator.mul, (out, base))
        else:
            fold = {sympy.Add: operator.add, sympy.Mul: operator.mul, sympy.Max: torch.sym_max}[type(expr)]
            args = [self(a) for a in expr.args]
            out = args[0]
            for a in args[1:]:
                out = self._node(fold, (out, a))
        self.cache[expr] = out
        return out


@dataclass
class AppliedArena:
    arenas: dict[str, Node]  # ArenaBuffer key -> the node allocating it
    views: dict[str, Node]  # slot name -> the node writing it (replacement of the planned node)
    fills: list[Node]  # debug fills


def apply_arena(gm: GraphModule, plan: ArenaPlan, debug: bool = False) -> AppliedArena:
    """Rewrite ``gm`` so the planned tensors live in the arena; ``debug``: poison dead bytes."""
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    fake_mode = compat.fake_mode_of(gm)
    emit = _Emitter(gm, graph_symbols(gm))
    applied = AppliedArena({}, {}, [])
    slots_of: dict[str, list[ArenaSlot]] = {}
    for s in plan.slots:
        slots_of.setdefault(s.node, []).append(s)
    typed: dict[tuple[str, torch.dtype], Node] = {}
    for key, buf in plan.buffers.items():
        first = min((s for s in plan.slots if s.buffer == key), key=lambda s: s.start)
        device = buf.device
        with graph.inserting_before(by_name[first.node]):
            arena = graph.create_node("call_function", aten.empty.memory_format, ([emit(buf.nbytes_expr)],),
                                      {"dtype": torch.uint8, "device": torch.device(device)}, name="arena")
            arena.meta["val"] = _fake(fake_mode, lambda: torch.empty(
                compat.symint_of(fake_mode, buf.nbytes_expr, buf.nbytes), dtype=torch.uint8, device=device))
            if debug:
                applied.fills.append(graph.create_node("call_function", aten.fill_.Scalar, (arena, DEBUG_FILL),
                                                       name=f"{arena.name}_poison"))
        applied.arenas[key] = arena

    def typed_view(key: str, dtype: torch.dtype) -> Node:
        if (key, dtype) not in typed:
            arena = applied.arenas[key]
            buf = plan.buffers[key]
            device = buf.device
            itemsize = torch.empty((), dtype=dtype).element_size()
            with graph.inserting_after(arena):
                node = graph.create_node("call_function", aten.view.dtype, (arena, dtype),
                                         name=f"{arena.name}_{str(dtype).replace('torch.', '')}")
            node.meta["val"] = _fake(fake_mode, lambda: torch.empty(
                compat.symint_of(fake_mode, FloorDiv(buf.nbytes_expr, itemsize), buf.nbytes // itemsize),
                dtype=dtype, device=device))
            typed[(key, dtype)] = node
        return typed[(key, dtype)]

    replaced: dict[Node, Node] = {}
    for name, slots in slots_of.items():
        node = by_name[name]
        writer = writer_of(node)
        vals = tensor_values(node.meta["val"])
        planned = {s.index: s for s in slots}
        outs = []
        with graph.inserting_before(node):
            for idx, t in vals:
                s = planned.get(idx)
                if s is None:  # an output of this op that stays out of the arena
                    out = graph.create_node("call_function", aten.empty_strided.default, (
                        [emit(compat.sym_expr(x)) for x in t.shape], [emit(compat.sym_expr(x)) for x in t.stride()]),
                        {"dtype": t.dtype, "device": t.device}, name=f"{name}_out{idx}")
                else:
                    itemsize = t.element_size()
                    out = graph.create_node("call_function", aten.as_strided.default, (
                        typed_view(s.buffer, t.dtype),
                        [emit(compat.sym_expr(x)) for x in t.shape],
                        [emit(compat.sym_expr(x)) for x in t.stride()],
                        emit(FloorDiv(s.offset_expr, itemsize) if not s.offset_expr.is_Integer
                             else sympy.Integer(s.offset // itemsize))), name=f"{name}_in_arena")
                    applied.views[s.name] = out
                out.meta["val"] = t
                outs.append(out)
            if writer.kind == "out":
                node.target = writer.op
                node.kwargs = {**node.kwargs, **dict(zip(writer.out_args, outs))}
                continue
            if writer.kind == "fill":
                value = node.args[1] if node.target is aten.full.default else node.args[0]
                new = graph.call_function(aten.fill_.Scalar, (outs[0], value))
            elif writer.kind == "copy":
                new = graph.call_function(aten.copy_.default, (outs[0], node.args[0]))
            else:  # "view": an empty tensor is just its bytes
                new = outs[0]
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        replaced[node] = new
        by_name[name] = new
    if debug:
        for s in plan.slots:
            last = by_name.get(s.last_use, None)
            last = replaced.get(last, last)
            arena = applied.arenas[s.buffer]
            label = s.name.replace("[", "_").replace("]", "")
            with graph.inserting_after(last):
                region = graph.create_node("call_function", aten.slice.Tensor, (
                    arena, 0, emit(s.offset_expr), emit(s.offset_expr + s.nbytes_expr)), name=f"{label}_dead")
            with graph.inserting_after(region):
                applied.fills.append(graph.create_node("call_function", aten.fill_.Scalar, (region, DEBUG_FILL),
                                                       name=f"{label}_poison"))
    graph.lint()
    gm.recompile()
    return applied


def _fake(fake_mode: Any, make: Callable[[], torch.Tensor]) -> Any:
    if fake_mode is None:
        return None
    with fake_mode:
        return make()


def arena_graph(gm: GraphModule, stage: str, debug: bool = False) -> tuple[ArenaPlan, AppliedArena | None]:
    """Plan and apply in one go (what a compile with ``arena=True, inductor=False`` does)."""
    plan = plan_arena(gm, held=default_held(stage))
    if not plan.slots:
        return plan, None
    applied = apply_arena(gm, plan, debug)
    plan.fx_peak = TensorLifetimes(gm, default_held(stage)).peak()[0]
    return plan, applied
