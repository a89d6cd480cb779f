# Session 12, H200 call 3 (issue 12): after the loss-only forward (a plan that recomputes the
# fused loss op no longer runs its gradient GEMMs in the forward too) and the op's FLOPs priced
# at its matmul dtype: the 24-layer GPT at per-block checkpointing's memory and the Llama
# decoder at its gradient checkpointing's memory, each with its anchor in the same run; GPT-2-
# small at 2.94 and 4.9 GiB against Inductor, fresh Inductor caches (first-step ratios). The
# JSON is rewritten after each run. About 9 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 250 python -m benchmarks.planner_zoo --models gpt24 --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s12_zoo3_gpt24.json 2>&1 | grep -v Warn | tee $OUT/s12_zoo3_gpt24.log)
(timeout 200 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 90 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s12_gpt2.json > $OUT/s12_gpt2.log 2>&1; grep "^|" $OUT/s12_gpt2.log | tail -5)
(timeout 150 python -m benchmarks.planner_zoo --models llama --steps 6 --timeout 140 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s12_zoo3_llama.json 2>&1 | grep -v Warn | tee $OUT/s12_zoo3_llama.log)
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
        pre = (ds.get("pre_grad") or {}).get("memory") or {}
        print(os.path.basename(f), r.get("model", r.get("workload")), r.get("role", ""), r["config"][:40], "ms", r.get("step_ms"),
              "peak", r.get("peak_allocated_bytes"), "first", r.get("first_step_s"), "chunks", pre.get("chunk_loss_chunks"),
              {k: joint.get("checkpoint_" + k) for k in ("predicted_peak", "inductor_peak", "recompute_ms", "recomputed_segments", "margin", "analysis_s")},
              r.get("error", "")[-200:])
PY
