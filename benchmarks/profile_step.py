"""Where a training step's time goes, kernel by kernel, for several configs in one process.

    python -m benchmarks.profile_step --workload gpt2 --configs inductor "dsgraph:memory_budget=5GiB" \\
        --json out/profile.json

For each config (one compile each, ``torch._dynamo.reset()`` between them): warm-up steps,
then ``--steps`` steps under ``torch.profiler``; per kernel name the launches and time per
step (device time on CUDA, CPU self time on CPU), and the step's total. One JSON for all
configs, because a device call returns few files. Steps are set up as ``benchmarks.measure``
sets them up (bf16 autocast unless ``--dtype fp32``, gradients set to None). What it is for:
comparing two configs of one model (which kernels a recomputation plan adds, and what they
cost), not timing a step (``benchmarks.run`` does that, without the profiler's overhead).
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

import torch

from benchmarks import workloads
from benchmarks.configs import parse
from benchmarks.measure import _step, _sync


def profile(workload: str, config_text: str, device: str, size: str, steps: int, dtype: str,
            warmup: int = 3, top: int = 40) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    config = parse(config_text)
    autocast = dtype == "bf16"
    torch._dynamo.reset()
    model, inputs = workloads.build(workload, device, size)
    with config.active():
        compiled = config.compile(model)
        for _ in range(warmup):
            _step(compiled, model, inputs, "none", autocast, device)
        _sync(device)
        on_cuda = device.startswith("cuda")
        activities = [ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
        with torch_profile(activities=activities) as prof:
            for _ in range(steps):
                _step(compiled, model, inputs, "none", autocast, device)
            _sync(device)
    per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        us = event.device_time_total if on_cuda else event.self_cpu_time_total
        if us <= 0:
            continue
        row = per_name[event.key]
        row[0] += event.count
        row[1] += us
    kernels = sorted(((name, n / steps, us / steps / 1e3) for name, (n, us) in per_name.items()),
                     key=lambda r: -r[2])
    return {
        "workload": workload, "config": config_text, "device": device, "size": size, "dtype": dtype,
        "steps": steps, "time": "device" if on_cuda else "cpu self",
        "total_ms": round(sum(r[2] for r in kernels), 4),
        "launches": round(sum(r[1] for r in kernels), 1),
        "kernels": [{"name": name, "per_step": round(n, 2), "ms": round(ms, 4)} for name, n, ms in kernels[:top]],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--top", type=int, default=40, help="kernels kept per config, by time")
    p.add_argument("--json", help="write all configs' profiles to this file")
    args = p.parse_args(argv)
    results = []
    for config in args.configs:
        r = profile(args.workload, config, args.device, args.size, args.steps, args.dtype, top=args.top)
        results.append(r)
        print(f"## {args.workload} {config}: {r['total_ms']:.3f} ms of {r['time']} time per step, "
              f"{r['launches']:.0f} launches")
        for k in r["kernels"][:15]:
            print(f"{k['ms']:9.4f} ms {k['per_step']:7.1f}x  {k['name'][:120]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python -m benchmarks.profile_step", "profiles": results}, f, indent=1)


if __name__ == "__main__":
    main()
