"""What is allocated at the peak of one training step, from the CUDA allocator's history.

    python -m benchmarks.alloc_replay --workload budget_test --budget 2523414534 [--fp32] [--json F]
    python -m benchmarks.alloc_replay --workload gpt2 --budget 2.94GiB

Runs a model compiled by dsgraph for a few steps, records the caching allocator's history
(``torch.cuda.memory._record_memory_history``, C++ frames too) from before the first call,
replays the alloc and free events to the last step's peak, and prints the live blocks at
that point (each with its Python frame, that frame's source line, which for Inductor's
wrapper names the buffer, and its C++ frames), next to Inductor's plan of the same step as
dsgraph stitches it (``memory_profile``: its peak and the intervals live there) and the
peak of the plans the session checked (``checkpoint_inductor_peak``). ``--workload``: the
GPU budget test's model or a ``benchmarks.workloads`` name. What it is for: finding memory outside the
compiled graphs' plans (library workspaces), which a memory budget does not cover.
CUDA only (the allocator history is CUDA's).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import linecache
import os
from typing import Callable, Iterable


def replay(events: Iterable[dict], base: int = 0, start: int = 0) -> tuple[int, dict[int, dict]]:
    """(peak bytes, live blocks by address at the peak) of an allocator event list: ``alloc``
    adds a block, ``free_completed`` removes it (a ``free_requested`` block is still
    allocated until then). ``base``: bytes allocated before the first event. ``start``: the
    peak is looked for from that event on (the events before it only say what is live:
    a history recorded from the process's start, the peak of its last step)."""
    live: dict[int, dict] = {}
    current = base
    peak, at_peak = -1, {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            current += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])["size"]
        if i >= start and current > peak:
            peak, at_peak = current, dict(live)
    return max(peak, base), at_peak


_GENERATED = re.compile(r"^c[a-z0-9]{51}\.py$")  # Inductor's output code: c<hash>.py


def graph_frame(event: dict) -> str | None:
    """The outermost frame in Inductor's generated code ("file:line"): which compiled graph,
    and which line of it (a buffer's allocation, an extern kernel's call), was running."""
    found = None
    for f in event.get("frames", []):
        if _GENERATED.match(os.path.basename(f["filename"])):
            found = f
    return f"{os.path.basename(found['filename'])}:{found['line']}" if found else None


def phase_peaks(events: list[dict], base: int, start: int) -> dict[str, tuple[int, dict[int, dict]]]:
    """Per compiled graph that ran from event ``start`` on (named by its generated file, in
    the order they first ran: a forward, then its backward), the peak while that graph was
    the last to allocate, and the blocks live there."""
    live: dict[int, dict] = {}
    current, phase = base, None
    peaks: dict[str, tuple[int, dict[int, dict]]] = {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            current += e["size"]
            frame = graph_frame(e)
            if i >= start and frame is not None:
                phase = frame.split(":")[0]
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])["size"]
        if i >= start and phase is not None and current > peaks.get(phase, (-1, None))[0]:
            peaks[phase] = (current, dict(live))
    return peaks


def where(event: dict, depth: int = 3) -> str:
    """The innermost Python frames of an allocation, innermost first."""
    frames = [f for f in event.get("frames", []) if f["filename"].endswith(".py")]
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames[:depth])


# allocator and dispatch frames say nothing about who asked for the memory
_PLUMBING = ("CUDACachingAllocator", "c10::", "torch::unwind", "torch::CapturedTraceback", "gather_with_cpp",
             "torch::cuda::", "THPVariable", "torch::autograd::python", "_PyObject", "_PyFunction", "cfunction_",
             "method_vectorcall", "PyVectorcall", "slot_tp_call", "_Py", "Py_", "at::detail::empty", "at::empty", "at::native::empty",
             "_PyEval", "PyObject", "torch::autograd::", "at::_ops::", "c10::impl", "std::", "_start",
             "__libc", "pybind11::", "torch::jit", "at::native::resize", "at::TensorBase")


def native(event: dict, depth: int = 3) -> str:
    """The innermost C++ frames of an allocation that name a library or kernel (recorded with
    ``stacks="all"``): what allocated memory a Python frame shows only as an op call."""
    names = [f["name"] for f in event.get("frames", []) if not f["filename"].endswith(".py")]
    useful = [n for n in names if n and not any(p in n for p in _PLUMBING)]
    return " < ".join(n[:80] for n in useful[:depth])


def source_line(event: dict) -> str:
    """The source text of the innermost Python frame: for Inductor's generated wrapper,
    the line that allocates the buffer (``buf12 = empty_strided_cuda(...)``)."""
    for f in event.get("frames", []):
        if f["filename"].endswith(".py"):
            return linecache.getline(f["filename"], f["line"]).strip()
    return ""


def group(blocks: dict[int, dict], key: Callable[[dict], str] = where) -> list[tuple[int, str]]:
    sizes: collections.Counter = collections.Counter()
    for e in blocks.values():
        sizes[key(e)] += e["size"]
    return [(size, k) for k, size in sizes.most_common()]


