"""A region as its kernel sees it: loads, values, reductions, stores; and its signature.

``region_ir(region)`` turns the FX nodes into a straight-line list of values, each a Triton
expression over earlier values (or a reduction of one). Sizes never appear: they are kernel
arguments, so the signature -- which names the kernel and keys the cache -- depends on the
op sequence, constants, dtypes, broadcast pattern (which inputs are per row) and rank only::

    x: bf16 [B, T, C], w: f32 [C]          loads  in0 (param 0, full), in1 (param 1, full)
    mul(x, w) -> convert(bf16)             values v0 = load in0; v1 = load in1; v2 = v0 * v1
                                                  v3 = v2.to(tl.bfloat16).to(tl.float32)
                                           stores out0 <- v3 (bf16, full)

The layout of every tensor (strides, broadcast) is a kernel argument too: a transposed or
broadcast input is the same kernel as a contiguous one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch.fx import Node

from dsgraph import compat

from .op_table import TL_DTYPE, compute_dtype, literal
from .regions import Region, same_shape


@dataclass(frozen=True)
class Param:
    """A tensor argument of the region's op (an FX input, or a tensor it writes into)."""

    node: str  # FX name, for plans only (not part of the signature)
    dtype: torch.dtype
    mutated: bool = False


@dataclass(frozen=True)
class Load:
    name: str  # "in0": the kernel's pointer argument
    param: int  # which Param
    space: str  # "full": indexed by row and column; "row": one value per row (last dim broadcast)
    # a full input broadcast over every row (a layer norm's weight, shape [N]): indexed by
    # the column alone, so the kernels load it once per program as a [1, BLOCK_N] tile
    # whatever BLOCK_M is, instead of once per row
    cols_only: bool = False


@dataclass(frozen=True)
class Store:
    name: str  # "out0"
    value: str  # the Value stored
    dtype: torch.dtype
    space: str  # "full", "row" (shape F[:-1] + [1]) or "rownk" (shape F[:-1])
    order: tuple[int, ...] = ()  # fresh full outputs: dims outermost first in memory
    param: int | None = None  # a write into an existing tensor (copy_ into a pool slot)
    node: str = ""  # FX name, for plans only


@dataclass(frozen=True)
class Value:
    name: str  # "v3"
    op: str  # "load", "scalar", "expr", "sum", "max"
    args: tuple[str, ...]  # values, loads or scalar arguments it reads
    dtype: torch.dtype  # compute type
    row: bool  # one value per row
    expr: str = ""  # "expr": Triton expression over "{i}" = args[i]
    label: str = ""  # the aten op it computes (kernel comments)


@dataclass(frozen=True)
class KernelIR:
    kind: str  # "pointwise" or "reduction"
    rank: int  # rank of the iteration space, at least 2 (lower ranks get leading 1s)
    params: tuple[Param, ...]
    scalars: int  # SymInt arguments a0, a1, ...
    loads: tuple[Load, ...]
    values: tuple[Value, ...]
    stores: tuple[Store, ...]

    def signature(self) -> str:
        lines = [f"kind={self.kind} rank={self.rank} scalars={self.scalars}"]
        lines += [f"param {p.dtype} mutated={p.mutated}" for p in self.params]
        lines += [f"load {l.name} param={l.param} {l.space}{' cols_only' if l.cols_only else ''}"
                  for l in self.loads]
        lines += [f"{v.name} = {v.op}{v.args} {v.dtype} row={v.row} {v.expr!r}" for v in self.values]
        lines += [f"store {s.name} <- {s.value} {s.dtype} {s.space} order={s.order} param={s.param}"
                  for s in self.stores]
        return "\n".join(lines)

    @property
    def name(self) -> str:
        digest = hashlib.sha256(self.signature().encode()).hexdigest()[:12]
        return f"dsg_{'pw' if self.kind == 'pointwise' else 'red'}_{digest}"

    def value(self, name: str) -> Value:
        return next(v for v in self.values if v.name == name)


