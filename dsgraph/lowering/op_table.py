"""Which aten ops the Triton code generator knows, and the Triton expression of each.

``classify(node)`` turns one FX node into an ``OpMatch`` (or None: the op is unsupported and
ends a region). A match names the operands (FX nodes, Python scalars) and how to compute
the result from operand expressions already converted to the right compute type::

    mul = aten.mul.Tensor(x, 0.5)       ->  OpMatch("pointwise", "mul", operands=(x,),
                                                    template="{0} * 0.5")
    amax = aten.amax(x, [-1], True)     ->  OpMatch("reduction", "max", operands=(x,),
                                                    keepdim=True)

Only Triton builtins appear in templates (``tl.exp``, ``tl.where``, ``tl.math.erf``...) and the
code generator's own helpers (``_round_bf16``, ``_erf``), never
``triton.language``'s own ``@jit`` helpers (``tl.sigmoid``, ``tl.sum``, ``tl.cdiv``): those are
interpreted only when TRITON_INTERPRET is set before triton is first imported, and the
generated kernels must run under the interpreter however it was switched on.

Compute types: floating values are computed in fp32 (fp64 stays fp64), whatever their
storage type; bf16/fp16 are rounded only where the graph casts explicitly and where a
value is stored, as Inductor does. Bools are ``tl.int1``, integers ``tl.int32``/``tl.int64``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
from torch.fx import Node

aten = torch.ops.aten
prims = torch.ops.prims

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SUPPORTED_DTYPES = FLOATS + (torch.bool, torch.int32, torch.int64)

TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.bool: "tl.int1", torch.int32: "tl.int32", torch.int64: "tl.int64",
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a value of storage type ``dtype`` is held in inside a kernel."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def literal(value) -> str:
    """A Python scalar as Triton source (deterministic: the source is part of the kernel key)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(value)


@dataclass(frozen=True)
class OpMatch:
    kind: str  # "pointwise", "reduction", "copy" (a write into an existing tensor), "getitem"
    name: str  # short op name for plans and kernel comments: "mul", "gelu", "sum", ...
    operands: tuple  # FX Nodes (tensors or SymInt scalars) and Python scalars, in template order
    template: str = ""  # pointwise: expression over "{i}" = operand i (already in compute type)
    operand_dtype: torch.dtype | None = None  # what operands are converted to (None: the result's)
    keepdim: bool = False  # reductions
    correction: float = 0.0  # var / var_mean
    index: int = 0  # getitem
    params: dict = field(default_factory=dict)


# ---- pointwise -----------------------------------------------------------------------

_UNARY = {
    aten.neg.default: ("neg", "-{0}"),
    aten.abs.default: ("abs", "tl.abs({0})"),
    aten.exp.default: ("exp", "tl.exp({0})"),
    aten.log.default: ("log", "tl.log({0})"),
    aten.sqrt.default: ("sqrt", "tl.sqrt({0})"),
    aten.rsqrt.default: ("rsqrt", "tl.rsqrt({0})"),
    aten.reciprocal.default: ("reciprocal", "1.0 / {0}"),
    aten.sigmoid.default: ("sigmoid", "1.0 / (1.0 + tl.exp(-{0}))"),
    aten.silu.default: ("silu", "{0} / (1.0 + tl.exp(-{0}))"),
    aten.clone.default: ("clone", "{0}"),
}

# tanh from exp: libdevice's tanh is not available under TRITON_INTERPRET, and one source
# for both keeps what the CPU tests check identical to what runs on the GPU. Near zero the
# exp form cancels (1 - 2/(e^2x + 1)), so small |x| use the odd Taylor series to x^7
# (error below 3e-8 relative for |x| < 0.0625).
TANH = ("tl.where(tl.abs({0}) < 0.0625, "
        "{0} * (1.0 + {0} * {0} * (-0.3333333333333333 + {0} * {0} * (0.13333333333333333 + {0} * {0} * -0.05396825396825397))), "
        "tl.where({0} < 0, -1.0, 1.0) * (1.0 - 2.0 / (tl.exp(2.0 * tl.abs({0})) + 1.0)))")


def _fill(template: str, *inner: str) -> str:
    """Substitute expressions into a template that names its operand several times."""
    out = template
    for i, expr in enumerate(inner):
        out = out.replace("{%d}" % i, f"({expr})" if not expr.isidentifier() else expr)
    return out


