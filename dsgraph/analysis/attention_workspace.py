"""What CUDA's flash-attention backward allocates for itself besides its three gradients.

Found on an H100 (session 26, `benchmarks.alloc_replay` on the 24-layer GPT's chunked plan at
per-block checkpointing's memory): the measured peak was 34,078,976 B over Inductor's plan of
the step, exactly this op's fp32 scratch, live while the op runs. ATen's ``mha_bwd``
(``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``, called by
``_flash_attention_backward``) allocates, besides ``dq``/``dk``/``dv`` (the op's outputs):

- ``softmax_d``: (batch, heads, seqlen_q rounded up to 128), fp32;
- ``dq_accum``: (batch, seqlen_q rounded, heads, head dim rounded up to 32, or 64 above 128),
  fp32; with deterministic algorithms on (not warn-only), ``nsplits`` of them, ``nsplits =
  ceil(SMs / (batch * heads))``;
- for grouped-query attention (fewer key heads), ``dk``/``dv`` expanded to every query head
  in the input dtype, summed into the outputs at the end;
- before it, ``_flash_attention_backward`` makes ``grad_out`` and ``out`` contiguous in the
  kernel's (batch, seq, heads, dim) layout: a copy of each one that is not.

All of it is freed when the op returns, so it is a workspace (``dsgraph.analysis.workspace``):
live at the op's step only. The copies are judged by the strides the FX graph records; the
measured case had none (the GPT's ``grad_out`` and ``out`` are transposes of contiguous
tensors). A head dim that is not a multiple of 8 (padded copies of every input) is not
counted. The memory-efficient and cuDNN backwards are not registered: their scratch has not
been measured here.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from ..compat import FLASH_ATTENTION_BACKWARD, contiguous_strides, size_hint
from .workspace import register_workspace


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _is_contiguous_in_kernel_layout(t: torch.Tensor) -> bool:
    """Is ``t`` (batch, heads, seq, dim) contiguous once transposed to (batch, seq, heads, dim)?
    From size hints, so that a dynamic shape adds no guard; a size-1 dim's stride is free."""
    kernel = t.transpose(1, 2)
    sizes = [size_hint(s) for s in kernel.shape]
    strides = [size_hint(s) for s in kernel.stride()]
    return all(n == 1 or s == w for n, s, w in zip(sizes, strides, contiguous_strides(sizes)))


def _deterministic_splits(batch: int, heads: int, device: torch.device) -> int:
    if not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled():
        return 1
    if not torch.cuda.is_available():  # planning for a CUDA step without one: the SM count is unknown
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return math.ceil(sms / (batch * heads))


def flash_backward_workspace(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             out: torch.Tensor) -> int:
    """Bytes ``_scaled_dot_product_flash_attention_backward`` holds at its peak besides its
    outputs, from its tensors in SDPA's (batch, heads, seq, dim) layout; 0 off CUDA."""
    if query.device.type != "cuda" or query.dim() != 4:
        return 0
    batch, heads, seq_q, dim = (size_hint(s) for s in query.shape)
    heads_k, seq_k = size_hint(key.shape[1]), size_hint(key.shape[2])
    fp32 = 4
    seq_q_rounded = _round_up(seq_q, 128)
    head_rounded = _round_up(_round_up(dim, 8), 32 if dim <= 128 else 64)
    total = batch * heads * seq_q_rounded * fp32  # softmax_d
    total += _deterministic_splits(batch, heads, query.device) * batch * seq_q_rounded * heads * head_rounded * fp32
    if heads_k != heads:  # dk and dv over every query head, then summed
        total += 2 * batch * seq_k * heads * dim * query.element_size()
    for t in (grad_out, out):
        if not _is_contiguous_in_kernel_layout(t):
            total += t.numel() * t.element_size()
    return total


def _node_workspace(node: Node) -> int:
    vals = [a.meta.get("val") if isinstance(a, Node) else None for a in node.args[:5]]
    grad_out, query, key, _, out = vals
    if not all(isinstance(t, torch.Tensor) for t in (grad_out, query, key, out)):
        return 0
    return flash_backward_workspace(grad_out, query, key, out)


register_workspace(FLASH_ATTENTION_BACKWARD, _node_workspace)
