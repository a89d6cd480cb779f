"""Inductor's out-of-process compile, used to compile one graph while this process compiles another.

AOTAutograd compiles the forward, then the backward, one after the other in the compiling
process. Both graphs exist once the joint graph is partitioned, so the backward can be
compiled in a subprocess while the forward compiles here. This module holds the torch
side of that, through Inductor's own protocol for compiling a graph in another process
(``torch._inductor.compile_fx_ext``: the graph, its fake inputs, Inductor's config and
the tracing context pickled by ``GraphPickler``; the child returns the ``CompiledFxGraph``
the in-process compile would return). The worker process is dsgraph's
(``compile/ahead_worker.py``: one spawned interpreter, where Inductor's own worker pool
imports torch twice before its first job):

- ``serialize``: the compile input of a graph, or None when Inductor's protocol cannot
  carry it (a higher-order op, a user Triton kernel, something unpicklable);
- ``run_in_child``: the compile in the worker, with a context of the caller's entered
  inside Inductor's own config patch (the child's entry is dsgraph's: it also reads
  Inductor's plan there); ``start_worker_compiler``: the worker's start;
- ``serving``: while active, ``compile_fx_inner``'s codegen step returns the child's
  result for the graph it was made from, and compiles any other graph as usual; so cache
  handling, ``post_compile`` (output strides for AOTAutograd, the wrapper's module load)
  and the cudagraph policy stay Inductor's own;
- ``fingerprint``: what must be equal for the child's result to be the one this process
  would produce: the graph's code and its nodes' metadata (values of types other than
  tensors, containers and scalars by their type name), the
  inputs' sizes and strides, the compile arguments, Inductor's config, the process-wide
  settings its codegen reads (``global_settings``, which the child applies) and the
  backward inputs AOTAutograd donates (``donated_inputs``, which the child is given).

The child's code differs from this process's only in its header comment, which names the
AOT graph the tracing context named when the input was serialized (the forward's).

Checked on torch 2.13 (CPU) and 2.11 (H200).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Sequence

import torch

# What fx_codegen_and_compile gets besides the graph arguments; compared by value, except
# the forward's device box, which the forward's compile fills in after the child started
_UNCOMPARED_KWARGS = ("boxed_forward_device_index",)
# Inductor config keys a capture of the compiled plan changes (analysis.inductor_plan)
_UNCOMPARED_CONFIG = ("fx_graph_cache", "_post_fusion_custom_pass")


def torch_key() -> bytes | None:
    """Inductor's hash of torch's sources (cached once computed), for the worker to reuse:
    its kernel pool's start hashes them otherwise (0.3 s here)."""
    from torch._inductor import codecache

    try:
        return codecache.torch_key()
    except Exception:  # noqa: BLE001  only a saving
        return None


def start_worker_compiler(key: bytes | None) -> None:
    """In dsgraph's compile worker, before any job: the parent's source hash, Inductor's
    kernel-compile pool started (not waited for: Inductor compiles the kernels it generates
    before the pool answers in the compiling process, as everywhere), then the compiler's
    modules imported while that pool comes up."""
    from torch._inductor import codecache
    from torch._inductor.async_compile import AsyncCompile

    if key is not None and hasattr(codecache.torch_key, "set"):
        codecache.torch_key.set(key)
    AsyncCompile.warm_pool()
    AsyncCompile.use_process_pool()  # sends the pool its first job, which tells it is ready
    import importlib

    for module in ("torch._inductor.compile_fx", "torch._inductor.scheduler", "torch._inductor.codegen.triton"):
        importlib.import_module(module)


def child_env() -> dict[str, str]:
    """The cache folders a job's compile uses: this process's, read when it is sent."""
    return {v: os.environ[v] for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR") if v in os.environ}


def global_settings() -> tuple:
    """Process-wide torch settings Inductor's codegen reads (the ones its FX graph cache
    keys on): deterministic algorithms (an embedding backward's scatter without atomics) and
    the matmul precision flags. Not part of Inductor's out-of-process protocol."""
    matmul = torch.backends.cuda.matmul
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            bool(getattr(torch.utils.deterministic, "fill_uninitialized_memory", False)),
            torch.get_float32_matmul_precision(), bool(matmul.allow_tf32),
            bool(matmul.allow_fp16_reduced_precision_reduction), bool(matmul.allow_bf16_reduced_precision_reduction),
            bool(torch.backends.cudnn.allow_tf32))


def apply_global_settings(settings: tuple) -> None:
    deterministic, warn_only, fill, precision, tf32, fp16_reduced, bf16_reduced, cudnn_tf32 = settings
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    if hasattr(torch.utils.deterministic, "fill_uninitialized_memory"):
        torch.utils.deterministic.fill_uninitialized_memory = fill
    torch.set_float32_matmul_precision(precision)
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = tf32
    matmul.allow_fp16_reduced_precision_reduction = fp16_reduced
    matmul.allow_bf16_reduced_precision_reduction = bf16_reduced
    torch.backends.cudnn.allow_tf32 = cudnn_tf32


