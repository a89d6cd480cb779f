"""dsgraph.runtime.linear_cross_entropy, the op chunk_loss puts into graphs: loss and
gradients against F.linear + F.cross_entropy (fp64: exact up to rounding; bf16 matmul with
an fp32 loss: the bf16 rule), the inference op, its FLOPs and workspace as the analyses see
them, and the Triton row kernel (TRITON_INTERPRET=1) against the torch rows."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from dsgraph.analysis.cost_model import node_flops
from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.analysis.plan import fx_plan
from dsgraph.analysis.workspace import workspace_bytes
from dsgraph.runtime import linear_cross_entropy as lce


def data(n, d, v, dtype, seed, bias=False, ignore=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = torch.randn(v, generator=g, dtype=dtype).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    if ignore is not None:
        t[torch.rand(n, generator=g) < 0.25] = ignore
    return x, w, b, t


@pytest.mark.parametrize("reduction, smoothing, bias, ignore, chunk", [
    ("mean", 0.0, False, None, 6), ("mean", 0.1, True, -100, 7), ("sum", 0.0, True, 3, 40),
    ("sum", 0.2, False, -100, 1), ("mean", 0.0, True, -100, 1000),
])
def test_loss_and_gradients_equal_eager_in_fp64(reduction, smoothing, bias, ignore, chunk):
    x, w, b, t = data(37, 11, 23, torch.float64, seed=chunk, bias=bias, ignore=ignore)
    ce = dict(ignore_index=-100 if ignore is None else ignore, reduction=reduction, label_smoothing=smoothing)
    params = [x, w] + ([b] if bias else [])
    ref = F.cross_entropy(F.linear(x, w, b), t, **ce)
    ref_grads = torch.autograd.grad(ref * 0.7, params)
    got = lce.linear_cross_entropy(x, w, b, t, chunk_tokens=chunk, **ce)
    grads = torch.autograd.grad(got * 0.7, params)
    assert got.dtype == torch.float64 and abs(float((got - ref).detach())) <= 1e-12 * abs(float(ref.detach()))
    for g, r in zip(grads, ref_grads):
        assert float((g - r).norm() / r.norm()) <= 1e-12


def test_every_target_ignored_gives_eagers_nan_loss_and_zero_gradients():
    x, w, b, t = data(9, 5, 7, torch.float64, seed=1, bias=True)
    t[:] = -100
    ref = F.cross_entropy(F.linear(x, w, b), t)
    got = lce.linear_cross_entropy(x, w, b, t, chunk_tokens=4)
    assert torch.isnan(ref) and torch.isnan(got)
    for g in torch.autograd.grad(got, [x, w, b]):
        assert torch.equal(g, torch.zeros_like(g))


def rmse(a, b):
    return float((a.detach().double() - b.detach().double()).square().mean().sqrt())


def test_bf16_matmul_with_fp32_loss_meets_the_bf16_rule():
    """Autocast's semantics: x, w, b cast to bf16 for the matmul, logits upcast to fp32 for
    the loss; against fp64, no worse than eager autocast (RMSE <= 2 eager's + 1e-3)."""
    x, w, b, t = data(53, 32, 97, torch.float32, seed=2, bias=True, ignore=-100)
    params = [x, w, b]
    with torch.autocast("cpu", torch.bfloat16):
        eager = F.cross_entropy(F.linear(x, w, b).float(), t)
    eager_grads = torch.autograd.grad(eager, params)
    got = lce.linear_cross_entropy(x, w, b, t, mm_dtype=torch.bfloat16, loss_dtype=torch.float32, chunk_tokens=10)
    grads = torch.autograd.grad(got, params)
    x64, w64, b64 = (p.detach().double().requires_grad_() for p in params)
    exact = F.cross_entropy(F.linear(x64, w64, b64), t)
    exact_grads = torch.autograd.grad(exact, [x64, w64, b64])
    assert got.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
    assert rmse(got, exact) <= 2 * rmse(eager, exact) + 1e-3
    for g, e, ref in zip(grads, exact_grads, eager_grads):
        assert rmse(g, e) <= 2 * rmse(ref, e) + 1e-3


def test_without_gradients_the_loss_op_runs_and_nothing_is_saved():
    x, w, b, t = data(21, 6, 13, torch.float32, seed=3, bias=True)
    with torch.no_grad():
        got = lce.linear_cross_entropy(x, w, b, t, chunk_tokens=5)
        ref = F.cross_entropy(F.linear(x, w, b), t)
    assert not got.requires_grad and float((got - ref).abs()) <= 1e-6 * float(ref.abs())


def graph_of(fn, *args):
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake")(*args)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (lce.LOSS_OP, lce.GRADS_OP)]
    return gm, node


def test_flops_and_workspace_are_what_the_analyses_see():
    x, w, b, t = data(40, 8, 30, torch.float32, seed=4, bias=True)

    def grads(x, w, b, t):
        return lce.GRADS_OP(x, w, b, t, -100, "mean", 0.0, torch.bfloat16, torch.float32, 16, True, True, True)

    gm, node = graph_of(grads, x.detach(), w.detach(), b.detach(), t)
    assert node_flops(node) == 3 * 2 * 40 * 8 * 30
    expected = lce.workspace_bytes(40, 8, 30, x_dtype=torch.float32, w_dtype=torch.float32, mm_dtype=torch.bfloat16,
                                   loss_dtype=torch.float32, has_bias=True, chunk_tokens=16, grads=True, triton=False)
    # held: the fp32 scale, the bf16 casts of w and b; at the chunk's peak (rounding its
    # gradient to bf16): its bf16 x rows, the fp32 working copy, the bf16 gradient and the
    # fp32 row losses (tests/unit/test_chunk_loss_memory.py holds the op's tracked peak to it)
    assert expected == 4 + (30 * 8 + 30) * 2 + 16 * 8 * 2 + 16 * 30 * (4 + 2) + 16 * 4
    assert workspace_bytes(node) == expected
    lifetimes = TensorLifetimes(gm)
    i = lifetimes.index[node]
    outputs = sum(s.nbytes for s in lifetimes.storages if s.root is node)
    live_before = lifetimes.live[i - 1]
    assert lifetimes.live[i] == live_before + outputs + expected
    plan = fx_plan(gm)
    assert any(blk.name.endswith(":workspace") and blk.nbytes == expected and blk.start == blk.end for blk in plan.blocks)
    # the inference op: only the forward matmul
    gm, node = graph_of(lambda x, w, b, t: lce.LOSS_OP(x, w, b, t, -100, "sum", 0.0, torch.float32, torch.float32, 7),
                        x.detach(), w.detach(), b.detach(), t)
    assert node_flops(node) == 2 * 40 * 8 * 30
    # the fp32 scale, the fp32 logits (the working copy) and the per-row vectors: the valid
    # mask, the int64 targets with ignored ones zeroed, three fp32 vectors
    assert workspace_bytes(node) == 4 + 7 * 30 * 4 + 7 * (1 + 8 + 3 * 4)


TRITON_CHECK = textwrap.dedent("""
    import torch
    from dsgraph.runtime import linear_cross_entropy_triton as K
    from dsgraph.runtime.linear_cross_entropy import chunk_rows_torch
    K.BLOCK = 16  # several blocks per row
    for dtype in (torch.float32, torch.bfloat16):
        for eps, want in ((0.0, True), (0.1, True), (0.1, False)):
            g = torch.Generator().manual_seed(int(eps * 10) + want)
            n, v = 9, 37
            logits = (torch.randn(n, v, generator=g) * 3).to(dtype)
            t = torch.randint(0, v, (n,), generator=g)
            t[2] = -100
            scale = torch.tensor(1 / 8.0)
            ref_rows, ref_grad = chunk_rows_torch(logits.clone(), t, scale, -100, eps, want, torch.float32)
            out = logits.clone()
            rows = K.chunk_rows_(out, t, scale, -100, eps, want)
            assert rows[2] == 0 and ref_rows[2] == 0
            assert torch.allclose(rows, ref_rows, rtol=1e-5, atol=1e-5), (rows, ref_rows)
            if want:
                ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 1e-6
                assert torch.equal(out[2], torch.zeros_like(out[2]))
                err = (out.float() - ref_grad.to(dtype).float()).abs().max()
                assert err <= ulp * ref_grad.abs().max(), (dtype, eps, err)
            else:
                assert torch.equal(out, logits)
    print("triton rows ok")
""")


def test_triton_row_kernel_matches_the_torch_rows_in_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "triton rows ok" in done.stdout, done.stderr[-3000:]


PADDED_CHECK = textwrap.dedent("""
    from unittest import mock
    import torch
    from dsgraph.runtime import linear_cross_entropy as lce
    g = torch.Generator().manual_seed(5)
    n, d, v = 45, 12, 37  # the CUDA path pads the vocabulary to 64 for the bf16 matmul
    x = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) * 0.3
    b = torch.randn(v, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    t[::4] = -100
    assert lce.padded_vocab(v, torch.bfloat16, triton=True) == 64
    args = (x, w, b, t, -100, "mean", 0.1, torch.bfloat16, torch.float32, 16, True, True, True)
    with mock.patch.object(lce, "use_triton", lambda device: True):
        padded = lce.linear_cross_entropy_grads_op._init_fn(*args)
        with mock.patch.object(lce, "padded_vocab", lambda vocab, mm_dtype, triton: vocab):
            plain = lce.linear_cross_entropy_grads_op._init_fn(*args)
    for name, got, want in zip(("loss", "x", "weight", "bias"), padded, plain):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    print("padded ok")
""")


def test_the_padded_vocabulary_gives_the_unpadded_results_in_the_interpreter():
    """The CUDA path (Triton rows) with the vocabulary padded for aligned bf16 GEMMs gives the
    loss and gradients of the same path without padding: the padded columns are outside the
    softmax and their zero gradient adds nothing to the x gradient."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", PADDED_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "padded ok" in done.stdout, done.stderr[-3000:]
