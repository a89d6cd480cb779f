# Session 10, issue 12: the GPT-2-small 2.94 GiB point, Inductor's anchor in the same run:
# main's plan (checkpoint{mixes=0}: the search without the recompute-then-cheap candidates),
# this branch's default plan (5 blocks recomputed, the rest cheap; checkpoint{rates=profile},
# analysis.cost_model.H200_MEASURED, picks the same plan on the CPU rebuild, so it is not run
# here), and the default at 6 loss chunks (the pass plans 9 at 2.94 GiB) for the per-chunk
# cost's slope.
# docs/BENCHMARKS.md, "The 2.94 GiB plan's predicted and measured overhead". About 4 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 232 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 75 \
  --configs inductor \
  "dsgraph:memory_budget=2.94GiB;pipeline=chunk_loss,lifetimes,checkpoint{budget=2.94GiB,mixes=0}" \
  "dsgraph:memory_budget=2.94GiB" \
  "dsgraph:memory_budget=2.94GiB;chunk_loss=6" \
  --json $OUT/s10_plan294.json > $OUT/s10_plan294.log 2>&1
echo "run rc=$?"; grep -v Warning $OUT/s10_plan294.log | grep "^|" | tail -6
python - <<'PY'
import json, os
try:
    d = json.load(open(os.environ["OUT"] + "/s10_plan294.json"))
except Exception as e:
    print("no json", e); raise SystemExit
for r in d["records"]:
    ds = r.get("dsgraph") or {}
    joint = (ds.get("joint") or {}).get("memory") or {}
    pre = (ds.get("pre_grad") or {}).get("memory") or {}
    print(r["config"], "ms", sorted(r.get("step_ms_all") or [])[len(r.get("step_ms_all") or []) // 2:][:1],
          "peak", r.get("peak_allocated_bytes"), "chunks", pre.get("chunk_loss_chunks"),
          {k: joint.get("checkpoint_" + k) for k in ("predicted_peak", "recompute_ms", "saved_bytes",
                                                     "recomputed_segments")})
PY
