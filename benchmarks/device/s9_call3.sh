# Session 9, H200 call 3, after the chunked loss's fp32-GEMM check runs with autocast off
# and the lowering check stops autotuning at its sample sizes: the GPU chunk_loss tests
# (one new: the check under autocast), the GPT-2-small budget points again with Inductor's
# anchor in the same run (fresh caches: first steps cold), the GPU lowering tests, then
# one zoo model as far as the time allows.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 100 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_chunk_loss_gpu.py > $OUT/chunk_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/chunk_tests.log | cut -c1-250 | tail -12
timeout 250 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 110 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2GiB" \
  "dsgraph:memory_budget=2.94GiB;lower_triton=true" \
  --json $OUT/gpt2_points.json > $OUT/gpt2_points.log 2>&1
echo "run rc=$?"; grep -v Warning $OUT/gpt2_points.log | grep "^|" | tail -6
python - <<'PY'
import json, os
try:
    d = json.load(open(os.environ["OUT"] + "/gpt2_points.json"))
except Exception as e:
    print("no json", e); raise SystemExit
for r in d["records"]:
    ds = r.get("dsgraph") or {}
    print(r["config"], "first", r["first_step_s"], {k: (v or {}).get("pass_ms") for k, v in ds.items()},
          {k: (v or {}).get("compile_s") for k, v in ds.items()})
PY
timeout 130 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_lowering_gpu.py > $OUT/lowering_tests.log 2>&1
echo "lowering tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/lowering_tests.log | cut -c1-200 | tail -30
timeout 100 python -m benchmarks.model_zoo $OUT/zoo_resnet18.json --models resnet18 --repeats 5 --warmup 2 > $OUT/zoo_resnet18.log 2>&1
echo "zoo rc=$?"; python -c "
import json, os
d = json.load(open(os.environ['OUT'] + '/zoo_resnet18.json'))
for m in d['models']:
    print({k: m.get(k) for k in ('model', 'seconds', 'parity_worst_ratio', 'speedup_vs_inductor', 'peak_ratio_vs_inductor', 'error')})
    print('inductor', m.get('inductor'), 'dsgraph', m.get('dsgraph'))
" 2>&1 | cut -c1-600
