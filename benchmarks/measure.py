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
import contextlib
import json
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks import kernel_compiles, workloads
from dsgraph.report.capture import capture as capture_compiles
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


def time_steps(fn, steps: int, device: str) -> list[float]:
    """Milliseconds of each of ``steps`` calls of ``fn``: CUDA events on a GPU, the host clock otherwise."""
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


def predicted_peaks(captured, model, inputs, regime: str) -> dict[str, Any]:
    """dsgraph's predictions of the steady step just measured: the state at its start is
    the parameters, buffers and inputs, plus the gradients when they are kept ("zero")."""
    from dsgraph.memory import step_external, step_start_tensors, step_timelines

    compiles = [c for c in captured.compiles if c.fallback is None and "backward" in c.stages]
    if len(compiles) != 1:
        return {"error": f"{len(compiles)} compiled graphs with a backward"}
    tensors = step_start_tensors(model, inputs, kept_grads=(regime == "zero"))
    t0 = time.perf_counter()
    # the BLAS workspaces too: without them every CUDA prediction read about 66 MiB low
    timelines = step_timelines(compiles[0], step_external(compiles[0], tensors))
    out = {name: {"peak_bytes": tl.peak_bytes, "peak_at": f"{tl.peak_entry.graph}:{tl.peak_entry.node}"}
           for name, tl in timelines.items()}
    out["analysis_s"] = round(time.perf_counter() - t0, 3)
    return out


def parity(workload: str, config: Config, device: str) -> float | None:
    if config.backend == "eager":
        return 0.0
    from dsgraph.testing import training_step_parity

    model, inputs = workloads.build(workload, device, "small")
    with config.active():
        result = training_step_parity(model, inputs, config.compile)
    return max(r.rel_err for r in result.rows)


def measure(workload: str, config_text: str, regimes: list[str], device: str, size: str, steps: int,
            dtype: str, check_parity: bool) -> list[dict[str, Any]]:
    """One record per regime. The regimes share one compile: zeroing gradients happens
    outside the compiled graphs, so the graphs are the same; the allocator's cache is
    emptied between regimes so each peak is the regime's own."""
    config = parse(config_text)
    autocast = dtype == "bf16"
    torch._dynamo.reset()
    model, inputs = workloads.build(workload, device, size)
    capture = capture_compiles() if config.backend == "dsgraph" else contextlib.nullcontext()
    with config.active(), capture as captured:
        compiled = config.compile(model)
        t0 = time.perf_counter()
        with kernel_compiles.recorded() as kernels:
            _step(compiled, model, inputs, regimes[0], autocast, device)
            _sync(device)
        first_step_s = round(time.perf_counter() - t0, 3)
    records = []
    for regime in regimes:
        record: dict[str, Any] = {"workload": workload, "config": config_text, "regime": regime,
                                  "size": size, "dtype": dtype, "device": device, "first_step_s": first_step_s,
                                  "first_step_kernels": kernel_compiles.summary(kernels)}
        if device.startswith("cuda"):
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        run = lambda: _step(compiled, model, inputs, regime, autocast, device)  # noqa: E731
        run()  # untimed: in regime "zero" this creates the gradients the timed steps keep
        _sync(device)
        times = time_steps(run, steps - 1, device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times += time_steps(run, 1, device)
        record["step_ms"] = round(statistics.median(times), 3)
        record["step_ms_all"] = [round(t, 3) for t in times]
        if device.startswith("cuda"):
            record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        if config.backend == "dsgraph":
            record["dsgraph"] = dsgraph_figures()
            fallbacks = {r["fallback"] for r in record["dsgraph"].values() if r["fallback"]}
            if fallbacks:
                record["fallback"] = sorted(fallbacks)[0]  # the figures are stock Inductor's
            record["predicted"] = predicted_peaks(captured, model, inputs, regime)
        records.append(record)
    del compiled, model, inputs
    if check_parity:
        err = parity(workload, config, device)
        for record in records:
            record["parity_max_rel_err"] = err
    return records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one benchmark measurement; prints one JSON line")
    p.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    p.add_argument("--config", required=True)
    p.add_argument("--regimes", default="none", help="comma-separated: none, zero")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--parity", action="store_true")
    args = p.parse_args(argv)
    regimes = args.regimes.split(",")
    if set(regimes) - {"none", "zero"}:
        p.error(f"regimes must be none and/or zero, got {args.regimes}")
    for record in measure(args.workload, args.config, regimes, args.device, args.size, args.steps,
                          args.dtype, args.parity):
        sys.stdout.write("BENCH_RECORD " + json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
