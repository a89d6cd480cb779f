"""The chunked loss (issue 15) on one GPU: GPT-2-small, transformers' GPT-2, and capacity.

Three parts, each one command (each stays under 10 minutes on an H200 with the defaults;
``--configs`` / ``--batches`` narrow a part), each writing one JSON (``--json``):

    python -m benchmarks.chunk_loss --part gpt2 --json $OUT/chunk_loss_gpt2.json
    python -m benchmarks.chunk_loss --part hf --json $OUT/chunk_loss_hf.json
    python -m benchmarks.chunk_loss --part capacity --backends inductor --json $OUT/capacity_inductor.json
    python -m benchmarks.chunk_loss --part capacity --backends dsgraph --json $OUT/capacity_dsgraph.json

CPU check of the whole script at tiny size (what the tests run):

    python -m benchmarks.chunk_loss --part gpt2 --size tiny --device cpu --steps 2 --json /tmp/c.json

Method (FACTS.md "Baselines"): fp32 models under bf16 autocast, gradients set to None each
step, one untimed step after the compile step, then the timed steps with CUDA events,
median; the peak is ``max_memory_allocated`` over the last step. Every configuration runs
in a fresh process, so an out-of-memory or a compile failure does not touch the others.

- ``gpt2``: ``dsgraph.models`` GPT-2-small, 16 x 1024 (``benchmarks.workloads`` "gpt2"),
  through ``benchmarks.measure`` (with the fp32 gradient-parity check on the small model):
  Inductor; dsgraph without chunking; dsgraph with chunking and no budget; dsgraph under
  memory budgets of 2 and 2.5 GiB (chunked: the default under a budget). dsgraph under a
  budget without chunking is in FACTS.md (2.94 GiB: 37.6 ms / 2.985 GiB); add
  ``--configs "dsgraph:memory_budget=2.94GiB;chunk_loss=false"`` to measure it again.
- ``hf``: transformers' GPT2LMHeadModel 12 x 768, 8 x 1024, the loss computed outside the
  model in transformers' causal-LM form (``labels=`` breaks Dynamo's graph): workload
  "hf_gpt2"; Inductor, dsgraph without and with chunking, and under a 3 GiB budget.
- ``capacity``: a 24-layer GPT (d=1024, 16 heads, vocabulary 50304) at 1024 tokens per
  row, under a memory cap (``torch.cuda.set_per_process_memory_fraction``, default 16 GiB):
  for each backend, the batch doubles until one does not train (out of memory, or dsgraph's
  budget is infeasible), then bisection to ``--resolution``; the largest batch that trains
  and its tokens per second. dsgraph gets ``memory_budget`` = the cap less ``--reserve`` (CUDA workspaces and the
  allocator's fragmentation are outside the budget).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

GIB = 2**30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PART_CONFIGS = {
    "gpt2": [
        "inductor",
        "dsgraph:chunk_loss=false",
        "dsgraph:chunk_loss=true",
        "dsgraph:memory_budget=2GiB",
        "dsgraph:memory_budget=2.5GiB",
    ],
    "hf": [
        "inductor",
        "dsgraph:chunk_loss=false",
        "dsgraph:chunk_loss=true",
        "dsgraph:memory_budget=3GiB",
    ],
}
PART_WORKLOAD = {"gpt2": "gpt2", "hf": "hf_gpt2"}
# tiny sizes (the CPU check): budgets scaled to a tiny model
TINY_CONFIGS = ["dsgraph:chunk_loss=false;inductor=false", "dsgraph:chunk_loss=2;inductor=false",
                "dsgraph:memory_budget=1GiB;inductor=false"]

# first batch of the doubling search (then bisection): near the expected capacity
CAPACITY_START = {"inductor": 8, "dsgraph": 16}


def environment(argv: list[str]) -> dict[str, Any]:
    from benchmarks.run import environment as base

    env = base(argv)
    env["command"] = "python -m benchmarks.chunk_loss " + " ".join(argv)
    return env


# -- parts gpt2 and hf: benchmarks.measure in a fresh process per configuration -------------------

def run_measure(workload: str, config: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.measure", "--workload", workload, "--config", config,
           "--regimes", "none", "--size", args.size, "--steps", str(args.steps), "--dtype", "bf16",
           "--device", args.device]
    if args.parity:
        cmd.append("--parity")
    return _subprocess(cmd, "BENCH_RECORD ", {"workload": workload, "config": config}, args.timeout)


def _subprocess(cmd: list[str], tag: str, what: dict[str, Any], timeout: int) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        return {**what, "error": f"timed out after {timeout} s", "output": str(e.stdout or "")[-2000:]}
    records = [json.loads(line[len(tag):]) for line in proc.stdout.splitlines() if line.startswith(tag)]
    if records and proc.returncode == 0:
        return records[0]
    return {**what, "error": (proc.stderr or proc.stdout)[-3000:]}


def chunk_stats(record: dict[str, Any]) -> dict[str, Any]:
    """What the chunk_loss pass reported (chunks, chunk tokens, logits and workspace bytes)."""
    pre = (record.get("dsgraph") or {}).get("pre_grad") or {}
    return {k: v for k, v in (pre.get("memory") or {}).items() if k.startswith("chunk_loss_")}


# -- part capacity: one probe (backend, batch) per process --------------------------------------

def capacity_model(size: str):
    from dsgraph.models import GPT, GPTConfig

    if size == "full":
        cfg = GPTConfig(vocab=50304, seq=1024, layers=24, heads=16, dim=1024)
    else:
        cfg = GPTConfig(vocab=97, seq=16, layers=2, heads=2, dim=32)
    return GPT(cfg), cfg


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Does (backend, batch) train under the cap? Compile, one untimed step, timed steps."""
    from benchmarks.measure import _step, _sync, time_steps
    from dsgraph.models import gpt_inputs

    device, cap = spec["device"], spec["cap_bytes"]
    out: dict[str, Any] = {"backend": spec["backend"], "batch": spec["batch"]}
    if device.startswith("cuda"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0))
        out["cap_bytes"] = cap
    torch.manual_seed(0)
    model, cfg = capacity_model(spec["size"])
    model = model.to(device)
    inputs = gpt_inputs(cfg, spec["batch"], device)
    if spec["backend"] == "inductor":
        compiled = torch.compile(model, backend="inductor")
    else:
        compiled = torch.compile(model, backend="dsgraph", options=dict(spec["options"]))
        out["options"] = spec["options"]
    autocast = True
    try:
        t0 = time.perf_counter()
        _step(compiled, model, inputs, "none", autocast, device)
        _sync(device)
        out["first_step_s"] = round(time.perf_counter() - t0, 2)
        run = lambda: _step(compiled, model, inputs, "none", autocast, device)  # noqa: E731
        run()
        _sync(device)
        times = time_steps(run, spec["steps"] - 1, device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times += time_steps(run, 1, device)
    except Exception as e:  # out of memory, an infeasible budget: this batch does not train
        out["trains"] = False
        out["why"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        out["kind"] = "oom" if oom else ("budget" if "budget" in str(e).lower() else "error")
        return out
    out["trains"] = True
    out["step_ms"] = round(statistics.median(times), 3)
    out["tokens_per_s"] = round(spec["batch"] * cfg.seq / (out["step_ms"] / 1e3), 1)
    if device.startswith("cuda"):
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if spec["backend"] == "dsgraph":
        from benchmarks.measure import dsgraph_figures

        figures = dsgraph_figures()
        out["chunk_loss"] = {k: v for k, v in ((figures.get("pre_grad") or {}).get("memory") or {}).items()}
        joint = (figures.get("joint") or {}).get("memory") or {}
        out["checkpoint"] = {k: joint[k] for k in ("checkpoint_predicted_peak", "checkpoint_inductor_peak",
                                                   "checkpoint_recompute_ms") if k in joint}
    return out


def _next_batch(ok: int, bad: int | None, resolution: int, max_batch: int) -> int | None:
    """Doubling until a batch fails, then bisection between the largest that trains and
    the smallest that does not, to ``resolution``."""
    if bad is None:
        return ok * 2 if ok * 2 <= max_batch else None
    if bad - ok <= resolution:
        return None
    return (ok + bad) // 2


def capacity(args: argparse.Namespace, backend: str, record) -> dict[str, Any]:
    cap = int(float(args.cap_gib) * GIB)
    options = {"memory_budget": cap - int(float(args.reserve_gib) * GIB), "fallback": "error"}
    if args.device == "cpu":
        options["inductor"] = False
    probes: list[dict[str, Any]] = []

    def try_batch(batch: int) -> bool:
        spec = {"backend": backend, "batch": batch, "device": args.device, "cap_bytes": cap, "size": args.size,
                "steps": args.steps, "options": options}
        result = _subprocess([sys.executable, "-m", "benchmarks.chunk_loss", "--probe", json.dumps(spec)],
                             "PROBE_RECORD ", {"backend": backend, "batch": batch, "trains": False},
                             args.timeout)
        probes.append(result)
        record(probes)
        print(f"capacity {backend} batch {batch}: " + ("trains" if result.get("trains") else
              f"does not train ({result.get('why') or result.get('error', '')[-200:]})"), flush=True)
        return bool(result.get("trains"))

    if args.batches:  # in the order given, until one does not train
        for batch in (int(b) for b in args.batches.split(",")):
            if time.perf_counter() > args.deadline or not try_batch(batch):
                break
    else:
        ok, bad = 0, None
        batch: int | None = CAPACITY_START[backend] if args.size == "full" else 2
        while batch is not None and time.perf_counter() < args.deadline:
            if try_batch(batch):
                ok = batch
            else:
                bad = batch
                if ok == 0:  # not even the first: halve
                    batch = batch // 2 if batch > 1 else None
                    continue
            batch = _next_batch(ok, bad, args.resolution, args.max_batch if args.size == "full" else 4)
    ok_probes = [p for p in probes if p.get("trains")]
    best = max(ok_probes, key=lambda p: p["batch"]) if ok_probes else None
    return {"backend": backend, "cap_bytes": cap, "probes": probes,
            "largest_batch": best["batch"] if best else 0,
            "tokens_per_s": best["tokens_per_s"] if best else None,
            "searched_to": args.resolution if not args.batches else None}


# -- tables -----------------------------------------------------------------------------------

def measure_table(records: list[dict[str, Any]]) -> str:
    lines = ["| config | step ms | peak alloc GiB | predicted GiB | chunks | parity max rel err |", "|---" * 6 + "|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error'].strip().splitlines()[-1][:90]} | | | | |")
            continue
        pred = (r.get("predicted") or {}).get("inductor") or (r.get("predicted") or {}).get("fx") or {}
        peak, parity = r.get("peak_allocated_bytes"), r.get("parity_max_rel_err")
        cells = [r["config"] + (" (FELL BACK)" if r.get("fallback") else ""), f"{r['step_ms']:.1f}",
                 f"{peak / GIB:.3f}" if peak else "-", f"{pred['peak_bytes'] / GIB:.3f}" if pred else "-",
                 str(chunk_stats(r).get("chunk_loss_chunks", "-")), "-" if parity is None else f"{parity:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capacity_table(results: list[dict[str, Any]]) -> str:
    lines = ["| backend | largest batch | tokens/s | step ms | peak alloc GiB |", "|---" * 5 + "|"]
    for c in results:
        best = next((p for p in c["probes"] if p.get("trains") and p["batch"] == c["largest_batch"]), None)
        if best is None:
            lines.append(f"| {c['backend']} | none trains | - | - | - |")
            continue
        peak = best.get("peak_allocated_bytes")
        lines.append(f"| {c['backend']} | {best['batch']} | {best['tokens_per_s']:.0f} | {best['step_ms']:.1f} | "
                     f"{'-' if peak is None else f'{peak / GIB:.2f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["gpt2", "hf", "capacity"])
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # one capacity probe (internal)
    p.add_argument("--configs", nargs="+", default=None, help="configs of benchmarks/configs.py (gpt2, hf)")
    p.add_argument("--backends", default="inductor,dsgraph", help="capacity: comma-separated")
    p.add_argument("--batches", default=None, help="capacity: batches tried in this order until one fails "
                   "(default: doubling from 8 (Inductor) or 16 (dsgraph), then bisection)")
    p.add_argument("--resolution", type=int, default=2, help="capacity: bisection stops at this batch gap")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--cap-gib", default="16", help="capacity: memory cap in GiB")
    p.add_argument("--reserve-gib", default="1", help="capacity: dsgraph budget = cap - reserve")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-parity", dest="parity", action="store_false")
    p.add_argument("--timeout", type=int, default=560, help="seconds per configuration or probe")
    p.add_argument("--deadline-s", type=float, default=570, help="start nothing new after this many seconds")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.probe is not None:
        sys.stdout.write("PROBE_RECORD " + json.dumps(probe(json.loads(args.probe))) + "\n")
        return
    if args.part is None:
        p.error("--part is required")
    args.deadline = time.perf_counter() + args.deadline_s
    result: dict[str, Any] = {"environment": environment(argv), "part": args.part}

    def save() -> None:
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    if args.part in PART_CONFIGS:
        from benchmarks import configs, workloads

        workload = PART_WORKLOAD[args.part]
        texts = args.configs or (PART_CONFIGS[args.part] if args.size == "full" else TINY_CONFIGS)
        for text in texts:
            configs.parse(text)
        if not workloads.available(workload):
            result["error"] = f"{workload}: its package is not installed"
            save()
            print(result["error"])
            return
        result["records"] = []
        for text in texts:
            if time.perf_counter() > args.deadline:
                result["records"].append({"workload": workload, "config": text, "error": "skipped: deadline"})
                continue
            record = run_measure(workload, text, args)
            result["records"].append(record)
            save()
            brief = {k: record.get(k) for k in ("step_ms", "peak_allocated_bytes", "parity_max_rel_err")}
            print(f"{workload} | {text}: {brief if 'error' not in record else 'ERROR ' + record['error'][-300:]} "
                  f"{chunk_stats(record)}", flush=True)
        print(measure_table(result["records"]))
    else:
        result["capacity"] = []
        for backend in args.backends.split(","):
            current: dict[str, Any] = {"backend": backend, "probes": []}
            result["capacity"].append(current)

            def record(probes, current=current):
                current["probes"] = probes
                save()

            current.update(capacity(args, backend, record))
            save()
        print(capacity_table(result["capacity"]))
    save()


if __name__ == "__main__":
    main()
