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
from .inductor_read_maps import _INDIRECT, _UNROLLED, read_maps, scatter_slice
from .inductor_reductions import mean_epilogue, numel, reduces_trailing_dims, variance_epilogue
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
# reductions whose result is a pointwise expression over their buffer: mean = sum / n,
# and the variance (``variance_epilogue``); (op, getitem index) for multi-output ones
_VARIANCE = {("var", None), ("var_mean", 0)}
# ops whose lowering returns their input's loader unchanged (``clone``; a cast to the
# dtype it already has): no op of their own
_IDENTITY = {"clone", "alias", "contiguous"}
_CASTS = {"convert_element_type", "_to_copy"}
# ops that make a constant (``ops.constant``): shared by every use in an expression
_CONSTANT_MAKERS = {"full", "scalar_tensor", "zeros", "ones", "full_like", "zeros_like", "ones_like"}
# ops whose integer arguments are dimensions, not constants of the expression
_INDEX_ARGS = {"gather"}
# ops that compute in their inputs' promoted dtype and return bool or select: no cast counted
_NO_PROMOTION = {"eq", "ne", "lt", "le", "gt", "ge", "where", "convert_element_type", "_to_copy", "clone"}
_MUTATING = {"copy_"}
# pointwise lowerings that store their result (``lowering.inductor_random``: ``result.realize()``)
_REALIZED = {"inductor_random"}
# pointwise lowerings whose own ops read the index (masks of a slice, a pad, a cat)
_INDEX_READING = {"slice_scatter", "select_scatter", "constant_pad_nd", "cat", "iota", "arange"}
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
    # use_two_step_variance: a variance over at most this many elements is a sum of
    # squares (cpp / triton threshold); CUDA leaves (unroll, min_numel) to Welford
    two_step_variance: int = 1024
    two_step_generic: int = 8  # elsewhere (not the CPU, not CUDA half precision)
    two_step_min_numel: int = 0
    # the scheduler's fusion limits: kernels in one fused kernel (max_fusion_size), in a
    # horizontally fused one (CPU: cpp.max_horizontal_fusion_size), how many later sharers
    # of a buffer each kernel is tried with (max_fusion_buffer_group_pairwise_attempts),
    # the bytes two kernels must share to fuse horizontally (score_fusion_memory_threshold)
    max_fusion: int = 64
    horizontal_size: int = 16
    fusion_pairs: int = 64
    fusion_score: int = 10

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
    # per input (FX's ``all_input_nodes`` order, each once): the index maps it is read at
    # (``inductor_index.Step``; None: at this node's own index), one per read
    maps: tuple = ()
    # per output tensor of an extern kernel or a graph input, (sizes, strides): where its
    # elements lie in memory, which Inductor's loads index (a pointwise buffer's layout is
    # Inductor's own, row-major: None)
    layouts: tuple = ()
    # constants the expression holds (``ops.constant`` / an index constant, by value and
    # dtype): Inductor's counter counts each once per expression, whoever made it
    consts: frozenset = frozenset()
    # tuple index of each output tensor (``nbytes``' order): a multi-output op may return
    # None in places (``convolution_backward`` without grad_input)
    elements: tuple = ()
    # an extern kernel whose lowering puts a stride constraint on its inputs first
    # (``maybe_layout_constraints``): "strides"; "conv": the convolutions', which apply
    # only in a graph without layout optimization (``constrain_conv_to_fx_strides``)
    constraint: str = ""
    # a reduction over its input's last dimensions: it reads the input at the index a
    # pointwise kernel over that input reads it at (Inductor's in-place rule compares them)
    trailing: bool = False
    # dimensions of its (first) output tensor: ``run_node`` fixes a graph output's strides
    # (which realizes it) only when it has some
    dims: int = 0
    # a fallback kernel (``FallbackKernel``, its tuple taken apart by ``MultiOutput``s): the
    # op allocates its outputs itself (``should_allocate`` is False), so the wrapper's pool
    # never hands it a freed buffer, though what it returns goes to the pool when freed
    self_allocating: bool = False
    # the sizes of its (largest) output in the order of its strides, dimensions of one
    # element left out: the loop a pointwise kernel runs over, which the CPU scheduler's
    # horizontal fusion compares (``loop_shape``)
    shape: tuple = ()
    # the inputs (positions in ``maps``' order) a 2-D convolution's lowering asks for in
    # channels-last layout with layout optimization on (``require_channels_last``), which
    # copies a graph input in another layout: a convolution's input and weight;
    # ``convolution_backward``'s output gradient, its input for the weight gradient and its
    # weight for the input gradient (by ``output_mask``: the stem's weight is not copied)
    channels_last_args: tuple = ()
    # a pointwise op whose lowering stores its result itself (``inductor_random``:
    # ``result.realize()``), whatever its users: a buffer also where the mask made from
    # it is all that is read, in the forward and where the backward recomputes it
    realized: bool = False
    # ``convolution_backward``'s input (its position, -1: another op): without layout
    # optimization its lowering asks the same inputs for its results' strides
    # (``require_stride_order``), which are channels last when its input is
    # (``meta_convolution_backward``'s memory format)
    conv_input: int = -1

    @property
    def reads_index(self) -> bool:
        """Its own ops read the index they are evaluated at (an iota, a slice_scatter's or a
        pad's mask, a pointwise cat's), so two evaluations at two indices are two even
        where its inputs agree (``inductor_model``'s term keys)."""
        return self.kind == POINTWISE and (self.name in _INDEX_READING or (self.own_ops > 0 and not self.maps))

    @property
    def bytes(self) -> int:
        return self.nbytes[0] if self.nbytes else 0


