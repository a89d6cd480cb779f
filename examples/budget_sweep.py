"""Sweep dsgraph's memory budget on a GPT: predicted peak, recomputation, and (on a GPU) the
measured peak and step time at each budget.

    python examples/budget_sweep.py                  # small GPT on the CPU, FX execution
    python examples/budget_sweep.py --gpt2 --device cuda --points 6

dsgraph first reports the two ends of the range: the stock partition's predicted peak (a
budget that large changes nothing) and the smallest feasible budget (a smaller one is a
ValueError that names it). Then it compiles the model at evenly spaced budgets between
them. A smaller budget never gives a larger predicted peak.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.errors import BudgetError, find_cause
from dsgraph.models import GPT, GPTConfig, gpt_inputs


def step(compiled, model, inputs, device):
    for p in model.parameters():
        p.grad = None
    with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        loss = compiled(*inputs)
    loss.backward()


def compile_at(model, inputs, device, options):
    """Compile and run one step; the joint report of this compile."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    step(compiled, model, inputs, device)
    return compiled, [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory


def smallest_feasible(model, inputs, device, options) -> int:
    try:
        compile_at(model, inputs, device, {**options, "memory_budget": 1})
    except BackendCompilerFailed as e:
        cause = find_cause(e, BudgetError)
        if cause is None:
            raise
        return cause.smallest_feasible
    raise RuntimeError("a budget of 1 byte was accepted")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--gpt2", action="store_true", help="GPT-2-small, batch 16 x 1024 (use a GPU)")
    p.add_argument("--points", type=int, default=4)
    args = p.parse_args()
    device = torch.device(args.device)
    cfg = GPTConfig.gpt2_small() if args.gpt2 else GPTConfig(vocab=256, seq=128, layers=4, heads=4, dim=128)
    batch = 16 if args.gpt2 else 8
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    inputs = gpt_inputs(cfg, batch, device)
    options = {"fallback": "error"} if device.type == "cuda" else {"fallback": "error", "inductor": False}

    _, stock = compile_at(model, inputs, device, {**options, "memory_budget": "1TiB"})
    low = smallest_feasible(model, inputs, device, options)
    high = stock["checkpoint_stock_peak"]
    print(f"stock partition: predicted peak {high / 2**30:.3f} GiB; smallest feasible budget {low / 2**30:.3f} GiB")
    print("| budget GiB | predicted GiB | recomputed segments | recompute ms (model) | measured GiB | step ms |")
    print("|---|---|---|---|---|---|")
    for i in range(args.points):
        budget = high - (high - low) * i // max(1, args.points - 1)
        compiled, memory = compile_at(model, inputs, device, {**options, "memory_budget": budget})
        measured, ms = "-", "-"
        if device.type == "cuda":
            step(compiled, model, inputs, device)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            step(compiled, model, inputs, device)
            torch.cuda.synchronize()
            ms = f"{(time.perf_counter() - t0) * 1e3:.1f}"
            measured = f"{torch.cuda.max_memory_allocated() / 2**30:.3f}"
        print(f"| {budget / 2**30:.3f} | {memory['checkpoint_predicted_peak'] / 2**30:.3f} | "
              f"{memory['checkpoint_recomputed_segments']} | {memory['checkpoint_recompute_ms']} | {measured} | {ms} |")


if __name__ == "__main__":
    main()
