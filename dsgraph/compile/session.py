"""One compile of one Dynamo graph: the pre_grad, joint, forward, backward and inference stages.

The "pre_grad" passes (only when the pipeline has one) rewrite Dynamo's graph before
``compile_fx`` sees it. Then dsgraph goes through Inductor's own ``compile_fx`` with two
hooks, so that with an empty pipeline exactly the graphs stock Inductor would compile
reach ``compile_fx_inner``:

- a ``CustomPartitionerFn`` (stage "joint"): runs joint passes after Inductor's
  joint-graph passes, then partitions, with the partitioner a pass set
  (``ctx.set_partitioner``) or Inductor's min-cut;
- an ``inner_compile`` (stages "forward", "backward", "inference"): runs that stage's
  passes, then ``compile_fx_inner`` (``inductor=True``) or the FX code (``inductor=False``)
  for the graph and each variant passes registered, then the post-compile checks (after
  the backward) and the runtime wrappers passes registered.

The session names no pass: what a pass changes beyond its graph goes through the hooks of
``dsgraph.pass_api``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from typing import Any, Sequence

import torch

from .. import compat
from ..analysis.inductor_plan import GraphCapture, inductor_plan
from ..analysis.lifetimes import TensorLifetimes
from ..analysis.plan import fx_plan
from ..analysis.step import StageGraphs, saved_names
from ..errors import PassFailure
from ..pass_api import CompileConfig, CompiledStep, CompileState, PassContext
from ..report import capture, dumps
from ..report.capture import CapturedCompile
from ..report.reports import GraphReport
from ..runtime import handles
from ..runtime.wrappers import boxed, variant_switch
from ..units import format_bytes
from . import ahead, registry
from .manager import run_passes, run_variant_passes, write_final_dumps
from .partition_edit import pass_inputs_to_backward

log = logging.getLogger("dsgraph")


@functools.lru_cache(maxsize=None)
def _source_hash() -> str:
    """Hash of dsgraph's own sources: part of the partitioner's cache identity."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dsgraph package
    files = [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(".py")]
    return compat.hash_for_files(tuple(sorted(files)))


def graph_params(gm: torch.fx.GraphModule) -> list:
    """For each input of a Dynamo graph, the nn.Parameter (requiring grad) it is, or None.

    The backward's outputs follow these inputs (FACTS.md), so this is how passes find which
    gradient belongs to which parameter.
    """
    return [
        example if isinstance(example, torch.nn.Parameter) and example.requires_grad else None
        for _, example in compat.dynamo_graph_inputs(gm)
    ]


def stage_of(kwargs: dict[str, Any]) -> str:
    if kwargs.get("is_backward"):
        return "backward"
    if kwargs.get("is_inference"):
        return "inference"
    return "forward"