def loop_shape(t: torch.Tensor) -> tuple:
    """The loop a pointwise kernel writing ``t`` runs over, outermost first: its sizes in
    the order of its strides, largest first, size-1 dimensions left out.

    Inductor's ``ComputedBuffer.simplify_and_reorder`` orders a kernel's loop by the strides
    its store and loads see (``pick_loop_order``); the buffer keeps the FX strides when a
    reader constrains them (the attention's ``sdpa_constraint``, a matmul's fixed layout, a
    graph output), and a pointwise node's FX strides follow its inputs' as its loads do. So
    a (batch, heads, positions, head size) tensor stored heads inside positions iterates
    (batch, positions, heads, head size), and fuses horizontally on a CPU with a contiguous
    tensor of those sizes, not with a contiguous one of its own sizes (issue 12)."""
    sizes = [int(compat.size_hint(s)) for s in t.shape]
    strides = [int(compat.size_hint(s)) for s in t.stride()]
    order = sorted(range(len(sizes)), key=lambda d: -strides[d])
    return tuple(sizes[d] for d in order if sizes[d] != 1)


def classify(node: Node, rules: Rules) -> OpInfo:
    """What Inductor makes of one FX node, from its op and fake value."""
    val = node.meta.get("val")
    vals = tensor_values(val)
    nbytes = tuple(int(numel(t)) * t.element_size() for _, t in vals)
    info = _classify(node, rules, val, vals, nbytes)
    if info.kind in (POINTWISE, VIEW):
        info.maps = read_maps(node, info.name or op_name(node), info.kind == VIEW)
    info.dtypes = tuple(t.dtype for _, t in vals)
    if info.kind in (EXTERN, PLACEHOLDER):  # a layout fixed by the kernel or the caller
        info.layouts = tuple((tuple(int(compat.size_hint(d)) for d in t.shape),
                              tuple(int(compat.size_hint(d)) for d in t.stride())) for _, t in vals)
    info.elements = tuple(k if k is not None else 0 for k, _ in vals)
    if info.kind == EXTERN and node.op == "call_function":
        info.constraint = _constraint(node)
        info.channels_last_args = _channels_last_args(node)
        if node.target is torch.ops.aten.convolution_backward.default and isinstance(node.args[1], Node):
            info.conv_input = list(dict.fromkeys(node.all_input_nodes)).index(node.args[1])
    info.name = op_name(node) if node.op == "call_function" else ""
    info.loop = info.numel = max((numel(t) for _, t in vals), default=0)
    info.dims = vals[0][1].dim() if vals else 0
    largest = max((t for _, t in vals), key=numel, default=None)
    if largest is not None:
        info.shape = loop_shape(largest)
    if info.kind == REDUCTION:
        info.loop = max([numel(a.meta["val"]) for a in node.all_input_nodes
                         if isinstance(a.meta.get("val"), torch.Tensor)] + [info.loop])
    return info


