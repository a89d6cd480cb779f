"""One compile of one Dynamo graph: the joint, forward, backward and inference stages.

dsgraph goes through Inductor's own ``compile_fx`` with two hooks, so that with an empty
pipeline exactly the graphs stock Inductor would compile reach ``compile_fx_inner``:

- a ``CustomPartitionerFn`` (stage "joint"): runs joint passes after Inductor's
  joint-graph passes, then partitions (the checkpoint pass will decide the partition);
- an ``inner_compile`` (stages "forward", "backward", "inference"): runs that stage's
  passes, then ``compile_fx_inner`` (``inductor=True``) or the FX code (``inductor=False``),
  then the runtime wrappers passes registered.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from typing import Any, Sequence

import torch

from . import compat, dumps, profiling
from .analysis.inductor_plan import GraphCapture, inductor_plan
from .analysis.lifetimes import TensorLifetimes
from .context import CompileConfig, PassContext
from .errors import BudgetMiss, DsgraphBudgetWarning, PassFailure
from .manager import run_passes, write_final_dumps
from .analysis.plan import fx_plan
from .analysis.timeline import Interval
from .memory import inductor_timeline, inputs_external
from .profiling import CapturedCompile, StageGraphs
from .compile_reports import GraphReport
from .units import format_bytes
from .recompute.partition import saved_names


# compiles of one graph under a memory budget whose Inductor plan overruns it (each one
# plans the overruns so far below the budget): the prediction errs by a few percent, so
# one more compile usually fits
MAX_COMPILES = 3


@functools.lru_cache(maxsize=None)
def _source_hash() -> str:
    """Hash of dsgraph's own sources: part of the partitioner's cache identity."""
    from torch._inductor.custom_graph_pass import get_hash_for_files

    import dsgraph.lowering
    import dsgraph.passes

    files = []
    for module in (dsgraph.passes, dsgraph.lowering):
        root = os.path.dirname(os.path.abspath(module.__file__))
        files += [os.path.join(root, n) for n in os.listdir(root) if n.endswith(".py")]
    here = os.path.dirname(os.path.abspath(__file__))
    for dirpath, _, names in os.walk(here):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".py")]
    return get_hash_for_files(tuple(sorted(set(files)))).hex()


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
        rows.append(f"| {name} | {t.dtype} {list(t.shape)} | {storage.name} ({storage.nbytes} B) | {kind} |")
    activations = lifetimes.saved_bytes(names)
    text = "\n".join([
        "# partition", "",
        f"saved for backward: {len(names)} values, activations {format_bytes(activations)} "
        "(each storage once)", "",
        "| name | tensor | storage | kind |", "|---|---|---|---|", *rows, "",
    ])
    return text, {"saved_values": len(names), "saved_activation_bytes": activations}


class CompileSession:
    def __init__(self, config: CompileConfig, compile_id: str, inductor_patches: dict[str, Any], margin: int = 0,
                 attempt: int = 1):
        self.config = config
        self.compile_id = compile_id
        self.inductor_patches = inductor_patches
        self.attempt = attempt  # compiles of this graph so far, this one included
        self.shared: dict[str, Any] = {"checkpoint_margin": margin} if margin else {}
        self.reports: list[GraphReport] = []
        # graphs kept for memory timelines (dumps, dsgraph.memory_profile)
        self.stages: dict[str, StageGraphs] = {}
        self.inductor_plans: dict[str, Any] = {}  # Inductor's buffer plan per stage, under a budget
        self.forward_inputs: list = []  # the forward's inputs, as step-long memory (under a budget)
        capture = profiling.current()
        self.captured: CapturedCompile | None = None
        if capture is not None:
            self.captured = CapturedCompile(compile_id, config.options.inductor, self.stages)
            capture.compiles.append(self.captured)

    # -- stage "joint" ------------------------------------------------------------------

    def partition(self, gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        start = time.perf_counter()
        ctx = PassContext(self.config, "joint", f"{self.compile_id}_joint", joint_inputs, self.shared)
        report = self._new_report("joint")
        self.shared["partition_kwargs"] = dict(kwargs)
        gm = run_passes(gm, ctx, self.config.pipeline.for_stage("joint"), report)
        partition_fn = self.shared.get("partition_fn", compat.default_partition)
        fw, bw = partition_fn(gm, joint_inputs, **kwargs)
        self.shared["saved_names"] = saved_names(bw)
        if self.captured is not None:
            self.captured.saved_names = list(self.shared["saved_names"])
        text, figures = partition_summary(fw, bw)
        report.memory.update(figures)
        extra = {"partition.md": text}
        plan = self.shared.get("checkpoint_plan")
        if plan is not None:
            extra["checkpoint.md"] = plan.text()
            report.memory.update({f"checkpoint_{k}": v for k, v in plan.stats().items()})
        write_final_dumps(ctx, gm, extra)
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return fw, bw

    # -- stages "forward", "backward", "inference" --------------------------------------

    def inner_compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
        stage = stage_of(kwargs)
        start = time.perf_counter()
        ctx = PassContext(self.config, stage, f"{self.compile_id}_{stage}", example_inputs, self.shared)
        report = self._new_report(stage)
        passes = self.config.pipeline.for_stage(stage)
        keep_graphs = self.captured is not None or bool(self.config.dump_dir)
        before = compat.copy_graph_module(gm) if keep_graphs else None
        gm = run_passes(gm, ctx, passes, report)
        if self.config.options.arena and not self.config.options.inductor:
            gm = self._arena(gm, ctx, report, len(passes) + 1)
        write_final_dumps(ctx, gm)
        for record in report.passes:
            if record.name == "lifetimes":
                report.memory.update({k: v for k, v in record.stats.items() if k != "nodes"})
        if keep_graphs:
            self.stages[stage] = StageGraphs(before, compat.copy_graph_module(gm))
        if self.config.options.inductor:
            # under a memory budget Inductor's own plan is checked against it (below)
            check_budget = self.shared.get("checkpoint_plan") is not None and stage in ("forward", "backward")
            try:
                if keep_graphs or check_budget:
                    with GraphCapture().active() as graphs:
                        compiled = compat.compile_fx_inner(gm, ctx.example_inputs, **kwargs)
                    planned = inductor_plan(graphs.graphs[0]) if graphs.graphs else None
                    if keep_graphs:
                        self.stages[stage].inductor = planned
                    self.inductor_plans[stage] = planned
                else:
                    compiled = compat.compile_fx_inner(gm, ctx.example_inputs, **kwargs)
            except Exception as e:
                changed = [p.name for p in report.passes if p.changed]
                if not changed:
                    raise  # stock Inductor fails on this graph too: not dsgraph's to hide
                raise PassFailure(changed[-1], ctx.graph_name, [p.name for p in report.passes][:-1],
                                  RuntimeError(f"Inductor could not compile the graph this pass produced: {e}")) from e
            if check_budget and stage == "forward":
                # measured here, not taken from the planner, so the check is independent
                self.forward_inputs = inputs_external(gm)
            if check_budget and stage == "backward":
                self._check_budget(gm)
        else:
            compiled = compat.boxed_fx(gm)
        for _, wrapper in ctx.runtime_wrappers:
            compiled = _boxed(wrapper(compiled))
        if self.config.dump_dir and stage in ("backward", "inference"):
            dumps.step_memory(self.config.dump_dir, self.compile_id, self.stages, self.shared.get("saved_names", []))
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return compiled

    def _check_budget(self, bw_gm: torch.fx.GraphModule) -> None:
        """The checkpoint planner predicts Inductor's buffers with ``fused_plan``; here the
        plans Inductor really made are stitched into the step's peak and held against the
        budget. An overrun raises ``BudgetMiss``: the backend compiles again with the
        overruns so far reserved, up to MAX_COMPILES compiles; past that it is a warning."""
        plan = self.shared["checkpoint_plan"]
        fw, bw = self.inductor_plans.get("forward"), self.inductor_plans.get("backward")
        if fw is None or bw is None:
            return
        external = self.forward_inputs + [Interval("gradient pool", plan.extra_external, 0, 0)]
        peak = inductor_timeline(fw, bw, fx_plan(bw_gm), external, self.shared.get("saved_names", [])).peak_bytes
        plan.inductor_peak = peak
        for r in self.reports:
            if r.kind == "joint":
                r.memory["checkpoint_inductor_peak"] = peak
        if peak <= plan.budget:
            return
        if self.attempt < MAX_COMPILES and not plan.margin_capped:
            # the next plan keeps below the budget what this plan's prediction erred by (its
            # prediction was within the budget, so that is at least the overrun), or the
            # overruns so far, whichever is more, and 1% of the budget: the error changes
            # from plan to plan
            error = peak - (plan.predicted_peak - plan.margin)
            margin = max(error, plan.margin + peak - plan.budget) + plan.budget // 100
            raise BudgetMiss(margin, peak, plan.budget)
        last = ("the last with the smallest plan (a larger margin leaves none)" if plan.margin_capped
                else f"the last planning {plan.margin} bytes below the budget")
        warnings.warn(
            f"dsgraph memory budget {plan.budget} bytes: Inductor's plan of the compiled graphs peaks at "
            f"{peak} bytes after {self.attempt} compiles, {last}",
            DsgraphBudgetWarning, stacklevel=2)

    def _arena(self, gm: torch.fx.GraphModule, ctx: PassContext, report: GraphReport, step: int):
        """``arena=True`` with FX execution: intermediates at planned offsets in buffers
        (arena.py). Runs after the passes, on the graph that executes; a failure (or
        ``DSGRAPH_TEST_FAIL_PASS=arena``) is handled like a failing pass: the fallback
        compiles this graph stock, without the arena."""
        from .arena_rewrite import arena_graph

        try:
            if self.config.test_fail_pass == "arena":
                raise RuntimeError("DSGRAPH_TEST_FAIL_PASS=arena")
            plan, _ = arena_graph(gm, ctx.stage, debug=self.config.debug)
        except Exception as e:
            raise PassFailure("arena", ctx.graph_name, [p.name for p in report.passes], e) from e
        report.memory.update(plan.stats())
        report.nodes_after = len(gm.graph.nodes)
        if self.config.dump_dir:
            dumps.GraphDump(self.config.dump_dir, ctx.graph_name, ctx.stage).graph(
                step, "arena", gm, [f"dsgraph {ctx.graph_name}: after the arena (not a pass)", *str(plan).splitlines()])
        return gm

    def _new_report(self, kind: str) -> GraphReport:
        return GraphReport(self.compile_id, kind, str(self.config.pipeline), self.config.options.inductor)

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        if self.captured is not None:
            self.captured.dynamo_inputs = profiling.dynamo_inputs(gm)
        self.shared["graph_params"] = graph_params(gm)
        partitioner = make_partitioner(self)
        with compat.dsgraph_compile_config():
            return compat.compile_fx(
                gm,
                example_inputs,
                inner_compile=self.inner_compile,
                config_patches={**self.inductor_patches, "custom_partitioner_fn": partitioner},
            )


def _boxed(fn):
    if getattr(fn, "_boxed_call", False):
        return fn
    return compat.make_boxed(fn)


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
