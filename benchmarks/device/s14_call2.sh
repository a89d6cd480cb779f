# Session 14, H200 call 2 (issue 12): the repeat of call 1's ResNet-50 and GPT-2-small
# points, each with its anchor in the same run (the spread between calls), and the Llama
# decoder at its gradient checkpointing's memory with that anchor. Fresh Inductor caches.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 200 python -m benchmarks.planner_zoo --models resnet50 --steps 6 --timeout 150 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14b_zoo_resnet50.json 2>&1 | grep -v Warn | tee $OUT/s14b_zoo_resnet50.log)
(timeout 120 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 60 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s14b_gpt2.json > $OUT/s14b_gpt2.log 2>&1; grep "^|" $OUT/s14b_gpt2.log | tail -5)
(timeout 240 python -m benchmarks.planner_zoo --models llama --steps 6 --timeout 150 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14b_zoo_llama.json 2>&1 | grep -v Warn | tee $OUT/s14b_zoo_llama.log)
python -m benchmarks.summary "$OUT" s14b_
