"""analysis.attention_workspace: the scratch CUDA's attention backwards hold besides their
gradients: flash (softmax_d and dq_accum in fp32, GQA's expanded dk/dv, contiguous copies) and
cuDNN (the query gradient's fp32 accumulator and row sums, a copy of a strided grad_out)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensorMode

from dsgraph.analysis.attention_workspace import cudnn_backward_workspace, flash_backward_workspace
from dsgraph.compat import CUDNN_ATTENTION_BACKWARD as CUDNN_BACKWARD
from dsgraph.compat import FLASH_ATTENTION_BACKWARD as FLASH_BACKWARD
from dsgraph.analysis.workspace import workspace_bytes


def _sdpa_layout(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16):
    """(batch, heads, seq, dim), a transpose of a contiguous (batch, seq, heads, dim) tensor:
    the layout a GPT's attention hands SDPA."""
    return torch.empty(batch, seq, heads, dim, device=device, dtype=dtype).transpose(1, 2)


def test_the_24_layer_gpts_attention_backward_scratch():
    # measured on an H100 (session 26): the peak 34,078,976 B over Inductor's plan, inside
    # this op; softmax_d (8 x 16 x 1024 fp32) and dq_accum (8 x 1024 x 16 x 64 fp32) make
    # 34,078,720 B of it (256 B not traced)
    with FakeTensorMode():
        q = _sdpa_layout(8, 1024, 16, 64)
        assert flash_backward_workspace(q, q, q, q) == 8 * 16 * 1024 * 4 + 8 * 1024 * 16 * 64 * 4


def test_rounding_grouped_heads_and_copies():
    with FakeTensorMode():
        q = _sdpa_layout(2, 100, 4, 72)  # seq rounds up to 128, head dim 72 to 96
        base = 2 * 4 * 128 * 4 + 2 * 128 * 4 * 96 * 4
        assert flash_backward_workspace(q, q, q, q) == base
        kv = _sdpa_layout(2, 100, 2, 72)  # two key heads for four query heads
        assert flash_backward_workspace(q, q, kv, q) == base + 2 * 2 * 100 * 4 * 72 * 2
        dense = torch.empty(2, 4, 100, 72, device="cuda", dtype=torch.bfloat16)  # not contiguous transposed
        assert flash_backward_workspace(dense, q, q, q) == base + dense.numel() * 2
        assert flash_backward_workspace(dense, q, q, dense) == base + 2 * dense.numel() * 2
        wide = _sdpa_layout(1, 128, 1, 160)  # above 128 the head dim rounds to 64: 192
        assert flash_backward_workspace(wide, wide, wide, wide) == 128 * 4 + 128 * 192 * 4


def test_zero_off_cuda():
    q = _sdpa_layout(2, 64, 4, 32, device="cpu")
    assert flash_backward_workspace(q, q, q, q) == 0


def test_registered_for_the_op_in_a_traced_graph():
    def backward(grad, q, k, v, out, lse):
        empty = torch.empty(0, dtype=torch.int32, device=q.device)
        seed = torch.empty(2, dtype=torch.uint64, device=q.device)
        return FLASH_BACKWARD(grad, q, k, v, out, lse, empty, empty, q.shape[2], k.shape[2], 0.0, True, seed, seed)

    with FakeTensorMode():
        q = _sdpa_layout(2, 256, 4, 64)
        lse = torch.empty(2, 4, 256, device="cuda")
        gm = make_fx(backward)(q, q, q, q, q, lse)
    (node,) = [n for n in gm.graph.nodes if n.target is FLASH_BACKWARD]
    assert workspace_bytes(node) == 2 * 4 * 256 * 4 + 2 * 256 * 4 * 64 * 4


def test_the_24_layer_gpts_cudnn_backward_scratch():
    # the op that ran on the H100 (session 27's buffer gap): the measured 32.5 MiB besides
    # the op's gradients is its query gradient's fp32 accumulator and fp32 row sums
    with FakeTensorMode():
        q = _sdpa_layout(8, 1024, 16, 64)
        assert cudnn_backward_workspace(q, q) == 8 * 16 * 1024 * 64 * 4 + 8 * 16 * 1024 * 4 == 34_078_720


def test_cudnn_copies_a_grad_out_whose_innermost_stride_is_not_one():
    with FakeTensorMode():
        q = _sdpa_layout(2, 100, 4, 72)
        base = 2 * 4 * 100 * 72 * 4 + 2 * 4 * 100 * 4  # no rounding: the measured shape had none to show
        assert cudnn_backward_workspace(q, q) == base
        dense = torch.empty(2, 4, 100, 72, device="cuda", dtype=torch.bfloat16)  # innermost stride 1: used as it is
        assert cudnn_backward_workspace(dense, q) == base
        strided = torch.empty(2, 4, 72, 100, device="cuda", dtype=torch.bfloat16).transpose(2, 3)
        assert cudnn_backward_workspace(strided, q) == base + strided.numel() * 2


def test_cudnn_zero_off_cuda():
    q = _sdpa_layout(2, 64, 4, 32, device="cpu")
    assert cudnn_backward_workspace(q, q) == 0


def test_cudnn_registered_for_the_op_in_a_traced_graph():
    def backward(grad, q, k, v, out, lse):
        empty = torch.empty(0, device=q.device)
        seed = torch.empty(2, dtype=torch.int64, device=q.device)
        return CUDNN_BACKWARD(grad, q, k, v, out, lse, seed, seed, empty, empty, empty, q.shape[2], k.shape[2],
                              0.0, True)

    with FakeTensorMode():
        q = _sdpa_layout(2, 256, 4, 64)
        lse = torch.empty(2, 4, 256, 1, device="cuda")
        gm = make_fx(backward)(q, q, q, q, q, lse)
    (node,) = [n for n in gm.graph.nodes if n.target is CUDNN_BACKWARD]
    assert workspace_bytes(node) == 2 * 4 * 256 * 64 * 4 + 2 * 4 * 256 * 4
