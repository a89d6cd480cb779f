"""Passes registered only by tests: they exercise the pass manager with real graph edits."""

import contextlib
import copy
import types

import torch

from dsgraph.compile import registry
from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph import compat
from dsgraph.pass_api import PassResult, Recompile
from dsgraph.pass_api import PassSpec


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


# what the test passes saw, for the tests to read (cleared by ``registered()``)
RECORD: dict[str, list] = {"lifetimes_objects": [], "wrapper_calls": [], "use_variant": [], "carried": [],
                           "steps_checked": [], "partitioned": []}


def _count_lifetimes(gm, ctx):
    lt = ctx.analysis(TensorLifetimes)
    RECORD["lifetimes_objects"].append(lt)
    return PassResult(gm, False, {"storages": len(lt.storages)})


def _boom(gm, ctx):
    raise ValueError("this graph is not for me")


def _wrap(gm, ctx):
    calls = RECORD["wrapper_calls"]

    def wrapper(compiled):
        def run(args):
            calls.append(len(args))
            return compiled(args)
        run._boxed_call = True
        return run
    ctx.register_runtime_wrapper(wrapper)
    return PassResult(gm, False)


def _variant(gm, ctx):
    """Registers a variant of the backward whose gradients are doubled, used while
    RECORD["use_variant"] is non-empty."""
    variant = copy.deepcopy(gm)
    _double_outputs(variant, ctx)
    variant.recompile()
    ctx.add_variant("doubled", variant, lambda: bool(RECORD["use_variant"]))
    return PassResult(gm, False)


def _recompile_once(gm, ctx):
    """Asks for a second compile from its post-compile check, carrying the attempt."""
    RECORD["carried"].append(ctx.carry)

    def check(step):
        RECORD["steps_checked"].append((step.executor, step.attempt, len(step.saved_names)))
        step.figures["t_recompile_attempt"] = step.attempt
        if step.attempt == 1:
            raise Recompile("t_recompile", "from attempt 1", "testing the hook", max_compiles=2)

    ctx.add_post_compile_check(check)
    return PassResult(gm, False)


def _recompile_forever(gm, ctx):
    ctx.add_post_compile_check(lambda step: (_ for _ in ()).throw(
        Recompile("t_recompile_forever", None, "never satisfied", max_compiles=2)))
    return PassResult(gm, False)


def _partition(gm, ctx):
    def partition(joint, joint_inputs, **kwargs):
        RECORD["partitioned"].append(sorted(kwargs))
        return compat.default_partition(joint, joint_inputs, **kwargs)

    ctx.set_partitioner(partition)
    return PassResult(gm, False)


def _partition_late(gm, ctx):
    ctx.set_partitioner(lambda *a, **k: None)  # not allowed outside the joint stage
    return PassResult(gm, False)


PASSES = [
    _module(PassSpec("t_double", ("forward", "inference")), _double_outputs),
    _module(PassSpec("t_count", ("forward", "backward"), reads=("TensorLifetimes",)), _count_lifetimes),
    _module(PassSpec("t_count_again", ("forward", "backward"), reads=("TensorLifetimes",)), _count_lifetimes),
    _module(PassSpec("t_boom", ("backward",)), _boom),
    _module(PassSpec("t_wrap", ("forward",)), _wrap),
    _module(PassSpec("t_joint", ("joint",)), lambda gm, ctx: PassResult(gm, False, {"joint_nodes": len(gm.graph.nodes)})),
    _module(PassSpec("t_variant", ("backward",)), _variant),
    _module(PassSpec("t_recompile", ("joint",)), _recompile_once),
    _module(PassSpec("t_recompile_forever", ("joint",)), _recompile_forever),
    _module(PassSpec("t_partition", ("joint",)), _partition),
    _module(PassSpec("t_partition_late", ("forward",)), _partition_late),
]


@contextlib.contextmanager
def registered():
    for m in PASSES:
        registry.register_pass(m)
    for seen in RECORD.values():
        seen.clear()
    try:
        yield
    finally:
        for m in PASSES:
            registry.unregister_pass(m.SPEC.name)
