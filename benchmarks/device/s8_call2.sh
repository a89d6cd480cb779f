# Session 8, H200 call 2: the budget test's peak against Inductor's plan graph by graph
# (allocator history, full frames), then the GPT-2-small budget points with their Inductor
# anchor in the same run (4.9 GiB and 2.94 GiB: issue 12; 2 GiB with chunk_loss: issue 15).
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 160 python -m benchmarks.alloc_replay --workload budget_test --budget 1517525004 --top 40 \
  --json $OUT/alloc_budget_test.json > $OUT/alloc_budget_test.log 2>&1; grep -v Warning $OUT/alloc_budget_test.log | head -48 | cut -c1-260
timeout 330 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 150 --configs inductor \
  "dsgraph:memory_budget=4.9GiB" "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2GiB" \
  --json $OUT/gpt2_points.json > $OUT/gpt2_points.log 2>&1; grep -v Warning $OUT/gpt2_points.log | tail -14
