"""What each FX node is to Inductor's graph lowering, for the buffer-plan emulation
(``dsgraph.analysis.inductor_model``): its kind (view, pointwise, reduction, a kernel
Inductor does not generate, ...), the ops it adds to an expression, and the
store-or-recompute thresholds Inductor applies on a device (``Rules``), read from torch's
lowering tables through ``compat`` (torch 2.11 to 2.13).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
from torch.fx import Node

from .. import compat
from .lifetimes import is_view, tensor_values

# what each node is for Inductor
PLACEHOLDER, VIEW, POINTWISE, REDUCTION, EXTERN, MUTATE, CAT, SCATTER, GETITEM, NONE = range(10)

_REDUCTIONS = {"sum", "mean", "amax", "amin", "var_mean", "var", "prod", "any", "all", "argmax", "argmin",
               "max", "min", "std", "logsumexp", "norm", "linalg_vector_norm"}
_SCATTERS = {"_unsafe_masked_index_put_accumulate", "index_put", "_unsafe_index_put", "scatter", "scatter_add",
             "scatter_reduce", "index_add", "embedding_dense_backward", "index_reduce"}
# lowered to a template or an extern kernel call although not a fallback (their lowering
# realizes the inputs itself): matmuls and convolutions
_TEMPLATES = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_int_mm", "_scaled_mm", "_addmm_activation", "convolution",
              "_convolution", "convolution_backward", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_flex_attention", "flex_attention"}
# reductions whose result is a pointwise expression over their buffer (Inductor's
# lowering divides the sum by the count: a load, a constant, a division, so two ops beyond
# the load, ``inner_fn_opcount``); (op, getitem index) for multi-output ones
_EPILOGUE = {("mean", None): 2, ("var", None): 2, ("var_mean", 0): 2}
# ops whose integer arguments are dimensions, not constants of the expression
_INDEX_ARGS = {"gather"}
# ops that compute in their inputs' promoted dtype and return bool or select: no cast counted
_NO_PROMOTION = {"eq", "ne", "lt", "le", "gt", "ge", "where", "convert_element_type", "_to_copy", "clone"}
_HEAVY = {"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"}
_MUTATING = {"copy_"}
# element-moving ops: an output read through one of them is not read at its own index
MOVES = {"slice", "select", "narrow", "as_strided", "permute", "transpose", "t", "expand", "flip", "roll",
         "diagonal", "unfold", "repeat", "index", "_unsafe_index", "gather", "constant_pad_nd", "cat",
         "slice_scatter", "select_scatter", "embedding"}


def op_name(node: Node) -> str:
    """The op's name without overload (``mm``), or the callable's name."""
    target = node.target
    if compat.is_op(target):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


@functools.lru_cache(maxsize=1)
def _registries():
    return compat.inductor_registries()


@dataclass(frozen=True)
class Rules:
    """The thresholds Inductor's lowering uses; they differ between CPU and GPU."""

    cpu: bool
    opcount: int  # realize_opcount_threshold (CPU: realize_cpu_opcount_threshold)
    reads: int  # realize_reads_threshold: loads above which a reused expression is stored
    acc_reads: int  # realize_acc_reads_threshold (CPU: realize_cpu_acc_reads_threshold)
    pointwise_cat_inputs: int  # GPU: a cat of at most this many inputs is pointwise
    unroll: int  # unroll_reductions_threshold: shorter reductions become pointwise
    keep_half_addmm: bool = False  # keep_addmm_fused_for_half_dtypes

    @staticmethod
    def for_device(device_type: str) -> "Rules":
        return Rules(**compat.inductor_rules(device_type))


@dataclass
class OpInfo:
    kind: int
    own_ops: int = 1
    heavy: bool = False
    nbytes: tuple[int, ...] = ()  # bytes of each output tensor (numel * itemsize), in order
    nontrivial: bool = True  # more than one element: a load of it has a non-constant index
    moves: bool = False  # a view that moves elements (permute, slice, ...)
    multi: bool = False  # returns a tuple (its getitems take the elements)
    dtypes: tuple = ()  # dtype of each output tensor
    loop: int = 0  # elements its kernel iterates over (a reduction: its input's)
    numel: int = 0  # elements of its (largest) output
    name: str = ""  # the op's name (``mm``, ``add``)
    realizes_inputs: bool = False  # Inductor's needs_realized_inputs: users store what they read

    @property
    def bytes(self) -> int:
        return self.nbytes[0] if self.nbytes else 0


