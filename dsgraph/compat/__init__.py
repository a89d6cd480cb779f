"""The one home of torch internals: every difference between torch 2.11 and 2.14 and every
private torch import or attribute (``torch._inductor``, ``torch._functorch``, ``op._schema``,
autograd's hook dicts, ...) lives in this package; the rest of dsgraph goes through it, so a
rename in a new torch breaks one place. ``tests/unit/test_layout.py`` fails on a private
access anywhere else.

Checked: 2.11 (GPU machines) and 2.13 (CPU, CI); each module says what it covers.
"""

from . import inductor_ahead
from .autograd import at_backward_end, graph_task_id, hook_dicts, post_accumulate_hooks, tensor_hooks
from .distributed import all_reduce_op, group_name, wait_tensor_op
from .dynamo import dynamo_graph_inputs, explain, reset
from .functorch import (
    default_partition,
    dsgraph_compile_config,
    extract_partition,
    fx_graph_cse,
    make_boxed,
    min_cut_partition_if,
    min_cut_saved_names,
)
from .fx import (
    FloorDiv,
    boxed_fx,
    copy_graph_module,
    detect_fake_mode,
    fake_mode_of,
    real_tensors,
    size_hint,
    sym_expr,
    symint_of,
    tree_map,
)
from .inductor import (
    CPU_HEAVY_OPS,
    PEAK_ESTIMATE_FREES_OUTPUTS_AT_START,
    CodegenOnly,
    inductor_codegen_only,
    inductor_layout_constraint,
    inductor_layout_opt_possible,
    inductor_registries,
    inductor_rules,
    arena_inductor_patches,
    collective_order_patches,
    compile_fx,
    compile_fx_inner,
    control_deps_op,
    custom_partitioner_base,
    fallback_random,
    graph_handler,
    hash_for_files,
    inductor_mode_options,
    inductor_size_hint,
    pin_collectives,
    post_fusion_hook,
)
from .ops import (
    CUDNN_ATTENTION_BACKWARD,
    FLASH_ATTENTION_BACKWARD,
    HigherOrderOperator,
    OpOverload,
    contiguous_strides,
    is_op,
    non_overlapping_and_dense,
    op_schema,
    out_variant,
    storage_ref,
    writes,
)
from .lowering import has_side_effects, returns_alias, statically_equal
from .trace import trace_artifact, tracing
from .version import SUPPORTED, TORCH_VERSION, check_version

__all__ = [
    "inductor_ahead",
    "CodegenOnly", "inductor_codegen_only", "inductor_layout_constraint", "inductor_layout_opt_possible", "inductor_registries", "inductor_rules", "min_cut_saved_names",
    "min_cut_partition_if",
    "CPU_HEAVY_OPS", "PEAK_ESTIMATE_FREES_OUTPUTS_AT_START",
    "CUDNN_ATTENTION_BACKWARD", "FLASH_ATTENTION_BACKWARD", "FloorDiv", "HigherOrderOperator", "OpOverload", "SUPPORTED", "TORCH_VERSION", "all_reduce_op",
    "arena_inductor_patches", "at_backward_end", "graph_task_id", "collective_order_patches", "control_deps_op", "group_name",
    "pin_collectives", "real_tensors", "wait_tensor_op",
    "boxed_fx", "check_version", "compile_fx", "compile_fx_inner", "contiguous_strides", "copy_graph_module",
    "custom_partitioner_base", "default_partition", "detect_fake_mode", "dsgraph_compile_config",
    "dynamo_graph_inputs", "explain", "extract_partition", "fake_mode_of", "fallback_random", "fx_graph_cse",
    "graph_handler", "has_side_effects", "hash_for_files", "hook_dicts", "inductor_mode_options", "inductor_size_hint", "is_op",
    "make_boxed", "non_overlapping_and_dense", "op_schema", "out_variant", "post_accumulate_hooks",
    "post_fusion_hook", "real_tensors", "reset", "returns_alias", "size_hint", "statically_equal", "storage_ref", "sym_expr", "symint_of", "tensor_hooks", "trace_artifact", "tracing", "tree_map", "writes",
]
