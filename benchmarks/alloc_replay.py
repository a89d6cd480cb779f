"""What is allocated at the peak of one training step, from the CUDA allocator's history.

    python -m benchmarks.alloc_replay --workload budget_test --budget 2523414534 [--fp32]

Runs a model compiled by dsgraph for a few steps, records the caching allocator's history
(``torch.cuda.memory._record_memory_history``) during the last one, replays the alloc and
free events to the step's peak, and prints the live blocks at that point grouped by the
Python frames that allocated them, next to the peak of Inductor's own plans that the
session checked (``checkpoint_inductor_peak``). What it is for: finding memory outside the
compiled graphs' plans (library workspaces), which a memory budget does not cover.
CUDA only (the allocator history is CUDA's).
"""

from __future__ import annotations

import argparse
import collections
import os
from typing import Iterable


def replay(events: Iterable[dict], base: int = 0) -> tuple[int, dict[int, dict]]:
    """(peak bytes, live blocks by address at the peak) of an allocator event list: ``alloc``
    adds a block, ``free_completed`` removes it (a ``free_requested`` block is still
    allocated until then). ``base``: bytes allocated before the first event."""
    live: dict[int, dict] = {}
    current = peak = base
    at_peak: dict[int, dict] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            current += e["size"]
            if current > peak:
                peak, at_peak = current, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])["size"]
    return peak, at_peak


def where(event: dict, depth: int = 3) -> str:
    """The innermost Python frames of an allocation, innermost first."""
    frames = [f for f in event.get("frames", []) if f["filename"].endswith(".py")]
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames[:depth])


def group(blocks: dict[int, dict]) -> list[tuple[int, str]]:
    sizes: collections.Counter = collections.Counter()
    for e in blocks.values():
        sizes[where(e)] += e["size"]
    return [(size, key) for key, size in sizes.most_common()]


def _budget_test_model():
    """The GPU budget test's model (tests/gpu/test_gpu.py)."""
    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    import torch

    cfg = GPTConfig(vocab=32768, seq=1024, layers=4, heads=8, dim=1024)
    torch.manual_seed(2)
    return GPT(cfg).cuda(), gpt_inputs(cfg, 8, "cuda", seed=2)


def main() -> None:
    import torch

    import dsgraph
    from dsgraph.testing import loss_of

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["budget_test"], default="budget_test")
    p.add_argument("--budget", type=int, required=True, help="memory_budget in bytes")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    model, inputs = _budget_test_model()
    compiled = torch.compile(model, backend="dsgraph", options={"memory_budget": args.budget, "fallback": "error"})
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=not args.fp32)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=200000)
        with autocast:
            loss = loss_of(compiled(*inputs))
        loss.backward()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    measured = torch.cuda.max_memory_allocated()
    plan = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    planned = plan.get("checkpoint_inductor_peak") or 0
    peak, blocks = replay(snapshot["device_traces"][0], base)
    print(f"measured peak {measured} B, replayed {peak} B, Inductor's plans {planned} B, "
          f"outside them {(measured - planned) / 2**20:.1f} MiB; allocated before the step {base} B")
    for size, key in group(blocks)[: args.top]:
        print(f"{size / 2**20:10.1f} MiB  {key}")


if __name__ == "__main__":
    main()
