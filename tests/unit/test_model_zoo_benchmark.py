"""benchmarks/model_zoo.py on the CPU (the timings need a GPU: the script runs on an H200):
the zoo's names, and a smoke run of the script on the MLP at tiny size through CPU
Inductor, whose JSON holds the parity figure and both timings."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
