"""What ``dsgraph::linear_cross_entropy[_grads]`` costs: its FLOPs (registered with torch's
flop counter, for the checkpoint planner's cost model) and its workspace, the bytes it
holds at its peak besides its outputs (registered with ``analysis.workspace``, for every
memory analysis). Kept in step with the chunk loop of ``linear_cross_entropy._run``."""

from __future__ import annotations

import math

import torch

from ..analysis.cost_model import register_flop_dtype
from ..analysis.forward_variants import ForwardVariant, register_forward_variant
from ..analysis.workspace import WorkspaceChoice, register_workspace, register_workspace_choices
from . import linear_cross_entropy as lce


# -- what the op costs: FLOPs (the checkpoint planner's cost model) and workspace (memory) ------

def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _flops(x_shape, w_shape, grads: bool) -> int:
    n, d = x_shape
    v = w_shape[0]
    return 2 * n * d * v * (3 if grads else 1)  # logits; with gradients also dlogits @ W and dlogits^T @ x


def _register_flops() -> None:
    from torch.utils.flop_counter import register_flop_formula

    @register_flop_formula(torch.ops.dsgraph.linear_cross_entropy)
    def _loss_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return _flops(x_shape, w_shape, False)

    @register_flop_formula(torch.ops.dsgraph.linear_cross_entropy_grads)
    def _grads_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return _flops(x_shape, w_shape, True)