def erf_function(dtype: torch.dtype) -> str:
    """fp32: codegen's ``_erf`` (within 2 ulp, as libdevice's erff, in about 18 instructions
    where libdevice's takes about 30: GELU regions are compute-bound on an H200 otherwise);
    fp64: libdevice's erf."""
    return "tl.math.erf" if dtype == torch.float64 else "_erf"


def gelu_template(approximate: str, dtype: torch.dtype = torch.float32) -> str:
    if approximate == "tanh":
        inner = "0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0})"
        return "0.5 * {0} * (1.0 + %s)" % _fill(TANH, inner)
    return "0.5 * {0} * (1.0 + %s({0} * 0.7071067811865476))" % erf_function(dtype)


_BINARY = {
    aten.add.Tensor: ("add", "{0} + {1}"), aten.add.Scalar: ("add", "{0} + {1}"),
    aten.sub.Tensor: ("sub", "{0} - {1}"), aten.sub.Scalar: ("sub", "{0} - {1}"),
    aten.mul.Tensor: ("mul", "{0} * {1}"), aten.mul.Scalar: ("mul", "{0} * {1}"),
    aten.div.Tensor: ("div", "{0} / {1}"), aten.div.Scalar: ("div", "{0} / {1}"),
    # NaN-propagating, as torch.maximum / torch.minimum
    aten.maximum.default: ("maximum", "tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})"),
    aten.minimum.default: ("minimum", "tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})"),
}

_COMPARE = {}
for _name, _sym in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
    for _overload in ("Tensor", "Scalar"):
        _COMPARE[getattr(getattr(aten, _name), _overload)] = (_name, "{0} %s {1}" % _sym)


def _val(x):
    return x.meta.get("val") if isinstance(x, Node) else None


def _is_tensor(x) -> bool:
    return isinstance(_val(x), torch.Tensor)


def _is_sym_scalar(x) -> bool:
    """An FX node carrying an integer scalar (a size under dynamic shapes)."""
    return isinstance(x, Node) and isinstance(_val(x), (int, torch.SymInt)) and not isinstance(_val(x), bool)


def _scalar_ok(x) -> bool:
    return isinstance(x, (bool, int, float)) or _is_sym_scalar(x)


def _promote(operands) -> torch.dtype:
    """torch's type promotion of a binary op's operands (tensors by dtype and dimension,
    scalars by category), asked of ``torch.result_type`` on stand-ins without data."""
    def stand_in(x):
        if _is_tensor(x):
            t = _val(x)
            return torch.empty((1,) if t.dim() else (), dtype=t.dtype)
        if isinstance(x, Node):  # a SymInt scalar
            return 1
        return x

    a, b = (stand_in(x) for x in operands)
    return torch.result_type(a, b)


def _alpha(node: Node):
    return node.kwargs.get("alpha", 1)


def _pointwise(node: Node) -> OpMatch | None:
    target = node.target
    args = list(node.args)
    if target in _UNARY:
        if len(args) != 1 or node.kwargs or not _is_tensor(args[0]):
            return None
        name, template = _UNARY[target]
        return OpMatch("pointwise", name, (args[0],), template)
    if target is aten.relu.default:
        if len(args) != 1 or not _is_tensor(args[0]):
            return None
        zero = "0.0" if _val(node).dtype.is_floating_point else "0"
        # relu(nan) is nan in torch: compare "< 0", not "> 0"
        return OpMatch("pointwise", "relu", (args[0],), "tl.where({0} < 0, %s, {0})" % zero)
    if target is aten.tanh.default:
        if len(args) != 1 or not _is_tensor(args[0]):
            return None
        return OpMatch("pointwise", "tanh", (args[0],), TANH)
    if target is aten.erf.default:
        if len(args) != 1 or node.kwargs or not _is_tensor(args[0]):
            return None
        return OpMatch("pointwise", "erf", (args[0],), erf_function(compute_dtype(_val(node).dtype)) + "({0})")
    if target is aten.gelu.default:
        approximate = node.kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        if approximate not in ("none", "tanh") or not _is_tensor(args[0]):
            return None
        return OpMatch("pointwise", "gelu" if approximate == "none" else "gelu_tanh", (args[0],),
                       gelu_template(approximate, compute_dtype(_val(node).dtype)))
    if target in _BINARY:
        if len(args) != 2 or not all(_is_tensor(a) or _scalar_ok(a) for a in args):
            return None
        if set(node.kwargs) - {"alpha"} or (node.kwargs and target not in (aten.add.Tensor, aten.sub.Tensor)):
            return None
        name, template = _BINARY[target]
        alpha = _alpha(node)
        if alpha != 1:
            if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
                return None
            template = template.replace("{1}", "%s * {1}" % literal(alpha))
        return OpMatch("pointwise", name, tuple(args), template)
    if target in _COMPARE:
        if len(args) != 2 or node.kwargs or not all(_is_tensor(a) or _scalar_ok(a) for a in args):
            return None
        name, template = _COMPARE[target]
        return OpMatch("pointwise", name, tuple(args), template, operand_dtype=compute_dtype(_promote(args)))
    if target is aten.where.self:
        if len(args) != 3 or node.kwargs or not all(_is_tensor(a) for a in args) or _val(args[0]).dtype != torch.bool:
            return None
        return OpMatch("pointwise", "where", tuple(args), "tl.where({0}, {1}, {2})",
                       params={"condition": 0})
    if target is aten.pow.Tensor_Scalar:
        if len(args) != 2 or node.kwargs or not _is_tensor(args[0]) or not isinstance(args[1], (int, float)) \
                or isinstance(args[1], bool):
            return None
        return OpMatch("pointwise", "pow", (args[0],), pow_template(args[1]))
    if target in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        return _clamp(node)
    if target is prims.convert_element_type.default:
        if len(args) != 2 or node.kwargs or not _is_tensor(args[0]) or args[1] not in SUPPORTED_DTYPES:
            return None
        return _cast(node, args[0], args[1])
    if target is aten._to_copy.default:
        return _to_copy(node)
    return None


