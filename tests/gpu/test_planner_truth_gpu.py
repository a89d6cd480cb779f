"""The checkpoint planner's Inductor prediction against Inductor's own buffer plan on CUDA
(issue 12): the stock partition and the planner's smallest plan of a GPT step under bf16
autocast, each compiled through Inductor to code generation, predicted within 3%.

On CUDA Inductor stores pointwise expressions of more than 30 ops (50 on the CPU), so an
op count that differs from Inductor's changes which buffers exist only there; the CPU zoo
tests cannot see it. Session 7 measured the 4-layer GPT at full width
(``python -m benchmarks.planner_truth --layers 4``) at +25.7% / +40.5% before the op-count
fix and -0.001% / -0.002% after; this test is the same comparison at a size that compiles
in well under a minute, run by the GPU tier."""

import pytest
import torch

from benchmarks.planner_truth import compare
from dsgraph.models import GPT, GPTConfig

pytestmark = pytest.mark.gpu


def test_inductor_prediction_within_3_percent_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=32768, seq=512, layers=2, heads=8, dim=512)
    model = GPT(cfg).cuda()
    ids = torch.randint(0, cfg.vocab, (4, cfg.seq), device="cuda")
    out = compare(model, (ids, ids.clone()))
    errors = {label: r["error"] for label, r in out.items()}
    assert set(errors) == {"stock", "smallest"}
    assert all(abs(e) <= 0.03 for e in errors.values()), errors
