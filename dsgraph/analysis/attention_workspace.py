"""What CUDA's fused attention backwards allocate for themselves besides their three gradients.

Found on an H100 (session 26, `benchmarks.alloc_replay` on the 24-layer GPT's chunked plan at
per-block checkpointing's memory): the measured peak was 34,078,976 B over Inductor's plan of
the step, one block of scratch live while an attention backward runs (80.5 MiB allocated
inside the op: 48 MiB of gradients and 32.5 MiB more). Session 26 took the op for the
flash-attention backward and registered that op's scratch; session 27's buffer gap on the same
step (``benchmarks.budget_gap --workload gpt24``, H100, torch 2.11) named the op that ran:
``_scaled_dot_product_cudnn_attention_backward``. SDPA picks cuDNN's kernel on these Hopper
cards, so the flash registration had changed no prediction there. Both are registered.

cuDNN (``run_cudnn_SDP_bprop`` in ``aten/src/ATen/native/cudnn/MHA.cpp``) takes one workspace
of the size cuDNN's frontend graph asks for from the caching allocator. What that graph holds
is cuDNN's choice; counted here, and equal to the measured 34,078,720 B on the measured shape
(8 x 16 heads x 1024 x 64, bf16, causal, no dropout):

- the query gradient's fp32 accumulator, (batch, heads, seqlen_q, head dim);
- the fp32 row sums of ``dO * O``, (batch, heads, seqlen_q);
- before it, a copy of ``grad_out`` in ``out``'s layout when its innermost stride is not 1
  (cuDNN 9.5.1 and later; torch 2.11's CUDA wheels carry a later one).

Grouped-query attention, dropout and an attention bias are not counted for cuDNN: not
measured here.

Flash (``mha_bwd`` in ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``,
called by ``_flash_attention_backward``; from the source, not measured: SDPA picks it where
cuDNN's kernel is off or does not apply) allocates, besides ``dq``/``dk``/``dv``:

- ``softmax_d``: (batch, heads, seqlen_q rounded up to 128), fp32;
- ``dq_accum``: (batch, seqlen_q rounded, heads, head dim rounded up to 32, or 64 above 128),
  fp32; with deterministic algorithms on (not warn-only), ``nsplits`` of them, ``nsplits =
  ceil(SMs / (batch * heads))``;
- for grouped-query attention (fewer key heads), ``dk``/``dv`` expanded to every query head
  in the input dtype, summed into the outputs at the end;
- before it, ``_flash_attention_backward`` makes ``grad_out`` and ``out`` contiguous in the
  kernel's (batch, seq, heads, dim) layout: a copy of each one that is not.

All of it is freed when the op returns, so it is a workspace (``dsgraph.analysis.workspace``):
live at the op's step only. Copies are judged by the strides the FX graph records. A head dim
that is not a multiple of 8 (padded copies of every input) is not counted. The
memory-efficient backward is not registered: its scratch has not been measured here.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from ..compat import CUDNN_ATTENTION_BACKWARD, FLASH_ATTENTION_BACKWARD, contiguous_strides, size_hint
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


def cudnn_backward_workspace(grad_out: torch.Tensor, query: torch.Tensor) -> int:
    """Bytes ``_scaled_dot_product_cudnn_attention_backward`` holds besides its outputs, from
    its tensors in SDPA's (batch, heads, seq, dim) layout; 0 off CUDA."""
    if query.device.type != "cuda" or query.dim() != 4:
        return 0
    batch, heads, seq_q, dim = (size_hint(s) for s in query.shape)
    fp32 = 4
    total = batch * heads * seq_q * dim * fp32  # the query gradient's accumulator
    total += batch * heads * seq_q * fp32  # the row sums of dO * O
    if size_hint(grad_out.stride(-1)) != 1 and size_hint(grad_out.shape[-1]) != 1:
        total += grad_out.numel() * grad_out.element_size()  # dO copied to out's layout
    return total


def _tensor_args(node: Node) -> list:
    """The leading (grad_out, query, key, value, out) of either backward, fake values."""
    return [a.meta.get("val") if isinstance(a, Node) else None for a in node.args[:5]]


def _flash_node_workspace(node: Node) -> int:
    grad_out, query, key, _, out = _tensor_args(node)
    if not all(isinstance(t, torch.Tensor) for t in (grad_out, query, key, out)):
        return 0
    return flash_backward_workspace(grad_out, query, key, out)


def _cudnn_node_workspace(node: Node) -> int:
    grad_out, query, _, _, _ = _tensor_args(node)
    if not all(isinstance(t, torch.Tensor) for t in (grad_out, query)):
        return 0
    return cudnn_backward_workspace(grad_out, query)


register_workspace(FLASH_ATTENTION_BACKWARD, _flash_node_workspace)
register_workspace(CUDNN_ATTENTION_BACKWARD, _cudnn_node_workspace)
