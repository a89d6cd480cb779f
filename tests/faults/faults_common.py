"""Shared pieces of the fault-injection tests: a tiny language model every single-process
pass applies to (an embedding, a GELU MLP, a layer norm, an output projection into
``F.cross_entropy`` for chunk_loss, and a parameter used elementwise, whose pooled gradient
``slot += g * h`` is a region lower_triton takes by default), the fallback warnings of one
call, and Triton's interpreter for the lowering tests."""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dsgraph.compile import backend
from dsgraph.errors import DsgraphFallbackWarning

VOCAB, DIM, SEQ, BATCH = 37, 16, 7, 3


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.up = nn.Linear(DIM, 3 * DIM - 1)
        self.down = nn.Linear(3 * DIM - 1, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.gate = nn.Parameter(1 + 0.1 * torch.randn(BATCH, SEQ, DIM))

    def forward(self, idx, targets):
        h = self.tok(idx) * self.gate
        h = h + self.down(F.gelu(self.up(h)))
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def lm_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))


def fresh_lm(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM()


@contextlib.contextmanager
def fallback_warnings():
    """Collects the DsgraphFallbackWarning messages raised inside (the backend shows each
    distinct failure once per process: forget the ones earlier tests saw)."""
    backend._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(w.message) for w in caught if issubclass(w.category, DsgraphFallbackWarning))


@contextlib.contextmanager
def triton_interpreter():
    """Triton's interpreter (what TRITON_INTERPRET=1 sets), through Triton's knob for the
    test only: an environment variable set while pytest imports modules would make the GPU
    tier's Inductor kernels interpreted too (tests/unit/test_lowering_pass.py). Triton reads
    the knob when a kernel is made, and dsgraph makes its kernels inside the tests."""
    import triton

    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    try:
        yield
    finally:
        triton.knobs.runtime.interpret = old