_register_flops()


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def workspace_bytes(n_tokens: int, dim: int, vocab: int, *, x_dtype: torch.dtype, w_dtype: torch.dtype,
                    mm_dtype: torch.dtype, loss_dtype: torch.dtype, has_bias: bool, chunk_tokens: int,
                    grads: bool, triton: bool, fp32_gemm: bool = False, b_dtype: torch.dtype | None = None,
                    want_x: bool | None = None, want_w: bool | None = None, want_b: bool | None = None,
                    reduction: str = "mean") -> int:
    """What the op holds at its peak besides its outputs: its peak of live bytes less the
    bytes of its outputs (so the outputs plus this is the op's peak, which is what the memory
    analyses count at its step), in bytes asked of the allocator (its rounding is not the
    op's). Exact for ``_run`` as written, phase by phase: tests/unit/test_chunk_loss_memory.py
    tracks every tensor the op makes and holds the peak to this count; the GPU test holds
    the CUDA allocator's requested bytes to it.

    Held for the whole call: the scale and, when the loss is not in ``acc``, the running
    total; the casts of the weight and bias to ``mm_dtype`` (into zero-padded buffers of
    ``padded_vocab`` rows where the CUDA path pads, also when no cast is needed); the fp32 accumulators of the
    gradients of a bf16/fp16 weight and bias (their outputs are made at the end). One
    chunk's buffers at a time: its rows of ``x`` cast (X), its logits (L), and then

    - Triton (CUDA): the fp32 row losses; the gradient overwrites the logits;
    - torch: the ``acc`` working copy (W, made from L, which is then freed), the per-row
      vectors of ``chunk_rows_torch``, the gradient rounded to ``mm_dtype`` when that is not
      ``acc``;
    - the per-chunk products the gradient GEMMs cannot write in place (none for a bf16/fp16
      GEMM writing fp32 in place: ``fp32_gemm``), and the bias gradient's column sum.

    ``chunk_tokens=0`` counts no chunk at all: what is held outside the chunks (planning
    takes the difference). ``want_x``/``want_w``/``want_b`` default to ``grads``, ``b_dtype`` to
    ``w_dtype``."""
    size = _size
    want_x = grads if want_x is None else want_x
    want_w = grads if want_w is None else want_w
    want_b = (grads if want_b is None else want_b) and has_bias
    want = want_x or want_w or want_b
    b_dtype = b_dtype or w_dtype
    acc_t, gw_t, gb_t = lce._acc_dtype(loss_dtype), lce._acc_dtype(w_dtype), lce._acc_dtype(b_dtype)
    mm, acc, out_loss = size(mm_dtype), size(acc_t), size(loss_dtype)
    fast = fp32_gemm and mm_dtype in (torch.bfloat16, torch.float16)
    V, D, N = vocab, dim, n_tokens
    Vp = lce.padded_vocab(V, mm_dtype, triton)  # the casts' and the logits' rows (padded on the CUDA path)
    pad = Vp != V
    n = min(chunk_tokens, N)
    outputs = (out_loss + (N * D * size(x_dtype) if want_x else 0) + (V * D * size(w_dtype) if want_w else 0)
               + (V * size(b_dtype) if want_b else 0))
    # before anything else, the scale: for a mean the valid mask with its int64 count, then
    # the count with its reciprocal (no output exists yet)
    first = max(N + 8, 8 + acc) if reduction == "mean" else acc
    # held through the loop, less the outputs not made before the end
    loss_sep = loss_dtype != acc_t  # else the running total is the loss output itself
    gw_acc = V * D * size(gw_t) if want_w and gw_t != w_dtype else 0
    gb_acc = V * size(gb_t) if want_b and gb_t != b_dtype else 0
    late = (V * D * size(w_dtype) if gw_acc else 0) + (V * size(b_dtype) if gb_acc else 0) + (out_loss if loss_sep else 0)
    held = (acc + (acc if loss_sep else 0) + (Vp * D * mm if pad or w_dtype != mm_dtype else 0)
            + (Vp * mm if has_bias and (pad or b_dtype != mm_dtype) else 0) + gw_acc + gb_acc - late)
    # one chunk (the largest: the last may be shorter)
    X = n * D * mm if x_dtype != mm_dtype else 0
    L = n * Vp * mm
    if triton:
        rows = n * 4
        grad = L  # written over the logits
        chunk = [X + L + rows + (4 if acc_t != torch.float32 else 0),  # the kernel (its scale in fp32)
                 X + (grad if want else 0) + rows + 4]  # the rows' sum
    else:
        W, rows = n * V * acc, n * acc
        vectors = n + 8 * n + 3 * n * acc  # valid, the safe int64 targets, three acc vectors
        rounded = want and mm_dtype != acc_t
        grad = n * V * mm if rounded else W
        chunk = [X + L + (W if mm_dtype != acc_t else 0),  # the upcast
                 X + W + vectors,
                 X + W + grad + rows if rounded else 0,  # rounding the gradient to mm_dtype
                 X + (grad if want else 0) + rows + acc]  # the rows' sum
    if want:
        prod_w = want_w and gw_t != mm_dtype and not (fast and gw_t == torch.float32)
        prod_x = want_x and x_dtype != mm_dtype and not (fast and x_dtype == torch.float32)
        chunk += [X + grad + (V * D * mm if prod_w else 0),  # the weight gradient's GEMM
                  grad + (n * D * mm if prod_x else 0),  # the x gradient's (the cast x is freed)
                  grad + (V * size(gb_t) if want_b else 0)]  # the bias gradient's column sum
    loop = held + max(chunk) if N > 0 and chunk_tokens > 0 else held
    # the end: the loss out of the total (with the scale), then the gradients out of their
    # accumulators, bias first
    end = [2 * acc + gw_acc + gb_acc - late + out_loss if loss_sep else 0,
           gw_acc + gb_acc - (V * D * size(w_dtype) if gw_acc else 0) if gb_acc else 0,
           gw_acc]
    return max(first - outputs, loop, *end, 0)


