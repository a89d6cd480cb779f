"""Inductor: its compile entry points, config, partitioner base class and scheduler access.

Checked on torch 2.11 (GPU) and 2.13 (CPU) unless a docstring says otherwise.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .version import TORCH_VERSION

# torch 2.11 and 2.12's ``memory.estimate_peak_memory`` frees a graph output (``end_step``
# -1) at index ``end_step + 1``, i.e. step 0: each output's bytes are taken off from the
# first step on and added back when it is made, so every output not yet made lowers the
# estimate. torch 2.13 skips that free (``peak_memory_from_buf_info_list``). Both the
# wrapper's pool (``EfficientPeakEstimate``) and ``reorder_for_peak_memory`` use this
# estimate: in a backward, whose outputs are the parameter gradients, 2.11's estimate is
# lower by the gradients not yet made (1.4 GB on the 24-layer GPT), so its pool takes
# hand-overs a 2.13 estimate refuses. Read from both wheels' source (session 28).
PEAK_ESTIMATE_FREES_OUTPUTS_AT_START = TORCH_VERSION < (2, 13)

# ``StorageBox.should_realize_on_reuse`` on a CPU stores a value read more than once when its
# expression uses one of these ops; torch 2.13 added the logs and tanh to 2.11 and 2.12's
# exp and sigmoid (read from the wheels, session 28: Llama's smallest CPU plan on 2.11 was
# predicted 3.45% low with 2.13's list)
CPU_HEAVY_OPS = frozenset({"exp", "sigmoid"} if TORCH_VERSION < (2, 13) else
                          {"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})

def compile_fx(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx as _compile_fx

    return _compile_fx(*args, **kwargs)


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx_inner as _inner

    return _inner(*args, **kwargs)


def custom_partitioner_base() -> type:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


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


def inductor_size_hint(expr: Any, fallback: int = 8192) -> int:
    """A concrete int for an Inductor size expression (inside a graph handler).

    torch 2.13 calls it ``SizeVarAllocator.optimization_hint``; older releases ``size_hint``.
    """
    from torch._inductor.virtualized import V

    sizevars = V.graph.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return int(hint(expr, fallback=fallback))




def hash_for_files(files: tuple[str, ...]) -> str:
    """Inductor's content hash of source files (its custom-pass cache identity)."""
    from torch._inductor.custom_graph_pass import get_hash_for_files

    return get_hash_for_files(files).hex()


@contextlib.contextmanager
def post_fusion_hook(hook) -> Iterator[None]:
    """Call ``hook(graph_lowering)`` for every graph Inductor schedules inside the context
    (through ``_post_fusion_custom_pass``, which sees ``V.graph``), with Inductor's FX graph
    cache off: a cache hit would skip the scheduler."""
    import torch._inductor.config as iconfig

    previous = iconfig._post_fusion_custom_pass

    def chained(nodes):
        from torch._inductor.virtualized import V

        hook(V.graph)
        return previous(nodes) if previous is not None else nodes

    with iconfig.patch(_post_fusion_custom_pass=chained, fx_graph_cache=False):
        yield


@contextlib.contextmanager
def graph_handler(graph: Any) -> Iterator[None]:
    """Make ``graph`` (a GraphLowering) Inductor's current graph, as during its compile."""
    from torch._inductor.virtualized import V

    with V.set_graph_handler(graph):
        yield


@contextlib.contextmanager
def fallback_random(enabled: bool = True) -> Iterator[None]:
    """Inductor's random ops drawn like eager's (compared against eager in tests)."""
    import torch._inductor.config as iconfig

    with iconfig.patch(fallback_random=enabled):
        yield


# -- collectives in dsgraph's graphs (the allreduce pass) ---------------------------------


def control_deps_op() -> Any:
    """Inductor's ``control_deps`` higher-order op: ``control_deps(deps, subgraph, *args)``
    runs ``subgraph(*args)`` and Inductor schedules every kernel the subgraph lowers to after
    the latest writer of each tensor in ``deps`` (weak dependencies, renamed through
    mutations, so a graph input in ``deps`` means "after its last in-place write so far").
    Eager and FX execution just call the subgraph. Present since torch 2.10; checked on 2.13."""
    from torch._inductor.fx_passes.control_dependencies import control_deps

    return control_deps


