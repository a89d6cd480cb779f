"""The planner's Inductor prediction error on the CPU model zoo, every model and plan in one
table (the loop of tests/e2e/test_checkpoint_zoo_inductor.py, printed instead of asserted).

    python -m benchmarks.planner_zoo_errors                 # gated llama gpt24 cnn masked
    python -m benchmarks.planner_zoo_errors llama cnn

Per model (tests/zoo.py, CPU sizes): the stock partition, a plan halfway between it and the
smallest feasible budget, and the smallest plan, each chosen by the planner for the
Inductor executor and compiled through Inductor (plans read after code generation); per
plan the predicted peak, Inductor's own plan's peak and the error. A plan is the planner's
choice at its budget, so two versions of the emulation may compare different saved sets.
``benchmarks.planner_gap`` shows one plan buffer by buffer.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint


def main(argv: list[str] | None = None) -> None:
    from tests import zoo
    from tests.e2e.test_checkpoint_zoo import NAMES, captured, smallest, stock_peak

    names = (sys.argv[1:] if argv is None else argv) or NAMES
    for name in names:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()  # a fresh cache: the scheduler runs
        t = time.time()
        j = captured(name)
        low = smallest(j, "inductor").smallest_feasible
        stock = stock_peak(j, "inductor")
        model, inputs = zoo.build(name)
        out = []
        for label, budget in (("stock", 1 << 50), ("halfway", (low + stock) // 2), ("smallest", low)):
            made = {}

            def choose(gm, joint_inputs, kwargs, budget=budget):
                made["plan"] = plan_checkpoint(gm, joint_inputs, kwargs, budget, executor="inductor")
                return made["plan"].forward, made["plan"].backward

            real = truth.compiled_peaks(model, inputs, choose, inductor=True).inductor_peak
            predicted = made["plan"].predicted_peak
            out.append(f"{label} {predicted} {real} {predicted / real - 1:+.2%}")
        print(name, " | ".join(out), f"({time.time() - t:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
