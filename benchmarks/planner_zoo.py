"""The checkpoint planner against each model's hand-written anchor (issue 12), in one run.

    python -m benchmarks.planner_zoo --json $OUT/planner_zoo.json                 # H200
    python -m benchmarks.planner_zoo --size tiny --device cpu --models gpt24 --json z.json

For each model: the anchor (transformers' own gradient checkpointing for the Llama
decoder, torch.utils.checkpoint per block for the 24-layer GPT and the vision transformer, Inductor's
activation_memory_budget=0.5 for ResNet-50, its budget 0.9 for the MLP) is measured first; then dsgraph with
``memory_budget`` set to the anchor's measured peak (the target: that memory, faster than
the anchor), and a budget 10% below it (monotone: not larger). Inductor without a budget
is the reference; ``--variants`` adds dsgraph runs at the anchor's budget with more options
(``chunk_loss=False``: the same budget without the chunked loss). Every run is its own process (``benchmarks.measure``: bf16 autocast,
grads None, median of CUDA-event step times, absolute peak); the JSON is written after
each run, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks import run as bench_run

# model -> (the dsgraph workload, the anchor's workload and config)
ANCHORS = {
    "llama": ("llama", "llama_gc", "inductor"),
    "gpt24": ("gpt24", "gpt24_ckpt", "inductor"),
    "resnet50": ("resnet50_b128", "resnet50_b128", "inductor:budget=0.5"),
    "vit": ("vit", "vit_ckpt", "inductor"),
    # the MLP target: at Inductor's best budget point's memory, at least as fast
    "mlp": ("mlp", "mlp", "inductor:budget=0.9"),
    # the GPT-2 target: every Inductor budget point dominated (a dsgraph budget at
    # its memory, faster)
    "gpt2@0.9": ("gpt2", "gpt2", "inductor:budget=0.9"),
    "gpt2@0.5": ("gpt2", "gpt2", "inductor:budget=0.5"),
    "gpt2@0.1": ("gpt2", "gpt2", "inductor:budget=0.1"),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ANCHORS), help=f"comma-separated, of {sorted(ANCHORS)}")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--below", type=float, default=0.9,
                   help="a second budget, this fraction of the anchor's peak (0: none)")
    p.add_argument("--no-inductor", action="store_true", help="leave out Inductor without a budget")
    p.add_argument("--fresh-cache", action="store_true",
                   help="a new Inductor cache dir per run (first steps then include cold kernel compiles)")
    p.add_argument("--variants", nargs="*", default=[],
                   help="more dsgraph options run at the anchor's budget, each ';'-separated "
                        "(e.g. 'chunk_loss=False'): what a plan would give with them, same run")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ns = argparse.Namespace(regimes="none", size=args.size, steps=args.steps, dtype="bf16", device=device,
                            parity=False, fresh_cache=args.fresh_cache, timeout=args.timeout)
    env = bench_run.environment(sys.argv[1:] if argv is None else argv, "benchmarks.planner_zoo")
    out = {"environment": env, "records": []}

    def record(model: str, role: str, workload: str, config: str) -> dict:
        rec = bench_run.run_one(ns, workload, config)[0]
        rec.update(model=model, role=role)
        out["records"].append(rec)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        peak = rec.get("peak_allocated_bytes")
        print(f"{model:10s} {role:14s} {config:40s} step {rec.get('step_ms')} ms  peak "
              f"{peak / 2**30 if peak else float('nan'):.3f} GiB  first {rec.get('first_step_s')} s"
              + (f"  ERROR {rec['error'][-300:]}" if "error" in rec else ""), flush=True)
        return rec

    for model in args.models.split(","):
        workload, anchor_workload, anchor_config = ANCHORS[model]
        anchor = record(model, "anchor", anchor_workload, anchor_config)
        if not args.no_inductor:
            record(model, "inductor", workload, "inductor")
        target = anchor.get("peak_allocated_bytes") or anchor.get("peak_reserved_bytes")
        if not target:
            continue  # on CPU no peak is measured: the anchor's budget is unknown
        record(model, "dsgraph@anchor", workload, f"dsgraph:memory_budget={target}")
        for variant in args.variants:
            record(model, f"dsgraph@anchor {variant}", workload, f"dsgraph:memory_budget={target};{variant}")
        if args.below:
            record(model, f"dsgraph@{args.below:g}x", workload, f"dsgraph:memory_budget={int(target * args.below)}")


if __name__ == "__main__":
    main()
