# Session 7, H200 call 3: the model zoo with the harness's leftovers collected between
# models, then the generated layer_norm / rms_norm kernels' tile sweep and the GPU lowering tests.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 330 python -m benchmarks.model_zoo $OUT/zoo.json --repeats 5 --warmup 2 > $OUT/zoo.log 2>&1
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/zoo.json"))
for m in d["models"]:
    i, s = m.get("inductor") or {}, m.get("dsgraph") or {}
    f = lambda x: "%.1f" % ((x or 0) / 1e6)
    print(m["model"], "ind", round(i.get("ms") or 0, 2), f(i.get("peak_bytes")), f(i.get("other_before_bytes")),
          "| ds", round(s.get("ms") or 0, 2), f(s.get("peak_bytes")), f(s.get("other_before_bytes")),
          "budget", f((m.get("options") or {}).get("memory_budget")), "par", m.get("parity_worst_ratio"),
          (m.get("error") or "")[:100])
PY
timeout 100 python -m benchmarks.lowering --cases layer_norm,rms_norm --repeats 3 --sweep --json $OUT/lowering.json 2>&1 | tail -12
timeout 130 python -m pytest -q -rf -p no:cacheprovider tests/gpu/test_lowering_gpu.py > $OUT/lowering_tests.log 2>&1; tail -6 $OUT/lowering_tests.log
