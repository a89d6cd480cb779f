"""What a partition really peaks at: compile it and read the executor's own plans.

The checkpoint planner predicts peaks from the joint graph alone (``evaluator``). This
module is what those predictions are held against, in tests and benchmarks:

- ``capture_joint(model, inputs)``: the joint graph dsgraph's partitioner receives for one
  training step of ``model(*inputs)`` (after Inductor's decompositions and joint-graph
  passes), with the partitioner's arguments;
- ``compiled_peaks(model, inputs, choose, inductor)``: compile the step with the partition
  ``choose(joint_gm, joint_inputs, kwargs)`` returns (``stock`` or a saved set through
  ``dsgraph.recompute.partition``), then the step's peak as FX execution runs those graphs
  (``fx_plan``) and, with ``inductor=True``, as Inductor's final schedule runs them
  (``inductor_plan``: its own buffers, fusion, reuse and peak-memory reordering). The
  graphs run once, so the compile is the one that executes.

External memory is what the forward graph receives (parameters, buffers, inputs), as the
session's budget check counts it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx import GraphModule

from .. import compat
from ..analysis.inductor_plan import GraphCapture, inductor_plan
from ..analysis.lifetimes import TensorLifetimes
from ..analysis.plan import GraphPlan, fx_plan
from ..analysis.step_model import StepModel
from ..analysis.timeline import Interval, MemoryTimeline, stitch

Choose = Callable[[GraphModule, Any, dict], tuple[GraphModule, GraphModule]]
# a rewrite of Dynamo's graph before AOTAutograd (a pre_grad pass such as chunk_loss: the
# caller brings it, as this layer does not import passes)
PreGrad = Callable[[GraphModule], GraphModule]


@dataclass
class JointCapture:
    gm: GraphModule  # the joint graph (a copy: partitioners edit theirs)
    joint_inputs: Any
    kwargs: dict  # num_fwd_outputs, static_lifetime_input_indices
    # what Inductor's own partitioner chose to save (joint nodes; values its backward does
    # not read included, ``StepModel`` drops them as the extraction does)
    stock_saved: list[str] = field(default_factory=list)

    def stock_prediction(self, executor: str) -> int:
        """The step model's peak of the stock partition (what Inductor's partitioner saved)
        for ``executor``."""
        model = StepModel(self.gm, self.kwargs["num_fwd_outputs"], self.kwargs.get("static_lifetime_input_indices") or [])
        by_name = {n.name: n for n in self.gm.graph.nodes}
        return model.evaluate([model.index[by_name[n]] for n in self.stock_saved], executor, sink=False).peak


@dataclass
class CompiledPeaks:
    fx: MemoryTimeline
    inductor: MemoryTimeline | None
    saved_names: list[str]
    forward: GraphModule
    backward: GraphModule
    joint: JointCapture
    plans: dict[str, GraphPlan] = field(default_factory=dict)  # Inductor's per stage
    external: int = 0
    origins: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # stage -> Inductor buffer -> FX nodes
    origin_node: dict[str, dict[str, str | None]] = field(default_factory=dict)  # stage -> buffer -> its FX node
    # stage -> (step, buffer, its FX node, bytes, reuses) of each buffer Inductor's wrapper allocates or reuses
    allocations: dict[str, list[tuple]] = field(default_factory=dict)
    # stage -> per scheduler step, the FX nodes its kernel was lowered from
    step_origins: dict[str, list[list[str]]] = field(default_factory=dict)

    @property
    def fx_peak(self) -> int:
        return self.fx.peak_bytes

    @property
    def inductor_peak(self) -> int | None:
        return self.inductor.peak_bytes if self.inductor is not None else None


def stock(gm: GraphModule, joint_inputs, kwargs: dict):
    """Inductor's own partition (its min-cut), on a copy."""
    return compat.default_partition(compat.copy_graph_module(gm), joint_inputs, **kwargs)


def _partitioner(fn: Callable):
    base = compat.custom_partitioner_base()

    class TruthPartitioner(base):  # type: ignore[misc, valid-type]
        def __call__(self, gm, joint_inputs, **kwargs):
            return fn(gm, joint_inputs, **kwargs)

        def uuid(self):
            return None

    return TruthPartitioner()


def _saved_names(bw: GraphModule) -> list[str]:
    return [n.name for n in bw.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]


def forward_inputs(fw: GraphModule) -> list[Interval]:
    """What the forward graph receives, each storage once: memory of the whole step."""
    lifetimes = TensorLifetimes(fw)
    return [Interval(f"input:{s.name}", s.nbytes, 0, 0, s.nbytes_expr) for s in lifetimes.storages if s.is_input]


def _allocations(graph) -> list[tuple]:
    """(scheduler step, buffer, the FX node it holds, bytes, the buffer it reuses or None),
    for debugging predictions buffer by buffer."""
    step_of = {}
    for step, snode in enumerate(graph.scheduler.nodes):
        for buf in snode.get_outputs():
            step_of[buf.get_name()] = step
    out = []
    with compat.graph_handler(graph):
        for line in getattr(graph.wrapper_code, "lines", []):
            kind = type(line).__name__
            if kind not in ("AllocateLine", "ReuseLine"):
                continue
            node = line.reused_as if kind == "ReuseLine" else line.node
            name = node.get_name()
            try:
                nbytes = compat.inductor_size_hint(node.get_layout().storage_size()) * node.get_dtype().itemsize
            except Exception:
                nbytes = -1
            origin = getattr(getattr(node, "origin_node", None), "name", None)
            out.append((step_of.get(name, -1), name, origin, nbytes, line.node.get_name() if kind == "ReuseLine" else None))
    return out


