"""Where the chunk_loss pass applies: ``F.linear`` (or a matmul) whose output reaches
``F.cross_entropy`` through row-preserving ops only, on Dynamo's graph (``find_loss_sites``
returns each such ``LossSite``, and why other cross-entropies are not one). Not a pass of
its own: ``dsgraph.passes.chunk_loss`` plans and rewrites the sites found here.
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.runtime import linear_cross_entropy as lce

_CROSS_ENTROPY = {F.cross_entropy}
_LINEAR = {F.linear}  # Dynamo records nn.Linear and F.linear as this builtin
_MATMUL = {operator.matmul, torch.matmul, torch.mm}
_MATMUL_METHODS = {"matmul", "mm", "__matmul__"}


def _projection_kind(node: Node) -> str | None:
    """"linear" (``F.linear`` / ``nn.Linear``), "matmul" (``x @ M``, ``torch.matmul``,
    ``x.matmul(M)``), or None."""
    if node.op == "call_function" and node.target in _LINEAR:
        return "linear"
    if (node.op == "call_function" and node.target in _MATMUL) or (
            node.op == "call_method" and node.target in _MATMUL_METHODS):
        return "matmul"
    return None


def _arg(node: Node, index: int, name: str) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)
_CASTS = {"float", "double", "half", "bfloat16", "to", "type"}
_SAME_ROWS = {"contiguous", "clone"}
_RESHAPES = {"view", "reshape", "flatten"}
_RESHAPE_FUNCTIONS = {torch.reshape: "reshape", torch.flatten: "flatten"}
_CE_SIGNATURE = inspect.signature(F.cross_entropy)


def value(node: Any) -> Any:
    """The fake value of a node: Dynamo's ``example_value``, or ``val`` (make_fx graphs)."""
    if not isinstance(node, Node):
        return node
    return node.meta.get("example_value", node.meta.get("val"))


def method_name(node: Node) -> str | None:
    """The name of the tensor method or function a node applies to its first argument."""
    if node.op == "call_method":
        return node.target
    if node.op == "call_function":
        if node.target in _RESHAPE_FUNCTIONS:
            return _RESHAPE_FUNCTIONS[node.target]
        if node.target is operator.getitem:
            return "getitem"
    return None


def _keeps_last(index: Any, ndim: int) -> bool:
    """Does ``t[index]`` (t of ``ndim`` dims) leave the last dimension whole and last?"""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, (Node, torch.Tensor, list)) or i is None for i in items):
        return False  # advanced indexing or new dims: rows would not map one to one
    if Ellipsis in items:
        after = items[items.index(Ellipsis) + 1:]
        return not after or after[-1] == slice(None)
    if len(items) < ndim:
        return True
    return len(items) == ndim and items[-1] == slice(None)


def _row_op(node: Node, vocab: int) -> tuple[str, str] | str:
    """(kind, method) of an op that keeps the logits' rows (one row of V per token), or why not.
    kinds: "cast" (dtype only), "same" (no change of rows), "rows" (the same op applies to
    the projection's input with its last dimension D in place of V)."""
    method = method_name(node)
    out, src = value(node), value(node.args[0]) if node.args else None
    if method is None or not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return f"{node.name} ({node.target if node.op != 'call_method' else '.' + node.target}) is not a row-preserving op"
    if out.shape[-1] != vocab or src.shape[-1] != vocab:
        return f"{node.name} ({method}) changes the vocabulary dimension"
    if method in _CASTS:
        if tuple(out.shape) != tuple(src.shape) or out.device != src.device:
            return f"{node.name} (.{method}) changes more than the dtype"
        return ("cast", method)
    if method in _SAME_ROWS:
        return ("same", method)
    if method in _RESHAPES:
        return ("rows", method)
    if method == "getitem":
        if not _keeps_last(node.args[1], src.dim()):
            return f"{node.name} (indexing) does not keep the vocabulary dimension whole"
        return ("rows", method)
    return f"{node.name} (.{method}) is not a row-preserving op"


@dataclass
class LossSite:
    """One output projection + cross-entropy found in the graph."""

    loss: str  # the cross_entropy node
    projection: str  # the linear / matmul node
    kind: str  # "linear" or "matmul"
    x: str  # the projection's input
    weight: str
    bias: str | None
    targets: str
    chain: list[tuple[str, str, str]]  # (node, kind, method) from the projection to the loss
    ignore_index: int
    reduction: str
    label_smoothing: float
    mm_dtype: torch.dtype
    loss_dtype: torch.dtype
    tokens: Any  # int or SymInt: rows reaching the loss
    dim: int
    vocab: int
    tied: bool  # the weight is also read elsewhere (an embedding table)
    device: torch.device
    x_dtype: torch.dtype
    w_dtype: torch.dtype

    @property
    def tokens_hint(self) -> int:
        return compat.size_hint(self.tokens)


