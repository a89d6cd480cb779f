"""How long dsgraph's analyses take on transformer graphs of growing depth (CPU).

    python -m benchmarks.analysis_cost --layers 12,24,48

For each depth, the GPT reference model (small width: the cost depends on the number of
nodes, not on tensor sizes) is compiled once with ``inductor=False`` under a capture; then
the analyses run on its forward and backward graphs, each timed as the best of five:
``TensorLifetimes`` on both graphs, the whole-step ``MemoryTimeline`` (both FX plans and the
stitch), and the ``reorder_for_memory`` plan. A second compile with a memory budget times
the ``checkpoint`` pass (once: it includes Inductor's min-cut for the stock partition and
the simulated plans) and its solver (the Pareto DP). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import time

import torch

from dsgraph.report.capture import capture as capture_compiles
from dsgraph.analysis.lifetimes import TensorLifetimes, default_held
from dsgraph.analysis.step import graph_inputs_external, stage_timelines
from dsgraph.models import GPT, GPTConfig, gpt_inputs


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(layers: int) -> dict:
    torch._dynamo.reset()
    cfg = GPTConfig(vocab=256, seq=32, layers=layers, heads=2, dim=32)
    model = GPT(cfg)
    with capture_compiles() as cap:
        torch.compile(model, backend="dsgraph", options={"inductor": False})(*gpt_inputs(cfg, 2)).backward()
    captured = cap.compiles[0]
    fw, bw = captured.stages["forward"].after, captured.stages["backward"].after
    nodes = len(fw.graph.nodes) + len(bw.graph.nodes)
    reorder = importlib.import_module("dsgraph.passes.reorder_for_memory")
    external = graph_inputs_external(captured.stages)
    torch._dynamo.reset()
    torch.compile(model, backend="dsgraph", options={"inductor": False, "memory_budget": "1TiB"})(
        *gpt_inputs(cfg, 2)).backward()
    import dsgraph

    joint = [r for r in dsgraph.reports() if r.kind == "joint"][-1]
    checkpoint_ms = next(p.ms for p in joint.passes if p.name == "checkpoint")
    return {
        "checkpoint_s": checkpoint_ms / 1e3,
        "solver_s": joint.memory["checkpoint_solver_ms"] / 1e3,
        "segments": joint.memory["checkpoint_segments"],
        "layers": layers,
        "nodes": nodes,
        "lifetimes_s": best_of(lambda: (TensorLifetimes(fw, default_held("forward")),
                                        TensorLifetimes(bw, default_held("backward")))),
        "timeline_s": best_of(lambda: stage_timelines(captured.stages, captured.saved_names, external)),
        "reorder_plan_s": best_of(lambda: (reorder.plan_reorder(fw, TensorLifetimes(fw, default_held("forward"))),
                                           reorder.plan_reorder(bw, TensorLifetimes(bw, default_held("backward"))))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="12,24,48")
    args = parser.parse_args()
    rows = [measure(int(n)) for n in args.layers.split(",")]
    print("| blocks | fw+bw nodes | TensorLifetimes s | MemoryTimeline s | reorder plan s | checkpoint segments | checkpoint pass s | its solver s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layers']} | {r['nodes']} | {r['lifetimes_s']:.3f} | {r['timeline_s']:.3f} | {r['reorder_plan_s']:.3f} "
              f"| {r['segments']} | {r['checkpoint_s']:.2f} | {r['solver_s']:.3f} |")


if __name__ == "__main__":
    main()