def _caused_by(e: BaseException | None, cls: type) -> bool:
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, cls):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _run(model, inputs, backend, autocast: torch.dtype | None) -> None:
    compat.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    device = next((x.device.type for x in inputs if isinstance(x, torch.Tensor)), "cpu")
    ctx = torch.autocast(device, autocast) if autocast is not None else contextlib.nullcontext()
    with ctx:
        loss = compiled(*inputs)
    loss.backward()
    for p in model.parameters():
        p.grad = None
    compat.reset()


def capture_joint(model: torch.nn.Module, inputs, autocast: torch.dtype | None = None,
                  pre_grad: PreGrad | None = None) -> JointCapture:
    """The joint graph the partitioner sees (Inductor's decompositions and joint passes
    applied), CSE'd as the checkpoint pass and the stock partitioner do. The graphs run as
    FX code: no Inductor compile."""
    seen: dict = {}

    def partition(gm, joint_inputs, **kwargs):
        copy = compat.copy_graph_module(gm)
        copy.graph = compat.fx_graph_cse(copy)
        copy.recompile()
        seen["joint"] = JointCapture(copy, joint_inputs, dict(kwargs),
                                     compat.min_cut_saved_names(gm, joint_inputs, **kwargs))
        return stock(gm, joint_inputs, kwargs)

    def backend(gm, example_inputs):
        gm = pre_grad(gm) if pre_grad is not None else gm
        with compat.dsgraph_compile_config():
            return compat.compile_fx(gm, example_inputs, inner_compile=lambda g, i, **kw: compat.boxed_fx(g),
                                     config_patches={"custom_partitioner_fn": _partitioner(partition)})

    _run(model, inputs, backend, autocast)
    return seen["joint"]


def compiled_peaks(model: torch.nn.Module, inputs, choose: Choose = stock, inductor: bool = True,
                   autocast: torch.dtype | None = None, kernels: bool = False,
                   pre_grad: PreGrad | None = None) -> CompiledPeaks:
    """Compile one step of ``model(*inputs)`` with the partition ``choose`` makes from the
    (CSE'd) joint graph, run it, and return the step's peaks by the executors' own plans.

    ``kernels=False``: Inductor stops once its wrapper is generated (its buffer plan is
    complete then: ``compat.inductor_codegen_only``) and the step runs the same graphs as FX
    code; ``True`` compiles and runs Inductor's kernels. ``pre_grad`` rewrites Dynamo's graph
    first (``capture_joint`` takes it too: the joint graphs then match)."""
    seen: dict = {"graphs": {}, "plans": {}, "origins": {}, "origin_node": {}, "allocations": {}, "steps": {}}

    def partition(gm, joint_inputs, **kwargs):
        gm.graph = compat.fx_graph_cse(gm)
        gm.recompile()
        seen["joint"] = JointCapture(compat.copy_graph_module(gm), joint_inputs, dict(kwargs),
                                     compat.min_cut_saved_names(gm, joint_inputs, **kwargs))
        fw, bw = choose(gm, joint_inputs, dict(kwargs))
        seen["saved"] = _saved_names(bw)
        return fw, bw

    def inner(gm, example_inputs, **kwargs):
        stage = "backward" if kwargs.get("is_backward") else "forward"
        seen["graphs"][stage] = compat.copy_graph_module(gm)
        if not inductor:
            return compat.boxed_fx(gm)
        fallback = compat.copy_graph_module(gm)
        stop = contextlib.nullcontext() if kernels else compat.inductor_codegen_only()
        try:
            with GraphCapture().active() as graphs, stop:
                compiled = compat.compile_fx_inner(gm, example_inputs, **kwargs)
        except Exception as e:
            if not _caused_by(e, compat.CodegenOnly):
                raise
            compiled = compat.boxed_fx(fallback)
        graph = graphs.graphs[0]
        seen["plans"][stage] = inductor_plan(graph)
        seen["origins"][stage] = {buf.get_name(): sorted(o.name for o in getattr(buf, "origins", ()) or ())
                                  for buf in graph.buffers}
        seen["origin_node"][stage] = {buf.get_name(): getattr(getattr(buf, "origin_node", None), "name", None)
                                      for buf in graph.buffers}
        seen["allocations"][stage] = _allocations(graph)
        seen["steps"][stage] = [sorted(o.name for o in getattr(getattr(sn, "node", None), "origins", ()) or ())
                                if getattr(sn, "node", None) is not None else
                                sorted({o.name for m in sn.get_nodes() for o in (getattr(m.node, "origins", ()) or ())})
                                for sn in graph.scheduler.nodes]
        return compiled

    def backend(gm, example_inputs):
        gm = pre_grad(gm) if pre_grad is not None else gm
        with compat.dsgraph_compile_config():
            return compat.compile_fx(gm, example_inputs, inner_compile=inner,
                                     config_patches={"custom_partitioner_fn": _partitioner(partition)})

    _run(model, inputs, backend, autocast)
    fw, bw = seen["graphs"]["forward"], seen["graphs"]["backward"]
    external = forward_inputs(fw)
    saved = seen["saved"]
    bw_fx = fx_plan(bw)
    fx = stitch(fx_plan(fw), bw_fx, external, saved)
    real = None
    if inductor:
        fw_plan, bw_plan = seen["plans"]["forward"], seen["plans"]["backward"]
        bw_plan.input_bytes, bw_plan.input_expr = dict(bw_fx.input_bytes), dict(bw_fx.input_expr)
        real = stitch(fw_plan, bw_plan, external, saved)
    return CompiledPeaks(fx, real, saved, fw, bw, seen["joint"], seen["plans"], sum(iv.nbytes for iv in external),
                         seen["origins"], seen["origin_node"], seen["allocations"], seen["steps"])