def pow_template(exponent) -> str:
    """x ** c for a Python scalar c: exact forms for the common exponents, repeated
    multiplication for small integers, exp2/log2 otherwise (NaN for a negative base with a
    fractional exponent, as torch)."""
    c = float(exponent)
    if c == 0:
        return "tl.where({0} == {0}, 1.0, 1.0)"  # 1 everywhere (torch: x**0 == 1, nan**0 == 1)
    if c == 0.5:
        return "tl.sqrt({0})"
    if c == -0.5:
        return "tl.rsqrt({0})"
    if c.is_integer() and abs(c) <= 8:
        product = " * ".join(["{0}"] * int(abs(c)))
        return product if c > 0 else "1.0 / (%s)" % product
    if c.is_integer():
        # odd integer powers keep the sign of the base
        magnitude = "tl.exp2(%s * tl.log2(tl.abs({0})))" % literal(c)
        if int(c) % 2:
            return "tl.where({0} < 0, -%s, %s)" % (magnitude, magnitude)
        return magnitude
    return "tl.exp2(%s * tl.log2({0}))" % literal(c)


def _clamp(node: Node) -> OpMatch | None:
    args = list(node.args)
    if not args or not _is_tensor(args[0]):
        return None
    if node.target is aten.clamp.default:
        lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    elif node.target is aten.clamp_min.default:
        lo, hi = (args[1] if len(args) > 1 else node.kwargs.get("min")), None
    else:
        lo, hi = None, (args[1] if len(args) > 1 else node.kwargs.get("max"))
    for bound in (lo, hi):
        if bound is not None and (not isinstance(bound, (int, float)) or isinstance(bound, bool)):
            return None
    # "where" keeps NaN (torch.clamp propagates it): a NaN compares false
    template = "{0}"
    if lo is not None:
        template = "tl.where(%s < %s, %s, %s)" % ("{0}", literal(lo), literal(lo), "{0}")
    if hi is not None:
        inner = template
        template = _fill("tl.where({0} > %s, %s, {0})" % (literal(hi), literal(hi)), inner)
    return OpMatch("pointwise", "clamp", (args[0],), template)


def _cast(node: Node, x: Node, dtype: torch.dtype) -> OpMatch:
    src = _val(x).dtype
    if dtype == torch.bool:
        return OpMatch("pointwise", "cast", (x,), "{0} != 0", operand_dtype=compute_dtype(src))
    if dtype == torch.bfloat16 and src != dtype:
        # round to bf16, then compute on in fp32 as eager would see it (codegen's helper:
        # Triton's interpreter truncates where the GPU rounds to nearest even)
        return OpMatch("pointwise", "cast", (x,), "_round_bf16({0})", operand_dtype=torch.float32)
    if dtype == torch.float16 and src != dtype:
        return OpMatch("pointwise", "cast", (x,), "{0}.to(tl.float16).to(tl.float32)",
                       operand_dtype=compute_dtype(src))
    return OpMatch("pointwise", "cast", (x,), "{0}.to(%s)" % TL_DTYPE[compute_dtype(dtype)],
                   operand_dtype=compute_dtype(src))


