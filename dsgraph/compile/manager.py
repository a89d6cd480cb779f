"""The pass manager: runs a stage's passes over one graph.

For each pass: time it, collect its stats, dump the graph after it, lint it in debug mode,
drop cached analyses it does not preserve. On an exception, raise ``PassFailure`` naming
the pass, the graph and the passes that ran before it.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from . import registry
from .context import CompileConfig, PassContext, PassResult
from .dumps import GraphDump, prepare_dir
from .errors import BudgetError, PassFailure
from .pipeline import PassInvocation
from .compile_reports import GraphReport, PassRecord


class InjectedFailure(RuntimeError):
    """Raised in place of a pass named by DSGRAPH_TEST_FAIL_PASS (tests of the fallback)."""


def _header(report_name: str, label: str, ms: float | None, result: PassResult | None) -> list[str]:
    if ms is None:
        return [f"dsgraph {report_name}: input graph"]
    stats = ", ".join(f"{k}={v}" for k, v in (result.stats if result else {}).items())
    return [f"dsgraph {report_name}: after pass '{label}'",
            f"pass: {label}  ms: {ms:.2f}  changed: {result.changed if result else '-'}",
            f"stats: {stats or '-'}"]


def run_passes(
    gm: torch.fx.GraphModule,
    ctx: PassContext,
    passes: Sequence[PassInvocation],
    report: GraphReport,
) -> torch.fx.GraphModule:
    """Run ``passes`` on ``gm`` in order; fills ``report`` and returns the final graph."""
    config: CompileConfig = ctx.config
    dump = None
    if config.dump_dir:
        prepare_dir(config.dump_dir)
        dump = GraphDump(config.dump_dir, ctx.graph_name, ctx.stage)
        dump.graph(0, "input", gm, _header(ctx.graph_name, "input", None, None))
    report.nodes_before = len(gm.graph.nodes)
    done: list[str] = []
    ctx.gm = gm
    for step, inv in enumerate(passes, start=1):
        module = registry.load(inv.name)
        ctx.args = inv.parsed_args()
        ctx._current_pass = inv.name
        start = time.perf_counter()
        try:
            if config.test_fail_pass == inv.name:
                raise InjectedFailure(f"DSGRAPH_TEST_FAIL_PASS={inv.name}")
            result = module.run(ctx.gm, ctx)
            if not isinstance(result, PassResult):
                raise TypeError(f"pass returned {type(result).__name__}, expected PassResult")
            if config.debug:
                result.gm.graph.lint()
                result.gm.recompile()
        except BudgetError:
            raise  # the user's budget cannot be met: an options mistake, never a fallback
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
        done.append(inv.name)
        if dump is not None:
            dump.graph(step, inv.name, ctx.gm, _header(ctx.graph_name, inv.name, ms, result))
    report.nodes_after = len(ctx.gm.graph.nodes)
    return ctx.gm


def write_final_dumps(ctx: PassContext, gm: torch.fx.GraphModule, extra: dict[str, Any] | None = None) -> None:
    """repro.py and memory_timeline.csv of the graph handed to the backend compiler."""
    if not ctx.config.dump_dir:
        return
    dump = GraphDump(ctx.config.dump_dir, ctx.graph_name, ctx.stage)
    dump.timeline_csv(gm)
    if ctx.stage != "joint":
        dump.repro(gm)
    for name, text in (extra or {}).items():
        dump.text(name, text)
