"""The checkpoint planner's plan for GPT-2-small at a budget, and its predicted recomputation
time broken down per recomputed item, on CPU, for the H200 (issue 12; docs/BENCHMARKS.md,
session 10).

    python -m benchmarks.plan_overhead --budget 2.94GiB --chunks auto,14 --json out.json
    python -m benchmarks.plan_overhead --budget 2.94GiB --rates measured    # planned with H200_MEASURED
    python -m benchmarks.plan_overhead --budget 2.94GiB --hand              # hand-built plans, same pricing

The joint graph is captured on the CPU at full size (``truth.capture_joint``: one step runs
as FX code, about 2 minutes and 8 GiB here) and planned as the session plans it on the H200
(``cuda_planning``): Inductor's CUDA rules in the step model, the chunked loss's workspace
with its Triton rows and fp32-output GEMMs, recomputation priced with the CUDA rates, the
66 MiB of BLAS workspaces beside the graphs, and the chunk count the pass gives that budget
on CUDA (``auto``) or the count asked for. What cannot be emulated: the attention op is the
CPU flash kernel (the H200 runs cuDNN's; both save the output and the row logsumexp).

For each chunk count: the chosen plan and every candidate the planner evaluated (exact
peak, recomputation time), each with its recomputed items counted (``items``: GEMMs by
shape, attention forwards, pointwise and reduction nodes) and priced two ways: the rates
the planner uses (``recompute_rates``) and ``H200_MEASURED`` (``analysis.cost_model``:
per-kernel rates from the session-9 profile).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import time

import torch

from benchmarks import workloads

GiB = 1 << 30


@contextlib.contextmanager
def cuda_planning():
    """Plan a CPU-captured graph as the H200 session would: the step model's device is CUDA
    (Inductor's GPU rules), the chunked loss op's workspace is the CUDA path's (Triton rows,
    fp32-output GEMMs). Only while planning: the capture itself runs the CPU path."""
    from dsgraph.analysis import step_model
    from dsgraph.runtime import linear_cross_entropy as lce

    saved = step_model._device_type, lce.use_triton, lce.fp32_out_gemm
    step_model._device_type = lambda nodes: "cuda"
    lce.use_triton = lambda device: True
    lce.fp32_out_gemm = lambda device_type: True
    try:
        yield
    finally:
        step_model._device_type, lce.use_triton, lce.fp32_out_gemm = saved


def blas_bytes() -> int:
    """Two threads' cuBLAS + cuBLASLt workspaces on an H200 (``analysis.library_memory``)."""
    from dsgraph.analysis.library_memory import cublas_workspace_bytes, cublaslt_workspace_bytes

    return 2 * (cublas_workspace_bytes(torch.device("cuda", 0), env={}) + cublaslt_workspace_bytes(env={}))


def capture(budget: int, chunks: int | None, workload: str = "gpt2"):
    """The joint graph of ``workload`` (full size) with the chunked loss planned for
    ``budget`` (as on CUDA) or at ``chunks``; returns (joint capture, chunk count)."""
    from dsgraph.passes.chunk_loss import apply_chunk_loss, plan_chunk_loss
    from dsgraph.recompute import truth

    seen = {}

    def pre_grad(gm):
        with cuda_planning():
            plan = plan_chunk_loss(gm, chunks=chunks, budget=budget)
        seen["chunks"] = plan.sites[0].chunks
        seen["chunk_tokens"] = plan.sites[0].chunk_tokens
        return apply_chunk_loss(gm, plan)

    torch._dynamo.reset()
    model, inputs = workloads.build(workload, "cpu", "full")
    j = truth.capture_joint(model, inputs, torch.bfloat16, pre_grad)
    return j, seen["chunks"], seen["chunk_tokens"]


_GEMM = {"mm", "addmm", "bmm", "baddbmm"}
_ATTENTION = "attention"


def kind_of(node) -> str:
    from dsgraph.analysis.cost_model import node_flops

    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    if name in _GEMM:
        return "gemm"
    if _ATTENTION in name:
        return "attention"
    if node_flops(node):
        return "other_flops"
    return "memory"


