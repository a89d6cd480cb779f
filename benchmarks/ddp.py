"""Data parallelism in one run: dsgraph's in-graph all-reduce against DDP eager and DDP + Inductor.

    torchrun --nproc_per_node 2 -m benchmarks.ddp --workload gpt2 --json $OUT/ddp.json
    NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 -m benchmarks.ddp --json $OUT/ddp_p2p_off.json
    torchrun --nproc_per_node 2 -m benchmarks.ddp --systems "ddp_inductor,dsgraph,dsgraph:compress=bf16"
    torchrun --nproc_per_node 2 -m benchmarks.ddp --size tiny --steps 3      # CPU check (gloo)

For each system, on every rank, in this order (all in this process, ``torch._dynamo.reset()``
and a fresh model between systems; dsgraph last, its gradient pool stays allocated):

- ``step_ms``: the data-parallel step: forward, backward, gradient averaging. Method of
  FACTS.md's data-parallel table (``benchmarks.measure``): fp32 model under bf16 autocast
  (``--dtype fp32`` turns it off), every ``p.grad = None`` before the step, no optimizer; the
  first step (compile) timed with a host clock, one untimed step, then ``--steps`` timed
  steps (CUDA events on GPU), median; the ranks meet at a barrier before every step.
- ``compute_ms``: the same step without gradient communication (``ddp.no_sync()``;
  ``dsgraph.no_sync(model)``: the same compiled graphs without their collectives).
- ``allreduce_ms``: all-reduce of the gradients' bytes alone (a flat buffer, in that
  system's buckets: DDP's 1 MiB first bucket then ``bucket_cap_mb`` = 25 MiB; dsgraph's first
  bucket of 1 MiB then ``bucket_mb`` (25 by default), in its wire dtype: bf16 with
  ``compress=bf16``), issued back to back and waited at the end, median.
- ``hidden_fraction`` = (compute + allreduce - step) / allreduce: the share of the
  all-reduce that the step overlaps with computation (1: all of it).

Rank 0 prints a Markdown table and writes JSON (``--json``) with the environment and every
timing. ``--systems`` picks systems: ``ddp_eager``, ``ddp_inductor``, ``dsgraph`` with optional
dsgraph options after a colon (``dsgraph:compress=bf16;bucket_mb=50``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from benchmarks import workloads
from benchmarks.configs import _value
from benchmarks.measure import _sync
from benchmarks.run import environment

MIB = 1 << 20
DDP_FIRST_BUCKET = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_MB = 25


def _timed(fn: Callable[[], Any], steps: int, device: str) -> list[float]:
    """Per-step milliseconds; ranks start each step together."""
    times = []
    for _ in range(steps):
        dist.barrier()
        _sync(device)
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


def _chunks(total: int, first: int, rest: int) -> list[int]:
    """Bucket sizes in bytes: ``first``, then ``rest`` each, the remainder last."""
    sizes, left = [], total
    while left > 0:
        size = min(left, first if not sizes else rest)
        sizes.append(size)
        left -= size
    return sizes


def allreduce_alone(grad_bytes: int, dtype: torch.dtype, first: int, rest: int, steps: int, device: str) -> list[float]:
    """The gradients' bytes all-reduced in these buckets, issued back to back, waited at the end."""
    elems = grad_bytes // 4  # gradients are fp32; compressed ones travel in fewer bytes
    flat = torch.randn(elems, device=device).to(dtype)
    views, at = [], 0
    for size in _chunks(elems * dtype.itemsize, first, rest):
        n = size // dtype.itemsize
        views.append(flat[at:at + n])
        at += n

    def run() -> None:
        works = [dist.all_reduce(v, async_op=True) for v in views]
        for w in works:
            w.wait()

    run()
    return _timed(run, steps, device)


def _step(fn, model, inputs, autocast: bool, device: str) -> None:
    for p in model.parameters():
        p.grad = None
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
        loss = fn(*inputs)
    loss.backward()


