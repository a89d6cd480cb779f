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


def arena_inductor_patches() -> dict[str, Any]:
    """Inductor config for ``arena=True``: Inductor's own memory planning (one pool of
    intermediates per graph). torch 2.13 applies it to inference graphs only: its wrapper
    codegen skips planning for training graphs (a comment there says it raises peaks)."""
    return {"memory_planning": True}


def out_variant(op: Any) -> Any:
    """The ``out=`` overload of a functional op (``aten.mm.default`` -> ``aten.mm.out``), or
    None: the same other arguments (names, types, defaults, keyword-only or not), one
    keyword-only ``Tensor(a!)`` argument per returned tensor, returning them in order.

    Read from the schemas, not from ``torch._library._out_variant.to_out_variant``: on
    torch 2.11 that finds no out variant for ``aten.add.Tensor`` or ``aten.mm.default``.
    """
    schema = op._schema
    if schema.name.endswith("_") or any(_writes(a) for a in schema.arguments):
        return None  # in-place, or out= itself
    returns = schema.returns
    if not returns or any(str(r.type) != "Tensor" for r in returns):
        return None
    wanted = _non_out_args(schema)
    packet = getattr(getattr(torch.ops, op.namespace), schema.name.split("::")[1])
    for name in packet.overloads():
        candidate = getattr(packet, name)
        cs = candidate._schema
        outs = [a for a in cs.arguments if _writes(a)]
        if len(outs) != len(returns) or len(cs.returns) != len(outs) or _non_out_args(cs) != wanted:
            continue
        if not all(a.kwarg_only and str(a.type) == "Tensor" for a in outs):
            continue
        if all(r.alias_info is not None and set(r.alias_info.before_set) == set(a.alias_info.before_set)
               for r, a in zip(cs.returns, outs)):
            return candidate
    return None


