"""The checkpoint planner's predicted peak against Inductor's plan and the measured peak, at
memory budgets with ``chunk_loss`` on (a diagnostic for GPT-2-small's budget points, the default workload:
docs/BENCHMARKS.md, session 8).

    python -m benchmarks.budget_gap --budgets 4.9GiB,2.94GiB,2GiB --json $OUT/gap.json   # H200
    python -m benchmarks.budget_gap --size small --budgets 0.9,0.5                         # CPU check
    python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 --no-session     # another model

For each budget (bytes with a unit, or a fraction of the stock step's predicted peak):

1. the session as users run it: ``torch.compile(backend="dsgraph", options={"memory_budget":
   ...})`` under bf16 autocast, three steps; the joint report's predicted peak
   (``checkpoint_predicted_peak``) and the peak of the compiled graphs' own plans that the
   session checked (``checkpoint_inductor_peak``), both with the CUDA BLAS workspaces, and on
   CUDA ``torch.cuda.max_memory_allocated()`` of the last step;
2. the same partition rebuilt outside the session (``benchmarks.planner_gap.gap``: the joint
   graph with the chunk_loss rewrite planned for that budget, the planner's choice compiled
   through Inductor up to code generation), and at Inductor's peak step the buffers live in
   Inductor's plan and not in the planner's emulation, and the other way round.

What the allocator holds beyond Inductor's plan (step 1's measured less its checked peak) is
traced block by block by ``python -m benchmarks.alloc_replay --workload gpt2 --budget B``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import torch

from benchmarks import workloads


def _budget(raw: str, stock: int) -> int:
    from dsgraph.units import parse_bytes

    try:
        fraction = float(raw)
    except ValueError:
        return parse_bytes(raw, "--budgets")
    return int(stock * fraction) if fraction < 1 else int(fraction)


def _steps(compiled, model, inputs, device: str, steps: int) -> int | None:
    """Run ``steps`` training steps (gradients set to None first, as the benchmark's regime
    "none"); on CUDA the last step's allocator peak."""
    from dsgraph.testing import loss_of

    for step in range(steps):
        model.zero_grad(set_to_none=True)
        if device.startswith("cuda") and step == steps - 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast(device.split(":")[0], torch.bfloat16):
            loss = loss_of(compiled(*inputs))
        loss.backward()
        del loss
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def session_figures(size: str, device: str, budget: int, steps: int = 3, workload: str = "gpt2") -> dict:
    """Step 1: the step compiled by the dsgraph backend at ``budget``."""
    import dsgraph
    from dsgraph.errors import BudgetError

    import gc

    torch._dynamo.reset()
    gc.collect()
    # what an earlier budget's run left allocated is in the measured peak too: reported
    before = torch.cuda.memory_allocated() if device.startswith("cuda") else None
    model, inputs = workloads.build(workload, device, size)
    compiled = torch.compile(model, backend="dsgraph", options={"memory_budget": budget, "fallback": "error"})
    try:
        _steps(compiled, model, inputs, device, 1)
    except Exception as e:  # a budget below the floor: the floor the error names (torch wraps it)
        cause = e
        while cause is not None and not isinstance(cause, BudgetError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        print(f"  budget below the smallest plan: the session at the smallest ({cause.smallest_feasible} B)")
        return session_figures(size, device, cause.smallest_feasible, steps, workload)
    measured = _steps(compiled, model, inputs, device, steps - 1)
    reports = dsgraph.reports()
    report = [r for r in reports if r.kind == "joint"][-1]  # the last compile's, when the check asked again
    joint = report.memory
    checkpoint = [p for p in report.passes if p.name == "checkpoint"]
    pre = [r for r in reports if r.kind == "pre_grad"]
    chunks = pre[-1].memory.get("chunk_loss_chunks") if pre else None
    out = {"budget": budget, "predicted": joint.get("checkpoint_predicted_peak"),
           "inductor_plan": joint.get("checkpoint_inductor_peak"), "measured": measured,
           "allocated_before_model": before, "chunks": chunks,
           "blas_workspaces": checkpoint[-1].stats.get("blas_workspace_bytes") if checkpoint else None}
    del compiled, model, inputs
    return out


def buffer_gap(size: str, device: str, budget: int, workload: str = "gpt2") -> dict:
    """Step 2: the planner's emulation against Inductor's plan of the same partition."""
    from benchmarks.planner_gap import gap
    from dsgraph.analysis.library_memory import blas_workspace_bytes
    from dsgraph.errors import BudgetError
    from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
    from dsgraph.recompute import truth
    from dsgraph.recompute.planner import plan_checkpoint

    torch._dynamo.reset()
    model, inputs = workloads.build(workload, device, size)

    def pre_grad(gm):  # the chunk count the session plans for this budget
        return apply_chunk_loss(gm, plan_chunk_loss(gm, budget=budget))

    j = truth.capture_joint(model, inputs, torch.bfloat16, pre_grad)
    library = blas_workspace_bytes(j.gm)
    try:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor="inductor", extra_external=library)
    except BudgetError as e:
        print(f"  budget below the smallest plan: using the smallest ({e.smallest_feasible} B)")
        budget = e.smallest_feasible
    out = gap(model, inputs, j, budget, f"  budget {budget}", autocast=torch.bfloat16, pre_grad=pre_grad,
              verbose=False, extra_external=library)
    tl = out["real"].inductor
    predicted = out["plan"].predicted_peak - library
    lines = io.StringIO()
    with contextlib.redirect_stdout(lines):
        out["compare"](tl.peak_index())
    print(lines.getvalue(), end="")
    return {"predicted_without_blas": predicted, "inductor_plan_without_blas": tl.peak_bytes,
            "error": predicted / tl.peak_bytes - 1, "peak_at": f"{tl.peak_entry.graph}:{tl.peak_entry.node}",
            "at_peak": lines.getvalue().splitlines()}


