"""Inductor's peak-estimate curve of a plan's backward against the emulation's, step by step
(a diagnostic for the wrapper pool's hand-overs: ``AllocateLine.should_reuse_buffer`` takes a
freed buffer when the estimate between the free and the allocation stays under the peak).

    python -m benchmarks.curve_diff --workload gpt24 --budget 3345400832 --json $OUT/curves.json

The plan is the one ``benchmarks.budget_gap`` rebuilds (the chunked loss planned for the
budget, the CUDA BLAS workspaces beside the graphs). Writes, for the last graph compiled
(the backward), Inductor's curve over its scheduler nodes with each node's FX origins, and
the emulation's curve over its scheduled steps with each step's FX nodes, and prints the
first step where the two part once matched by their nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import torch

from benchmarks import workloads


def curves(workload: str, device: str, size: str, budget: int) -> dict:
    from benchmarks.planner_gap import gap
    from dsgraph.analysis.library_memory import blas_workspace_bytes
    from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
    from dsgraph.recompute import truth

    model, inputs = workloads.build(workload, device, size)

    def pre_grad(gm):
        return apply_chunk_loss(gm, plan_chunk_loss(gm, budget=budget))

    j = truth.capture_joint(model, inputs, torch.bfloat16, pre_grad)
    library = blas_workspace_bytes(j.gm)
    with contextlib.redirect_stdout(io.StringIO()):
        out = gap(model, inputs, j, budget, workload, autocast=torch.bfloat16, pre_grad=pre_grad,
                  verbose=False, extra_external=library)
    sm, trace = out["sm"], out["trace"]
    inductor = out["inductor_estimates"][-1]
    _, model_curve, groups, buffers = trace.curves[-1]
    origins = out["real"].step_origins.get("backward", [])
    return {"inductor": {"overall": inductor["overall"], "curve": list(inductor["curve"]),
                         "origins": [list(o) for o in origins], "nodes": inductor.get("nodes", []),
                         "buffers": inductor.get("buffers", []),
                         "buffer_origins": out["real"].origins.get("backward", {})},
            "model": {"curve": list(model_curve), "groups": [[sm.nodes[i].name for i in g] for g in groups],
                      "buffers": [(sm.nodes[n].name, e, nb, list(pl), i, o, fr) for n, e, nb, pl, i, o, fr in buffers]}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="gpt24")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    got = curves(args.workload, args.device, args.size, args.budget)
    with open(args.json, "w") as f:
        json.dump(got, f)
    ind, mod = got["inductor"], got["model"]
    print(f"inductor: {len(ind['curve'])} steps, peak {ind['overall']}; model: {len(mod['curve'])} steps, "
          f"peak {max(mod['curve'], default=0)}")


if __name__ == "__main__":
    main()