def pin_collectives(snodes: list) -> list:
    """Inductor scheduler pass (after its fusion and peak-memory reordering): put every
    collective, with the kernels that produce what it sends (a scale, a cast; and what
    exists only to feed those: the extern kernel behind a MultiOutput, an allocation a
    user-defined kernel writes into), right after the last kernel it depends on, and move every wait, with everything that depends on it,
    to the end. Kernels that neither feed a collective nor follow a wait keep Inductor's
    order. Any order this returns is a topological order of the scheduler's dependencies:
    a node moves to right after its last ancestor, and a set closed under descendants
    moves to the end in its own order.

    dsgraph issues a gradient bucket as soon as its last gradient is written and waits for it
    at the end of the backward (``dsgraph.passes.allreduce``); Inductor's peak-memory
    reordering would otherwise place collectives and waits wherever its heuristics put nodes
    that allocate nothing. Uses ``BaseSchedulerNode.ancestors`` / ``read_writes`` (torch 2.13)."""
    from torch._inductor.dependencies import WeakDep
    from torch._inductor.utils import contains_collective, contains_wait

    comms = [n for n in snodes if contains_collective(n)]
    if not comms:
        return snodes
    order = list(snodes)
    owner = {b: n for n in order for b in n.get_buffer_names()}

    def after_last_ancestor(node) -> int:
        ancestors = node.ancestors
        last = -1
        for i, other in enumerate(order):
            if other.get_operation_names() & ancestors:
                last = i
        return last + 1

    def sources(node) -> list:
        found = []
        for dep in node.read_writes.reads:
            source = None if isinstance(dep, WeakDep) else owner.get(dep.name)
            if (source is not None and source is not node and source not in found
                    and not contains_collective(source) and not contains_wait(source)):
                found.append(source)
        return found

    def feeds_only(node, names: set) -> bool:
        # weak users only need to run after it, which moving it earlier keeps
        users = [u for buf in node.get_outputs() for u in buf.users if not u.is_weak]
        return bool(users) and all(
            hasattr(u.node, "get_operation_names") and u.node.get_operation_names() <= names for u in users)

    for comm in comms:
        # what it reads, and further back what exists only to produce that (an extern
        # kernel behind its MultiOutput, the allocation a user-defined kernel writes into)
        feeders = sources(comm)
        names = set(comm.get_operation_names()).union(*(f.get_operation_names() for f in feeders))
        frontier = list(feeders)
        while frontier:
            for source in sources(frontier.pop()):
                if source not in feeders and feeds_only(source, names):
                    feeders.append(source)
                    names |= source.get_operation_names()
                    frontier.append(source)
        feeders.sort(key=order.index)
        for node in feeders + [comm]:
            order.remove(node)
            order.insert(after_last_ancestor(node), node)

    sunk, sunk_ops = [], set()
    for node in order:
        if contains_wait(node) or node.ancestors & sunk_ops:
            sunk.append(node)
            sunk_ops |= node.get_operation_names()
    moved = set(sunk)
    return [n for n in order if n not in moved] + sunk


def collective_order_patches() -> dict[str, Any]:
    """Inductor config for a compile whose graphs carry dsgraph's collectives: Inductor's own
    communication passes off (its bucketing of all-reduces, DDP fusion, overlap scheduling)
    and its comm-reordering slot filled with ``pin_collectives`` alone, which runs after the
    peak-memory reordering (torch 2.13: ``Scheduler.__init__`` runs
    ``reorder_for_compute_comm_overlap_passes`` last)."""
    return {
        "reorder_for_compute_comm_overlap": True,
        "reorder_for_compute_comm_overlap_passes": [pin_collectives],
        "bucket_all_reduces_fx": "none",
        "_fuse_ddp_communication": False,
        "aten_distributed_optimizations.enable_overlap_scheduling": False,
    }


