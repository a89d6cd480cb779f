"""The nodes whose emulated op count differs from Inductor's (CPU), for a zoo model or the
small GPT of tests/e2e/test_inductor_opcount.py: node, FX target, Inductor's (ops, distinct
loads), the emulation's, and whether a threshold (30 GPU, 50 CPU) lies between them.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python -m benchmarks.opcount_diff llama cnn gpt
"""

from __future__ import annotations

import sys

import torch

from dsgraph.analysis.inductor_ops import Rules
from dsgraph.recompute import truth
from tests import zoo
from tests.e2e import test_inductor_opcount as opcount


class _Patch:
    """pytest's monkeypatch, the two calls the test's helpers make."""

    def __init__(self):
        self.undo = []

    def setattr(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def close(self):
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)
        self.undo = []


def _model(name: str):
    if name != "gpt":
        return zoo.build(name)
    from dsgraph.models import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=211, seq=64, layers=2, heads=2, dim=32)
    ids = torch.randint(0, cfg.vocab, (8, cfg.seq))
    return GPT(cfg), (ids, ids.clone())


def report(name: str) -> list[str]:
    model, inputs = _model(name)
    j = truth.capture_joint(model, inputs, autocast=torch.bfloat16)
    patch = _Patch()
    try:
        mine = opcount._emulated_counts(patch, j)
        patch.close()
        real = opcount._inductor_counts(patch, model, inputs)
    finally:
        patch.close()
    by = {n.name: n for n in j.gm.graph.nodes}
    order = {n: k for k, n in enumerate(by)}
    both = sorted(set(mine) & set(real), key=lambda n: order.get(n, 0))
    thresholds = (Rules.for_device("cuda").opcount, Rules.for_device("cpu").opcount)
    off = [n for n in both if abs(real[n][0] - mine[n][0]) > 2 or real[n][1] != mine[n][1]]
    lines = []
    for n in off:
        across = any((real[n][0] > t) != (mine[n][0] > t) for t in thresholds)
        target = by[n].target if n in by else "?"
        lines.append(f"{n:28s} {str(target):40s} inductor={real[n]} emulated={mine[n]}{' ACROSS' if across else ''}")
    across = sum(1 for line in lines if line.endswith("ACROSS"))
    lines.insert(0, f"== {name}: {len(off)} of {len(both)} nodes off, {across} across a threshold")
    return lines


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["gpt"]:
        print("\n".join(report(model_name)), flush=True)
