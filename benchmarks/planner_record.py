"""The checkpoint planner's outputs, recorded to JSON to check that a speed change changes no plan.

    python benchmarks/planner_record.py out.json [case,case,...]
    python benchmarks/planner_record_compare.py before.json after.json

Cases: benchmarks.planner_cost's 12- and 24-layer GPT and the CPU zoo (tests/zoo.py), each for the
Inductor and FX executors at a stock-met budget, budget 1 (BudgetError: smallest feasible, lower
bound, message), halfway, a third, the smallest plan and the smallest with a margin (capped).
JUNK=N allocates N objects before capturing: the fused recomputation seconds sum over sets of
Nodes, whose order follows memory addresses, so their last bits move with the heap layout.
"""
import hashlib, json, sys, time
import torch
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__))))
from dsgraph.errors import BudgetError
from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint
from benchmarks.planner_cost import capture
from tests import zoo


def plan_record(p):
    return {
        "predicted_peak": p.predicted_peak, "stock_peak": p.stock_peak, "model_peak": p.model_peak,
        "recompute_seconds": repr(p.recompute_seconds), "margin": p.margin, "capped": p.margin_capped,
        "saved": [(s.name, s.nbytes, s.why) for s in p.saved],
        "regions": [(r.segment, r.policy, r.nodes, r.flops, repr(r.seconds)) for r in p.regions],
        "candidates": [(n, pk, repr(s)) for n, pk, s in p.candidates],
        "segments": p.segments, "evaluations": p.evaluations,
        "lower_bound": (p.lower_bound.nbytes, p.lower_bound.term) if p.lower_bound else None,
        "fw": hashlib.sha1(p.forward.code.encode()).hexdigest(),
        "bw": hashlib.sha1(p.backward.code.encode()).hexdigest(),
    }


def run(j, executor, out, key):
    res = {}
    t = time.perf_counter()
    loose = plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1 << 50, executor=executor)
    res["stock"] = plan_record(loose)
    try:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor=executor)
        res["error"] = None
    except BudgetError as e:
        res["error"] = (e.smallest_feasible, e.lower_bound, getattr(e, "dominated_by", None), str(e))
    low = res["error"][0]
    stock = loose.stock_peak
    res["mid"] = plan_record(plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, (stock + low) // 2, executor=executor))
    res["third"] = plan_record(plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, stock - (stock - low) // 3,
                                               executor=executor))
    res["low"] = plan_record(plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, low, executor=executor))
    # a margin that leaves no plan: the capped branch
    res["capped"] = plan_record(plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, low, margin=1000, executor=executor))
    out[key] = res
    print(f"{key}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)


def main(path):
    import os
    junk = [object() for _ in range(int(os.environ.get("JUNK", "0")))]
    out = {}
    cases = []
    for layers in (12, 24):
        cases.append((f"gpt{layers}", lambda layers=layers: capture(layers, "cpu", 2, 128)))
    for name in ["gated", "llama", "gpt24", "cnn", "masked"]:
        if zoo.available(name):
            cases.append((f"zoo-{name}", lambda name=name: truth.capture_joint(*zoo.build(name))))
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    for key, make in cases:
        if only and key not in only:
            continue
        j = make()
        for executor in ("inductor", "fx"):
            run(j, executor, out, f"{key}/{executor}")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