def items(nodes) -> dict:
    """Recomputed nodes counted by kind: GEMMs by (M, N, K), attention forwards, the rest."""
    from dsgraph.analysis.cost_model import node_flops
    from dsgraph.analysis.lifetimes import is_view

    gemms = collections.Counter()
    out = {"gemm_flops": 0, "attention": 0, "attention_flops": 0, "memory_nodes": 0, "view_nodes": 0}
    for n in nodes:
        k = kind_of(n)
        if k == "gemm":
            val = n.meta["val"]
            a = n.args[1] if len(n.args) == 3 else n.args[0]
            kdim = a.meta["val"].shape[-1]
            gemms[f"{val.shape[0]}x{val.shape[1]}x{kdim}"] += 1
            out["gemm_flops"] += node_flops(n)
        elif k == "attention":
            out["attention"] += 1
            out["attention_flops"] += node_flops(n)
        elif n.op == "call_function" and is_view(n):
            out["view_nodes"] += 1
        elif n.op == "call_function" and n.target.__name__ != "getitem":
            out["memory_nodes"] += 1
    out["gemms"] = dict(gemms)
    out["gemm_count"] = sum(gemms.values())
    return out


def priced(nodes, held, costs, measured) -> dict:
    """A recomputation's seconds by the planner's rates (fused as Inductor runs it) and by
    ``measured`` (``H200_MEASURED``), split by kind."""
    out = {}
    for label, model in (("planner", costs), ("measured", measured)):
        total = model.fused_seconds(nodes, held)
        parts = {}
        for kind in ("gemm", "attention", "memory"):
            sub = [n for n in nodes if kind_of(n) == kind]
            parts[kind] = model.fused_seconds(sub, held) if sub else 0.0
        out[label] = {"total_ms": total * 1e3, **{f"{k}_ms": v * 1e3 for k, v in parts.items()}}
    # what the fused model charges the memory-bound part: bytes and kernels
    from dsgraph.analysis.lifetimes import tensor_bytes, tensor_values

    sub = set(n for n in nodes if kind_of(n) == "memory")
    reads = {a for n in sub for a in n.all_input_nodes if a not in sub or a in held}
    writes = {n for n in sub if n in held}
    out["memory_bytes"] = sum(tensor_bytes(t) for a in reads | writes for _, t in tensor_values(a.meta.get("val")))
    out["memory_kernels"] = len(writes) + (1 if sub - writes else 0)
    return out


def analyse(budget: int, chunks: int | None, rates_name: str = "planner") -> dict:
    from dsgraph.analysis import cost_model
    from dsgraph.analysis.cost_model import CostModel, recompute_rates
    from dsgraph.analysis.step_model import StepModel
    from dsgraph.errors import BudgetError
    from dsgraph.recompute.joint import JointGraph
    from dsgraph.recompute import planner as planner_mod

    t0 = time.perf_counter()
    j, count, chunk_tokens = capture(budget, chunks)
    capture_s = time.perf_counter() - t0
    library = blas_bytes()
    plan_rates = None if rates_name == "planner" else cost_model.H200_MEASURED
    record = {"rates": rates_name, "budget": budget, "chunks": count, "chunk_tokens": chunk_tokens,
              "capture_s": round(capture_s, 1),
              "blas_bytes": library}
    with cuda_planning():
        t0 = time.perf_counter()
        try:
            plan = planner_mod.plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor="inductor",
                                               extra_external=library, rates=plan_rates)
        except BudgetError as e:
            record["error"] = str(e)
            return record
        record["plan_s"] = round(time.perf_counter() - t0, 1)
        static = list(j.kwargs.get("static_lifetime_input_indices") or [])
        joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], static)
        model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static)
        held = planner_mod._held(joint, model)
        looped = planner_mod.looped_reductions(joint, model)  # priced as the planner prices them
        rates = recompute_rates("cuda", False)
        costs = CostModel(j.gm, rates, looped=looped)
        measured = CostModel(j.gm, cost_model.H200_MEASURED, looped=looped)
        by_name = {n.name: n for n in j.gm.graph.nodes}
        record.update(predicted_peak=plan.predicted_peak, stock_peak=plan.stock_peak,
                      saved_bytes=plan.saved_bytes, recompute_ms=plan.recompute_seconds * 1e3,
                      segments=plan.segments)
        record["regions"] = []
        for r in plan.regions:
            nodes = [by_name[x] for x in r.nodes]
            record["regions"].append({"segment": r.segment, "policy": r.policy, "ms": r.seconds * 1e3,
                                      "items": items(nodes), "priced": priced(nodes, held, costs, measured)})
        record["chosen"] = {"items": items(plan_nodes := _recomputed(plan, joint, by_name)),
                            "priced": priced(plan_nodes, held, costs, measured)}
        # every candidate, re-priced
        cands = []
        for name, peak, sec in plan.candidates:
            cands.append({"name": name, "peak": peak, "planner_ms": sec * 1e3})
        record["candidates"] = cands
        record["text"] = plan.text()
        # the candidates' recomputed sets (the planner does not return them): plan again and
        # price each candidate kept by plan_checkpoint's internals
        record["candidate_detail"] = _candidates(j, budget, library, held, costs, measured, plan_rates)
    return record


