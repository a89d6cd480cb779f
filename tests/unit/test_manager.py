import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dsgraph
from dsgraph.report.reports import GraphReport
from dsgraph.pass_api import CompileConfig, PassContext
from dsgraph.errors import PassFailure
from dsgraph.compile.manager import run_passes
from dsgraph.compile.pipeline import parse

from dsgraph.compile import registry
from passes_for_tests import RECORD, registered


@pytest.fixture(autouse=True)
def _passes():
    with registered():
        yield


def graph():
    def f(x, w):
        return (torch.mm(x, w).relu(),)
    return make_fx(f, tracing_mode="fake")(torch.randn(5, 3), torch.randn(3, 7))


def run(pipeline, stage="forward", **config):
    RECORD["lifetimes_objects"].clear()
    cfg = CompileConfig(options=dsgraph.validate_options({}), pipeline=parse(pipeline), **config)
    ctx = PassContext(cfg, stage, f"c000_{stage}")
    report = GraphReport("c000", stage, pipeline, True)
    gm = run_passes(graph(), ctx, registry.stage_passes(cfg.pipeline, stage), report)
    return gm, ctx, report


def test_stage_filtering_timing_and_stats():
    gm, ctx, report = run("lifetimes,t_double,t_boom")  # t_boom is backward-only
    assert [p.name for p in report.passes] == ["lifetimes", "t_double"]
    assert all(p.ms >= 0 for p in report.passes)
    assert report.passes[0].stats["peak_bytes"] > 0 and not report.passes[0].changed
    assert report.passes[1].stats == {"doubled": 1} and report.passes[1].changed
    assert report.nodes_after == report.nodes_before + 1
    assert "mul" in gm.code  # recompiled after the change


def test_analysis_cached_until_a_pass_changes_the_graph():
    _, ctx, _ = run("t_count,t_count_again")
    first, second = RECORD["lifetimes_objects"]
    assert first is second
    _, ctx, _ = run("t_count,t_double,t_count_again")
    first, second = RECORD["lifetimes_objects"]
    assert first is not second  # t_double preserves nothing
    assert len(second.storages) == len(first.storages) + 1


def test_failure_names_the_pass_the_graph_and_the_passes_before():
    with pytest.raises(PassFailure) as info:
        run("lifetimes,t_count,t_boom", stage="backward")
    msg = str(info.value)
    assert "'t_boom'" in msg and "c000_backward" in msg and "lifetimes, t_count" in msg
    assert "this graph is not for me" in msg
    assert isinstance(info.value.cause, ValueError)


def test_injected_failure_hook():
    with pytest.raises(PassFailure, match="DSGRAPH_TEST_FAIL_PASS=t_double"):
        run("lifetimes,t_double", test_fail_pass="t_double")


def test_debug_mode_lints():
    gm, _, report = run("t_double", debug=True)
    assert report.passes[0].changed


def test_runtime_wrappers_are_collected_with_their_pass():
    _, ctx, _ = run("t_wrap")
    assert [name for name, _ in ctx.runtime_wrappers] == ["t_wrap"]


def test_pass_returning_wrong_type_fails_cleanly():
    import types
    from dsgraph.pass_api import PassSpec

    m = types.ModuleType("t_bad")
    m.SPEC = PassSpec("t_bad", ("forward",))
    m.run = lambda gm, ctx: gm
    registry.register_pass(m)
    try:
        with pytest.raises(PassFailure, match="expected PassResult"):
            run("t_bad")
    finally:
        registry.unregister_pass("t_bad")
