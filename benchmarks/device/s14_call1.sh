# Session 14, H200 call 1 (issue 12): after the cut finding became local minima along the
# forward (no positional window), cuts inside multi-output ops dropped and plateaus kept
# once: ResNet-50 (bf16, batch 128) at Inductor's budget-0.5 memory and the 24-layer GPT at
# per-block checkpointing's memory, each with its anchor in the same run; GPT-2-small at
# 2.94 and 4.9 GiB against Inductor. Fresh Inductor caches per run. About 9 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 230 python -m benchmarks.planner_zoo --models resnet50 --steps 6 --timeout 170 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14_zoo_resnet50.json 2>&1 | grep -v Warn | tee $OUT/s14_zoo_resnet50.log)
(timeout 170 python -m benchmarks.planner_zoo --models gpt24 --steps 8 --timeout 100 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14_zoo_gpt24.json 2>&1 | grep -v Warn | tee $OUT/s14_zoo_gpt24.log)
(timeout 150 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 70 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s14_gpt2.json > $OUT/s14_gpt2.log 2>&1; grep "^|" $OUT/s14_gpt2.log | tail -5)
python -m benchmarks.summary "$OUT" s14_
