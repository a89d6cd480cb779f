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

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch
from torch.fx import GraphModule, Node

from .. import compat
from ..units import format_bytes
from .arena_packing import ArenaBlock, _outside, best_fit, split_in_time, symbolic_offsets
from .lifetimes import Storage, TensorLifetimes, storage_bytes_expr, tensor_values
from .sweep import live_per_step

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
    if node.op != "call_function" or not compat.is_op(op):
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
    names = tuple(a.name for a in compat.op_schema(out).arguments if compat.writes(a))
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
    if isinstance(expr, (sympy.Add, sympy.Mul, compat.FloorDiv, sympy.Max)):
        return all(_computable(a, symbols) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return expr.exp.is_Integer and int(expr.exp) > 0 and _computable(expr.base, symbols)
    return False


def _align(expr: sympy.Expr, align: int) -> sympy.Expr:
    if expr.is_Integer:
        return sympy.Integer(-(-int(expr) // align) * align)
    return align * compat.FloorDiv(expr + (align - 1), align)


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