# --- checkpoint planner: Inductor's plan without compiling kernels ---

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


def inductor_layout_constraint(target: Any, fallback: bool) -> str | None:
    """Whether Inductor's lowering puts a stride constraint on ``target``'s inputs before
    it runs (``GraphLowering.call_function``: ``maybe_layout_constraints``: the SDPA
    fallbacks' ``sdpa_constraint``, ``constrain_to_fx_strides``, ``require_contiguous``,
    layout tags); for an op without a lowering (``fallback=False``), the one its implicit
    fallback gets from its tags or the custom-op default. None: no constraint; "fake":
    ``constrain_to_fake_tensors``, which applies only to a node with ``eager_input_vals``;
    "strides": any other."""
    import torch
    import torch._inductor.lowering as L
    from torch._library.utils import get_layout_constraint_tag, is_builtin

    if not isinstance(target, torch._ops.OpOverload):
        return None
    if target in L.lowerings:
        found = L.maybe_layout_constraints(target)
    elif fallback:
        return None
    elif get_layout_constraint_tag(target, with_default=False) is None and is_builtin(target):
        return None  # in a backward: require_contiguous (not known per node here)
    else:
        found = L.tag_to_layout_constraint(get_layout_constraint_tag(target, with_default=True))
    if found is None:
        return None
    return "fake" if found is L.constrain_to_fake_tensors else "strides"


def inductor_layout_opt_possible(device_type: str) -> bool:
    """Whether a graph with a convolution gets Inductor's layout optimization on this
    device (``GraphLowering.decide_layout_opt``, torch 2.13: ``config.layout_optimization``;
    on a CPU, mkldnn enabled and available)."""
    import torch
    import torch._inductor.config as c

    if not c.layout_optimization:
        return False
    if c.force_layout_optimization or device_type != "cpu":
        return True
    return bool(torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available())


def _two_step_variance(c: Any, cpu: bool) -> dict[str, int]:
    """Where ``lowering.use_two_step_variance`` lowers a variance as a sum of squared
    differences rather than Welford (read from the 2.11, 2.12 and 2.13 wheels, session 28),
    as thresholds on the reduced elements (a variance over at most that many):
    ``two_step_variance`` on the CPU and for CUDA half precision, ``two_step_generic``
    elsewhere, ``two_step_min_numel`` the lower end of CUDA half's band left to Welford.
    torch 2.11: fewer than ``unroll_reductions_threshold`` on every device. 2.12: the CPU's
    ``cpp.use_two_step_variance_threshold``, else at most the unroll threshold. 2.13: also
    CUDA half up to ``triton.use_two_step_variance_threshold`` outside (unroll,
    min_numel)."""
    unroll = int(getattr(c, "unroll_reductions_threshold", 8))
    if TORCH_VERSION < (2, 12):
        return dict(two_step_variance=unroll - 1, two_step_generic=unroll - 1, two_step_min_numel=0)
    cpp = int(getattr(c.cpp, "use_two_step_variance_threshold", 1024))
    if TORCH_VERSION < (2, 13):
        return dict(two_step_variance=cpp if cpu else unroll, two_step_generic=unroll, two_step_min_numel=0)
    return dict(two_step_variance=cpp if cpu else int(getattr(c.triton, "use_two_step_variance_threshold", 32768)),
                two_step_generic=unroll, two_step_min_numel=int(getattr(c.triton, "use_two_step_variance_min_numel", 0)))


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
                keep_half_addmm=bool(getattr(c, "keep_addmm_fused_for_half_dtypes", False)),
                **_two_step_variance(c, cpu),
                max_fusion=int(getattr(c, "max_fusion_size", 64)),
                horizontal_size=int(getattr(c.cpp, "max_horizontal_fusion_size", 16) if cpu
                                    else getattr(c, "max_fusion_size", 64)),
                fusion_pairs=int(getattr(c, "max_fusion_buffer_group_pairwise_attempts", 64)),
                fusion_score=int(getattr(c, "score_fusion_memory_threshold", 10)))