def partition_summary(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> tuple[str, dict[str, Any]]:
    """partition.md text and the joint report's memory figures."""
    names = saved_names(bw)
    lifetimes = TensorLifetimes(fw)
    by_name = {n.name: n for n in lifetimes.nodes}
    rows = []
    for name in names:
        node = by_name.get(name)
        storage = lifetimes.storage_of.get(node) if node is not None else None
        if storage is None:
            rows.append(f"| {name} | (not a tensor) | | |")
            continue
        t = node.meta["val"]
        kind = "input" if storage.is_input else "activation"
        rows.append(f"| {name} | {t.dtype} {list(t.shape)} | {storage.name} ({format_bytes(storage.nbytes)}) | {kind} |")
    activations = lifetimes.saved_bytes(names)
    text = "\n".join([
        "# partition", "",
        f"saved for backward: {len(names)} values, activations {format_bytes(activations)} "
        "(each storage once)", "",
        "| name | tensor | storage | kind |", "|---|---|---|---|", *rows, "",
    ])
    return text, {"saved_values": len(names), "saved_activation_bytes": activations}


class CompileSession:
    def __init__(self, config: CompileConfig, compile_id: str, inductor_patches: dict[str, Any],
                 state: CompileState | None = None):
        self.config = config
        self.compile_id = compile_id
        self.inductor_patches = inductor_patches
        self.state = state if state is not None else CompileState()
        self.reports: list[GraphReport] = []
        # graphs kept for memory timelines (dumps, dsgraph.memory_profile) and checks
        self.stages: dict[str, StageGraphs] = {}
        current = capture.current()
        self.captured: CapturedCompile | None = None
        # the backward compiled in Inductor's worker while the forward compiles (ahead.py)
        self.partitioned_backward: torch.fx.GraphModule | None = None
        self.backward_ahead: ahead.BackwardAhead | None = None
        if current is not None:
            self.captured = CapturedCompile(compile_id, config.options.inductor, self.stages)
            current.compiles.append(self.captured)

    @property
    def attempt(self) -> int:
        return self.state.attempt

    # -- stage "joint" ------------------------------------------------------------------

    def partition(self, gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        start = time.perf_counter()
        log.info("%s_joint: partitioning the joint graph (%d nodes) into forward and backward",
                 self.compile_id, len(gm.graph.nodes))
        ctx = PassContext(self.config, "joint", f"{self.compile_id}_joint", joint_inputs, self.state)
        report = self._new_report("joint")
        self.state.partition_kwargs = dict(kwargs)
        gm = run_passes(gm, ctx, registry.stage_passes(self.config.pipeline, "joint"), report)
        partition_fn = self.state.partitioner[1] if self.state.partitioner else compat.default_partition
        fw, bw = partition_fn(gm, joint_inputs, **kwargs)
        if self.state.backward_receives:
            self.state.backward_input_names = pass_inputs_to_backward(
                fw, bw, self.state.backward_receives, kwargs["num_fwd_outputs"])
        self.state.saved_names = saved_names(bw)
        if self.config.options.compile_ahead:
            self.partitioned_backward = bw
        if self.captured is not None:
            self.captured.saved_names = list(self.state.saved_names)
        text, figures = partition_summary(fw, bw)
        report.memory.update(figures)
        log.info("%s_joint: the forward saves %d values for the backward (%s of activations)%s", self.compile_id,
                 figures["saved_values"], format_bytes(figures["saved_activation_bytes"]),
                 f", partitioned by pass '{self.state.partitioner[0]}'" if self.state.partitioner else "")
        write_final_dumps(ctx, gm, {"partition.md": text})
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return fw, bw

    # -- stages "forward", "backward", "inference" --------------------------------------

    def inner_compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
        stage = stage_of(kwargs)
        start = time.perf_counter()
        log.info("%s_%s: compiling the %s graph (%d nodes)", self.compile_id, stage, stage, len(gm.graph.nodes))
        if stage == "forward":
            self._start_backward_ahead(gm, kwargs)
        ctx = PassContext(self.config, stage, f"{self.compile_id}_{stage}", example_inputs, self.state)
        report = self._new_report(stage)
        passes = registry.stage_passes(self.config.pipeline, stage)
        # graphs are kept (and Inductor's plan read, which needs a compile that misses its
        # FX graph cache) only for dumps, captures (memory_profile) and post-compile checks
        keep_before = self.captured is not None or bool(self.config.dump_dir)
        keep = self._keeps()
        before = compat.copy_graph_module(gm) if keep_before else None
        gm = run_passes(gm, ctx, passes, report)
        variants = []
        for variant in ctx.variants:
            sub = self._new_report(stage)
            vgm = run_variant_passes(variant.gm, ctx, passes, variant.after_pass, sub)
            report.passes += [type(p)(f"{p.name}[{variant.name}]", p.ms, p.changed, p.stats) for p in sub.passes]
            variants.append((variant, vgm))
        write_final_dumps(ctx, gm)
        for record in report.passes:
            if record.name == "lifetimes":
                report.memory.update({k: v for k, v in record.stats.items() if k != "nodes"})
        if keep:
            self.stages[stage] = StageGraphs(before, compat.copy_graph_module(gm))
        compiled = self._backend_compile(gm, ctx, report, kwargs, stage, keep)
        if variants:
            compiled = variant_switch(boxed(compiled), [
                (v.use_when, boxed(self._backend_compile(vgm, ctx, report, kwargs, stage, keep=False)))
                for v, vgm in variants])
        if stage == "backward":
            self._run_checks()
        for _, wrapper in ctx.runtime_wrappers:
            compiled = boxed(wrapper(compiled))
        if stage == "forward" and self.state.backward_receives:
            # the backward's handles of these inputs are resolved against them when the
            # graph runs for other tensors than it was compiled for (runtime.handles)
            positions = sorted(self.state.backward_receives)
            params = self.state.graph_params
            compiled = handles.remember_inputs(compiled, positions, [params[i] for i in positions])
        if self.config.dump_dir and stage in ("backward", "inference"):
            dumps.step_memory(self.config.dump_dir, self.compile_id, self.stages, self.state.saved_names or [])
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        log.info("%s_%s: compiled in %.1f s", self.compile_id, stage, report.compile_seconds)
        return compiled

    def _keeps(self) -> bool:
        """Does this stage's compile keep its graphs and Inductor's plan (dumps, captures,
        post-compile checks)?"""
        return self.captured is not None or bool(self.config.dump_dir) or bool(self.state.post_compile_checks)

    def _start_backward_ahead(self, fw: torch.fx.GraphModule, forward_kwargs: dict) -> None:
        """Send the partitioned backward to Inductor's worker, when nothing of the backward
        stage will rewrite it (ahead.py)."""
        bw, self.partitioned_backward = self.partitioned_backward, None
        if bw is None:  # compile_ahead off (option validation holds it to inductor=True)
            return
        if any(registry.spec(p.name).rewrites for p in registry.stage_passes(self.config.pipeline, "backward")):
            return
        try:
            self.backward_ahead = ahead.start(fw, bw, forward_kwargs, want_plan=self._keeps())
        except Exception as e:  # noqa: BLE001  a head start only: the backward compiles here as usual
            log.warning("%s_backward: could not be sent to Inductor's worker (%s: %s); it compiles here",
                        self.compile_id, type(e).__name__, e)
            self.backward_ahead = None
        if self.backward_ahead is not None:
            log.info("%s_backward: sent to Inductor's worker, compiling beside the forward (%.2f s to send)",
                     self.compile_id, self.backward_ahead.submitted_s)

    def _backend_compile(self, gm, ctx: PassContext, report: GraphReport, kwargs: dict, stage: str, keep: bool):
        """``compile_fx_inner`` (recording Inductor's buffer plan when ``keep``) or the FX code."""
        if not self.config.options.inductor:
            return compat.boxed_fx(gm)
        early = None
        if stage == "backward":
            early, self.backward_ahead = self.backward_ahead, None
        try:
            with early.serving() if early is not None else contextlib.nullcontext():
                if keep:
                    with GraphCapture().active() as graphs:
                        compiled = compat.compile_fx_inner(gm, ctx.example_inputs, **kwargs)
                    plan = inductor_plan(graphs.graphs[0]) if graphs.graphs else None
                    if plan is None and early is not None and early.served:
                        plan = early.plan  # read by the worker, from its scheduler
                    self.stages[stage].inductor = plan
                else:
                    compiled = compat.compile_fx_inner(gm, ctx.example_inputs, **kwargs)
            if early is not None:
                report.memory.update(early.figures())
        except Exception as e:
            changed = [p.name for p in report.passes if p.changed]
            if not changed:
                raise  # stock Inductor fails on this graph too: not dsgraph's to hide
            raise PassFailure(changed[-1], ctx.graph_name, [p.name for p in report.passes][:-1],
                              RuntimeError(f"Inductor could not compile the graph this pass produced: {e}")) from e
        return compiled

    def _run_checks(self) -> None:
        """The post-compile checks passes registered, on the forward and backward as they
        will execute; their figures go into the joint graph's report."""
        if not self.state.post_compile_checks:
            return
        fw, bw = self.stages.get("forward"), self.stages.get("backward")
        if fw is None or bw is None:
            return
        bw_fx = fx_plan(bw.after)
        inductor = self.config.options.inductor
        if inductor and (fw.inductor is None or bw.inductor is None):
            return  # Inductor scheduled nothing to read (an empty graph)
        step = CompiledStep(
            executor=self.config.executor, forward=fw.after, backward=bw.after,
            forward_plan=fw.inductor if inductor else fx_plan(fw.after),
            backward_plan=bw.inductor if inductor else bw_fx, backward_fx_plan=bw_fx,
            saved_names=list(self.state.saved_names or []), attempt=self.state.attempt)
        try:
            for _, check in self.state.post_compile_checks:
                check(step)
        finally:
            for r in self.reports:
                if r.kind == "joint":
                    r.memory.update(step.figures)

    def _new_report(self, kind: str) -> GraphReport:
        return GraphReport(self.compile_id, kind, str(self.config.pipeline), self.config.options.inductor)

    # -- stage "pre_grad" ---------------------------------------------------------------

    def pre_grad(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
        """The pre_grad passes on Dynamo's graph, before compile_fx (and AOTAutograd) sees it.

        What only this graph shows: library calls as the user wrote them (``F.linear``,
        ``F.cross_entropy`` with their keyword arguments) rather than their decompositions,
        and no backward yet, so a pass can swap a call for an op with its own autograd
        formula (chunk_loss). Nothing runs, and no report is made, when the pipeline has no
        pre_grad pass.
        """
        passes = registry.stage_passes(self.config.pipeline, "pre_grad")
        if not passes:
            return gm
        start = time.perf_counter()
        ctx = PassContext(self.config, "pre_grad", f"{self.compile_id}_pre_grad", example_inputs, self.state)
        report = self._new_report("pre_grad")
        gm = run_passes(gm, ctx, passes, report)
        if self.config.dump_dir:  # Dynamo's graph has no "val" metadata: no timeline, no repro
            dump = dumps.GraphDump(self.config.dump_dir, ctx.graph_name, ctx.stage)
            for name, text in ctx.dump_files.items():
                dump.text(name, text)
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return gm

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        if self.captured is not None:
            self.captured.dynamo_inputs = capture.dynamo_inputs(gm)
        self.state.graph_params = graph_params(gm)
        if self.config.options.compile_ahead:
            ahead.warm_up()
        gm = self.pre_grad(gm, example_inputs)
        partitioner = make_partitioner(self)
        with compat.dsgraph_compile_config():
            return compat.compile_fx(
                gm,
                example_inputs,
                inner_compile=self.inner_compile,
                config_patches={**self.inductor_patches, "custom_partitioner_fn": partitioner},
            )


class _PartitionerKey:
    """What Inductor's FX graph cache pickles for the partitioner: its identity, no state."""

    def __init__(self, uuid: str):
        self.uuid = uuid


def make_partitioner(session: CompileSession):
    return _partitioner_class()(session)


@functools.lru_cache(maxsize=None)
def _partitioner_class() -> type:
    base = compat.custom_partitioner_base()

    class DsgraphPartitioner(base):  # type: ignore[misc, valid-type]
        """Runs dsgraph's joint-stage passes, then partitions forward from backward."""

        def __init__(self, session: CompileSession):
            self.session = session

        def __call__(self, gm, joint_inputs, **kwargs):
            return self.session.partition(gm, joint_inputs, **kwargs)

        def uuid(self):
            config = self.session.config
            return f"dsgraph-{_source_hash()}-{config.pipeline}-{sorted(config.options.describe().items())}"

        def __reduce__(self):
            # Inductor's cache key pickles the config, partitioner included: pickle only
            # the identity, never the session (graphs, fake tensors).
            return (_PartitionerKey, (self.uuid(),))

    DsgraphPartitioner.__qualname__ = "DsgraphPartitioner"
    return DsgraphPartitioner