def static_inputs(example_inputs: Sequence[Any]) -> bool:
    """No symbolic size, stride or scalar among the inputs (the child compiles for these
    sizes; a dynamic graph would need the shape environment carried over too)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return False
        if isinstance(x, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(), x.storage_offset())):
            return False
    return True


# compile_fx_inner's defaults, which it sets before its codegen sees the arguments (torch 2.13)
_INNER_DEFAULTS = {"static_input_idxs": (), "is_backward": False, "graph_id": None, "cpp_wrapper": False,
                   "fx_wrapper": False, "is_inference": False, "boxed_forward_device_index": None,
                   "layout_opt": None, "extern_node_serializer": None}


def backward_kwargs(gm: torch.fx.GraphModule, forward_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments this backward's codegen will get: Inductor's ``bw_compiler`` calls
    ``inner_compile`` with the forward's (graph id, cudagraphs and device boxes, the
    decomposition table) but ``is_backward`` and the backward's static inputs (the ones
    before its tangents), and ``compile_fx_inner`` adds its defaults; the output metadata
    ``bw_compiler`` sets first is set here too. The fingerprint compares all of it with what
    the backward's codegen really gets, so an argument of another torch version costs the
    head start, not correctness."""
    from torch._inductor import config
    from torch._inductor.utils import BoxedBool, count_tangents, output_node

    out = output_node(gm)
    if getattr(config, "bw_outputs_user_visible", True):
        leaves = torch.utils._pytree.arg_tree_leaves(*out.args)
        out.meta["user_visible_output_idxs"] = [i for i, n in enumerate(leaves) if isinstance(n, torch.fx.Node)]
    else:
        out.meta["user_visible_output_idxs"] = []
    kwargs = {k: v for k, v in forward_kwargs.items() if k not in ("is_inference", "compile_region_name")}
    kwargs.update(is_backward=True, static_input_idxs=list(range(count_tangents(gm))))
    for key, default in _INNER_DEFAULTS.items():
        kwargs.setdefault(key, default)
    if kwargs.get("cudagraphs") is None:  # what _compile_fx_inner sets
        kwargs["cudagraphs"] = BoxedBool(config.triton.cudagraphs)
    return kwargs


def inputs_to_check(example_inputs: Sequence[Any], graph_kwargs: dict[str, Any]) -> list[int]:
    from torch._inductor.compile_fx import get_input_idxs_to_check

    return list(get_input_idxs_to_check(example_inputs, graph_kwargs.get("static_input_idxs", ())))


# Op namespaces the child can unpickle: torch's own, and dsgraph's (its worker entry imports
# the modules that register them before the graph is read). Inductor's default carries aten
# only (torch.fx._graph_pickler._ops_filter_safe), which refuses every graph holding a prims
# op (an iota in a cross-entropy backward) or a dsgraph op.
_CARRIED_OPS = ("torch.ops.aten", "torch.ops.prims", "torch.ops.dsgraph.")


def serialize(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_kwargs: dict[str, Any]) -> Any:
    """Inductor's pickled compile input for this graph (what
    ``_SerializedFxCompile.serialize_compile`` builds, with dsgraph's and prims' ops
    carried too), or None where it cannot be made."""
    from pickle import PicklingError

    from torch._inductor import compile_fx_ext as ext
    from torch._inductor import config
    from torch._inductor.codecache import BypassFxGraphCache, FxGraphCache
    from torch.fx._graph_pickler import GraphPickler, Options

    try:
        FxGraphCache._check_for_hop(gm)
    except BypassFxGraphCache:
        return None
    if ext._graph_contains_triton_kernel_wrappers(gm):  # process-local kernel table
        return None
    deterministic = None
    try:  # what Inductor's own serializer carries when tests run under a DeterministicGuard
        deterministic = torch.testing._internal.common_utils.DeterministicGuard._current_state()
    except AttributeError:
        pass
    try:
        wire = ext._WireProtocolInput(
            gm, example_inputs, inputs_to_check(example_inputs, graph_kwargs), graph_kwargs,
            torch._guards.TracingContext.try_get(), config.save_config_portable(),
            ext._VirtualizedSerializer.serialize(), deterministic, ext._LoggerState(), ext._LoweringSerializer(),
            ext._FakeTensorModeSerializer(ext._current_fake_mode()))
        options = Options(ops_filter=lambda name: name.startswith(_CARRIED_OPS))
        return ext._WireProtocolPickledInput(GraphPickler.dumps(wire, options))
    except (AttributeError, BypassFxGraphCache, PicklingError, NotImplementedError, TypeError):
        return None


def donated_inputs() -> list[int] | None:
    """The backward inputs AOTAutograd donates (saved activations the backward may reuse in
    place: ``fw_metadata.bw_donated_idxs``, set once the joint graph is partitioned). Inductor's
    protocol drops ``fw_metadata`` from the tracing context it carries, so without this the
    child compiles a backward that reuses none of them (a gated network's backward peaked
    2% higher, session 17)."""
    from torch._inductor.utils import get_donated_idxs

    donated = get_donated_idxs()
    return None if donated is None else list(donated)


