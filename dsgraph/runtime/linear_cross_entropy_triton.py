"""The Triton kernel of one chunk of ``linear_cross_entropy``: softmax, loss rows, gradient in place.

One program per row of the chunk's logits (n, V), in the spirit of Liger-Kernel's fused
linear cross-entropy: a first pass over the row keeps the running max, the running sum of
``exp(x - max)`` and the sum of ``x`` (for label smoothing); the row's loss is
``(1 - eps) (lse - x_t) + eps (lse - mean x)``; a second pass writes the gradient
``(softmax - (1 - eps) [j == t] - eps / V) * scale`` over the logits, rounded to their
dtype. Rows whose target is ``ignore_index`` get loss 0 and gradient 0. ``scale`` (1 / the
number of valid tokens for a mean, 1 for a sum) is read from device memory, so the caller
never synchronises with the host. Memory traffic: two reads and one write of the row.

Tested on CPU with ``TRITON_INTERPRET=1`` against ``chunk_rows_torch``.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def ce_rows_kernel(logits_ptr, stride, targets_ptr, rows_ptr, scale_ptr, vocab, ignore_index, eps,
                       WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        target = tl.load(targets_ptr + row)
        valid = target != ignore_index
        safe = tl.where(valid, target, 0)
        m = -float("inf")
        s = 0.0
        sx = 0.0
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab
            x = tl.load(base + cols, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            sx += tl.sum(tl.where(mask, x, 0.0), 0)
            m = m_new
        lse = m + tl.log(s)
        x_t = tl.load(base + safe).to(tl.float32)
        loss = (1.0 - eps) * (lse - x_t) + eps * (lse - sx / vocab)
        tl.store(rows_ptr + row, tl.where(valid, loss, 0.0))
        if WANT_GRAD:
            scale = tl.load(scale_ptr).to(tl.float32)
            scale = tl.where(valid, scale, 0.0)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < vocab
                x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
                g = tl.exp(x - lse) - eps / vocab - tl.where(cols == safe, 1.0 - eps, 0.0)
                tl.store(base + cols, (g * scale).to(logits_ptr.dtype.element_ty), mask=mask)

    return ce_rows_kernel


BLOCK = 4096  # columns per step of a row's loop (the vocabulary is walked in blocks)


def chunk_rows_(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
                label_smoothing: float, want_grad: bool) -> torch.Tensor:
    """Per-row fp32 losses of ``logits`` (n, V; rows of unit column stride, any row stride:
    the first V columns of a padded buffer); with ``want_grad`` the logits' gradient is
    written over ``logits``."""
    import triton

    n, vocab = logits.shape
    if n and vocab and logits.stride(1) != 1:
        raise ValueError("chunk_rows_: the chunk's logits must have unit column stride")
    rows = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return rows
    block = min(BLOCK, triton.next_power_of_2(vocab))
    _kernel()[(n,)](logits, logits.stride(0), targets.contiguous(), rows, scale.reshape(1).to(torch.float32),
                    vocab, ignore_index, float(label_smoothing), WANT_GRAD=bool(want_grad), BLOCK=block,
                    num_warps=8 if block >= 2048 else 4)
    return rows
