# Session 12, H200 call 4 (issue 12): after the relaxed candidate (the smallest plan made
# cheaper where its exact peak does not rise): the 24-layer GPT at per-block checkpointing's
# memory with its anchor in the same run, and the Llama decoder at the memory its gradient
# checkpointing measured in calls 2 and 3 (7,526,895,104 B; the anchor is not re-run, for
# the device time left). Fresh Inductor caches. About 4 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 150 python -m benchmarks.planner_zoo --models gpt24 --steps 8 --timeout 90 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s12_zoo4_gpt24.json 2>&1 | grep -v Warn | tee $OUT/s12_zoo4_gpt24.log)
(timeout 125 python -m benchmarks.run --workloads llama --regimes none --steps 6 --timeout 120 --fresh-cache \
  --configs "dsgraph:memory_budget=7526895104" --json $OUT/s12_zoo4_llama.json > $OUT/s12_zoo4_llama.log 2>&1; grep "^|" $OUT/s12_zoo4_llama.log | tail -3)
python - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/s12_*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    for r in d["records"]:
        ds = r.get("dsgraph") or {}
        joint = (ds.get("joint") or {}).get("memory") or {}
        print(os.path.basename(f), r.get("model", r.get("workload")), r.get("role", ""), r["config"][:40], "ms", r.get("step_ms"),
              sorted(r.get("step_ms_all") or []), "peak", r.get("peak_allocated_bytes"), "first", r.get("first_step_s"),
              {k: joint.get("checkpoint_" + k) for k in ("predicted_peak", "inductor_peak", "recompute_ms", "recomputed_segments", "margin", "analysis_s")},
              r.get("error", "")[-200:])
PY
