# Session 8, H200 call 1: what is allocated at the GPU budget test's peak outside Inductor's
# plan (allocator history with C++ frames), the CUDA planner-truth test, the zoo models
# session 7 did not reach.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 170 python -m benchmarks.alloc_replay --workload budget_test --budget 1517525004 --top 30 \
  --json $OUT/alloc_budget_test.json > $OUT/alloc_budget_test.log 2>&1; grep -v Warning $OUT/alloc_budget_test.log | tail -75
timeout 110 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_planner_truth_gpu.py > $OUT/truth_test.log 2>&1
grep -E "PASSED|FAILED|passed|failed|assert|Error" $OUT/truth_test.log | tail -8
timeout 270 python -m benchmarks.model_zoo $OUT/zoo.json --models bert,t5,resnet18,vit_b_16 --repeats 5 --warmup 2 > $OUT/zoo.log 2>&1
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/zoo.json"))
for m in d["models"]:
    i, s = m.get("inductor") or {}, m.get("dsgraph") or {}
    f = lambda x: "%.1f" % ((x or 0) / 1e6)
    print(m["model"], "ind", round(i.get("ms") or 0, 2), f(i.get("peak_bytes")),
          "| ds", round(s.get("ms") or 0, 2), f(s.get("peak_bytes")),
          "budget", f((m.get("options") or {}).get("memory_budget")), "par", m.get("parity_worst_ratio"),
          (m.get("error") or "")[:100])
PY