def _to_copy(node: Node) -> OpMatch | None:
    if len(node.args) != 1 or not _is_tensor(node.args[0]):
        return None
    kwargs = dict(node.kwargs)
    dtype = kwargs.pop("dtype", None)
    src = _val(node.args[0])
    if kwargs.pop("layout", torch.strided) not in (None, torch.strided):
        return None
    device = kwargs.pop("device", None)
    if device is not None and torch.device(device) != src.device:
        return None
    if kwargs.pop("memory_format", None) not in (None, torch.preserve_format):
        return None
    kwargs.pop("pin_memory", None)
    if kwargs or dtype is None or dtype not in SUPPORTED_DTYPES:
        return None
    return _cast(node, node.args[0], dtype)


# ---- reductions over the last dimension ------------------------------------------------

_REDUCTIONS = {
    aten.sum.dim_IntList: "sum",
    aten.mean.dim: "mean",
    aten.amax.default: "max",
    aten.var.correction: "var",
    aten.var_mean.correction: "var_mean",
}


def _last_dim_only(dims, rank: int) -> bool:
    if dims is None or rank == 0:
        return False
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    return len(dims) == 1 and isinstance(dims[0], int) and dims[0] % rank == rank - 1


def _reduction(node: Node) -> OpMatch | None:
    name = _REDUCTIONS[node.target]
    args = list(node.args)
    if not args or not _is_tensor(args[0]):
        return None
    x = _val(args[0])
    if x.dtype not in FLOATS or not _last_dim_only(args[1] if len(args) > 1 else node.kwargs.get("dim"), x.dim()):
        return None
    if name in ("sum", "mean"):
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        dtype = node.kwargs.get("dtype")
        if len(args) > 3 or set(node.kwargs) - {"keepdim", "dtype"} or (dtype is not None and dtype not in FLOATS):
            return None
        return OpMatch("reduction", name, (args[0],), keepdim=bool(keepdim))
    if name == "max":
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        return OpMatch("reduction", "max", (args[0],), keepdim=bool(keepdim))
    if len(args) > 2 or set(node.kwargs) - {"correction", "keepdim"}:
        return None
    correction = node.kwargs.get("correction")
    correction = 1.0 if correction is None else correction
    if not isinstance(correction, (int, float)) or isinstance(correction, bool):
        return None
    return OpMatch("reduction", name, (args[0],), keepdim=bool(node.kwargs.get("keepdim", False)),
                   correction=float(correction))


# ---- entry point ----------------------------------------------------------------------

def _dtypes_ok(node: Node, match: OpMatch) -> bool:
    vals = node.meta.get("val")
    outs = vals if isinstance(vals, (tuple, list)) else (vals,)
    if not all(isinstance(v, torch.Tensor) and v.dtype in SUPPORTED_DTYPES and v.layout == torch.strided
               for v in outs):
        return False
    devices = {v.device for v in outs}
    for x in match.operands:
        if _is_tensor(x):
            t = _val(x)
            if t.dtype not in SUPPORTED_DTYPES or t.layout != torch.strided:
                return False
            devices.add(t.device)
        elif not _scalar_ok(x):
            return False
    return len(devices) == 1


def classify(node: Node) -> OpMatch | None:
    """The op table's view of ``node``, or None when the code generator does not know it."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, Node) and src.target is aten.var_mean.correction and isinstance(node.args[1], int):
            return OpMatch("getitem", "getitem", (src,), index=node.args[1])
        return None
    if node.target is aten.copy_.default:
        # a write of a computed value into an existing tensor (a gradient-pool slot): the
        # kernel stores into it; only same shape and no broadcast
        if len(node.args) != 2 or node.kwargs or not all(_is_tensor(a) for a in node.args):
            return None
        dst, src = (_val(a) for a in node.args)
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype not in SUPPORTED_DTYPES or dst.device != src.device:
            return None
        return OpMatch("copy", "copy_", tuple(node.args))
    if node.target in _REDUCTIONS:
        match = _reduction(node)
    else:
        match = _pointwise(node)
    if match is None or not _dtypes_ok(node, match):
        return None
    return match