def _val(x):
    return x.meta.get("val") if isinstance(x, Node) else None


def _dense_order(t: torch.Tensor) -> tuple[int, ...]:
    """Dims of ``t`` from outermost to innermost in memory (size hints, no guards)."""
    strides = [compat.size_hint(s) for s in t.stride()]
    return tuple(sorted(range(t.dim()), key=lambda d: (-strides[d], d)))


def _input_space(t: torch.Tensor, full: tuple) -> str:
    """'row' when the input's last dimension is broadcast against F's (absent or 1)."""
    if not full or (isinstance(full[-1], int) and full[-1] == 1):
        return "full"
    if t.dim() == 0 or (isinstance(t.shape[-1], int) and t.shape[-1] == 1):
        return "row"
    return "full"


def _one(s) -> bool:
    return isinstance(s, int) and s == 1


def _cols_only(t: torch.Tensor, full: tuple) -> bool:
    """Is a full input the same for every row: each of its leading dims absent or 1 (known,
    not symbolic), where F has rows to broadcast over (a leading dim that is not 1)?"""
    if len(full) < 2 or _one(full[-1]) or all(_one(s) for s in full[:-1]):
        return False
    return all(_one(s) for s in t.shape[:-1])


class _Builder:
    def __init__(self, region: Region):
        self.region = region
        self.full = tuple(region.full_shape)
        self.params: list[Param] = []
        self.param_of: dict[Node, int] = {}
        self.scalar_of: dict[Node, str] = {}
        self.loads: list[Load] = []
        self.load_of: dict[tuple[Node, str], str] = {}
        self.values: list[Value] = []
        self.env: dict[Node, object] = {}  # member -> value name (var_mean: (var, mean))

    def new(self, op: str, args: tuple, dtype: torch.dtype, row: bool, expr: str = "", label: str = "") -> str:
        name = f"v{len(self.values)}"
        self.values.append(Value(name, op, tuple(args), dtype, row, expr, label))
        return name

    def param(self, node: Node, mutated: bool = False) -> int:
        if node not in self.param_of:
            self.param_of[node] = len(self.params)
            self.params.append(Param(node.name, _val(node).dtype, mutated))
        elif mutated:
            i = self.param_of[node]
            self.params[i] = Param(node.name, self.params[i].dtype, True)
        return self.param_of[node]

    def load(self, node: Node, consumer_space: str) -> str:
        t = _val(node)
        space = "row" if consumer_space != "full" else _input_space(t, self.full)
        key = (node, space)
        if key not in self.load_of:
            name = f"in{len(self.loads)}"
            self.loads.append(Load(name, self.param(node), space, space == "full" and _cols_only(t, self.full)))
            # labels name the op's argument (x0, x1, ...), never FX names: kernels are shared
            # between regions with one signature, so their source must not name one graph
            self.load_of[key] = self.new("load", (name,), compute_dtype(t.dtype), space == "row",
                                         label=f"x{self.param_of[node]}")
        return self.load_of[key]

    def scalar(self, node: Node) -> str:
        if node not in self.scalar_of:
            self.scalar_of[node] = f"a{len(self.scalar_of)}"
        return self.scalar_of[node]

    def cast(self, value: str, dtype: torch.dtype) -> str:
        v = self.values[int(value[1:])]
        if v.dtype == dtype:
            return value
        if dtype == torch.bool:
            return self.new("expr", (value,), dtype, v.row, "{0} != 0", "to_bool")
        return self.new("expr", (value,), dtype, v.row, "{0}.to(%s)" % TL_DTYPE[dtype], "to")

    def operand(self, x, space: str, dtype: torch.dtype | None) -> str:
        """Template text for one operand: a literal, a scalar argument, or a value name."""
        if not isinstance(x, Node):
            return literal(x)
        val = _val(x)
        if not isinstance(val, torch.Tensor):
            return self.scalar(x)
        name = self.env[x] if x in self.env else self.load(x, space)
        return self.cast(name, dtype) if dtype is not None else name

    def reduce(self, op: str, value: str, label: str) -> str:
        return self.new(op, (value,), self.values[int(value[1:])].dtype, True, label=label)

    def node(self, n: Node) -> None:
        m = self.region.matches[n]
        row = self.region.space.get(n, "full") != "full"
        if m.kind == "getitem":
            self.env[n] = self.env[m.operands[0]][m.index]
            return
        if m.kind == "copy":
            return  # a store (below)
        if m.kind == "reduction":
            x = m.operands[0]
            acc = compute_dtype(_val(x).dtype)
            v = self.operand(x, "full", acc)  # a reduction reads a full value
            total = self.reduce("max" if m.name == "max" else "sum", v, m.name)
            if m.name in ("sum", "max"):
                self.env[n] = total
                return
            mean = self.new("expr", (total,), acc, True, "{0} / N", "mean")
            if m.name == "mean":
                self.env[n] = mean
                return
            # var: two passes (mean, then squares about it), as exact as Welford's
            centered = self.new("expr", (v, mean), acc, False, "{0} - {1}", "var")
            squares = self.new("expr", (centered,), acc, False, "{0} * {0}", "var")
            total2 = self.reduce("sum", squares, "var")
            var = self.new("expr", (total2,), acc, True,
                           "{0} / tl.maximum(N - %s, 0.0)" % literal(m.correction), "var")
            self.env[n] = var if m.name == "var" else (var, mean)
            return
        out = compute_dtype(_val(n).dtype)
        want = m.operand_dtype or out
        args, texts = [], []
        for i, x in enumerate(m.operands):
            dtype = None if m.params.get("condition") == i else want
            text = self.operand(x, self.region.space[n], dtype)
            if isinstance(x, Node) and isinstance(_val(x), torch.Tensor):
                texts.append("{%d}" % len(args))
                args.append(text)
            else:
                texts.append(text)
        expr = m.template
        for i, t in enumerate(texts):
            expr = expr.replace("{%d}" % i, "\x00%d\x00" % i)
        for i, t in enumerate(texts):
            expr = expr.replace("\x00%d\x00" % i, t)
        self.env[n] = self.new("expr", tuple(args), out, row, expr, m.name)