def _node_workspace(node, as_loss: bool = False, chunk_tokens: int | None = None) -> int:
    """Workspace of a node calling one of the two ops, from its arguments' fake tensors
    (``as_loss``: of the loss-only op called with the same arguments; ``chunk_tokens``: with
    chunks of that many tokens instead of the node's)."""
    from ..compat import size_hint

    args = list(node.args)
    x, w, b = (a.meta.get("val") if hasattr(a, "meta") else a for a in args[:3])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return 0
    grads = node.target is lce.GRADS_OP and not as_loss
    wants = [bool(a) for a in args[10:13]] if grads else [False] * 3
    n_tokens, dim = (size_hint(s) for s in x.shape)
    return workspace_bytes(
        n_tokens, dim, size_hint(w.shape[0]), x_dtype=x.dtype, w_dtype=w.dtype, mm_dtype=args[7],
        loss_dtype=args[8], has_bias=b is not None,
        chunk_tokens=int(args[9]) if chunk_tokens is None else chunk_tokens, grads=grads,
        triton=lce.use_triton(x.device), fp32_gemm=lce.fp32_out_gemm(x.device.type),
        b_dtype=b.dtype if isinstance(b, torch.Tensor) else None, want_x=wants[0], want_w=wants[1],
        want_b=wants[2], reduction=args[5])


def _node_mm_dtype(node) -> torch.dtype:
    """The op's GEMMs run in ``mm_dtype`` (argument 7), not in its fp32 loss's dtype."""
    dtype = node.args[7] if len(node.args) > 7 else node.kwargs.get("mm_dtype")
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _node_loss_flops(node) -> int:
    from ..compat import size_hint

    x, w = (a.meta.get("val") if hasattr(a, "meta") else a for a in node.args[:2])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return 0
    return _flops([size_hint(s) for s in x.shape], [size_hint(s) for s in w.shape], False)


# a plan that recomputes the grads op in the backward runs the loss-only op in the forward
# (analysis.forward_variants): the same chunk loop without the gradients, the loss bitwise
# the same (the gradients do not feed it, on either path)
register_forward_variant(lce.GRADS_OP, ForwardVariant(
    target=lce.LOSS_OP, args=lambda args: tuple(args[:10]), kept=(0,),
    workspace=lambda node: _node_workspace(node, as_loss=True), flops=_node_loss_flops))
register_flop_dtype(lce.LOSS_OP, _node_mm_dtype)
register_flop_dtype(lce.GRADS_OP, _node_mm_dtype)
register_workspace(lce.LOSS_OP, _node_workspace)
register_workspace(lce.GRADS_OP, _node_workspace)


def _with_chunk_tokens(tokens: int):
    def rewrite(args: tuple) -> tuple:
        return tuple(args[:9]) + (tokens,) + tuple(args[10:])
    return rewrite


def _fewer_chunks(node) -> list[WorkspaceChoice]:
    """The same call with fewer, larger chunks, fewest first: one chunk's GEMMs are longer and
    launched fewer times, and each chunk reads and writes the fp32 weight-gradient
    accumulator once (GPT-2's head: 154 MB each way per chunk). Balanced as ``chunk_loss``
    balances them. The FLOPs are the same; the workspace grows with the chunk."""
    from ..compat import size_hint

    x = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else node.args[0]
    if not isinstance(x, torch.Tensor):
        return []
    n, current = max(size_hint(x.shape[0]), 1), int(node.args[9])
    # each count below the node's, as chunk_loss balances it; counts that balance to the
    # same chunk are one form
    tokens = sorted({math.ceil(n / count) for count in range(1, math.ceil(n / current))} - {current}, reverse=True)
    light = node.target is lce.GRADS_OP
    return [WorkspaceChoice(f"{math.ceil(n / t)} chunk{'s' if t < n else ''} of {t} tokens", _with_chunk_tokens(t),
                            _node_workspace(node, chunk_tokens=t),
                            _node_workspace(node, as_loss=True, chunk_tokens=t) if light else 0)
            for t in tokens if t > current]


register_workspace_choices(lce.LOSS_OP, _fewer_chunks)
register_workspace_choices(lce.GRADS_OP, _fewer_chunks)
