"""Linear + cross-entropy over chunks of tokens: the op the ``chunk_loss`` pass puts into graphs.

``linear_cross_entropy(x, weight, bias, targets, ...)`` computes
``F.cross_entropy((x @ weight.T + bias).to(loss_dtype), targets, ...)`` without ever holding
the logits of all tokens, nor their gradient: it walks the tokens in chunks of
``chunk_tokens`` rows, and for each chunk makes the logits, the chunk's loss terms and, when
a gradient is wanted, the logits' gradient, which it folds right away into the gradients of
``x`` (rows of the chunk), ``weight`` and ``bias`` (accumulated). The loss is a scalar
(reduction ``"mean"`` or ``"sum"``) and nothing after it changes how its gradient flows
back, so the gradient for an upstream gradient of 1 is computed in the forward and the
backward only scales it by the upstream gradient (``g * grad_x``, ...). This is what
Liger-Kernel's fused linear cross-entropy does by hand; the matmuls are the three of the
unchunked step (no logits are recomputed).

Two custom ops, so that AOTAutograd sees one opaque node and the partitioner can only save
its outputs (the gradients: parameter-sized, not logits-sized)::

    dsgraph::linear_cross_entropy(x, w, b, t, ...) -> loss                 (no gradient wanted)
    dsgraph::linear_cross_entropy_grads(x, w, b, t, ...) -> (loss, gx, gw, gb)

Semantics follow eager (``F.linear`` then ``F.cross_entropy``): the matmul runs in
``mm_dtype`` (autocast's bf16: ``x``, ``weight`` and ``bias`` are cast as autocast casts
them), the loss in ``loss_dtype`` (the dtype of the tensor that reaches ``cross_entropy``,
fp32 after the usual ``.float()``), computed in at least fp32; the logits' gradient is
rounded to ``mm_dtype`` before the two gradient matmuls, as autograd does through the cast.
Sums are regrouped by chunk (so results are not bitwise eager's): per-chunk weight
gradients are accumulated in fp32.

The per-chunk softmax work runs as a Triton kernel on CUDA when Triton is installed
(``linear_cross_entropy_triton``: two reads of the chunk's logits and one write of their
gradient, in place); otherwise as torch ops (CPU, and the reference the kernel is tested
against). ``workspace_bytes`` is what the op allocates for itself while it runs (chunk
buffers, casts, accumulators; its outputs excluded); the memory analyses add it at the op's
node (``dsgraph.analysis.workspace``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ..analysis.workspace import register_workspace

REDUCTIONS = ("mean", "sum")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulate in at least fp32 (fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


def use_triton(device: torch.device) -> bool:
    """Does the per-chunk softmax run as the Triton kernel on this device?"""
    if device.type != "cuda":
        return False
    from . import linear_cross_entropy_triton as kernels

    return kernels.available()


# -- one chunk's softmax work -----------------------------------------------------------------

def chunk_rows_torch(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
                     label_smoothing: float, want_grad: bool, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row losses (``acc`` dtype, 0 for ignored rows) of ``logits`` (n, V) and, when
    ``want_grad``, the logits' gradient for an upstream gradient ``scale`` per valid row
    (in ``logits.dtype``). ``logits`` is a temporary of the caller: it may be overwritten."""
    n, vocab = logits.shape
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros((), dtype=targets.dtype, device=targets.device))
    work = logits if logits.dtype == acc else logits.to(acc)
    del logits  # the caller's reference is all that keeps the low-precision logits alive
    x_t = work.gather(1, safe[:, None]).squeeze(1)
    mean = work.mean(1) if label_smoothing else None
    m = work.amax(1)
    work.sub_(m[:, None]).exp_()  # exp(x - max), in place
    s = work.sum(1)
    lse = m + s.log()
    rows = lse - x_t
    if label_smoothing:
        rows = (1.0 - label_smoothing) * rows + label_smoothing * (lse - mean)
    rows = rows.masked_fill(~valid, 0.0)
    if not want_grad:
        return rows, None
    # d loss_i / d x_ij = softmax_ij - (1 - eps) [j == t_i] - eps / V, times the row's scale
    work.div_(s[:, None])
    if label_smoothing:
        work.sub_(label_smoothing / vocab)
    onehot = torch.full((n, 1), -(1.0 - label_smoothing), dtype=acc, device=work.device)
    work.scatter_add_(1, safe[:, None], onehot)
    work.mul_(torch.where(valid, scale.to(acc), torch.zeros((), dtype=acc, device=work.device))[:, None])
    return rows, work


