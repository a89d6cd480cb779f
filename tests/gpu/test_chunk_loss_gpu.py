"""chunk_loss on a CUDA GPU (the Triton row kernel, the fp32-output GEMMs): parity with eager
through Inductor, the bf16 rule under autocast, and the op's measured memory against the
workspace the analyses count (skipped without CUDA)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import dsgraph
from dsgraph.models import GPT, GPTConfig, gpt_inputs
from dsgraph.runtime import linear_cross_entropy as lce
from dsgraph.testing import check_training_step

pytestmark = pytest.mark.gpu

CFG = GPTConfig(vocab=5003, seq=96, layers=2, heads=4, dim=128)


def test_the_gpu_paths_are_taken():
    assert lce.use_triton(torch.device("cuda"))
    assert lce.fp32_out_gemm("cuda")  # torch 2.11+: out_dtype GEMMs; the fallback is tested on CPU


def test_the_fp32_gemm_check_holds_under_autocast():
    """A budgeted step compiles under the user's bf16 autocast, where the check is first
    asked for: its fp32 reference must not be computed in bf16 (session 9)."""
    lce.fp32_out_gemm.cache_clear()
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert lce.fp32_out_gemm("cuda")
    finally:
        lce.fp32_out_gemm.cache_clear()


def test_chunked_gpt_matches_eager_fp32_through_inductor():
    torch.manual_seed(0)
    model, inputs = GPT(CFG).cuda(), gpt_inputs(CFG, 3, "cuda", seed=1)
    check_training_step(model, inputs, {"fallback": "error", "chunk_loss": 5})
    record = [p for r in dsgraph.reports() if r.kind == "pre_grad" for p in r.passes][-1]
    assert record.changed and record.stats["chunks"] == "5"


def rmse(a, b):
    return float((a.double() - b.double()).square().mean().sqrt())


def test_bf16_autocast_within_the_bf16_rule_on_cuda():
    torch.manual_seed(1)
    model = GPT(CFG).cuda()
    idx, targets = gpt_inputs(CFG, 4, "cuda", seed=2)

    def step(fn, m, autocast):
        for p in m.parameters():
            p.grad = None
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            loss = fn(idx, targets)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    m64 = copy.deepcopy(model).double()
    exact = step(m64, m64, False)
    eager = step(model, model, True)
    mc = copy.deepcopy(model)
    got = step(torch.compile(mc, backend="dsgraph", options={"fallback": "error", "chunk_loss": 4}), mc, True)
    assert rmse(got[0], exact[0]) <= 2 * rmse(eager[0], exact[0]) + 1e-3
    for name in exact[1]:
        assert rmse(got[1][name], exact[1][name]) <= 2 * rmse(eager[1][name], exact[1][name]) + 1e-3, name


@pytest.mark.parametrize("mm_dtype", [torch.bfloat16, torch.float32])
def test_measured_memory_of_the_op_is_the_counted_workspace(mm_dtype):
    """What the op asks the CUDA allocator for beyond its inputs and outputs at its peak
    (the allocator's requested bytes: what the tensors need, as every memory analysis counts
    them) is exactly what ``workspace_bytes`` counts: 98,053,672 bytes with the bf16 matmul (the
    vocabulary of 32003 padded to 32064 in the casts and the logits, session 11),
    128,140,016 with fp32 (tests/unit/test_chunk_loss_memory.py tracks the same on CPU).
    The allocator's blocks are at most that plus 1 MiB: its rounding, 512 bytes a tensor and
    up to 1 MiB a large block it does not split (issue 15: of the 1.07 MiB read over the
    count, 116,112 bytes were the op's, the rest rounding, most of it the 0.96 MiB tail of
    a 62 MiB block holding a chunk's 61.04 MiB of bf16 logits)."""
    n, d, v, chunk = 4096, 512, 32003, 1000
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(n, d, device="cuda", generator=g)
    w = torch.randn(v, d, device="cuda", generator=g) * 0.05
    b = torch.randn(v, device="cuda", generator=g)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    args = (x, w, b, t, -100, "mean", 0.1, mm_dtype, torch.float32, chunk, True, True, True)
    outs = lce.GRADS_OP(*args)  # warm-up: Triton compile, cuBLAS workspace
    del outs
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["requested_bytes.all.current"]
    before_blocks = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    outs = lce.GRADS_OP(*args)
    torch.cuda.synchronize()
    out_bytes = sum(o.untyped_storage().nbytes() for o in outs)
    measured = torch.cuda.memory_stats()["requested_bytes.all.peak"] - before - out_bytes
    blocks = torch.cuda.max_memory_allocated() - before_blocks - out_bytes
    counted = lce.workspace_bytes(n, d, v, x_dtype=x.dtype, w_dtype=w.dtype, mm_dtype=mm_dtype,
                                  loss_dtype=torch.float32, has_bias=True, chunk_tokens=chunk, grads=True,
                                  triton=True, fp32_gemm=lce.fp32_out_gemm("cuda"), reduction="mean")
    assert measured == counted, dict(requested=measured, counted=counted, blocks=blocks)
    assert blocks <= counted + 2**20, dict(requested=measured, counted=counted, blocks=blocks)
    with torch.autocast("cuda", torch.bfloat16, enabled=mm_dtype == torch.bfloat16):
        ref = F.cross_entropy(F.linear(x, w, b).float(), t, label_smoothing=0.1)
    assert abs(float(outs[0] - ref)) <= 1e-2 * float(ref)
