"""FX graph modules, fake tensors and symbolic sizes.

Checked on torch 2.11 (GPU) and 2.13 (CPU).
"""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch

def boxed_fx(gm: torch.fx.GraphModule) -> Callable[[list], Any]:
    """Run an FX graph with the boxed calling convention, as Inductor's wrapper does.

    The generated code takes the argument list, empties it, and drops each input after its
    last use, so a backward frees saved activations as it goes. A plain ``gm(*args)`` would
    keep every input alive until the graph returns (the caller's list holds them).
    """
    codegen_cls = getattr(torch.fx.graph, "_BoxedCodeGen", None)
    if codegen_cls is None:  # older torch: the same convention, written here
        codegen_cls = _BoxedCodeGenFallback
    gm.graph.set_codegen(codegen_cls())
    gm.recompile()

    def run(args: list) -> Any:
        return gm.forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


class _BoxedCodeGenFallback(torch.fx.graph.CodeGen):
    def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):  # type: ignore[override]
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        lines = [f"def {getattr(self, '_func_name', 'forward')}(self, args_list){maybe_return_annotation}:"]
        if names:
            lines.append("    args_iter = iter(args_list)")
            lines += [f"    {n} = next(args_iter)" for n in names]
            lines.append("    args_list.clear()")
        return "\n".join(lines)


def fake_mode_of(gm: torch.fx.GraphModule) -> Any:
    """The FakeTensorMode of a graph's ``meta['val']`` tensors, or None."""
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def symint_of(fake_mode: Any, expr: sympy.Expr, hint: int) -> Any:
    """An int, or a SymInt of the graph's shape environment standing for ``expr``."""
    if expr.is_Integer or fake_mode is None or fake_mode.shape_env is None:
        return int(hint)
    return fake_mode.shape_env.create_symintnode(expr, hint=int(hint))


def size_hint(x: Any, fallback: int = 8192) -> int:
    """A concrete int for an int or SymInt, without adding guards."""
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        node = x.node
        hint = getattr(node, "hint", None)
        if hint is not None:
            return int(hint)
        try:
            from torch.fx.experimental.symbolic_shapes import optimization_hint
        except ImportError:  # older spelling
            from torch.fx.experimental.symbolic_shapes import hint_int as optimization_hint  # type: ignore
        return int(optimization_hint(x, fallback=fallback))
    return int(x)


def sym_expr(x: Any) -> sympy.Expr:
    """The sympy expression behind an int or SymInt."""
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return sympy.Integer(int(x))


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy with its own Graph (node meta copied shallowly) sharing parameters and buffers.

    Used to keep Dynamo's graph for a stock fallback compile or another compile: compile_fx
    takes ownership of the graph it is given and may rewrite it. What AOTAutograd reads to
    tell parameters (static inputs) from other inputs goes along: the module's
    ``_param_name_to_source`` and each node's ``_dynamo_source`` (a deep copy of the graph
    drops node attributes; without them a copy of Dynamo's graph counts as exported and
    every parameter as a dynamic input). Checked on torch 2.13
    (``torch._functorch._aot_autograd.frontend_utils``).
    """
    import copy

    new_graph = copy.deepcopy(gm.graph)
    new_gm = torch.fx.GraphModule(gm, new_graph, gm.__class__.__name__)
    new_gm.meta = dict(getattr(gm, "meta", {}))
    if hasattr(gm, "_param_name_to_source"):
        new_gm._param_name_to_source = gm._param_name_to_source
    for old, new in zip(gm.graph.nodes, new_graph.nodes):
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    return new_gm


def detect_fake_mode(values) -> Any:
    """The FakeTensorMode of these values (inputs of a graph), or None."""
    from torch._guards import detect_fake_mode as _detect

    return _detect(values)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``fn`` applied to every leaf of nested tuples, lists and dicts (torch's pytree)."""
    from torch.utils._pytree import tree_map as _tree_map

    return _tree_map(fn, tree)


def _floor_div() -> type:
    from torch.utils._sympy.functions import FloorDiv as _FloorDiv

    return _FloorDiv


# sympy floor division as torch's symbolic shapes write it (sizes in bytes / itemsize)
FloorDiv = _floor_div()


# -- real tensors while a compile traces (the allreduce pass's agreement check) --------------


def real_tensors():
    """A context where tensor operations make real tensors although a compile's fake mode is
    active (a collective run at compile time needs real data; the lowering pass runs a kernel
    once to check it). Checked on torch 2.13."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()
