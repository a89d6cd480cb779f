"""Compare eager, Inductor (with and without activation_memory_budget) and dsgraph.

    python -m benchmarks.run --workloads gpt2,mlp \\
        --configs eager inductor inductor:budget=0.5 dsgraph --regimes none,zero \\
        --parity --json bench_out/results.json

Every (workload, config) runs in its own process (``benchmarks.measure``), so
compile caches in memory, allocator state and peaks never leak between runs; Inductor's
on-disk cache is shared unless ``--fresh-cache`` gives each run its own (first-step
seconds then include cold kernel compiles). Prints a Markdown table and writes JSON with
the date, GPU, torch version and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Any

import torch

from benchmarks import configs, workloads

GIB = 2**30


def environment(argv: list[str], module: str = "benchmarks.run") -> dict[str, Any]:
    """``argv``: the arguments after the module's name."""
    import dsgraph

    env = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dsgraph": dsgraph.__version__,
        "command": f"python -m {module} " + " ".join(argv),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def run_one(args: argparse.Namespace, workload: str, config: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "benchmarks.measure", "--workload", workload, "--config", config,
           "--regimes", args.regimes, "--size", args.size, "--steps", str(args.steps), "--dtype", args.dtype,
           "--device", args.device]
    if args.parity:
        cmd.append("--parity")
    env = dict(os.environ)
    if args.fresh_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cache_")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except subprocess.TimeoutExpired:
        # a run past its limit is a result (recorded), not the end of the benchmark
        return [{"workload": workload, "config": config, "regime": args.regimes,
                 "error": f"timed out after {args.timeout} s"}]
    records = [json.loads(line[len("BENCH_RECORD "):]) for line in proc.stdout.splitlines()
               if line.startswith("BENCH_RECORD ")]
    if records and proc.returncode == 0:
        return records
    tail = (proc.stderr or proc.stdout)[-3000:]
    return [{"workload": workload, "config": config, "regime": args.regimes, "error": tail}]


def _gib(record: dict[str, Any], key: str) -> str:
    return f"{record[key] / GIB:.2f}" if key in record else "-"


def _predicted(record: dict[str, Any]) -> tuple[str, str]:
    pred = record.get("predicted") or {}
    best = pred.get("inductor") or pred.get("fx")
    if not best:
        return "-", "-"
    text = f"{best['peak_bytes'] / GIB:.2f}"
    measured = record.get("peak_allocated_bytes")
    if not measured:
        return text, "-"
    return text, f"{100 * (best['peak_bytes'] - measured) / measured:+.1f}%"


def table(records: list[dict[str, Any]]) -> str:
    head = ("| workload | config | grads | first step s | step ms | peak alloc GiB | peak reserved GiB "
            "| predicted GiB | prediction error | parity max rel err |")
    lines = [head, "|---" * 10 + "|"]
    for r in records:
        if "error" in r:
            err = r["error"].strip().splitlines()[-1][:80] if r["error"].strip() else "failed"
            lines.append(f"| {r['workload']} | {r['config']} | {r['regime']} | error: {err} |" + " |" * 6)
            continue
        parity = r.get("parity_max_rel_err")
        predicted, error = _predicted(r)
        config = r["config"] + (" (FELL BACK TO STOCK)" if r.get("fallback") else "")
        lines.append(
            f"| {r['workload']} | {config} | {r['regime']} | {r['first_step_s']:.1f} | {r['step_ms']:.1f} | "
            f"{_gib(r, 'peak_allocated_bytes')} | {_gib(r, 'peak_reserved_bytes')} | {predicted} | {error} | "
            f"{'-' if parity is None else f'{parity:.1e}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="gpt2,mlp", help=f"comma-separated, of {sorted(workloads.WORKLOADS)}")
    p.add_argument("--configs", nargs="+", default=["eager", "inductor", "dsgraph"],
                   help="space-separated configs; ';' separates options inside one (see benchmarks/configs.py)")
    p.add_argument("--regimes", default="none", help="none (grads set to None), zero (kept, zeroed in place)")
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parity", action="store_true", help="fp32 gradient parity vs eager on a small model")
    p.add_argument("--fresh-cache", action="store_true", help="a new Inductor cache dir per run")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--json", default=None, help="write all records here")
    args = p.parse_args(argv)

    config_texts = args.configs
    for text in config_texts:
        configs.parse(text)  # fail on a typo before spending minutes on the others
    records = []
    env = environment(argv)

    def write() -> None:  # after every run: a call cut short keeps what it measured
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"environment": env, "records": records}, f, indent=1)

    for workload in args.workloads.split(","):
        if not workloads.available(workload):
            print(f"skipping {workload}: its package is not installed", flush=True)
            continue
        for config in config_texts:
            for record in run_one(args, workload, config):
                records.append(record)
                summary = {k: record.get(k) for k in ("first_step_s", "step_ms", "peak_allocated_bytes",
                                                      "parity_max_rel_err", "predicted")}
                status = summary if "error" not in record else "ERROR " + record["error"][-300:]
                print(f"{workload} | {config} | {record['regime']}: {status}", flush=True)
                write()
    result = {"environment": env, "records": records}
    write()
    print()
    print(json.dumps(result["environment"]))
    print(table(records))


if __name__ == "__main__":
    main()