def _ce_args(node: Node) -> dict[str, Any]:
    bound = _CE_SIGNATURE.bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _site(gm: GraphModule, ce: Node) -> LossSite | str:
    args = _ce_args(ce)
    inp, targets = args["input"], args["target"]
    for key in ("weight", "size_average", "reduce"):
        if args[key] is not None:
            return f"{ce.name}: cross_entropy with {key}= is not chunked"
    if args["reduction"] not in lce.REDUCTIONS:
        return f"{ce.name}: cross_entropy with reduction={args['reduction']!r} is not chunked (mean or sum only)"
    if not isinstance(args["ignore_index"], int) or not isinstance(args["label_smoothing"], (int, float)):
        return f"{ce.name}: ignore_index and label_smoothing must be constants"
    logits_in, t = value(inp), value(targets)
    if not isinstance(inp, Node) or not isinstance(logits_in, torch.Tensor) or logits_in.dim() != 2:
        return f"{ce.name}: the cross_entropy input is not a 2-D tensor (tokens, vocabulary)"
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point:
        return f"{ce.name}: the targets are not class indices (1-D integers)"
    vocab = logits_in.shape[-1]
    chain: list[tuple[str, str, str]] = []
    cur = inp
    while _projection_kind(cur) is None:
        if cur.op != "call_function" and cur.op != "call_method":
            return f"{ce.name}: no cross_entropy after a matmul (its input comes from {cur.op} {cur.name})"
        op = _row_op(cur, vocab)
        if isinstance(op, str):
            return f"{ce.name}: no cross_entropy after a matmul: {op}"
        chain.append((cur.name, *op))
        cur = cur.args[0]
    projection = cur
    chain.reverse()
    # every value between the projection and the loss must be read by the next op only
    path = [projection] + _chain_nodes(gm, chain)
    for a, b in zip(path, path[1:] + [ce]):
        others = [u.name for u in a.users if u is not b]
        if others:
            return (f"{ce.name}: the logits ({a.name}) are also read by {', '.join(others)}: chunking would not "
                    "remove them")
    kind = _projection_kind(projection)
    if kind == "linear":
        x, weight, bias = _arg(projection, 0, "input"), _arg(projection, 1, "weight"), _arg(projection, 2, "bias")
    else:
        x, bias = _arg(projection, 0, "input"), None
        weight = _arg(projection, 1, "other") if _arg(projection, 1, "other") is not None else projection.kwargs.get("mat2")
    if not isinstance(x, Node) or not isinstance(weight, Node):
        return f"{ce.name}: the projection {projection.name}'s operands are not tensors of the graph"
    xv, wv, out = value(x), value(weight), value(projection)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or wv.dim() != 2 or xv.dim() < 1:
        return f"{ce.name}: the projection {projection.name} is not (..., D) @ a 2-D weight"
    if kind == "matmul":
        wv = wv.t()
    if wv.shape[0] != vocab or xv.shape[-1] != wv.shape[1]:
        return f"{ce.name}: the projection {projection.name} does not map D to the vocabulary"
    if bias is not None and not isinstance(bias, Node):
        return f"{ce.name}: the projection's bias is not a tensor"
    weight_users = [u for u in weight.users if u is not projection]
    return LossSite(
        loss=ce.name, projection=projection.name, kind=kind, x=x.name, weight=weight.name,
        bias=bias.name if bias is not None else None, targets=targets.name, chain=chain,
        ignore_index=int(args["ignore_index"]), reduction=args["reduction"],
        label_smoothing=float(args["label_smoothing"]), mm_dtype=out.dtype, loss_dtype=logits_in.dtype,
        tokens=logits_in.shape[0], dim=int(compat.size_hint(xv.shape[-1])), vocab=int(compat.size_hint(vocab)),
        tied=bool(weight_users) and weight.op == "placeholder", device=xv.device, x_dtype=xv.dtype,
        w_dtype=wv.dtype,
    )


def _chain_nodes(gm: GraphModule, chain) -> list[Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    return [by_name[name] for name, _, _ in chain]


def find_loss_sites(gm: GraphModule) -> tuple[list[LossSite], list[str]]:
    """The chunkable sites, and why each other cross_entropy (or the graph) is not one."""
    ces = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _CROSS_ENTROPY]
    if not ces:
        return [], ["no cross_entropy in the graph"]
    sites, reasons = [], []
    for ce in ces:
        found = _site(gm, ce)
        (reasons if isinstance(found, str) else sites).append(found)
    return sites, reasons
