"""The checkpoint planner's smallest plan on the CPU zoo against per-block checkpointing.

    python -m benchmarks.zoo_smallest [--models resnet50,gated,llama,gpt24,cnn,masked]

For each model of ``tests/zoo.py`` (CPU sizes) and each executor: the candidate cuts, the
smallest plan's predicted peak (the ``BudgetError`` of a 1-byte budget) and the stock
partition's predicted peak of the same model with per-block ``torch.utils.checkpoint``
(the quantities ``tests/e2e/test_checkpoint_zoo.py`` compares), and the planning seconds.
ResNet-50 runs under bf16 autocast and is FX only, as its test. Prints one line each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsgraph.errors import BudgetError  # noqa: E402
from dsgraph.recompute import truth  # noqa: E402
from dsgraph.recompute.cuts import candidate_cuts  # noqa: E402
from dsgraph.recompute.joint import JointGraph  # noqa: E402
from dsgraph.recompute.planner import plan_checkpoint  # noqa: E402
from tests import zoo  # noqa: E402


def _capture(name: str, per_block: bool, autocast):
    model, inputs = zoo.build(name, per_block=per_block)
    return truth.capture_joint(model, inputs, autocast)


def _static(j) -> list:
    return j.kwargs.get("static_lifetime_input_indices") or []


def smallest(j, executor: str) -> int:
    try:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor=executor)
    except BudgetError as e:
        return e.smallest_feasible
    raise AssertionError("a 1-byte budget was met")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,gated,llama,gpt24,cnn,masked")
    args = p.parse_args(argv)
    print("model executor cuts smallest_B per_block_B vs_per_block_% planning_s")
    for name in args.models.split(","):
        if not zoo.available(name):
            print(name, "unavailable (transformers missing)")
            continue
        autocast = torch.bfloat16 if name == "resnet50" else None
        j = _capture(name, False, autocast)
        blocked = _capture(name, True, autocast)
        joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], _static(j))
        cuts = len(candidate_cuts(joint))
        for executor in ("fx",) if name == "resnet50" else ("fx", "inductor"):
            if name == "resnet50":  # the stock partition's FX plan, as the ResNet test
                model, inputs = zoo.build(name, per_block=True)
                per_block = truth.compiled_peaks(model, inputs, truth.stock, inductor=False, autocast=autocast).fx_peak
            else:
                per_block = blocked.stock_prediction(executor)
            t = time.perf_counter()
            low = smallest(j, executor)
            dt = time.perf_counter() - t
            print(name, executor, cuts, low, per_block, f"{100 * (low / per_block - 1):+.2f}", f"{dt:.1f}", flush=True)


if __name__ == "__main__":
    main()
