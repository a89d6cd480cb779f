# Session 14, H200 call 5 (issue 12): after the review took the 3-start descent out again,
# are the H200 plans the ones measured in calls 1-3? dsgraph only, at the same budgets; the
# plan's predicted peak, recomputed segments and priced recomputation are compared with
# those calls' (a changed plan would need its own measurement). Few steps: plans, not times.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 110 python -m benchmarks.run --workloads resnet50_b128 --regimes none --steps 2 --timeout 100 \
  --configs "dsgraph:memory_budget=3310986240" --json $OUT/s14e_resnet50.json > $OUT/s14e_resnet50.log 2>&1)
(timeout 90 python -m benchmarks.run --workloads gpt24 --regimes none --steps 2 --timeout 80 \
  --configs "dsgraph:memory_budget=3345400832" --json $OUT/s14e_gpt24.json > $OUT/s14e_gpt24.log 2>&1)
(timeout 90 python -m benchmarks.run --workloads gpt2 --regimes none --steps 2 --timeout 80 \
  --configs "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" --json $OUT/s14e_gpt2.json > $OUT/s14e_gpt2.log 2>&1)
(timeout 100 python -m benchmarks.run --workloads llama --regimes none --steps 2 --timeout 90 \
  --configs "dsgraph:memory_budget=7526895104" --json $OUT/s14e_llama.json > $OUT/s14e_llama.log 2>&1)
python -m benchmarks.summary "$OUT" s14e_
