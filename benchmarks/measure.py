"""One measurement: one workload, one configuration, one gradient regime, in this process.

The method of FACTS.md's baselines: the model is built in fp32 and run under
``torch.autocast(<device>, torch.bfloat16)`` (``--dtype fp32`` turns autocast off); each
step sets every ``p.grad = None`` (regime "none") or keeps the gradients and zeroes them in
place (regime "zero"), then ``loss = model(*inputs); loss.backward()`` with no optimizer.
The first step (compile included) is timed with a host clock; one untimed step follows,
then ``steps`` timed steps with CUDA events, median reported.
``torch.cuda.reset_peak_memory_stats()`` before the last step and ``max_memory_allocated()``
/ ``max_memory_reserved()`` after it, so peaks are absolute (parameters, inputs and kept
gradients included).

Gradient parity is checked on a small model of the same architecture in fp32 with TF32 off:
the largest ||g - g_eager|| / ||g_eager|| over the loss and all gradients.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks import workloads
from benchmarks.configs import Config, parse


def _step(compiled, model, inputs, regime: str, autocast: bool, device: str):
    if regime == "none":
        for p in model.parameters():
            p.grad = None
    else:
        model.zero_grad(set_to_none=False)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
        loss = compiled(*inputs)
    loss.backward()
    return loss


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_steps(fn, steps: int, device: str) -> list[float]:
    times = []
    for _ in range(steps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def dsgraph_figures() -> dict[str, Any]:
    """What dsgraph's reports say about the graphs it compiled in this process."""
    import dsgraph

    out: dict[str, Any] = {}
    for r in dsgraph.reports():
        out[r.kind] = {"pass_ms": {p.name: round(p.ms, 2) for p in r.passes}, "memory": r.memory,
                       "compile_s": round(r.compile_seconds, 2), "fallback": r.fallback}
    return out


def parity(workload: str, config: Config, device: str) -> float | None:
    if config.backend == "eager":
        return 0.0
    from dsgraph.testing import training_step_parity

    model, inputs = workloads.build(workload, device, "small")
    with config.active():
        result = training_step_parity(model, inputs, config.compile)
    return max(r.rel_err for r in result.rows)


def measure(workload: str, config_text: str, regime: str, device: str, size: str, steps: int,
            dtype: str, check_parity: bool) -> dict[str, Any]:
    config = parse(config_text)
    autocast = dtype == "bf16"
    record: dict[str, Any] = {"workload": workload, "config": config_text, "regime": regime,
                              "size": size, "dtype": dtype, "device": device}
    torch._dynamo.reset()
    model, inputs = workloads.build(workload, device, size)
    with config.active():
        compiled = config.compile(model)
        t0 = time.perf_counter()
        _step(compiled, model, inputs, regime, autocast, device)
        _sync(device)
        record["first_step_s"] = round(time.perf_counter() - t0, 3)
    run = lambda: _step(compiled, model, inputs, regime, autocast, device)  # noqa: E731
    run()  # untimed
    _sync(device)
    times = _time_steps(run, steps - 1, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times += _time_steps(run, 1, device)
    record["step_ms"] = round(statistics.median(times), 3)
    record["step_ms_all"] = [round(t, 3) for t in times]
    if device.startswith("cuda"):
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    record["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if config.backend == "dsgraph":
        record["dsgraph"] = dsgraph_figures()
    del compiled, model, inputs, run
    if check_parity:
        record["parity_max_rel_err"] = parity(workload, config, device)
    return record


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one benchmark measurement; prints one JSON line")
    p.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    p.add_argument("--config", required=True)
    p.add_argument("--regime", default="none", choices=["none", "zero"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--parity", action="store_true")
    args = p.parse_args(argv)
    record = measure(args.workload, args.config, args.regime, args.device, args.size, args.steps,
                     args.dtype, args.parity)
    sys.stdout.write("BENCH_RECORD " + json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
