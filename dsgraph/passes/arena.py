"""arena: a graph's intermediates at planned offsets in one buffer (FX execution only).

Runs last, on the graph that executes (``arena=True`` with ``inductor=False`` puts it in the
default pipeline; through Inductor the option turns on Inductor's own ``memory_planning``
instead). The plan (``dsgraph.analysis.arena_plan``) gives each planned tensor an offset;
this rewrite makes its node write into a typed, strided view of the buffer through the
op's ``.out`` overload (or fill/copy), with sizes and offsets emitted as integer arithmetic
on the graph's size symbols, and in debug mode poisons bytes after their last use.
Before/after::

    mm = aten.mm.default(x, w)                  arena = aten.empty.memory_format([4096], dtype=torch.uint8)
                                           ->   view = aten.view.dtype(aten.as_strided(arena, ...), torch.float32)
                                                mm = aten.mm.out(x, w, out=view)

Arithmetic is unchanged (the same ops write the same values), so gradients are bitwise
those of the pipeline without it. Stats: the plan's figures (``arena_bytes``,
``arena_tensors``, ...), also added to the graph's report.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.analysis.arena_plan import DEBUG_FILL, ArenaPlan, ArenaSlot, graph_symbols, plan_arena, writer_of
from dsgraph.analysis.lifetimes import TensorLifetimes, default_held, tensor_values
from dsgraph.pass_api import PassContext, PassResult, PassSpec

SPEC = PassSpec(
    name="arena",
    stages=("forward", "backward", "inference"),
    mutates=True,
    handles_mutation=True,  # runs after grad_pool's in-place adds
    executors=("fx",),
    doc="intermediates at planned offsets in one buffer per graph (FX execution)",
)

aten = torch.ops.aten


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
        elif isinstance(expr, compat.FloorDiv):
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
                compat.symint_of(fake_mode, compat.FloorDiv(buf.nbytes_expr, itemsize), buf.nbytes // itemsize),
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
                        emit(compat.FloorDiv(s.offset_expr, itemsize) if not s.offset_expr.is_Integer
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


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    plan, applied = arena_graph(gm, ctx.stage, debug=ctx.config.debug)
    ctx.report(**plan.stats())
    ctx.dump_text("arena.md", str(plan) + "\n")
    return PassResult(gm, changed=applied is not None, stats=plan.stats())