def stock_peak(size: str, device: str, workload: str = "gpt2") -> int:
    """The stock step's predicted peak (what a fraction in ``--budgets`` is of)."""
    from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
    from dsgraph.recompute import truth
    from dsgraph.recompute.planner import plan_checkpoint

    model, inputs = workloads.build(workload, device, size)
    j = truth.capture_joint(model, inputs, torch.bfloat16, lambda gm: apply_chunk_loss(gm, plan_chunk_loss(gm)))
    return plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1 << 50, executor="inductor").stock_peak


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="full", choices=["full", "small", "tiny"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workload", default="gpt2", help="a benchmarks.workloads name with a loss to chunk")
    p.add_argument("--budgets", default="4.9GiB,2.94GiB,2GiB")
    p.add_argument("--no-session", action="store_true",
                   help="leave out step 1 (the compiled session's figures): only the rebuilt partition's gap")
    p.add_argument("--json")
    args = p.parse_args(argv)
    raws = args.budgets.split(",")
    stock = stock_peak(args.size, args.device, args.workload) if any("." in r and r.replace(".", "").isdigit() for r in raws) else 0
    results = []
    for raw in raws:
        budget = _budget(raw, stock)
        print(f"== budget {raw} ({budget} B)", flush=True)
        record = {"budget": budget, "workload": args.workload}
        if not args.no_session:
            record["session"] = s = session_figures(args.size, args.device, budget, workload=args.workload)
            budget = s["budget"]  # the smallest plan's, when the budget was below it
            measured = f"{s['measured']} B ({s['predicted'] / s['measured'] - 1:+.2%} predicted/measured)" \
                if s["measured"] else "n/a (not CUDA)"
            print(f"  session: {s['chunks']} chunks; predicted {s['predicted']} B, Inductor's plan {s['inductor_plan']} B "
                  f"({s['predicted'] / s['inductor_plan'] - 1:+.2%}), measured {measured}; allocated before the "
                  f"model {s['allocated_before_model']}", flush=True)
        record["buffers"] = buffer_gap(args.size, args.device, budget, args.workload)
        b = record["buffers"]
        print(f"  rebuilt: predicted {b['predicted_without_blas']} B, Inductor's plan "
              f"{b['inductor_plan_without_blas']} B ({b['error']:+.2%}, BLAS workspaces left out), peak at "
              f"{b['peak_at']}", flush=True)
        results.append(record)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
