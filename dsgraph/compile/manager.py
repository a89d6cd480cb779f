"""The pass manager: runs a stage's passes over one graph.

For each pass: time it, collect its stats, dump the graph after it, lint it in debug mode,
drop cached analyses it does not preserve. On an exception, raise ``PassFailure`` naming
the pass, the graph and the passes that ran before it (a ``UsageError``, such as a budget
below what the graph needs, goes through unchanged: it is the user's to fix). A graph
variant a pass registers (``ctx.add_variant``) is rewritten by the passes after it too.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch

from ..errors import PassFailure, UsageError
from ..pass_api import CompileConfig, PassContext, PassInvocation, PassResult
from .. import compat
from ..report.dumps import GraphDump, prepare_dir, readable_code
from ..report.reports import GraphReport, PassRecord, format_stats
from . import registry

log = logging.getLogger("dsgraph")


class InjectedFailure(RuntimeError):
    """Raised in place of a pass named by DSGRAPH_TEST_FAIL_PASS (tests of the fallback):
    ``<pass>`` fails the pass in the first stage it runs in, ``<pass>@<stage>`` only in that
    stage (a pass that runs in several stages, failing after its earlier stages succeeded)."""


def injected(test_fail_pass: str | None, name: str, stage: str) -> bool:
    return test_fail_pass in (name, f"{name}@{stage}")


def _header(report_name: str, label: str, ms: float | None, result: PassResult | None) -> list[str]:
    if ms is None:
        return [f"dsgraph {report_name}: input graph"]
    stats = format_stats(result.stats) if result else ""
    return [f"dsgraph {report_name}: after pass '{label}'",
            f"pass: {label}  ms: {ms:.2f}  changed: {result.changed if result else '-'}",
            f"stats: {stats or '-'}"]


def run_passes(
    gm: torch.fx.GraphModule,
    ctx: PassContext,
    passes: Sequence[PassInvocation],
    report: GraphReport,
    first: int = 0,
) -> torch.fx.GraphModule:
    """Run ``passes[first:]`` on ``gm`` in order; fills ``report`` and returns the final graph."""
    config: CompileConfig = ctx.config
    dump = None
    if config.dump_dir:
        prepare_dir(config.dump_dir)
        dump = GraphDump(config.dump_dir, ctx.graph_name, ctx.stage)
        if first == 0:
            dump.graph(0, "input", gm, _header(ctx.graph_name, "input", None, None))
    if first == 0:
        report.nodes_before = len(gm.graph.nodes)
    done: list[str] = [p.name for p in passes[:first]]
    ctx.gm = gm
    for step, inv in enumerate(passes, start=1):
        if step <= first:
            continue
        module = registry.load(inv.name)
        ctx.args = registry.parsed_args(inv)
        ctx._current_pass = inv.name
        ctx._pass_index = step
        start = time.perf_counter()
        try:
            if injected(config.test_fail_pass, inv.name, ctx.stage):
                raise InjectedFailure(f"DSGRAPH_TEST_FAIL_PASS={config.test_fail_pass}")
            result = module.run(ctx.gm, ctx)
            if not isinstance(result, PassResult):
                raise TypeError(f"pass returned {type(result).__name__}, expected PassResult")
            if config.debug:
                result.gm.graph.lint()
                result.gm.recompile()
        except UsageError:
            raise  # the user asked for the impossible: an options mistake, never a fallback
        except Exception as e:
            raise PassFailure(inv.name, ctx.graph_name, done, e) from e
        finally:
            ctx._current_pass = None
        ms = (time.perf_counter() - start) * 1e3
        if result.changed:
            result.gm.recompile()
            ctx.invalidate(module.SPEC.preserves)
        ctx.gm = result.gm
        report.passes.append(PassRecord(inv.name, ms, result.changed, dict(result.stats)))
        log.info("%s: pass %s %.0f ms%s%s", ctx.graph_name, inv.name, ms, "" if result.changed else " (unchanged)",
                 f": {format_stats(result.stats)}" if result.stats else "")
        done.append(inv.name)
        header = _header(ctx.graph_name, inv.name, ms, result)
        if dump is not None:
            dump.graph(step, inv.name, ctx.gm, header)
        if compat.tracing():  # TORCH_TRACE: the same file as an artifact tlparse shows
            gm_now, stage = ctx.gm, ctx.stage
            compat.trace_artifact(f"dsgraph_{ctx.graph_name}_{step:02d}_{inv.name}",
                                  lambda: readable_code(gm_now, stage, header))
    report.nodes_after = len(ctx.gm.graph.nodes)
    report.memory.update(ctx.figures)
    return ctx.gm


def run_variant_passes(variant_gm: torch.fx.GraphModule, ctx: PassContext, passes: Sequence[PassInvocation],
                       after_pass: int, report: GraphReport) -> torch.fx.GraphModule:
    """The passes after ``after_pass`` on a graph variant, with a context of its own (its
    runtime wrappers and variants are not the main graph's: the main graph's wrappers wrap
    the switch between them)."""
    sub = PassContext(ctx.config, ctx.stage, ctx.graph_name, ctx.example_inputs, ctx.state)
    return run_passes(variant_gm, sub, passes, report, first=after_pass)


def write_final_dumps(ctx: PassContext, gm: torch.fx.GraphModule, extra: dict[str, Any] | None = None) -> None:
    """repro.py, memory_timeline.csv and the files passes asked for, of the graph handed to
    the backend compiler."""
    files = {**ctx.dump_files, **(extra or {})}
    if compat.tracing():
        for name, text in files.items():
            compat.trace_artifact(f"dsgraph_{ctx.graph_name}_{name}", lambda text=text: text)
    if not ctx.config.dump_dir:
        return
    dump = GraphDump(ctx.config.dump_dir, ctx.graph_name, ctx.stage)
    dump.timeline_csv(gm)
    if ctx.stage != "joint":
        dump.repro(gm)
    for name, text in files.items():
        dump.text(name, text)
