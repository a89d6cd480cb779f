"""A fallback kernel's outputs that Inductor assumes unaligned never take part in the
wrapper's buffer reuse: the pool's key holds the alignment (``buffer_reuse_key``) and what
the wrapper allocates is aligned. ``FallbackKernel.create`` marks the outputs unaligned when
an input is, and on a CPU every graph input is (``should_assume_input_aligned``): Inductor's
CPU code for ``QAndGate``'s backward says "buffer buf9 (op: ..._scaled_dot_product_flash_
attention_for_cpu_backward.default) is assumed to be not aligned" for each gradient of the
attention backward, which reads saved tensors, and nothing of the kind for the forward's
attention, which reads buffers of its own graph. Counted as pooled, Llama's halfway plan was
predicted 2.21% low on a CPU (issue 12)."""

from types import SimpleNamespace

import pytest
import torch

from dsgraph.analysis.inductor_model import Buffer, InductorRun
from dsgraph.analysis.inductor_reuse import reuse_pool
from tests.unit.test_inductor_loop_order import QAndGate, stock_runs


@pytest.mark.parametrize("unaligned", [False, True])
def test_an_unaligned_buffer_is_not_handed_out_again(unaligned):
    run = InductorRun(kernels=[0, 1, 2])
    first = Buffer(64, torch.float32, 0, 0, 0, kernel=0, self_allocated=True, unaligned=unaligned)
    later = Buffer(64, torch.float32, 2, 2, 2, kernel=2)
    for b in (first, later):
        b.planned = (b.start, b.end, b.nbytes)
    run.buffers = [first, later]
    reuse_pool(run, SimpleNamespace(donated=frozenset()))
    assert (later.nbytes, first.end) == ((64, 0) if unaligned else (0, 2))


def test_the_attention_backward_reading_saved_tensors_is_unaligned_on_cpu(monkeypatch):
    torch.manual_seed(0)
    _, model, runs = stock_runs(QAndGate(True), (torch.randn(3, 7, 32),), monkeypatch)
    forward, backward = runs

    def attention(run, name):
        return [b for b in run.buffers if b.self_allocated and name in model.nodes[b.node].name]

    fw, bw = attention(forward, "attention_for_cpu"), attention(backward, "attention_for_cpu_backward")
    assert fw and bw
    assert not any(b.unaligned for b in fw)
    assert all(b.unaligned for b in bw)
