# Session 13, H200 call 1 (issue 12): ResNet-50 (bf16, batch 128) at Inductor's budget-0.5
# memory after the input-only fix (a weight's bf16 cast is not an input: the planner found
# no cut in a bf16 network) and the cut changes (getitems made with their op, empty cuts at
# the ends dropped); then the 24-layer GPT at per-block checkpointing's memory with the
# relaxed candidate (never measured). Each with its anchor in the same run, fresh caches.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 290 python -m benchmarks.planner_zoo --models resnet50 --steps 6 --timeout 200 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s13_zoo_resnet50.json 2>&1 | grep -v Warn | tee $OUT/s13_zoo_resnet50.log)
(timeout 250 python -m benchmarks.planner_zoo --models gpt24 --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s13_zoo_gpt24.json 2>&1 | grep -v Warn | tee $OUT/s13_zoo_gpt24.log)
python - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/s13_*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    for r in d["records"]:
        ds = r.get("dsgraph") or {}
        joint = (ds.get("joint") or {}).get("memory") or {}
        print(os.path.basename(f), r.get("model", r.get("workload")), r.get("role", ""), r["config"][:40], "ms", r.get("step_ms"),
              "range", r.get("step_ms_range", r.get("step_ms_min")), "peak", r.get("peak_allocated_bytes"), "first", r.get("first_step_s"),
              {k: joint.get("checkpoint_" + k) for k in ("predicted_peak", "inductor_peak", "recompute_ms", "recomputed_segments", "analysis_s")},
              r.get("error", "")[-300:])
PY