def run_in_child(pickled_input: Any, extra_env: dict[str, str], inner: Callable[[], Any],
                 donated: list[int] | None) -> Any:
    """Inductor's child side of an out-of-process compile, with ``inner()`` (a context
    manager) entered around the codegen, inside the parent's config patch (so a config
    patch of ``inner`` holds there), and the parent's ``donated_inputs``."""
    from torch._inductor import compile_fx_ext as ext
    from torch._inductor import graph as lowering_graph
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

    base = ext._InProcessFxCompile
    base_donated = lowering_graph.get_donated_idxs

    class _WithContext(base):  # type: ignore[misc, valid-type]
        def codegen_and_compile(self, *args: Any, **kwargs: Any) -> Any:
            with _defaults_for_the_uncarried(), inner():
                return super().codegen_and_compile(*args, **kwargs)

    ext._InProcessFxCompile = _WithContext
    lowering_graph.get_donated_idxs = lambda: donated  # what GraphLowering reads
    try:
        return _SubprocessFxCompile._run_in_child_subprocess(pickled_input, extra_env)
    finally:
        ext._InProcessFxCompile = base
        lowering_graph.get_donated_idxs = base_donated


@contextlib.contextmanager
def _defaults_for_the_uncarried() -> Iterator[None]:
    """Inductor's child poisons every virtualized global it does not carry over from the
    parent (``_VirtualizedSerializerContextManager``), but its codegen reads some of them:
    the mix-order reduction kernels of a CUDA backward read ``V.interpreter`` (torch 2.11 on
    the H200: "Attempt to use poisoned virtualized value 'interpreter'"). The parent's
    backward compile runs with no graph active, where each of those is its default: so is
    it here."""
    from torch._inductor import virtualized

    with contextlib.ExitStack() as stack:
        for var in list(vars(virtualized).values()):
            if (isinstance(var, virtualized.Virtualized)
                    and getattr(virtualized.threadlocal, var._key, None) is virtualized._PoisonedVirtual):
                stack.enter_context(var._set_handler(var._default()))
        yield


def output_code(pickled_output: Any, gm: torch.fx.GraphModule) -> Any:
    """The child's ``CompiledFxGraph``, as this process's codegen would return it."""
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile
    from torch._inductor.output_code import CompiledFxGraphConstantsWithGm

    output = pickled_output.deserialize(CompiledFxGraphConstantsWithGm(gm))
    _SubprocessFxCompile()._postprocess(output)
    return output.graph


def _meta_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(), str(value.dtype),
                str(value.device), bool(value.requires_grad))
    if isinstance(value, (list, tuple)):
        return tuple(_meta_value(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _meta_value(v)) for k, v in value.items()))
    if isinstance(value, (int, float, str, bool, type(None), torch.dtype, torch.device)):
        return value
    return type(value).__name__


def _unread_meta(key: str) -> bool:
    """Node metadata Inductor's codegen does not read: where the node came from, and the
    annotations dsgraph's own analyses add (``dsgraph_bytes``, ...)."""
    return key in ("stack_trace", "source_fn_stack") or key.startswith("dsgraph_")


def fingerprint(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], checked: Sequence[int],
                graph_kwargs: dict[str, Any]) -> tuple:
    from torch._inductor import config

    nodes = tuple((n.name, n.op, str(n.target), tuple(sorted((k, _meta_value(v)) for k, v in n.meta.items()
                                                             if not _unread_meta(k))))
                  for n in gm.graph.nodes)
    kwargs = tuple(sorted((k, _meta_value(getattr(v, "value", v))) for k, v in graph_kwargs.items()
                          if k not in _UNCOMPARED_KWARGS and k != "compile_region_name"))
    settings = tuple(sorted((k, _meta_value(v)) for k, v in config.save_config_portable().items()
                            if k not in _UNCOMPARED_CONFIG))
    donated = donated_inputs()
    return (gm.code, nodes, tuple(_meta_value(x) for x in example_inputs), tuple(checked), kwargs, settings,
            global_settings(), None if donated is None else tuple(donated))


@contextlib.contextmanager
def serving(fingerprint_of_child: tuple, result: Callable[[torch.fx.GraphModule], Any]) -> Iterator[None]:
    """Inside: the first codegen of a graph whose fingerprint is ``fingerprint_of_child``
    returns ``result(gm)`` unless that is None; every other graph compiles here."""
    import torch._inductor.compile_fx as cfx

    original = cfx.fx_codegen_and_compile
    asked = False

    def codegen(gm, example_inputs, checked, *args, **kwargs):
        nonlocal asked
        graph_kwargs = {k: v for k, v in kwargs.items() if k != "compile_region_name"}
        if not asked and fingerprint(gm, example_inputs, checked, graph_kwargs) == fingerprint_of_child:
            asked = True
            code = result(gm)
            if code is not None:
                return code
        return original(gm, example_inputs, checked, *args, **kwargs)

    cfx.fx_codegen_and_compile = codegen
    try:
        yield
    finally:
        cfx.fx_codegen_and_compile = original