def measure_system(system: str, args: argparse.Namespace, device: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dsgraph

    name, _, rest = system.partition(":")
    options = {k.strip(): _value(v.strip()) for k, _, v in (i.partition("=") for i in filter(None, rest.split(";")))}
    torch._dynamo.reset()
    dsgraph.clear_reports()
    model, _ = workloads.build(args.workload, device, args.size)
    cfg_inputs = _rank_inputs(args, device)
    autocast = args.dtype == "bf16"
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if name == "dsgraph":
        dsgraph.replicate(model)
        fn = torch.compile(model, backend="dsgraph", options={"data_parallel": True, **options})
        no_sync = lambda: dsgraph.no_sync(model)  # noqa: E731
        wire = torch.bfloat16 if options.get("compress") == "bf16" else torch.float32
        first, bucket = min(MIB, int(options.get("bucket_mb", DDP_BUCKET_MB) * MIB)), int(options.get("bucket_mb", DDP_BUCKET_MB) * MIB)
    elif name in ("ddp_eager", "ddp_inductor"):
        if options:
            raise ValueError(f"{name} takes no options")
        ddp = DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
        fn = ddp if name == "ddp_eager" else torch.compile(ddp, backend="inductor")
        no_sync = ddp.no_sync
        wire, first, bucket = torch.float32, DDP_FIRST_BUCKET, DDP_BUCKET_MB * MIB
    else:
        raise ValueError(f"unknown system {system!r}: ddp_eager, ddp_inductor or dsgraph[:options]")

    step = lambda: _step(fn, model, cfg_inputs, autocast, device)  # noqa: E731

    def step_local() -> None:
        with no_sync():
            step()

    t0 = time.perf_counter()
    step()
    _sync(device)
    first_step_s = time.perf_counter() - t0
    step_local()  # compiles what no_sync needs (DDP + Inductor may recompile; dsgraph does not)
    step()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    step_times = _timed(step, args.steps, device)
    record: dict[str, Any] = {"system": system, "first_step_s": round(first_step_s, 2)}
    if device.startswith("cuda"):
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    compute_times = _timed(step_local, args.steps, device)
    ar_times = allreduce_alone(grad_bytes, wire, first, bucket, args.steps, device)
    step_ms, compute_ms, ar_ms = (statistics.median(t) for t in (step_times, compute_times, ar_times))
    record.update({
        "step_ms": round(step_ms, 3), "compute_ms": round(compute_ms, 3), "allreduce_ms": round(ar_ms, 3),
        "hidden_fraction": round((compute_ms + ar_ms - step_ms) / ar_ms, 3) if ar_ms > 0 else None,
        "step_ms_all": [round(t, 3) for t in step_times], "compute_ms_all": [round(t, 3) for t in compute_times],
        "allreduce_ms_all": [round(t, 3) for t in ar_times], "gradient_bytes": grad_bytes,
        "wire_dtype": str(wire), "buckets_bytes": [first, bucket],
    })
    if name == "dsgraph":
        for r in dsgraph.reports():
            for p in r.passes:
                if p.name == "allreduce":
                    record["dsgraph_allreduce"] = {k: v for k, v in p.stats.items()}
    del fn, model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return record


def _rank_inputs(args: argparse.Namespace, device: str):
    """This rank's batch: the workload's inputs drawn with a rank-dependent seed."""
    torch.manual_seed(1000 + dist.get_rank())
    _, inputs = workloads.build(args.workload, "cpu", args.size)
    g = torch.Generator().manual_seed(1000 + dist.get_rank())
    out = []
    for t in inputs:
        if t.dtype.is_floating_point:
            out.append(torch.randn(t.shape, generator=g).to(device))
        else:
            out.append(torch.randint(0, int(t.max()) + 1, t.shape, generator=g).to(device))
    return tuple(out)


def table(records: list[dict[str, Any]]) -> str:
    rows = ["| system | step ms | compute alone ms | all-reduce alone ms | all-reduce hidden |",
            "|---|---|---|---|---|"]
    for r in records:
        hidden = "-" if r["hidden_fraction"] is None else f"{100 * r['hidden_fraction']:.0f}%"
        rows.append(f"| {r['system']} | {r['step_ms']:.1f} | {r['compute_ms']:.1f} | {r['allreduce_ms']:.1f} | {hidden} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="gpt2", choices=sorted(workloads.WORKLOADS))
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--systems", default="ddp_eager,ddp_inductor,dsgraph")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    records = [measure_system(s.strip(), args, device) for s in args.systems.split(",") if s.strip()]
    if dist.get_rank() == 0:
        env = environment(argv if argv is not None else [])
        env["command"] = "torchrun -m benchmarks.ddp " + " ".join(sys.argv[1:] if argv is None else argv)
        env.update({"world_size": dist.get_world_size(), "backend": dist.get_backend(),
                    "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE"), "workload": args.workload,
                    "size": args.size, "dtype": args.dtype, "steps": args.steps})
        print(table(records), flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"environment": env, "records": records}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
