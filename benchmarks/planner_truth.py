"""Where the checkpoint planner's Inductor prediction differs from Inductor's own plan, on
the device at hand (a diagnostic: the CPU zoo tests hold it within 3%; this shows a gap on
a GPU buffer by buffer).

    python -m benchmarks.planner_truth --layers 4 --json $OUT/truth.json     # H200

The zoo's 24-layer GPT at its H200 width with fewer layers, bf16 autocast, on CUDA: its
joint graph captured, then the stock partition and the planner's smallest plan each
compiled through Inductor (stopped after code generation) and compared with the prediction:
both peaks, where each peaks, and the 25 largest live buffers at each peak.
"""

from __future__ import annotations

import argparse
import json

import torch

from dsgraph.analysis.step_model import StepModel
from dsgraph.errors import BudgetError
from dsgraph.recompute import truth
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.planner import external_bytes, plan_checkpoint


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    from dsgraph.models import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=50304, seq=1024, layers=args.layers, heads=16, dim=1024) if args.device != "cpu" else \
        GPTConfig(vocab=211, seq=64, layers=args.layers, heads=2, dim=32)
    model = GPT(cfg).to(args.device)
    ids = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), device=args.device)
    inputs = (ids, ids.clone())
    compare(model, inputs, args.json)


def compare(model, inputs, json_path: str | None = None) -> dict:
    """The stock partition and the planner's smallest plan of ``model``'s bf16 step, each
    compiled through Inductor to code generation: the planner's prediction against
    Inductor's own plan (``error``), where each peaks and the largest buffers live there.
    Written to ``json_path`` after each partition when given."""
    j = truth.capture_joint(model, inputs, autocast=torch.bfloat16)
    static = j.kwargs.get("static_lifetime_input_indices") or []
    joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], static)
    sm = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static, external=external_bytes(joint))
    try:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor="inductor")
    except BudgetError as e:
        low = e.smallest_feasible
    out = {}
    for label, budget in (("stock", 1 << 50), ("smallest", low)):
        made = {}

        def choose(gm, joint_inputs, kwargs, budget=budget):
            made["plan"] = plan_checkpoint(gm, joint_inputs, kwargs, budget, executor="inductor")
            return made["plan"].forward, made["plan"].backward

        real = truth.compiled_peaks(model, inputs, choose, inductor=True, autocast=torch.bfloat16)
        plan = made["plan"]
        by = {n.name: n for n in j.gm.graph.nodes}
        saved = [sm.index[by[n]] for n in real.saved_names if n in by]
        pred = sm.evaluate(saved, "inductor", explain=True)
        tl = real.inductor
        i = tl.peak_index()
        out[label] = {
            "predicted_peak": plan.predicted_peak, "model_peak_of_saved": pred.peak, "inductor_peak": tl.peak_bytes,
            "error": plan.predicted_peak / tl.peak_bytes - 1,
            "predicted_at": list(pred.steps[pred.peak_step]), "inductor_at": str(tl.entries[i]),
            "predicted_live": [list(x) for x in pred.live_at(pred.peak_step)[:25]],
            "inductor_live": [[iv.label, iv.nbytes, iv.start, iv.end] for iv in
                              sorted(tl.live_at(i), key=lambda iv: -iv.nbytes)[:25]],
            "allocations": {k: v[:400] for k, v in real.allocations.items()},
        }
        print(label, {k: out[label][k] for k in ("predicted_peak", "model_peak_of_saved", "inductor_peak", "error")},
              flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
