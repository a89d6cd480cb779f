"""How long the checkpoint planner takes on GPTs of growing depth (CPU).

    python -m benchmarks.planner_cost --layers 12,24,48 [--json out.json]

For each depth, the GPT reference model at GPT-2-small width (768, 12 heads, vocabulary
50304) is traced at a small batch (default 2 x 128: the planner's work depends on the
graph's nodes, not on tensor sizes; the meta device does not work, Inductor's joint-graph
passes fold a meta graph away), its joint graph captured once,
then ``plan_checkpoint`` timed for: a budget the stock partition meets, a budget halfway
between the stock peak and the smallest plan, and the smallest plan, for the Inductor and
the FX executor. Also reported: nodes, cuts (segments), exact plan evaluations, and the
time of the stock min-cut partition alone (Inductor's own partitioner, which the planner
runs first). ``--bf16``: the step under bf16 autocast with the chunked loss, as the
benchmarks run GPT-2 (more nodes: the casts). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsgraph.errors import BudgetError  # noqa: E402
from dsgraph.models import GPT, GPTConfig  # noqa: E402
from dsgraph.recompute import truth  # noqa: E402
from dsgraph.recompute.planner import plan_checkpoint  # noqa: E402


def capture(layers: int, device: str, batch: int, seq: int, bf16: bool = False):
    """``bf16``: the step as the benchmarks run GPT-2 (bf16 autocast, the chunked loss)."""
    torch.manual_seed(0)
    cfg = GPTConfig(layers=layers, seq=seq)
    with torch.device(device):
        model = GPT(cfg)
        idx = torch.randint(0, cfg.vocab, (batch, seq))
        tgt = torch.randint(0, cfg.vocab, (batch, seq))
    if not bf16:
        return truth.capture_joint(model, (idx, tgt))
    from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss

    def chunked(gm):  # the chunk count the pass picks without a budget
        return apply_chunk_loss(gm, plan_chunk_loss(gm))

    return truth.capture_joint(model, (idx, tgt), torch.bfloat16, chunked)


def measure(layers: int, device: str, batch: int, seq: int, bf16: bool = False) -> dict:
    t0 = time.perf_counter()
    joint = capture(layers, device, batch, seq, bf16)
    capture_s = time.perf_counter() - t0
    row = {"layers": layers, "nodes": len(joint.gm.graph.nodes), "capture_s": round(capture_s, 2)}
    t0 = time.perf_counter()
    truth.stock(joint.gm, joint.joint_inputs, joint.kwargs)
    row["stock_partition_s"] = round(time.perf_counter() - t0, 3)
    for executor in ("inductor", "fx"):
        t0 = time.perf_counter()
        loose = plan_checkpoint(joint.gm, joint.joint_inputs, joint.kwargs, 1 << 50, executor=executor)
        row[f"{executor}_stock_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        try:
            plan_checkpoint(joint.gm, joint.joint_inputs, joint.kwargs, 1, executor=executor)
            smallest = None
        except BudgetError as e:
            smallest = e.smallest_feasible
        row[f"{executor}_infeasible_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        mid = plan_checkpoint(joint.gm, joint.joint_inputs, joint.kwargs, (loose.stock_peak + smallest) // 2,
                              executor=executor)
        row[f"{executor}_mid_s"] = round(time.perf_counter() - t0, 3)
        row[f"{executor}_segments"] = mid.segments
        row[f"{executor}_evaluations"] = mid.evaluations
        row[f"{executor}_stock_peak"] = loose.stock_peak
        row[f"{executor}_smallest"] = smallest
        row[f"{executor}_mid_peak"] = mid.predicted_peak
    return row


def profile(layers: int, device: str, batch: int, seq: int, executor: str, out: str, bf16: bool = False) -> None:
    """cProfile of plan_checkpoint at the three budgets (stock-met, smallest, halfway)."""
    import cProfile
    import pstats

    joint = capture(layers, device, batch, seq, bf16)
    args = (joint.gm, joint.joint_inputs, joint.kwargs)
    prof = cProfile.Profile()
    prof.enable()
    loose = plan_checkpoint(*args, 1 << 50, executor=executor)
    try:
        plan_checkpoint(*args, 1, executor=executor)
        smallest = loose.stock_peak
    except BudgetError as e:
        smallest = e.smallest_feasible
    plan_checkpoint(*args, (loose.stock_peak + smallest) // 2, executor=executor)
    prof.disable()
    prof.dump_stats(out)
    stats = pstats.Stats(prof).sort_stats("cumulative")
    stats.print_stats(45)
    stats.sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="12,24,48")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", default=None, metavar="OUT",
                        help="instead of the table: cProfile the three plans of the first --layers depth "
                             "and --executor, write the stats to OUT and print the top functions")
    parser.add_argument("--executor", default="inductor", choices=("inductor", "fx"))
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 autocast and the chunked loss, as the benchmarks' GPT-2 step runs")
    args = parser.parse_args()
    if args.profile:
        profile(int(args.layers.split(",")[0]), args.device, args.batch, args.seq, args.executor, args.profile,
                args.bf16)
        return
    rows = [measure(int(n), args.device, args.batch, args.seq, args.bf16) for n in args.layers.split(",")]
    print("| layers | joint nodes | stock min-cut s | plan s (inductor: stock / mid / smallest) | "
          "plan s (fx: stock / mid / smallest) | segments | exact evaluations |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layers']} | {r['nodes']} | {r['stock_partition_s']:.2f} | {r['inductor_stock_s']:.2f} / "
              f"{r['inductor_mid_s']:.2f} / {r['inductor_infeasible_s']:.2f} | {r['fx_stock_s']:.2f} / "
              f"{r['fx_mid_s']:.2f} / {r['fx_infeasible_s']:.2f} | {r['inductor_segments']} | "
              f"{r['inductor_evaluations']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
