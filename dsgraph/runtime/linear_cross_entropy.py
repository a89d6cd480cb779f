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

On the CUDA path (the Triton kernel below) with a 16-bit matmul, a vocabulary that is not a
multiple of ``VOCAB_ALIGN`` is padded with zero rows of the weight cast (and zero bias): the
three GEMMs then have aligned leading dimensions. Stock Inductor pads such matmuls itself
(``shape_padding``); inside this opaque op nothing did, and on the H200 transformers' GPT-2
(vocabulary 50257) ran its chunked step 11.3 ms slower than the unchunked one (35.0 against
23.6 ms, session 11) where GPT-2-style's 50304 was 0.7 ms slower. The padded columns'
logits are exactly 0 and are not part of the softmax (the kernel reads the first ``V``
columns of each row); their gradient stays 0, so the x gradient's GEMM over the padded
width adds only zero products.

The per-chunk softmax work runs as a Triton kernel on CUDA when Triton is installed
(``linear_cross_entropy_triton``: two reads of the chunk's logits and one write of their
gradient, in place); otherwise as torch ops (CPU, and the reference the kernel is tested
against). ``workspace_bytes`` is what the op holds at its peak besides its outputs (chunk
buffers, casts, accumulators, the small vectors and scalars), to the byte; the memory
analyses add it at the op's node (``dsgraph.analysis.workspace``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

