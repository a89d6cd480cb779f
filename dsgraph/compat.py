"""Every difference between the supported torch versions (2.11 to 2.14) lives here.

Checked: 2.11 (GPU machines) and 2.13 (CPU, CI). The rest of dsgraph imports torch
internals only through this module, so a rename in a new torch breaks one place.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import sympy
import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
SUPPORTED = ((2, 11), (2, 14))


def check_version() -> None:
    if not (SUPPORTED[0] <= TORCH_VERSION <= SUPPORTED[1]):
        raise RuntimeError(
            f"dsgraph supports torch 2.11 to 2.14; this is torch {torch.__version__}"
        )


# --- Inductor / AOTAutograd entry points -------------------------------------------------

def compile_fx(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx as _compile_fx

    return _compile_fx(*args, **kwargs)


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx_inner as _inner

    return _inner(*args, **kwargs)


def custom_partitioner_base() -> type:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


def default_partition(gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
    """What Inductor's partition_fn does when no custom partitioner is set.

    Called with keyword arguments only (FACTS.md: torch passes ``num_fwd_outputs`` and
    ``static_lifetime_input_indices`` as keywords on 2.11 and 2.13).
    """
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)


def make_boxed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A callable AOTAutograd calls with one list argument that it may clear."""
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


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


@contextlib.contextmanager
def dsgraph_compile_config(extra_functorch: dict[str, Any] | None = None):
    """Config for a dsgraph compile.

    force_non_lazy_backward_lowering: the backward compiles inside the first compile, so a
    failure in either graph reverts both. enable_autograd_cache off: a cache hit would load
    compiled graphs without calling dsgraph's partitioner or inner compiler, skipping its
    passes, runtime wrappers and reports. Inductor's FX graph cache stays on: it keys on the
    graph after dsgraph's passes, so a hit is always for the graph dsgraph produced.
    """
    import torch._functorch.config as fconfig

    patches = {"force_non_lazy_backward_lowering": True, "enable_autograd_cache": False}
    patches.update(extra_functorch or {})
    with fconfig.patch(**patches):
        yield


def inductor_mode_options(mode: str | None) -> dict[str, Any]:
    """Inductor config patches that ``torch.compile(mode=...)`` means for backend='inductor'."""
    if mode is None or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


# --- symbolic sizes ---------------------------------------------------------------------

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


def inductor_size_hint(expr: Any, fallback: int = 8192) -> int:
    """A concrete int for an Inductor size expression (inside a graph handler).

    torch 2.13 calls it ``SizeVarAllocator.optimization_hint``; older releases ``size_hint``.
    """
    from torch._inductor.virtualized import V

    sizevars = V.graph.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return int(hint(expr, fallback=fallback))


def sym_expr(x: Any) -> sympy.Expr:
    """The sympy expression behind an int or SymInt."""
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return sympy.Integer(int(x))


# --- graph module helpers ---------------------------------------------------------------

def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy with its own Graph (node meta copied shallowly) sharing parameters and buffers.

    Used to keep Dynamo's graph for a stock fallback compile: compile_fx takes ownership of
    the graph it is given and may rewrite it.
    """
    import copy

    new_graph = copy.deepcopy(gm.graph)
    new_gm = torch.fx.GraphModule(gm, new_graph, gm.__class__.__name__)
    new_gm.meta = dict(getattr(gm, "meta", {}))
    return new_gm


def dynamo_graph_inputs(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, Any]]:
    """(placeholder, the real object Dynamo bound to it or None) for a Dynamo graph.

    Dynamo keeps the real tensor of each graph input in the placeholder's ``grapharg``
    (possibly through a weak reference that may be gone).
    """
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        try:
            example = grapharg.example if grapharg is not None else None
        except Exception:  # the weak reference died
            example = None
        out.append((node, example))
    return out
