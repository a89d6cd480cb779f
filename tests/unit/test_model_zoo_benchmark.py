"""benchmarks/model_zoo.py on the CPU (the timings need a GPU: the script runs on an H200):
the zoo's names, and a smoke run of the script on the MLP at tiny size through CPU
Inductor, whose JSON holds the parity figure and both timings."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dsgraph

from benchmarks import model_zoo

ROOT = Path(__file__).resolve().parents[2]


def test_the_zoo_covers_the_families_of_issue_16():
    assert {e.family for e in model_zoo.ZOO} >= {"decoder LM", "encoder", "encoder-decoder", "CNN",
                                                 "vision transformer", "MLP"}
    assert len(model_zoo.BY_NAME) == len(model_zoo.ZOO)


@pytest.mark.e2e
def test_script_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "zoo.json"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.model_zoo", str(out), "--device", "cpu",
                           "--models", "mlp", "--warmup", "1", "--repeats", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    (mlp,) = result["models"]
    assert mlp["model"] == "mlp" and not mlp["parity_failed"] and mlp["parity_worst_ratio"] <= 1
    assert mlp["inductor"]["ms"] > 0 and mlp["dsgraph"]["ms"] > 0 and not mlp["fallbacks"]
    assert "grad_pool" in mlp["pipeline"]["backward"] and "checkpoint" in mlp["pipeline"]["joint"]
    assert mlp["options"]["memory_budget"] > 0 and mlp["options"]["lower_triton"] is True
    # where a model's time went, also printed as each stage ends (a run cut short says it)
    assert list(mlp["stage_seconds"]) == ["inductor compiled and timed", "stock peak predicted", "budget found",
                                          "dsgraph compiled, parity", "dsgraph timed"]
    assert "mlp: budget found" in done.stdout
    assert any("checkpoint" in r for r in mlp["pass_ms"] if r["kind"] == "joint")


class _Broken(torch.nn.Module):
    """Two linear layers with a graph break between them: two compiled pieces."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)

    def forward(self, x):
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return torch.relu(self.b(y)).sum()


@pytest.mark.e2e
def test_stock_peak_of_a_model_with_a_graph_break_is_its_largest_piece():
    """memory_profile refuses a graph break; the zoo then budgets by the largest piece's stock
    peak, each piece planned against the whole budget, and the budget it settles on compiles."""
    torch.manual_seed(0)
    model, inputs = _Broken(), (torch.randn(256, 128),)
    with pytest.raises(ValueError, match="graph break"):
        dsgraph.memory_profile(model, *inputs, pipeline="")
    stock = model_zoo.stock_peak(model, inputs)
    pieces = [r.memory["checkpoint_stock_peak"] for r in dsgraph.reports() if r.kind == "joint"]
    assert len(pieces) == 2 and stock == max(pieces)
    options = model_zoo.full_options(model, inputs, stock)  # returns once every piece compiled under it
    assert options["memory_budget"] >= stock // 2 and options["grad_pool"] and options["lower_triton"]