def _writes(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _non_out_args(schema: Any) -> list:
    return [(a.name, str(a.type), a.default_value, a.kwarg_only) for a in schema.arguments if not _writes(a)]


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


def extract_partition(joint: torch.fx.GraphModule, saved: list, num_fwd_outputs: int, static_input_indices):
    """Forward and backward modules passing exactly ``saved`` (forward nodes) between them,
    built the way Inductor's min-cut partitioner finishes (torch 2.11 to 2.13): torch's
    extraction, backward reordered like the autograd engine, getitems raised."""
    import inspect

    from torch._functorch import partitioners as P

    node_info = P.classify_nodes(joint, list(static_input_indices or []), num_fwd_outputs)
    sym = [n for n in saved if P.is_sym_node(n)]
    tensors = [n for n in saved if not P.is_sym_node(n)]
    kwargs = dict(num_fwd_outputs=num_fwd_outputs, static_lifetime_input_nodes=node_info.static_lifetime_input_nodes)
    if "saved_opaque_nodes" in inspect.signature(P._extract_fwd_bwd_modules).parameters:
        kwargs["saved_opaque_nodes"] = []
    fw, bw = P._extract_fwd_bwd_modules(joint, tensors, saved_sym_nodes=sym, **kwargs)
    bw = P.reordering_to_mimic_autograd_engine(bw)
    fw, bw = P.raise_getitems(fw), P.raise_getitems(bw)
    if hasattr(P, "thread_graphsafe_rng_from_hops"):
        fw = P.thread_graphsafe_rng_from_hops(fw, is_backward=False)
        bw = P.thread_graphsafe_rng_from_hops(bw, is_backward=True)
    return fw, bw


# --- checkpoint planner: Inductor's plan without compiling kernels -----------------------

class CodegenOnly(Exception):
    """Raised by ``inductor_codegen_only`` once Inductor has generated a graph's wrapper."""


@contextlib.contextmanager
def inductor_codegen_only():
    """Inside, an Inductor compile stops with ``CodegenOnly`` right after its wrapper code is
    generated (lowering, scheduling, fusion, peak-memory reordering and the wrapper's buffer
    reuse all done), before the module is loaded and its kernels compiled. What the buffer
    plan reads (``dsgraph.analysis.inductor_plan``) is complete by then; the C++/Triton
    compile is most of a CPU compile's time.

    A compiled forward reports its outputs' strides to AOTAutograd, which lays out the
    backward's saved inputs by them (channels-last convolution outputs on CPU): the strides
    are reported here as ``compile_fx`` would (``set_tracing_context_output_strides``), or
    the backward would be planned for other layouts. Checked on torch 2.13
    (``GraphLowering._compile_to_module_lines``, ``TracingContext.output_strides``)."""
    from torch._inductor.graph import GraphLowering

    original = GraphLowering._compile_to_module_lines

    def stop(self, wrapper_code):
        _report_output_strides(self)
        raise CodegenOnly()

    GraphLowering._compile_to_module_lines = stop
    try:
        yield
    finally:
        GraphLowering._compile_to_module_lines = original


def _report_output_strides(graph: Any) -> None:
    from torch._guards import TracingContext
    from torch._inductor.ir import IRNode
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    context = TracingContext.try_get()
    if context is None or context.output_strides is None or context.output_strides:
        return
    shape_env = graph.sizevars.shape_env
    for out in graph.graph_outputs or ():
        if isinstance(out, IRNode) and out.has_tensor_output() and not free_unbacked_symbols(out.get_stride()):
            stride = out.get_layout().stride
            context.output_strides.append(tuple(
                int(e) if isinstance(e, int) or getattr(e, "is_Integer", False) else shape_env.evaluate_expr(e)
                for e in stride))
        else:
            context.output_strides.append(None)


def inductor_registries() -> tuple[Any, Any, Any]:
    """Inductor's lowering tables: (ops with a lowering, ops lowered as fallback kernels,
    ops whose lowering needs its inputs realized). Checked on torch 2.13
    (``torch._inductor.lowering.lowerings``, ``fallbacks``, ``needs_realized_inputs``)."""
    import torch._inductor.lowering as L

    return L.lowerings, L.fallbacks, L.needs_realized_inputs


def inductor_rules(device_type: str) -> dict[str, Any]:
    """The store-or-recompute thresholds Inductor's lowering applies on this device
    (``torch._inductor.config``; checked on torch 2.13): an unset
    ``realize_opcount_threshold`` / ``realize_acc_reads_threshold`` means the CPU or the
    GPU default."""
    import torch._inductor.config as c

    cpu = device_type == "cpu"
    opcount = c.realize_opcount_threshold
    if opcount is None:
        opcount = getattr(c, "realize_cpu_opcount_threshold", 30) if cpu else getattr(
            c, "_realize_opcount_threshold_default", 30)
    acc = c.realize_acc_reads_threshold
    if acc is None:
        acc = getattr(c, "realize_cpu_acc_reads_threshold", 8) if cpu else getattr(
            c, "_realize_acc_reads_threshold_default", 8)
    return dict(cpu=cpu, opcount=int(opcount), reads=int(c.realize_reads_threshold), acc_reads=int(acc),
                pointwise_cat_inputs=int(getattr(c, "max_pointwise_cat_inputs", 8)),
                unroll=int(getattr(c, "unroll_reductions_threshold", 8)),
                keep_half_addmm=bool(getattr(c, "keep_addmm_fused_for_half_dtypes", False)))


class _MinCutChoice(Exception):
    def __init__(self, names: list[str]):
        self.names = names


def min_cut_saved_names(gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any) -> list[str]:
    """Names of the values Inductor's min-cut partitioner would save, without building its
    forward and backward modules (most of its time on a large graph): the partitioner runs
    on a copy and stops when it hands its choice to ``_extract_fwd_bwd_modules``. Values the
    backward turns out not to read are dropped by the extraction; callers drop them too.
    Checked on torch 2.13 (``torch._functorch.partitioners``)."""
    from torch._functorch import partitioners as P

    original = P._extract_fwd_bwd_modules

    def stop(joint_module, saved_values, saved_sym_nodes=(), *args, **kw):
        raise _MinCutChoice([n.name for n in list(saved_values) + list(saved_sym_nodes or [])])

    P._extract_fwd_bwd_modules = stop
    try:
        default_partition(copy_graph_module(gm), joint_inputs, **kwargs)
    except _MinCutChoice as choice:
        return choice.names
    finally:
        P._extract_fwd_bwd_modules = original
    raise RuntimeError("the min-cut partitioner returned without choosing what to save")