def chunk_rows(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
               label_smoothing: float, want_grad: bool, acc: torch.dtype, triton: bool):
    """``chunk_rows_torch``, or the Triton kernel (gradient written into ``logits``)."""
    if triton:
        from . import linear_cross_entropy_triton as kernels

        rows = kernels.chunk_rows_(logits, targets, scale, ignore_index, label_smoothing, want_grad)
        return rows, (logits if want_grad else None)
    rows, grad = chunk_rows_torch(logits, targets, scale, ignore_index, label_smoothing, want_grad, acc)
    if grad is not None and grad.dtype != logits.dtype:
        grad = grad.to(logits.dtype)  # as autograd rounds the gradient through the upcast
    return rows, grad


# -- the chunk loop ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fp32_out_gemm(device_type: str) -> bool:
    """Can a bf16/fp16 GEMM write (or add) into an fp32 tensor in place here
    (``torch.mm`` / ``torch.addmm`` with ``out_dtype`` and ``out=``; CUDA)? Then the weight
    gradient accumulates inside the GEMM, with no per-chunk product to round and add. Checked
    once on a small problem against the plain path; anything else falls back."""
    if device_type != "cuda":
        return False
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(64, 48, generator=g, device="cuda").to(torch.bfloat16)
        b = torch.randn(48, 40, generator=g, device="cuda").to(torch.bfloat16)
        acc = torch.randn(64, 40, generator=g, device="cuda")
        want = acc + a.float() @ b.float()
        out = acc.clone()
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
        prod = torch.empty(64, 40, device="cuda")
        torch.mm(a, b, out_dtype=torch.float32, out=prod)
        return bool(torch.allclose(out, want, rtol=1e-4, atol=1e-4)
                    and torch.allclose(prod, a.float() @ b.float(), rtol=1e-4, atol=1e-4))
    except Exception:  # an older torch, or no such kernel for this device
        return False


@dataclass(frozen=True)
class LossConfig:
    ignore_index: int
    reduction: str
    label_smoothing: float
    mm_dtype: torch.dtype
    loss_dtype: torch.dtype
    chunk_tokens: int


def _run(x, weight, bias, targets, cfg: LossConfig, want_x: bool, want_w: bool, want_b: bool):
    n_tokens = x.shape[0]
    acc = _acc_dtype(cfg.loss_dtype)
    triton = use_triton(x.device)
    want = want_x or want_w or want_b
    fast = cfg.mm_dtype in (torch.bfloat16, torch.float16) and fp32_out_gemm(x.device.type)
    # the casts autocast makes for F.linear (no copy when the dtype already matches)
    w = weight.to(cfg.mm_dtype)
    b = bias.to(cfg.mm_dtype) if bias is not None else None
    valid = targets != cfg.ignore_index
    if cfg.reduction == "mean":
        scale = 1.0 / valid.sum().to(acc)  # on the device: no host sync (inf when all are ignored)
    else:
        scale = torch.ones((), dtype=acc, device=x.device)
    total = torch.zeros((), dtype=acc, device=x.device)
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if want_x else x.new_empty(0)
    w_acc = _acc_dtype(weight.dtype)
    gw = torch.zeros(weight.shape, dtype=w_acc, device=weight.device) if want_w else weight.new_empty(0)
    gb = (torch.zeros(bias.shape, dtype=_acc_dtype(bias.dtype), device=bias.device)
          if want_b and bias is not None else x.new_empty(0))
    for start in range(0, n_tokens, cfg.chunk_tokens):
        stop = min(start + cfg.chunk_tokens, n_tokens)
        xc = x[start:stop].to(cfg.mm_dtype)
        logits = torch.addmm(b, xc, w.t()) if b is not None else torch.mm(xc, w.t())
        rows, grad = chunk_rows(logits, targets[start:stop], scale, cfg.ignore_index, cfg.label_smoothing,
                                want, acc, triton)
        del logits
        total += rows.sum()
        if grad is None:
            continue
        if want_x:
            if gx.dtype == cfg.mm_dtype:
                torch.mm(grad, w, out=gx[start:stop])
            elif fast and gx.dtype == torch.float32:
                torch.mm(grad, w, out_dtype=torch.float32, out=gx[start:stop])
            else:
                gx[start:stop].copy_(torch.mm(grad, w))
        if want_w:
            if gw.dtype == cfg.mm_dtype:
                gw.addmm_(grad.t(), xc)
            elif fast and gw.dtype == torch.float32:
                torch.addmm(gw, grad.t(), xc, out_dtype=torch.float32, out=gw)  # accumulated in the GEMM
            else:
                gw.add_(torch.mm(grad.t(), xc))  # per-chunk product in mm_dtype, summed in fp32
        if want_b and bias is not None:
            gb.add_(grad.sum(0, dtype=gb.dtype))
        # the gradient is the chunk's logits (Triton writes it in place): drop it before the
        # next chunk's logits are made, or two chunks' logits are alive at once (measured on
        # the H200: 164 MB against the 98 MB counted)
        del grad, xc
    loss = (total * scale).to(cfg.loss_dtype)
    if want_w and gw.dtype != weight.dtype:
        gw = gw.to(weight.dtype)
    if want_b and bias is not None and gb.dtype != bias.dtype:
        gb = gb.to(bias.dtype)
    return loss, gx, gw, gb