def describe(event: dict) -> str:
    """One line per live block: Python frame, its source text, the generated code's line that
    was running and, when recorded, C++ frames."""
    text = f"{where(event, 1)} | {source_line(event)[:90]} | graph {graph_frame(event)}"
    cpp = native(event)
    return f"{text} | {cpp}" if cpp else text


def _budget_test_model():
    """The GPU budget test's model (tests/gpu/test_gpu.py)."""
    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    import torch

    cfg = GPTConfig(vocab=32768, seq=1024, layers=4, heads=8, dim=1024)
    torch.manual_seed(2)
    return GPT(cfg).cuda(), gpt_inputs(cfg, 8, "cuda", seed=2)


def _model(name: str):
    if name == "budget_test":
        return _budget_test_model()
    from benchmarks import workloads

    return workloads.build(name, "cuda")


def planned_at_peak(model, inputs, options: dict, autocast, top: int) -> dict:
    """Inductor's plan of the step as dsgraph stitches it (``memory_profile``): its peak, where,
    and the intervals live there, largest first."""
    import dsgraph

    with autocast:
        prof = dsgraph.memory_profile(model, *inputs, **options)
    tl = prof.timelines.get("inductor") or prof.timelines["fx"]

    def live_at(i: int) -> list:
        return [[iv.nbytes, iv.label] for iv in sorted(tl.live_at(i), key=lambda iv: -iv.nbytes)]

    phases = {}
    for graph in ("forward", "backward"):
        steps = [i for i, e in enumerate(tl.entries) if e.graph == graph]
        if steps:
            i = max(steps, key=lambda k: tl.entries[k].live_bytes)
            phases[graph] = {"peak_bytes": tl.entries[i].live_bytes, "node": tl.entries[i].node, "live": live_at(i)}
    return {"peak_bytes": tl.peak_bytes, "peak_node": prof.peak_node, "external_bytes": prof.external_bytes,
            "live": live_at(tl.peak_index())[:top], "phases": phases,
            "entries": [[e.graph, e.node, e.live_bytes] for e in tl.entries]}


def main() -> None:
    import torch

    import dsgraph
    from dsgraph.testing import loss_of
    from dsgraph.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="budget_test", help="budget_test or a benchmarks.workloads name")
    p.add_argument("--budget", required=True, help="memory_budget (bytes, or with a unit: 2.94GiB)")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--stacks", choices=["python", "all"], default="all", help="C++ frames too (all)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    budget = parse_bytes(args.budget, "--budget")
    model, inputs = _model(args.workload)
    options = {"memory_budget": budget, "fallback": "error"}
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=not args.fp32)
    # recorded from before the first compiled call, so that what a step finds allocated
    # (library workspaces made at the first call) has its frames too
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks=args.stacks)
    planned = planned_at_peak(model, inputs, options, autocast, args.top)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dsgraph", options=options)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            first = len(torch.cuda.memory._snapshot()["device_traces"][0])
        with autocast:
            loss = loss_of(compiled(*inputs))
        loss.backward()
        del loss
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    measured = torch.cuda.max_memory_allocated()
    memory = [r for r in dsgraph.reports() if r.kind == "joint"][-1].memory
    checked = memory.get("checkpoint_inductor_peak") or 0
    peak, blocks = replay(snapshot["device_traces"][0], base, first)
    out = {"workload": args.workload, "budget": budget, "measured_peak": measured, "replayed_peak": peak,
           "allocated_before_compile": base, "allocated_before_step": before, "checkpoint_inductor_peak": checked,
           "plan": planned,
           "at_peak": [[size, key] for size, key in group(blocks, describe)[: args.top * 2]],
           "at_peak_by_frame": [[size, key] for size, key in group(blocks)[: args.top]],
           "phases": {name: {"peak_bytes": b, "live": [[size, key] for size, key in group(live, describe)]}
                      for name, (b, live) in phase_peaks(snapshot["device_traces"][0], base, first).items()},
           "largest_blocks": [{"size": e["size"], "frames": [f"{os.path.basename(f['filename'])}:{f['line']}:{f['name'][:80]}"
                                                             for f in e.get("frames", [])][:40]}
                              for e in sorted(blocks.values(), key=lambda e: -e["size"])[: args.top]]}
    print(f"budget {budget} B; measured peak {measured} B, replayed {peak} B; Inductor's plans "
          f"{checked} B (checked by the session), {planned['peak_bytes']} B (memory_profile, at "
          f"{planned['peak_node']}); outside the plan {(measured - planned['peak_bytes']) / 2**20:.1f} MiB; "
          f"allocated before compiling {base} B, before the step {before} B")
    print("plan, live at its peak:")
    for size, label in planned["live"]:
        print(f"{size / 2**20:10.1f} MiB  {label}")
    for graph, ph in planned["phases"].items():
        print(f"plan's {graph} peak {ph['peak_bytes']} B at {ph['node']}")
    for name, ph in out["phases"].items():
        print(f"measured while {name} ran: peak {ph['peak_bytes'] + 0} B (blocks since recording "
              f"{sum(s for s, _ in ph['live'])} B)")
    print("measured, live at the peak (before-step blocks included):")
    for size, key in out["at_peak"]:
        print(f"{size / 2**20:10.1f} MiB  {key}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
