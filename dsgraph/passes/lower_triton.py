"""lower_triton: fused regions become one call of a generated Triton kernel each.

Which regions: by default those dsgraph's own passes created (``select=tagged``: a member
tagged ``dsgraph_recomputed`` / ``dsgraph_pool_epilogue``, or a write into a gradient-pool
slot); ``select=recomputed`` takes every backward region that recomputes forward values,
``select=all`` every region the code generator supports (dsgraph.lowering.regions).

Before/after (a recomputed GELU derivative in a backward graph; ``select=all``)::

    view_9 = view(addmm_2, [2, 7, 91])             view_9 = view(addmm_2, [2, 7, 91])
    mul_5 = mul(view_9, 0.7071067811865476)        view_14 = view(mm, [2, 7, 91])
    erf = erf(mul_5)                          ->   dsg_pw_7c1e = dsgraph_triton.dsg_pw_7c1e(view_9, view_14)
    ...                                            view_15 = view(dsg_pw_7c1e, [14, 91])
    view_14 = view(mm, [2, 7, 91])
    mul_13 = mul(view_14, add_8)
    view_15 = view(mul_13, [14, 91])

The fused node takes the place of the region's last member; pure nodes in between that
read its outputs move after it (regions never span a side effect). Each kernel is
compiled once per signature and checked against the region's aten ops on small random
inputs before the graph uses it: a Triton compile failure or a mismatch leaves the region
as it was, with a ``DsgraphLoweringWarning``. With ``inductor=False`` the graph calls the
ops (``dsgraph_triton::<kernel>``); through Inductor on a GPU each op is traced into
Inductor's user-defined Triton kernel form (``dsgraph.lowering.inductor``).

Refused (nothing changes, ``stats["refused"]`` says why): CPU tensors without Triton's
interpreter, and CPU graphs that go to Inductor (tests/unit/test_lowering_pass.py shows why).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Callable, Collection

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.lowering import kernels
from dsgraph.lowering.check import check_region
from dsgraph.lowering.codegen import render
from dsgraph.lowering.kernel_ir import Binding, KernelIR, region_ir
from dsgraph.lowering.kernels import DsgraphLoweringWarning
from dsgraph.lowering.regions import Region, acyclic, find_regions, selector
from dsgraph.pass_api import PassContext, PassResult, PassSpec


def _fail_list(text: str) -> tuple[int, ...]:
    """``fail_regions=0+2``: indices of planned regions whose compile fails (tests only)."""
    return tuple(int(x) for x in text.split("+") if x.strip())


def _select(text: str) -> str:
    selector(text)  # ValueError naming the accepted ones
    return text


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("expected 0 or 1")
    return text == "1"


SPEC = PassSpec(
    name="lower_triton",
    stages=("forward", "backward", "inference"),
    mutates=True,  # a region writing a gradient-pool slot becomes an op that mutates it
    handles_mutation=True,  # copy_ into slots, mutating custom ops: never spanned or moved across
    args={"select": _select, "opaque": _flag, "fail_regions": _fail_list},
    doc="lowers fused regions to generated Triton kernels",
)


def _nbytes(val) -> int:
    if not isinstance(val, torch.Tensor):
        return 0
    return compat.size_hint(val.numel()) * val.element_size()


@dataclass
class PlannedRegion:
    index: int
    region: Region
    ir: KernelIR
    binding: Binding
    bytes_read: int
    bytes_written: int
    status: str = "planned"  # then "lowered" or "left to Inductor: <why>"

    @property
    def kernel(self) -> str:
        return self.ir.name

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    def __str__(self) -> str:
        r = self.region
        shape = "x".join(str(s) for s in r.full_shape) or "scalar"
        return (f"  [{self.index}] {self.kernel} ({r.kind} over [{shape}], {self.bytes_moved} bytes moved): "
                f"{', '.join(r.names)}\n"
                f"      inputs {[n.name for n in self.binding.params]}"
                + (f" + scalars {[n.name for n in self.binding.scalars]}" if self.binding.scalars else "")
                + f" -> outputs {[n.name for n in r.outputs]}"
                + (f", writes {[w.args[0].name for w in r.writes]}" if r.writes else "")
                + ("" if self.status == "planned" else f"; {self.status}"))


@dataclass
class LoweringPlan:
    select: str
    regions: list[PlannedRegion] = field(default_factory=list)  # the selected ones, graph order
    not_selected: list[str] = field(default_factory=list)  # first node of each region left alone
    dropped: list[str] = field(default_factory=list)  # selected but would close a cycle with others

    @property
    def lowered(self) -> list[PlannedRegion]:
        return [p for p in self.regions if p.status == "lowered"]

    @property
    def fallbacks(self) -> list[PlannedRegion]:
        return [p for p in self.regions if p.status.startswith("left")]

    def stats(self) -> dict:
        return {
            "select": self.select,
            "regions": len(self.regions) + len(self.not_selected) + len(self.dropped),
            "selected": len(self.regions),
            "lowered": len(self.lowered),
            "fallbacks": len(self.fallbacks),
            "kernels": sorted({p.kernel for p in self.lowered}),
            "bytes_moved": sum(p.bytes_moved for p in self.lowered),
            # lowered regions that are an all-reduce bucket's epilogue (tagged by the allreduce pass)
            "pool_epilogues": sum(1 for p in self.lowered if any(n.meta.get("dsgraph_pool_epilogue")
                                                                 for n in p.region.nodes)),
        }

    def __str__(self) -> str:
        lines = [f"LoweringPlan(select={self.select}: {len(self.regions)} regions selected, "
                 f"{len(self.not_selected)} not selected, {len(self.dropped)} dropped for cycles)"]
        lines += [str(p) for p in self.regions]
        return "\n".join(lines)


def plan_lowering(gm: GraphModule, select: str | Callable[[Region], bool] = "tagged") -> LoweringPlan:
    """Find the graph's regions, keep the selected ones, and build each one's kernel IR."""
    choose = selector(select)
    found = find_regions(gm)
    chosen = [r for r in found if choose(r)]
    kept = acyclic(chosen, list(gm.graph.nodes))
    plan = LoweringPlan(select if isinstance(select, str) else getattr(select, "__name__", "custom"))
    plan.not_selected = [r.nodes[0].name for r in found if r not in chosen]
    plan.dropped = [r.nodes[0].name for r in chosen if r not in kept]
    for region in kept:
        ir, binding = region_ir(region)
        read = sum(_nbytes(n.meta.get("val")) for n in binding.params
                   if any(binding.params.index(n) == l.param for l in ir.loads))
        written = sum(_nbytes(n.meta.get("val")) for n in region.outputs)
        written += sum(_nbytes(w.args[0].meta.get("val")) for w in region.writes)
        plan.regions.append(PlannedRegion(len(plan.regions), region, ir, binding, read, written))
    return plan


def kernel_sources(plan: LoweringPlan) -> dict[str, str]:
    """One file per kernel of the plan's lowered regions (all selected before apply)."""
    chosen = plan.lowered if any(p.status != "planned" for p in plan.regions) else plan.regions
    where = kernels.target()  # the source the kernels run as here (GPU or interpreter)
    return {f"{p.kernel}.py": render(p.ir, where) for p in chosen}


