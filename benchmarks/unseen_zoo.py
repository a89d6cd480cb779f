"""The zoo's checks on benchmarks.unseen_models (CPU): stock prediction, budgets met as
predicted for FX and Inductor, monotone, smallest plan against per-block checkpointing.

    python -m benchmarks.unseen_zoo unet,vit,moe
"""
import sys, time, traceback
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks.unseen_models import build
from dsgraph.errors import BudgetError
from dsgraph.recompute import truth
from dsgraph.recompute.planner import plan_checkpoint
from tests.e2e.test_checkpoint_zoo import fx_truth

def smallest(j, ex):
    try:
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1, executor=ex)
    except BudgetError as e:
        return e
    raise AssertionError("budget 1 accepted")

for name in sys.argv[1].split(","):
    print("=====", name, flush=True)
    try:
        model, inputs = build(name)
        t = time.time()
        real = truth.compiled_peaks(model, inputs, truth.stock, inductor=False)
        j = real.joint
        print("nodes", len(j.gm.graph.nodes), "stock fx pred", j.stock_prediction("fx"), "fx real", real.fx_peak, flush=True)
        for ex in ("fx", "inductor"):
            e = smallest(j, ex)
            stock = j.stock_prediction(ex)
            pbm, pbi = build(name, per_block=True)
            pj = truth.capture_joint(pbm, pbi)
            per_block = pj.stock_prediction(ex)
            print(ex, "stock", stock, "smallest", e.smallest_feasible, "bound", e.lower_bound, "per-block", per_block,
                  "OK" if e.smallest_feasible <= per_block else "ABOVE PER-BLOCK", flush=True)
            peaks = []
            for i in range(4):
                budget = stock - (stock - e.smallest_feasible) * i // 3
                plan = plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor=ex)
                peaks.append(plan.predicted_peak)
                if ex == "fx":
                    ft = fx_truth(plan, j)
                    print("  fx budget", budget, "pred", plan.predicted_peak, "fx truth", ft, "" if ft == plan.predicted_peak else "MISMATCH", flush=True)
                else:
                    model, inputs = build(name)
                    def choose(gm, ji, kw, budget=budget, made={}):
                        p = plan_checkpoint(gm, ji, kw, budget, executor="inductor")
                        choose.pred = p.predicted_peak
                        return p.forward, p.backward
                    r = truth.compiled_peaks(model, inputs, choose, inductor=True).inductor_peak
                    print(f"  ind budget {budget} pred {choose.pred} inductor {r} err {choose.pred/r-1:+.2%}", flush=True)
            print("  monotone", peaks == sorted(peaks, reverse=True), peaks, flush=True)
        print("time", round(time.time() - t, 1))
    except Exception:
        traceback.print_exc()