def _check(x, weight, bias, targets, reduction, chunk_tokens) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be (N, D) and (V, D)")
    if targets.dim() != 1 or targets.shape[0] != x.shape[0]:
        raise ValueError(f"linear_cross_entropy: targets {tuple(targets.shape)} must be (N,) with N = {x.shape[0]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear_cross_entropy: bias {tuple(bias.shape)} must be ({weight.shape[0]},)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if chunk_tokens < 1:
        raise ValueError(f"linear_cross_entropy: chunk_tokens must be >= 1, got {chunk_tokens}")


@torch.library.custom_op("dsgraph::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                            targets: torch.Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                            mm_dtype: torch.dtype, loss_dtype: torch.dtype, chunk_tokens: int) -> torch.Tensor:
    _check(x, weight, bias, targets, reduction, chunk_tokens)
    cfg = LossConfig(ignore_index, reduction, label_smoothing, mm_dtype, loss_dtype, chunk_tokens)
    with torch.autocast(x.device.type, enabled=False):  # the op casts for itself
        return _run(x, weight, bias, targets, cfg, False, False, False)[0]


@linear_cross_entropy_op.register_fake
def _loss_fake(x, weight, bias, targets, ignore_index, reduction, label_smoothing, mm_dtype, loss_dtype, chunk_tokens):
    return x.new_empty((), dtype=loss_dtype)


@torch.library.custom_op("dsgraph::linear_cross_entropy_grads", mutates_args=())
def linear_cross_entropy_grads_op(
        x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor,
        ignore_index: int, reduction: str, label_smoothing: float, mm_dtype: torch.dtype, loss_dtype: torch.dtype,
        chunk_tokens: int, grad_x: bool, grad_weight: bool, grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, weight, bias, targets, reduction, chunk_tokens)
    cfg = LossConfig(ignore_index, reduction, label_smoothing, mm_dtype, loss_dtype, chunk_tokens)
    with torch.autocast(x.device.type, enabled=False):
        return _run(x, weight, bias, targets, cfg, grad_x, grad_weight, grad_bias)


@linear_cross_entropy_grads_op.register_fake
def _grads_fake(x, weight, bias, targets, ignore_index, reduction, label_smoothing, mm_dtype, loss_dtype,
                chunk_tokens, grad_x, grad_weight, grad_bias):
    loss = x.new_empty((), dtype=loss_dtype)
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if grad_x else x.new_empty(0)
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if grad_weight else weight.new_empty(0)
    gb = torch.empty_like(bias) if (grad_bias and bias is not None) else x.new_empty(0)
    return loss, gx, gw, gb


LOSS_OP = torch.ops.dsgraph.linear_cross_entropy.default
GRADS_OP = torch.ops.dsgraph.linear_cross_entropy_grads.default


class _LinearCrossEntropy(torch.autograd.Function):
    """The gradients come out of the forward op; the backward scales them."""

    @staticmethod
    def forward(ctx, x, weight, bias, targets, ignore_index, reduction, label_smoothing, mm_dtype, loss_dtype,
                chunk_tokens):
        want_x, want_w, want_b = ctx.needs_input_grad[:3]
        want_b = want_b and bias is not None
        ctx.wants = (want_x, want_w, want_b)
        if not (want_x or want_w or want_b):
            ctx.save_for_backward()
            return LOSS_OP(x, weight, bias, targets, ignore_index, reduction, label_smoothing, mm_dtype,
                           loss_dtype, chunk_tokens)
        loss, gx, gw, gb = GRADS_OP(x, weight, bias, targets, ignore_index, reduction, label_smoothing, mm_dtype,
                                    loss_dtype, chunk_tokens, want_x, want_w, want_b)
        ctx.save_for_backward(gx, gw, gb)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        want_x, want_w, want_b = ctx.wants
        if not (want_x or want_w or want_b):
            return (None,) * 10
        gx, gw, gb = ctx.saved_tensors
        return (
            gx * grad_loss.to(gx.dtype) if want_x else None,
            gw * grad_loss.to(gw.dtype) if want_w else None,
            gb * grad_loss.to(gb.dtype) if want_b else None,
            None, None, None, None, None, None, None,
        )


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                         mm_dtype: torch.dtype | None = None, loss_dtype: torch.dtype | None = None,
                         chunk_tokens: int = 1024) -> torch.Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias).to(loss_dtype), targets, ...)`` over
    chunks of ``chunk_tokens`` rows of ``x`` (N, D); differentiable in ``x``, ``weight``
    and ``bias``. ``mm_dtype`` defaults to ``x``'s dtype, ``loss_dtype`` to ``mm_dtype``."""
    mm_dtype = mm_dtype or x.dtype
    loss_dtype = loss_dtype or mm_dtype
    return _LinearCrossEntropy.apply(x, weight, bias, targets, int(ignore_index), reduction, float(label_smoothing),
                                     mm_dtype, loss_dtype, int(chunk_tokens))


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
                    grads: bool, triton: bool, fp32_gemm: bool = False) -> int:
    """Bytes the op allocates for itself at its peak (outputs excluded): the casts of the
    weight and bias, the fp32 weight-gradient accumulator when the weight is not fp32, and
    one chunk's buffers: its rows of ``x`` cast, its logits, the fp32 working copy (torch
    path) or nothing more (Triton: the gradient overwrites the logits), the gradient in
    ``mm_dtype``, and the per-chunk products that are added into the accumulators (none when
    the GEMMs write fp32 in place: ``fp32_gemm``)."""
    mm, acc = _size(mm_dtype), _size(_acc_dtype(loss_dtype))
    n = min(chunk_tokens, n_tokens)
    fixed = 0
    if w_dtype != mm_dtype:
        fixed += vocab * dim * mm + (vocab * mm if has_bias else 0)
    if grads and _acc_dtype(w_dtype) != w_dtype:
        fixed += vocab * dim * _size(_acc_dtype(w_dtype))
    chunk = n * dim * mm if x_dtype != mm_dtype else 0
    if triton:
        chunk += n * vocab * mm + n * 4
    elif mm_dtype == _acc_dtype(loss_dtype):
        chunk += n * vocab * acc  # the logits are the working copy, the gradient is written into them
    else:
        # logits + working copy while upcasting, then working copy + the rounded gradient
        chunk += n * vocab * acc + n * vocab * mm
    chunk += 4 * n * acc  # per-row statistics
    if grads and not (fp32_gemm and mm_dtype in (torch.bfloat16, torch.float16)):
        if _acc_dtype(w_dtype) != mm_dtype:
            chunk += vocab * dim * mm  # the chunk's weight-gradient product before it is added
        if x_dtype != mm_dtype:
            chunk += n * dim * mm  # the chunk's x-gradient before it is copied into place
    return fixed + chunk


def _node_workspace(node) -> int:
    """Workspace of a node calling one of the two ops, from its arguments' fake tensors."""
    from ..compat import size_hint

    args = list(node.args)
    x, w, b = (a.meta.get("val") if hasattr(a, "meta") else a for a in args[:3])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return 0
    grads = node.target is GRADS_OP
    n_tokens, dim = (size_hint(s) for s in x.shape)
    return workspace_bytes(
        n_tokens, dim, size_hint(w.shape[0]), x_dtype=x.dtype, w_dtype=w.dtype, mm_dtype=args[7],
        loss_dtype=args[8], has_bias=b is not None, chunk_tokens=int(args[9]), grads=grads,
        triton=use_triton(x.device), fp32_gemm=fp32_out_gemm(x.device.type))


register_workspace(LOSS_OP, _node_workspace)
register_workspace(GRADS_OP, _node_workspace)