REDUCTIONS = ("mean", "sum")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulate in at least fp32 (fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


VOCAB_ALIGN = 64  # columns: 16-byte aligned rows for bf16/fp16 with room to spare (GPT-2-style's 50304)


def padded_vocab(vocab: int, mm_dtype: torch.dtype, triton: bool) -> int:
    """The logits' row width the op allocates: ``vocab`` rounded up to ``VOCAB_ALIGN`` on the
    Triton (CUDA) path with a 16-bit matmul, else ``vocab``."""
    if triton and mm_dtype in (torch.bfloat16, torch.float16) and vocab % VOCAB_ALIGN:
        return vocab + VOCAB_ALIGN - vocab % VOCAB_ALIGN
    return vocab


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
    (in ``acc``, written over the working copy). ``logits`` is a temporary of the caller: it
    may be overwritten; when it is already in ``acc`` it is the working copy.

    Besides the working copy it holds at most a bool and an int64 vector of n and three
    ``acc`` vectors of n: ``workspace_bytes`` counts exactly that."""
    n, vocab = logits.shape
    eps = label_smoothing
    work = logits if logits.dtype == acc else logits.to(acc)
    del logits
    valid = targets != ignore_index
    safe = targets.masked_fill(~valid, 0)[:, None]
    # (1 - eps) (lse - x_t) + eps (lse - mean x) = lse - (1 - eps) x_t - eps mean x: the
    # terms without lse first, so the row mean is gone before the max and the sum are made
    rows = work.gather(1, safe).squeeze(1).neg_()
    if eps:
        rows.mul_(1.0 - eps).sub_(work.mean(1), alpha=eps)
    m = work.amax(1)
    work.sub_(m[:, None]).exp_()  # exp(x - max), in place
    s = work.sum(1)
    if want_grad:
        work.div_(s[:, None])  # the softmax, before s becomes the log-sum-exp
    rows.add_(s.log_().add_(m))  # the log-sum-exp, in place: s is not needed again
    del s, m
    rows.masked_fill_(~valid, 0.0)
    if not want_grad:
        return rows, None
    # d loss_i / d x_ij = softmax_ij - (1 - eps) [j == t_i] - eps / V, times the row's scale
    if eps:
        work.sub_(eps / vocab)
    onehot = torch.full((n, 1), -(1.0 - eps), dtype=acc, device=work.device)
    work.scatter_add_(1, safe, onehot)
    del onehot, safe
    # ignored rows get exactly 0, also when the scale is inf (every target ignored)
    row_scale = scale.to(acc).expand(n).masked_fill(~valid, 0.0)
    work.mul_(row_scale[:, None])
    return rows, work


def chunk_rows(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
               label_smoothing: float, want_grad: bool, acc: torch.dtype, triton: bool,
               grad_dtype: torch.dtype | None = None):
    """``chunk_rows_torch`` (its gradient rounded to ``grad_dtype``, by default the logits'
    dtype, as autograd rounds the gradient through the upcast), or the Triton kernel
    (gradient written into ``logits``)."""
    if triton:
        from . import linear_cross_entropy_triton as kernels

        rows = kernels.chunk_rows_(logits, targets, scale, ignore_index, label_smoothing, want_grad)
        return rows, (logits if want_grad else None)
    grad_dtype = grad_dtype or logits.dtype
    rows, grad = chunk_rows_torch(logits, targets, scale, ignore_index, label_smoothing, want_grad, acc)
    if grad is not None and grad.dtype != grad_dtype:
        grad = grad.to(grad_dtype)
    return rows, grad


# -- the chunk loop ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fp32_out_gemm(device_type: str) -> bool:
    """Can a bf16/fp16 GEMM write (or add) into an fp32 tensor in place here
    (``torch.mm`` / ``torch.addmm`` with ``out_dtype`` and ``out=``; CUDA)? Then the weight
    gradient accumulates inside the GEMM, with no per-chunk product to round and add. Checked
    once on a small problem against the plain path; anything else falls back.

    The first call usually comes from a compile (the memory analyses ask for the op's
    workspace), inside the user's step: a compile's fake mode is active there, and usually
    autocast. The check runs on real tensors with autocast off, or it fails and its cached
    answer turns the fast path off for the process: under fake mode it did on the H200
    (session 8); under bf16 autocast its fp32 reference products were computed in bf16 and
    missed the tolerance (session 9: the profile of a budgeted GPT-2 step still showed one
    fp32 add kernel per chunk)."""
    if device_type != "cuda":
        return False
    from .. import compat

    with compat.real_tensors(), torch.autocast(device_type, enabled=False):
        return _fp32_out_gemm_works(device_type)


def _fp32_out_gemm_works(device_type: str) -> bool:
    try:
        g = torch.Generator(device=device_type).manual_seed(0)
        a = torch.randn(64, 48, generator=g, device=device_type).to(torch.bfloat16)
        b = torch.randn(48, 40, generator=g, device=device_type).to(torch.bfloat16)
        acc = torch.randn(64, 40, generator=g, device=device_type)
        want = acc + a.float() @ b.float()
        out = acc.clone()
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
        prod = torch.empty(64, 40, device=device_type)
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
    """The chunk loop. What it holds, and when, is what ``workspace_bytes`` counts: keep the
    two in step (tests/unit/test_chunk_loss_memory.py holds the tracked peak to the count)."""
    n_tokens = x.shape[0]
    acc = _acc_dtype(cfg.loss_dtype)
    triton = use_triton(x.device)
    want_b = want_b and bias is not None
    want = want_x or want_w or want_b
    fast = cfg.mm_dtype in (torch.bfloat16, torch.float16) and fp32_out_gemm(x.device.type)
    if cfg.reduction == "mean":
        valid = targets != cfg.ignore_index
        count = valid.sum()  # exact in int64, on the device: no host sync
        del valid
        scale = count.to(acc).reciprocal_()  # inf when every target is ignored
        del count
    else:
        scale = torch.ones((), dtype=acc, device=x.device)
    total = torch.zeros((), dtype=acc, device=x.device)  # the loss itself when loss_dtype is acc
    vocab = weight.shape[0]
    padded = padded_vocab(vocab, cfg.mm_dtype, triton)
    if padded == vocab:
        # the casts autocast makes for F.linear (no copy when the dtype already matches)
        w = weight.to(cfg.mm_dtype)
        b = bias.to(cfg.mm_dtype) if bias is not None else None
    else:  # the same casts into zero-padded buffers (copy_ casts without a temporary)
        w = weight.new_zeros((padded, weight.shape[1]), dtype=cfg.mm_dtype)
        w[:vocab].copy_(weight)
        b = None
        if bias is not None:
            b = bias.new_zeros((padded,), dtype=cfg.mm_dtype)
            b[:vocab].copy_(bias)
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if want_x else x.new_empty(0)
    gw = torch.zeros(weight.shape, dtype=_acc_dtype(weight.dtype), device=weight.device) if want_w else weight.new_empty(0)
    gb = torch.zeros(bias.shape, dtype=_acc_dtype(bias.dtype), device=bias.device) if want_b else x.new_empty(0)
    for start in range(0, n_tokens, cfg.chunk_tokens):
        stop = min(start + cfg.chunk_tokens, n_tokens)
        xc = x[start:stop].to(cfg.mm_dtype)
        logits = torch.addmm(b, xc, w.t()) if b is not None else torch.mm(xc, w.t())
        if not triton and logits.dtype != acc:
            logits = logits.to(acc)  # the upcast; the mm_dtype logits are freed here, not held through the rows
        # padded: the kernel works on the first ``vocab`` columns and writes the gradient
        # there; the padded (n, padded) buffer, its other columns 0, feeds the x gradient
        full = logits
        rows, grad = chunk_rows(logits[:, :vocab] if padded != vocab else logits, targets[start:stop], scale,
                                cfg.ignore_index, cfg.label_smoothing, want, acc, triton, grad_dtype=cfg.mm_dtype)
        grad_full = full if grad is not None and padded != vocab else grad
        del full
        # Each buffer is dropped as soon as it is done with, so no two chunks' buffers (nor a
        # chunk's and its temporaries) overlap more than counted. Triton writes the gradient
        # over the logits: with both names gone it is freed before the next chunk's logits
        # (measured on the H200 when it was not: 164 MB against the 98 MB counted).
        del logits
        total += rows.sum()
        del rows
        if grad is None:
            del xc
            continue
        if want_w:
            if gw.dtype == cfg.mm_dtype:
                gw.addmm_(grad.t(), xc)
            elif fast and gw.dtype == torch.float32:
                torch.addmm(gw, grad.t(), xc, out_dtype=torch.float32, out=gw)  # accumulated in the GEMM
            else:
                gw.add_(torch.mm(grad.t(), xc))  # per-chunk product in mm_dtype, summed in fp32
        del xc  # before the x-gradient's product and the bias-gradient's sum
        if want_x:
            if gx.dtype == cfg.mm_dtype:
                torch.mm(grad_full, w, out=gx[start:stop])
            elif fast and gx.dtype == torch.float32:
                torch.mm(grad_full, w, out_dtype=torch.float32, out=gx[start:stop])
            else:
                gx[start:stop].copy_(torch.mm(grad_full, w))
        if want_b:
            gb.add_(grad.sum(0, dtype=gb.dtype))
        del grad, grad_full
    del w, b  # the casts, before the outputs are converted
    loss = total.mul_(scale).to(cfg.loss_dtype)
    del total, scale
    if want_b and gb.dtype != bias.dtype:
        gb = gb.to(bias.dtype)
    if want_w and gw.dtype != weight.dtype:
        gw = gw.to(weight.dtype)
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


# what the op costs (FLOPs, workspace) is registered by its own module; re-exported here
from .linear_cross_entropy_cost import workspace_bytes  # noqa: E402,F401
