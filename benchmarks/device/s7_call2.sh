# Session 7, H200 call 2: planner_truth after the op-count fix, the budget GPU test by name,
# the model zoo with the step's own peak (resident state counted, other process memory not).
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 120 python -m benchmarks.planner_truth --layers 4 --json $OUT/truth.json 2>&1 | grep -E "^stock|^smallest"
timeout 100 python -m pytest -q -rA -p no:cacheprovider \
  "tests/gpu/test_gpu.py::test_memory_budget_is_honoured_and_matches_eager_on_cuda" > $OUT/gpu_test.log 2>&1
grep -E "passed|failed|Error|assert" $OUT/gpu_test.log | tail -12
timeout 330 python -m benchmarks.model_zoo $OUT/zoo.json --repeats 5 --warmup 2 > $OUT/zoo.log 2>&1
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/zoo.json"))
for m in d["models"]:
    i, s = m.get("inductor") or {}, m.get("dsgraph") or {}
    f = lambda x: "%.1f" % ((x or 0) / 1e6)
    print(m["model"], "ind", round(i.get("ms") or 0, 2), f(i.get("peak_bytes")), f(i.get("other_before_bytes")),
          "| ds", round(s.get("ms") or 0, 2), f(s.get("peak_bytes")), f(s.get("other_before_bytes")), "par", m.get("parity_worst_ratio"), m.get("error", "")[:80] if m.get("error") else "")
PY
