"""grad_pool: the backward writes parameter gradients into one flat buffer per (device, dtype).

Before/after (one Linear; ``dsgraph_grad_0``, ``dsgraph_grad_1`` are new graph inputs: the
runtime wrapper passes the parameters' slots of the pool, and ``param.grad`` views them)::

    mm_1 = mm(permute_3, x)                    mm_into_(dsgraph_grad_0, permute_3, x)    # the matmul writes the slot
    sum_1 = sum(tangents_1, [0])          ->   sum_1 = sum(tangents_1, [0])
    return (mm_1, sum_1, None)                 add = add(dsgraph_grad_1, sum_1)
                                               copy_(dsgraph_grad_1, add)                # fuses into the reduction
                                               return (None, None, None)

One input per slot rather than one for the whole buffer: writes into one buffer input
would order every kernel that writes a gradient after the previous one (Inductor tracks
mutations per input) and stop it from fusing a bias reduction with its neighbours; slots
never overlap, so separate inputs are exact.

Slots follow the order in which this backward produces the gradients. A weight gradient
that is a plain ``mm`` (used by nothing else, written row-major) becomes ``mm_into_``: the
matmul writes the slot itself; every other gradient is added into its slot
(``slot += grad``), which Inductor fuses into the pointwise or reduction kernel that
produces it, so the pooled backward needs no extra kernels. Two forms that Inductor cannot
fuse an add into get their own rewrite when the graph goes to Inductor: a tied weight's
``bias + mm(a, b)`` (embedding scatter plus head matmul, one ``addmm`` in stock) becomes
``addmm_into_``, and an embedding gradient (a scatter-add into zeros) scatters into the slot
itself. Both reassociate float additions when the slot already holds gradients, so with
``inductor=False`` (bitwise to the unpooled pipeline) they stay plain adds. The graph always accumulates;
the runtime wrapper zeroes the slots of parameters whose ``.grad`` is None beforehand. The backward then returns None for
pooled parameters, and ``dsgraph.runtime.pool.PooledBackward`` (a runtime wrapper) owns ``.grad``:
accumulation, hooks, zeroing and set-to-None all keep eager's semantics.

Which backward output belongs to which parameter: outputs follow the forward's inputs,
which follow Dynamo's graph inputs (FACTS.md); Dynamo records the real tensor of each. A
graph where counts, shapes or dtypes do not line up is refused (the failure policy applies).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.pass_api import PassContext, PassResult, PassSpec
from dsgraph.runtime.ops import ADDMM_INTO, MM_INTO
from dsgraph.runtime.pool import MANAGER, PooledBackward, SameParameters, Slot

SPEC = PassSpec(
    name="grad_pool",
    stages=("forward", "backward"),  # forward: only the check that the call brings the same parameters
    mutates=True,
    handles_mutation=True,
    doc="parameter gradients in one flat buffer per (device, dtype)",
)


@dataclass
class PoolEntry:
    output_index: int
    node: str  # the node producing the gradient
    slot: Slot
    how: str  # "mm_into", "addmm_into", "scatter_into" or "copy"

    @property
    def overwrites(self) -> bool:
        """Does the graph's write set the whole slot when it starts empty (a matmul op that
        asks the pool), rather than add to what the slot holds?"""
        return self.how in ("mm_into", "addmm_into")


@dataclass
class PoolPlan:
    entries: list[PoolEntry] = field(default_factory=list)  # in the order of the new inputs

    @property
    def keys(self) -> list:
        return list(dict.fromkeys(e.slot.key for e in self.entries))

    def __str__(self) -> str:
        lines = [f"PoolPlan({len(self.entries)} gradients, keys {self.keys})"]
        for e in self.entries:
            lines.append(f"  out[{e.output_index}] {e.node} -> {e.how} at {e.slot.key} offset {e.slot.offset} numel {e.slot.numel}")
        return "\n".join(lines)


def _row_major(slot: Slot) -> bool:
    return tuple(slot.stride) == compat.contiguous_strides(slot.shape)


def _writes_whole_slot_by_mm(node: Node, slot: Slot) -> bool:
    if node.target is not torch.ops.aten.mm.default or len(node.users) != 1:
        return False
    return _row_major(slot) and tuple(node.meta["val"].shape) == slot.shape


def _addmm_parts(node: Node, slot: Slot) -> tuple[Node, Node] | None:
    """``bias + mm(a, b)`` (either order) whose matmul nothing else reads: (bias, mm)."""
    if node.target is not torch.ops.aten.add.Tensor or len(node.args) != 2 or node.kwargs:
        return None
    for mm, bias in (node.args, node.args[::-1]):
        if (isinstance(mm, Node) and isinstance(bias, Node) and _writes_whole_slot_by_mm(mm, slot)
                and mm.users.keys() == {node} and isinstance(bias.meta.get("val"), torch.Tensor)
                and tuple(bias.meta["val"].shape) == slot.shape and bias.meta["val"].dtype == slot.key[1]):
            return bias, mm
    return None


def _scatter_ops() -> tuple:
    ops = [torch.ops.aten.index_put.default]
    masked = getattr(torch.ops.aten, "_unsafe_masked_index_put_accumulate", None)  # torch >= 2.12 decomposition
    if masked is not None:
        ops.append(masked.default)
    return tuple(ops)


def _zeros_scattered(node: Node, slot: Slot) -> bool:
    """An embedding gradient as decomposed: a scatter-add into a zero buffer nothing else
    reads. Scattering straight into the slot saves the zero fill and the add."""
    if node.target not in _scatter_ops() or len(node.users) != 1:
        return False
    if node.target is torch.ops.aten.index_put.default:
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if not accumulate:
            return False
    base = node.args[0]
    if not isinstance(base, Node) or base.target is not torch.ops.aten.full.default or len(base.users) != 1:
        return False
    if base.args[1] != 0:
        return False
    val = base.meta.get("val")
    return (isinstance(val, torch.Tensor) and tuple(val.shape) == slot.shape and val.dtype == slot.key[1]
            and _row_major(slot))


def _how(node: Node, slot: Slot, inductor: bool) -> str:
    if _writes_whole_slot_by_mm(node, slot):
        return "mm_into"
    # the two forms below change the order of float additions when the slot already holds
    # gradients (g + (s + m) becomes (g + m) + s): through Inductor, where the fp32 rule of
    # eager applies, not with ``inductor=False``, where the pool is bitwise
    if inductor and _addmm_parts(node, slot) is not None:
        return "addmm_into"
    if inductor and _zeros_scattered(node, slot):
        return "scatter_into"
    return "copy"


def plan_pool(gm: GraphModule, params: list, inductor: bool = False) -> PoolPlan:
    """``params``: for each backward output, the parameter it is the gradient of (or None).
    ``inductor``: the graph goes to Inductor (allows the write forms that reassociate)."""
    outputs = list(gm.graph.output_node().args[0])
    if len(outputs) != len(params):
        raise ValueError(f"backward has {len(outputs)} outputs but the graph had {len(params)} inputs: "
                         "cannot tell which output is which parameter's gradient")
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    candidates = []
    for i, (out, param) in enumerate(zip(outputs, params)):
        if out is None or param is None or not isinstance(out, Node):
            continue
        val = out.meta.get("val")
        if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(param.shape) or val.dtype != param.dtype:
            raise ValueError(f"backward output {i} ({out.name}) does not match parameter {tuple(param.shape)} "
                             f"{param.dtype}: cannot pool it")
        candidates.append((position[out], i, out, param))
    plan = PoolPlan()
    seen = set()
    for _, i, out, param in sorted(candidates, key=lambda c: c[0]):  # backward production order
        if id(param) in seen:
            raise ValueError("one parameter has two gradient outputs")
        seen.add(id(param))
        slot = MANAGER.slot(param)
        plan.entries.append(PoolEntry(i, out.name, slot, _how(out, slot, inductor)))
    return plan


def apply_pool(gm: GraphModule, plan: PoolPlan, fake_mode) -> tuple[GraphModule, list]:
    """Edit the graph; returns it and the fake example inputs of the new placeholders."""
    graph = gm.graph
    cursor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    by_name = {n.name: n for n in graph.nodes}
    slot_inputs, fakes = [], []
    for i, entry in enumerate(plan.entries):
        slot = entry.slot
        with graph.inserting_after(cursor):
            cursor = graph.placeholder(f"dsgraph_grad_{i}")
        with fake_mode:
            cursor.meta["val"] = torch.empty_strided(slot.shape, slot.stride, device=slot.key[0], dtype=slot.key[1])
        fakes.append(cursor.meta["val"])
        slot_inputs.append(cursor)
    out_node = graph.output_node()
    outputs = list(out_node.args[0])
    replaced: list[Node] = []  # nodes the writes into slots take the place of, users first
    for entry, slot_input in zip(plan.entries, slot_inputs):
        producer = by_name[entry.node]
        # right after the producer, so its inputs and the gradient die as early as before
        with graph.inserting_after(producer):
            if entry.how == "mm_into":
                graph.call_function(MM_INTO, (slot_input, *producer.args))
                replaced.append(producer)
            elif entry.how == "addmm_into":
                bias, mm = _addmm_parts(producer, entry.slot)
                graph.call_function(ADDMM_INTO, (slot_input, bias, *mm.args))
                replaced += [producer, mm]
            elif entry.how == "scatter_into":
                # the scatter adds into the slot itself; Inductor turns the functional
                # scatter plus copy_ back into one in-place scatter kernel
                total = graph.call_function(producer.target, (slot_input, *producer.args[1:]), dict(producer.kwargs))
                replaced += [producer, producer.args[0]]
            else:
                total = graph.call_function(torch.ops.aten.add.Tensor, (slot_input, producer))
        if not entry.overwrites:
            with graph.inserting_after(total):
                write = graph.call_function(torch.ops.aten.copy_.default, (slot_input, total))
            total.meta["val"] = write.meta["val"] = slot_input.meta["val"]
        outputs[entry.output_index] = None
    out_node.args = (tuple(outputs),)
    # Inductor keeps the strides of "user visible" outputs and reads those entries as nodes
    # (torch 2.11 fails on a None there): the pooled outputs are gone
    visible = out_node.meta.get("user_visible_output_idxs")
    if visible is not None:
        out_node.meta["user_visible_output_idxs"] = [i for i in visible if isinstance(outputs[i], Node)]
    for node in replaced:
        graph.erase_node(node)
    return gm, fakes


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    params = ctx.state.graph_params
    if ctx.stage == "forward":
        # the backward binds slots to these parameters: another model may not reuse the graphs
        if any(p is not None for p in params):
            ctx.register_runtime_wrapper(SameParameters(params))
        return PassResult(gm, changed=False)
    if not params:
        raise ValueError("grad_pool needs the parameters behind the graph's inputs (Dynamo did not record them)")
    plan = plan_pool(gm, params, inductor=ctx.config.options.inductor)
    how = Counter(e.how for e in plan.entries)
    stats = {"pooled": len(plan.entries), "mm_into": how["mm_into"], "addmm_into": how["addmm_into"],
             "scatter_into": how["scatter_into"], "copies": how["copy"],
             "pooled_bytes": sum(e.slot.numel * e.slot.key[1].itemsize for e in plan.entries)}
    if not plan.entries:
        return PassResult(gm, changed=False, stats=stats)
    fake_mode = compat.detect_fake_mode(ctx.example_inputs) or compat.fake_mode_of(gm)
    gm, fakes = apply_pool(gm, plan, fake_mode)
    ctx.example_inputs.extend(fakes)
    ctx.register_runtime_wrapper(PooledBackward(MANAGER, [e.slot for e in plan.entries],
                                                [e.overwrites for e in plan.entries], ctx.config.debug))
    return PassResult(gm, changed=True, stats=stats)