def _fake_outputs(gm: GraphModule, op, args: list):
    vals = [a.meta["val"] for a in args]
    fake_mode = compat.fake_mode_of(gm)
    if fake_mode is None:
        return op(*vals)
    with fake_mode:
        return op(*vals)


def _replace(gm: GraphModule, planned: PlannedRegion, compiled: kernels.CompiledKernel,
             renamed: dict[Node, Node]) -> None:
    """Splice the fused node in after the region's last member; ``renamed`` learns which
    node now stands for each output."""
    graph = gm.graph
    region = planned.region
    members = set(region.nodes)
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    last = max(region.nodes, key=order.__getitem__)
    first = min(region.nodes, key=order.__getitem__)
    # pure nodes inside the span that read the region's outputs run after the fused node
    moved, after = [], set(members)
    for node in nodes[order[first] + 1:order[last]]:
        if node not in members and any(a in after for a in node.all_input_nodes):
            moved.append(node)
            after.add(node)
    args = list(planned.binding.params) + list(planned.binding.scalars)
    with graph.inserting_after(last):
        fused = graph.call_function(compiled.op, tuple(args))
    fused.meta["val"] = _fake_outputs(gm, compiled.op, args)
    fused.meta["dsgraph_kernel"] = compiled.name
    results = [fused]
    if len(region.outputs) > 1:
        results = []
        cursor = fused
        for i, out in enumerate(region.outputs):
            with graph.inserting_after(cursor):
                cursor = graph.call_function(operator.getitem, (fused, i))
            cursor.meta["val"] = fused.meta["val"][i]
            results.append(cursor)
    cursor = results[-1] if region.outputs else fused
    for n in moved:
        cursor.append(n)
        cursor = n
    for out, new in zip(region.outputs, results):
        out.replace_all_uses_with(new)
        renamed[out] = new
    for n in reversed(region.nodes):
        graph.erase_node(n)