def _classify(node: Node, rules: Rules, val, vals, nbytes) -> OpInfo:
    multi = isinstance(val, (tuple, list))
    nontrivial = any(numel(t) > 1 for _, t in vals)
    if node.op in ("placeholder", "get_attr"):
        return OpInfo(PLACEHOLDER, 0, nbytes=nbytes, nontrivial=nontrivial)
    if node.op != "call_function":
        return OpInfo(NONE)
    if node.target is operator.getitem:
        # var_mean's variance is an expression over its reduction's buffer, not the buffer
        src = node.args[0]
        if _is_call(src) and (op_name(src), node.args[1]) in _VARIANCE:
            own, consts = variance_epilogue(src, rules)
            return OpInfo(GETITEM, own, nbytes=nbytes, nontrivial=nontrivial, consts=consts)
        return OpInfo(GETITEM, 0, nbytes=nbytes, nontrivial=nontrivial)
    target = node.target
    if not compat.is_op(target):
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi)
    name = op_name(node)
    lowerings, fallbacks, needs_realized = _registries()
    realizing = target in needs_realized
    # a mutation, a scatter, a concat kernel: a buffer, no ops of an expression of their own
    if name in _MUTATING:
        return OpInfo(MUTATE, 0, nbytes=nbytes)
    if is_view(node):
        return OpInfo(VIEW, 0, nbytes=nbytes, nontrivial=nontrivial, moves=name in MOVES, multi=multi)
    if target in fallbacks or realizing or target not in lowerings or name in _TEMPLATES:
        return OpInfo(EXTERN, nbytes=nbytes, multi=multi, realizes_inputs=realizing,
                      self_allocating=target in fallbacks or target not in lowerings)
    if name in _REDUCTIONS:
        numel_in = max((numel(a.meta["val"]) for a in node.all_input_nodes
                        if isinstance(a.meta.get("val"), torch.Tensor)), default=1)
        numel_out = max((numel(t) for _, t in vals), default=1)
        rnumel = numel_in // max(numel_out, 1)
        if not (rnumel <= 1 or (rnumel < rules.unroll and numel_out != 1)):
            own, consts = 0, frozenset()
            if name == "mean":
                own, consts = mean_epilogue(node)
            elif (name, None) in _VARIANCE:
                own, consts = variance_epilogue(node, rules)
            return OpInfo(REDUCTION, own, nbytes=nbytes, nontrivial=nontrivial, multi=multi, consts=consts,
                          trailing=reduces_trailing_dims(node))
        if name in _UNROLLED and rnumel > 1:  # a reduction over a few elements is unrolled into a pointwise expression
            own, consts = mean_epilogue(node) if name == "mean" else (0, frozenset())
            return OpInfo(POINTWISE, own + max(rnumel - 1, 0) + _promotions(node, name), nbytes=nbytes,
                          nontrivial=nontrivial, multi=multi, name=name, consts=consts)
    if name in _SCATTERS:
        return OpInfo(SCATTER, 0, nbytes=nbytes, nontrivial=nontrivial)
    if name == "cat":
        count = len(node.args[0]) if node.args and isinstance(node.args[0], (list, tuple)) else 1
        if rules.cpu or count > rules.pointwise_cat_inputs:
            return OpInfo(CAT, 0, nbytes=nbytes, nontrivial=nontrivial)
    own, consts = _pointwise_ops(node, name, val)
    return OpInfo(POINTWISE, own, heavy=name in compat.CPU_HEAVY_OPS, nbytes=nbytes, nontrivial=nontrivial,
                  moves=name in MOVES, multi=multi, consts=consts, realized=name in _REALIZED)


def _channels_last_args(node: Node) -> tuple[int, ...]:
    """``OpInfo.channels_last_args`` (torch/_inductor/kernel/conv.py: ``convolution`` and
    ``convolution_backward_lowering`` under ``V.graph.layout_opt``)."""
    target, args = node.target, node.args
    if target is torch.ops.aten.convolution.default:
        wanted = args[:2]
    elif target is torch.ops.aten.convolution_backward.default and len(args) > 10:
        grad_input, grad_weight = args[10][0], args[10][1]  # output_mask
        wanted = [a for a, asked in ((args[0], grad_input or grad_weight), (args[1], grad_weight),
                                     (args[2], grad_input)) if asked]
    else:
        return ()
    inputs = list(dict.fromkeys(node.all_input_nodes))
    return tuple(sorted({inputs.index(a) for a in wanted if isinstance(a, Node) and a in inputs}))


def _constraint(node: Node) -> str:
    """What stride constraint Inductor's lowering puts on the inputs of this extern kernel
    (``OpInfo.constraint``)."""
    target = node.target
    if target in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default):
        return "conv"
    lowerings, fallbacks, _ = _registries()
    found = compat.inductor_layout_constraint(target, target in lowerings or target in fallbacks)
    if found == "fake" and "eager_input_vals" not in node.meta:
        return ""  # constrain_to_fake_tensors only constrains a node that recorded its eager inputs
    return found or ""


