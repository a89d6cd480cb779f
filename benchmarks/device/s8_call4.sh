# Session 8, H200 call 4 (tree: main with branch lowering-tiles merged): the planner-truth and
# budget GPU tests after the in-place rule, the GPT-2-small budget points after the chunked
# loss's fp32-GEMM fix (Inductor anchor in the same run), then the lowering benchmark with
# kernel device times and the GPU lowering tests as far as the time allows.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 120 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_planner_truth_gpu.py \
  "tests/gpu/test_gpu.py::test_memory_budget_is_honoured_and_matches_eager_on_cuda" > $OUT/gpu_tests.log 2>&1
grep -E "PASSED|FAILED|passed|failed|^E  " $OUT/gpu_tests.log | cut -c1-300 | tail -8
timeout 230 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 120 --configs inductor \
  "dsgraph:memory_budget=4.9GiB" "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2GiB" \
  --json $OUT/gpt2_points.json > $OUT/gpt2_points.log 2>&1; grep -v Warning $OUT/gpt2_points.log | tail -6
timeout 90 python -m benchmarks.lowering --cases layer_norm,rms_norm --repeats 3 --sweep --json $OUT/lowering.json > $OUT/lowering.log 2>&1
echo "lowering rc=$?"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/lowering.json"))
print("copy GB/s", d.get("copy_GBps"), "by kernel", d.get("copy_kernel_GBps"))
for c in d["cases"]:
    for p in ("dsgraph", "dsgraph_inductor", "inductor"):
        print(c["case"], p, "%.1f us (%.3f)" % (c.get(p + "_us") or 0, c.get(p + "_of_copy") or 0), "kernel", c.get(p + "_kernel_us"),
              "x", c.get(p + "_kernels_per_call"), "of_copy", c.get(p + "_kernel_of_copy"), "cpu", c.get(p + "_cpu_us"))
    print("  config", c.get("config"), "via Inductor", c.get("dsgraph_inductor_config"), "sweep best", c.get("sweep_best_config"))
PY
timeout 45 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_lowering_gpu.py > $OUT/lowering_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/lowering_tests.log | tail -30