@dataclass(frozen=True)
class Binding:
    """What the region's op is called with, in order: tensors (inputs, then slots it only
    writes) and SymInt scalars."""

    params: tuple[Node, ...]
    scalars: tuple[Node, ...]


def region_ir(region: Region) -> tuple[KernelIR, Binding]:
    b = _Builder(region)
    for n in region.nodes:
        b.node(n)
    stores: list[Store] = []
    for n in region.outputs:
        t = _val(n)
        space = region.space[n]
        order = _dense_order(t) if space == "full" else ()
        stores.append(Store(f"out{len(stores)}", b.env[n], t.dtype, space, order, None, n.name))
    for w in region.writes:
        dst, src = w.args
        stores.append(Store(f"out{len(stores)}", b.env[src], _val(dst).dtype, "full", (), b.param(dst, True), w.name))
    full = tuple(region.full_shape)
    for s in stores:
        if s.space == "full" and b.values[int(s.value[1:])].row:
            raise ValueError(f"store {s.node}: a full output computed per row")  # _domain rules it out
    for n in region.outputs:
        want = {"full": full, "row": full[:-1] + (1,), "rownk": full[:-1]}[region.space[n]]
        if not same_shape(tuple(_val(n).shape), want):
            raise ValueError(f"output {n.name}: shape {tuple(_val(n).shape)} is not its space's {want}")
    ir = KernelIR(region.kind, max(len(full), 2), tuple(b.params), len(b.scalar_of), tuple(b.loads),
                  tuple(b.values), tuple(stores))
    return ir, Binding(tuple(b.param_of), tuple(b.scalar_of))