def apply_lowering(gm: GraphModule, plan: LoweringPlan, *, fail_regions: Collection[int] = (),
                   check: bool = True) -> GraphModule:
    """Compile, check and splice in each planned region's kernel. ``fail_regions``: plan
    indices whose compile raises as a Triton failure would (the test hook for the fallback)."""
    renamed: dict[Node, Node] = {}
    for planned in plan.regions:
        # an earlier region's outputs are now its fused node's results
        planned.binding = Binding(tuple(renamed.get(n, n) for n in planned.binding.params),
                                  tuple(renamed.get(n, n) for n in planned.binding.scalars))
        try:
            compiled = kernels.compile_kernel(planned.ir, fail=planned.index in fail_regions)
            if check:
                check_region(planned.region, planned.binding, compiled)
        except Exception as e:  # noqa: BLE001 - any compile or check failure leaves the region alone
            planned.status = f"left to Inductor: {type(e).__name__}: {e}"
            warnings.warn(f"dsgraph lower_triton: region {planned.index} ({planned.kernel}: "
                          f"{', '.join(planned.region.names[:6])}{', ...' if len(planned.region.nodes) > 6 else ''}) "
                          f"is left to Inductor: {e}", DsgraphLoweringWarning, stacklevel=2)
            continue
        _replace(gm, planned, compiled, renamed)
        planned.status = "lowered"
    if plan.lowered:
        gm.graph.lint()
        gm.recompile()
    return gm


def refusal(gm: GraphModule, inductor: bool, opaque: bool = False) -> str | None:
    """Why this graph cannot have Triton kernels here, or None."""
    devices = {v.device.type for n in gm.graph.nodes if n.op == "placeholder"
               for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)}
    if "cpu" in devices and not kernels.interpreting():
        return "the graph's tensors are on the CPU and Triton's interpreter is off (TRITON_INTERPRET=1 turns it on)"
    if "cpu" in devices and inductor and not opaque:
        return ("on the CPU, Inductor can only call the kernels as opaque ops that run Triton's interpreter "
                "(wrap_triton does not trace interpreted kernels into user-defined Triton kernels); "
                "lower_triton{opaque=1} lowers anyway")
    return None


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    select = ctx.args.get("select", "tagged")
    opaque = ctx.args.get("opaque", False)
    inductor = ctx.config.options.inductor
    why = refusal(gm, inductor, opaque)
    if why is not None:
        return PassResult(gm, changed=False, stats={"select": select, "refused": why})
    plan = plan_lowering(gm, select)
    if not plan.regions:
        return PassResult(gm, changed=False, stats=plan.stats())
    gm = apply_lowering(gm, plan, fail_regions=ctx.args.get("fail_regions", ()))
    stats = plan.stats()
    if inductor and plan.lowered and not opaque:
        from dsgraph.lowering.inductor import to_user_kernels

        try:
            stats["user_kernels"] = to_user_kernels(gm)
        except Exception as e:  # noqa: BLE001 - the ops still run, as opaque calls
            stats["user_kernels"] = 0
            warnings.warn(f"dsgraph lower_triton: could not hand the kernels of {ctx.graph_name} to Inductor as "
                          f"user-defined Triton kernels ({type(e).__name__}: {e}); Inductor calls them as opaque ops",
                          DsgraphLoweringWarning, stacklevel=2)
    for name, text in kernel_sources(plan).items():
        ctx.dump_text(name, text)  # one file per kernel in the graph's dump folder
    return PassResult(gm, changed=bool(plan.lowered), stats=stats)