def _pointwise_ops(node: Node, name: str, val) -> tuple[int, frozenset]:
    """(ops of its own, constants) a pointwise node adds to an expression."""
    out_dtype = val.dtype if isinstance(val, torch.Tensor) else None
    if not node.all_input_nodes:
        if name in _CONSTANT_MAKERS:  # ops.constant(value): one per expression, shared
            value = next((a for a in node.args if isinstance(a, (int, float, bool))), name)
            return 0, frozenset({("constant", repr(value), out_dtype)})
        return 1, frozenset()  # iota: an index expression
    if name in _IDENTITY or (name in _CASTS and _same_dtype(node)):
        return 0, frozenset()  # the input's loader, unchanged
    if name == "slice_scatter":
        return _slice_scatter_ops(node)
    if name == "pow" and len(node.args) > 1 and isinstance(node.args[1], (int, float)) \
            and not isinstance(node.args[1], bool) and isinstance(node.args[0], Node):
        got = _pow_scalar_ops(node.args[1], out_dtype)
        if got is not None:
            return got[0] + _promotions(node, name), got[1]
    if (name, 0) in _INDIRECT:
        # the lowering loads the indices, wraps them in ``ops.indirect_indexing`` (which
        # Inductor's counter does not count) and loads the data there: no op of its own, and
        # the integer indices are not cast to the data's dtype (Llama's causal mask counted
        # one op too many per index: session 28)
        return 0, frozenset()
    # scalar arguments are constants of the expression (Inductor's counter sees each once)
    scalars = [a for a in list(node.args) + list(node.kwargs.values())
               if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if name in _INDEX_ARGS:
        scalars = []
    first = next((a.meta["val"].dtype for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)),
                 out_dtype)
    # by the value as written: Inductor's counter tells ``constant(0, ...)`` from ``constant(0.0, ...)``
    consts = frozenset(("constant", repr(a), first if not (isinstance(a, float) and first is not None
                                                      and not first.is_floating_point) else out_dtype)
                       for a in scalars[:2])
    return 1 + _promotions(node, name), consts


def _pow_scalar_ops(exponent, dtype) -> tuple[int, frozenset] | None:
    """A tensor to a scalar power as Inductor's ``pow`` lowering writes it (lowering.py): an
    integral float exponent taken as an int; 0.5 a ``sqrt``; 1 the input's loader (a
    clone); an int exponent below 32 in size multiplications by squaring
    (``pow_recursive``: a reciprocal first for a negative one, a constant 1 for 0). None:
    ``ops.pow`` with the exponent as a constant, the default count. Llama's RMSNorm
    backward has ``pow(x, 2)`` (a load and one mul, not three ops) and ``pow(x, 1.0)``
    (the load alone): counted as ``ops.pow`` they put the rotary backward's expression
    over the GPU's and torch 2.11 CPU's 30-op threshold, where Inductor inlines it."""
    if isinstance(exponent, float) and exponent.is_integer():
        exponent = int(exponent)
    if isinstance(exponent, float):
        return (1, frozenset()) if exponent == 0.5 else None
    if exponent == 1:
        return 0, frozenset()
    if not -32 < exponent < 32:
        return None

    def muls(y: int) -> int:
        return 0 if y <= 1 else muls(y // 2) + 1 + y % 2

    if exponent == 0:
        return 0, frozenset({("constant", "1", dtype)})
    return (1 if exponent < 0 else 0) + muls(abs(exponent)), frozenset()


def _same_dtype(node: Node) -> bool:
    a, out = node.args[0] if node.args else None, node.meta.get("val")
    return (isinstance(a, Node) and isinstance(a.meta.get("val"), torch.Tensor) and isinstance(out, torch.Tensor)
            and a.meta["val"].dtype == out.dtype)


def _slice_scatter_ops(node: Node) -> tuple[int, frozenset]:
    """``where(mask, masked(mask, src at the shifted index), x)``, the mask comparing the
    index along ``dim`` with the slice's bounds (index constants); a slice of everything is
    the source's loader alone (lowering.py ``slice_scatter``)."""
    x = node.args[0].meta["val"]
    dim, start, end, step = scatter_slice(node)
    size = int(compat.size_hint(x.shape[dim]))
    if start == 0 and end == size and step == 1:
        return 0, frozenset()
    consts, masks = set(), 0
    if start != 0:
        consts.add(("index", start))
        masks += 1
    if end != size:
        consts.add(("index", end))
        masks += 1
    own = 0
    if step != 1:
        own += 2  # the modular index and its comparison with 0
        consts.add(("constant", "0", torch.int64))
        masks += 1
    # index_expr of the index, the comparisons and their ``and``, masked, where
    return own + 1 + masks + (masks - 1) + 2, frozenset(consts)


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