def classify(node: Node, rules: Rules) -> OpInfo:
    """What Inductor makes of one FX node, from its op and fake value."""
    val = node.meta.get("val")
    vals = tensor_values(val)
    nbytes = tuple(int(_numel(t)) * t.element_size() for _, t in vals)
    info = _classify(node, rules, val, vals, nbytes)
    info.dtypes = tuple(t.dtype for _, t in vals)
    info.name = op_name(node) if node.op == "call_function" else ""
    info.loop = info.numel = max((_numel(t) for _, t in vals), default=0)
    if info.kind == REDUCTION:
        info.loop = max([_numel(a.meta["val"]) for a in node.all_input_nodes
                         if isinstance(a.meta.get("val"), torch.Tensor)] + [info.loop])
    return info


def _classify(node: Node, rules: Rules, val, vals, nbytes) -> OpInfo:
    multi = isinstance(val, (tuple, list))
    nontrivial = any(_numel(t) > 1 for _, t in vals)
    if node.op in ("placeholder", "get_attr"):
        return OpInfo(PLACEHOLDER, 0, nbytes=nbytes, nontrivial=nontrivial)
    if node.op != "call_function":
        return OpInfo(NONE)
    if node.target is operator.getitem:
        # var_mean's variance is an expression over its Welford buffer (m2 / (n - correction):
        # a load, a constant, a division), not the buffer itself
        own = _EPILOGUE.get((op_name(node.args[0]), node.args[1]), 0) if _is_call(node.args[0]) else 0
        return OpInfo(GETITEM, own, nbytes=nbytes, nontrivial=nontrivial)
    target = node.target
    if not compat.is_op(target):
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi)
    name = op_name(node)
    lowerings, fallbacks, needs_realized = _registries()
    realizing = target in needs_realized
    if name in _MUTATING:
        return OpInfo(MUTATE, nbytes=nbytes)
    if is_view(node):
        return OpInfo(VIEW, 0, nbytes=nbytes, nontrivial=nontrivial, moves=name in MOVES, multi=multi)
    if target in fallbacks or realizing or target not in lowerings or name in _TEMPLATES:
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi, realizes_inputs=realizing)
    if name in _REDUCTIONS:
        numel_in = max((_numel(a.meta["val"]) for a in node.all_input_nodes
                        if isinstance(a.meta.get("val"), torch.Tensor)), default=1)
        numel_out = max((_numel(t) for _, t in vals), default=1)
        rnumel = numel_in // max(numel_out, 1)
        if not (rnumel <= 1 or (rnumel < rules.unroll and numel_out != 1)):
            return OpInfo(REDUCTION, _EPILOGUE.get((name, None), 0), nbytes=nbytes, nontrivial=nontrivial,
                          multi=multi)
        # a reduction over a few elements is unrolled into a pointwise expression
    if name in _SCATTERS:
        return OpInfo(SCATTER, nbytes=nbytes, nontrivial=nontrivial)
    if name == "cat":
        count = len(node.args[0]) if node.args and isinstance(node.args[0], (list, tuple)) else 1
        if rules.cpu or count > rules.pointwise_cat_inputs:
            return OpInfo(CAT, nbytes=nbytes, nontrivial=nontrivial)
    scalars = sum(1 for a in list(node.args) + list(node.kwargs.values())
                  if isinstance(a, (int, float)) and not isinstance(a, bool))
    # a node that reads no tensor (full, scalar_tensor, iota) is one op to Inductor's
    # counter: a constant or an index expression
    own = 1 if not node.all_input_nodes else 1 + min(0 if name in _INDEX_ARGS else scalars, 2)
    own += _promotions(node, name)
    return OpInfo(POINTWISE, own, heavy=name in _HEAVY, nbytes=nbytes, nontrivial=nontrivial,
                  moves=name in MOVES, multi=multi)


def _numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= compat.size_hint(s)
    return n


def _is_call(a) -> bool:
    return isinstance(a, Node) and a.op == "call_function"


def _promotions(node: Node, name: str) -> int:
    """Casts Inductor's type promotion adds to a pointwise op's expression: one ``to_dtype``
    for each tensor input whose dtype is not the dtype the op computes (its output's)."""
    if name in _NO_PROMOTION:
        return 0
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor):
        return 0
    return sum(1 for a in node.all_input_nodes
               if isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dtype != out.dtype)
