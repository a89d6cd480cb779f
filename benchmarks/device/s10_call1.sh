# Session 10, H200 call 1: the 6 GPU lowering tests that have not run in any session
# (training steps with lowered kernels, the pool slot, dynamic batch, one launch per call),
# then GPT-2-small's budget points with lower_triton after the selection stopped lowering
# regions that store what Inductor fuses away (regions.writes_what_inductor_fuses), with
# Inductor's anchor and the same budget without lowering in the same run (fresh caches).
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 230 python -m pytest -v -p no:cacheprovider tests/gpu/test_lowering_gpu.py \
  -k "training_step or pool_slot or dynamic_batch or launches_the_kernel" > $OUT/lowering_tests.log 2>&1
echo "lowering tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/lowering_tests.log | cut -c1-200 | tail -12
timeout 340 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 120 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;lower_triton=true" \
  "dsgraph:memory_budget=4.9GiB;lower_triton=true" \
  --json $OUT/gpt2_lowering.json > $OUT/gpt2_lowering.log 2>&1
echo "run rc=$?"; grep -v Warning $OUT/gpt2_lowering.log | grep "^|" | tail -6
python - <<'PY'
import json, os
try:
    d = json.load(open(os.environ["OUT"] + "/gpt2_lowering.json"))
except Exception as e:
    print("no json", e); raise SystemExit
for r in d["records"]:
    ds = r.get("dsgraph") or {}
    print(r["config"], "first", r["first_step_s"], {k: (v or {}).get("pass_ms") for k, v in ds.items()},
          {k: (v or {}).get("compile_s") for k, v in ds.items()})
PY
