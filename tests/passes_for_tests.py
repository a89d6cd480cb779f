"""Passes registered only by tests: they exercise the pass manager with real graph edits."""

import contextlib
import types

import torch

from dsgraph import registry
from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.context import PassResult
from dsgraph.registry import PassSpec


def _module(spec, run):
    m = types.ModuleType(spec.name)
    m.SPEC, m.run = spec, run
    return m


def _double_outputs(gm, ctx):
    """Rewrites every returned tensor y into y * 2 (changes numerics on purpose)."""
    graph = gm.graph
    out = graph.output_node()
    new = []
    with graph.inserting_before(out):
        for arg in out.args[0]:
            if isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor):
                doubled = graph.call_function(torch.ops.aten.mul.Tensor, (arg, 2))
                doubled.meta["val"] = arg.meta["val"]
                new.append(doubled)
            else:
                new.append(arg)
    out.args = (tuple(new),)
    return PassResult(gm, True, {"doubled": len(new)})


def _count_lifetimes(gm, ctx):
    lt = ctx.analysis(TensorLifetimes)
    ctx.shared.setdefault("lifetimes_objects", []).append(lt)
    return PassResult(gm, False, {"storages": len(lt.storages)})


def _boom(gm, ctx):
    raise ValueError("this graph is not for me")


def _wrap(gm, ctx):
    calls = ctx.shared.setdefault("wrapper_calls", [])

    def wrapper(compiled):
        def run(args):
            calls.append(len(args))
            return compiled(args)
        run._boxed_call = True
        return run
    ctx.register_runtime_wrapper(wrapper)
    return PassResult(gm, False)


PASSES = [
    _module(PassSpec("t_double", ("forward", "inference")), _double_outputs),
    _module(PassSpec("t_count", ("forward", "backward"), reads=("TensorLifetimes",)), _count_lifetimes),
    _module(PassSpec("t_count_again", ("forward", "backward"), reads=("TensorLifetimes",)), _count_lifetimes),
    _module(PassSpec("t_boom", ("backward",)), _boom),
    _module(PassSpec("t_wrap", ("forward",)), _wrap),
    _module(PassSpec("t_joint", ("joint",)), lambda gm, ctx: PassResult(gm, False, {"joint_nodes": len(gm.graph.nodes)})),
]


@contextlib.contextmanager
def registered():
    for m in PASSES:
        registry.register_pass(m)
    try:
        yield
    finally:
        for m in PASSES:
            registry.unregister_pass(m.SPEC.name)