def _recomputed(plan, joint, by_name):
    """The forward nodes the chosen partition's backward recomputes."""
    forward = {n.name for n in joint.forward}
    return [by_name[n.name] for n in plan.backward.graph.nodes
            if n.op == "call_function" and n.name in by_name and n.name in forward]


def _candidates(j, budget, library, held, costs, measured, plan_rates=None) -> list[dict]:
    """Every candidate the planner evaluates, with its recomputed items and both prices
    (the planner's ``_candidate`` wrapped to see them)."""
    from dsgraph.recompute import planner as planner_mod
    from dsgraph.recompute.partition import closure

    seen = []
    original = planner_mod._candidate

    def spy(result, joint, c, h, fused):
        cand = original(result, joint, c, h, fused)
        nodes = closure(joint, result.saved).recomputed
        seen.append({"name": cand.name, "peak": cand.peak, "planner_ms": cand.seconds * 1e3,
                     "items": items(nodes), "priced": priced(nodes, h, costs, measured)})
        return cand

    planner_mod._candidate = spy
    try:
        planner_mod.plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor="inductor",
                                    extra_external=library, rates=plan_rates)
    finally:
        planner_mod._candidate = original
    return sorted(seen, key=lambda c: c["peak"])


def hand_plans(budget: int, chunks: int | None) -> dict:
    """Plans built by hand on the planner's own intervals and evaluated exactly as the
    planner evaluates its candidates: ``pairs`` tiles the forward into one segment then
    intervals of two (about one transformer block each) and gives each a policy: ``keep``,
    ``cheap``, ``recompute``, or ``attn`` (not a planner policy: recompute the interval but
    save the attention outputs the stock partition saves there). Printed and returned with
    the exact peak and the recomputation priced by the planner's rates and H200_MEASURED."""
    from dsgraph import compat
    from dsgraph.analysis import cost_model
    from dsgraph.analysis.cost_model import CostModel, recompute_rates
    from dsgraph.analysis.lifetimes import is_view
    from dsgraph.analysis.step_model import StepModel
    from dsgraph.recompute import planner as planner_mod
    from dsgraph.recompute.cuts import candidate_cuts
    from dsgraph.recompute.joint import JointGraph
    from dsgraph.recompute.model import PlanEvaluator
    from dsgraph.recompute.options import Intervals, Option, is_expensive
    from dsgraph.recompute.partition import closure

    j, count, _ = capture(budget, chunks)
    out = {"budget": budget, "chunks": count, "plans": []}
    with cuda_planning():
        gm = j.gm
        static = list(j.kwargs.get("static_lifetime_input_indices") or [])
        joint = JointGraph.build(gm, j.kwargs["num_fwd_outputs"], static)
        model = StepModel(gm, j.kwargs["num_fwd_outputs"], static,
                          external=planner_mod.external_bytes(joint) + blas_bytes())
        names, _ = compat.min_cut_partition_if(gm, j.joint_inputs, lambda n: False, **j.kwargs)
        stock = {n for n in joint.forward if n.name in set(names)}
        held = planner_mod._held(joint, model)
        looped = planner_mod.looped_reductions(joint, model)
        measured = CostModel(gm, cost_model.H200_MEASURED, looped=looped)
        planned = CostModel(gm, recompute_rates("cuda", False), looped=looped)
        cuts = candidate_cuts(joint)
        intervals = Intervals(joint, cuts, stock, planned, held, fused=True, max_len=planner_mod.MAX_SPAN)
        evaluator = PlanEvaluator(joint, model, intervals, "inductor")
        m = intervals.segments

        def attention_output(n) -> bool:
            for _ in range(16):
                if n.op == "call_function" and "attention" in str(n.target):
                    return True
                if n.op != "call_function" or not n.all_input_nodes or not (is_view(n) or "getitem" in str(n.target)):
                    return False
                n = n.all_input_nodes[0]
            return False

        def option(policy, a, b):
            if policy != "attn":
                return intervals.option(policy, a, b)
            inside = intervals.nodes(a, b)
            inner = [n for n in inside if n in stock and is_expensive(n) and attention_output(n)]
            o = Option("attn", a, b, inner)
            ends = set(cuts[a].crossing) | set(cuts[b].crossing)
            local = closure(joint, set(inner) | ends | (set(joint.forward) - set(inside)))
            o.recomputed = [n for n in local.recomputed if n in set(inside)]
            return o

        def pairs(policy_of):
            spec = [("cheap" if policy_of(-1) == "attn" else policy_of(-1), 0, 1)]
            k, i = 1, 0
            while k < m:
                spec.append((policy_of(i), k, min(k + 2, m)))
                k, i = min(k + 2, m), i + 1
            return spec

        def run(name, spec):
            result = evaluator.evaluate([option(*s) for s in spec], name)
            recomputed = closure(joint, result.saved).recomputed
            it = items(recomputed)
            row = {"name": name, "peak": result.peak.peak, "fits": result.peak.peak <= budget,
                   "planner_ms": planned.fused_seconds(recomputed, held) * 1e3,
                   "measured_ms": measured.fused_seconds(recomputed, held) * 1e3,
                   "gemms": it["gemm_count"], "attention": it["attention"], "spec": spec}
            print(f"{name:36s} {row['peak'] / GiB:6.3f} GiB fits={row['fits']!s:5s} planner {row['planner_ms']:6.3f} "
                  f"measured {row['measured_ms']:6.3f} ms; GEMMs {row['gemms']}, attention {row['attention']}",
                  flush=True)
            out["plans"].append(row)

        run("keep", pairs(lambda i: "keep"))
        run("cheap", pairs(lambda i: "cheap"))
        for r in range(4, 10):
            for policy in ("recompute", "attn"):
                run(f"{policy} x{r} then cheap", pairs(lambda i, r=r, p=policy: p if 0 <= i < r else "cheap"))
    return out


def main(argv=None) -> None:
    from dsgraph.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="2.94GiB")
    p.add_argument("--chunks", default="auto", help="comma-separated chunk counts ('auto': the pass's own)")
    p.add_argument("--rates", default="planner", choices=["planner", "measured"],
                   help="what the planner prices recomputation with: its own CUDA rates or H200_MEASURED")
    p.add_argument("--hand", action="store_true", help="hand-built plans (hand_plans) instead of the planner's")
    p.add_argument("--json")
    args = p.parse_args(argv)
    budget = parse_bytes(args.budget, "--budget")
    if args.hand:
        out = [hand_plans(budget, None if raw == "auto" else int(raw)) for raw in args.chunks.split(",")]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        return
    out = []
    for raw in args.chunks.split(","):
        chunks = None if raw == "auto" else int(raw)
        rec = analyse(budget, chunks, args.rates)
        out.append(rec)
        print(f"== chunks {rec['chunks']} ({rec['chunk_tokens']} tokens): " + (
            rec.get("error") or f"predicted {rec['predicted_peak'] / GiB:.3f} GiB, recompute "
            f"{rec['recompute_ms']:.3f} ms; chosen {json.dumps(rec['chosen'])}"), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
