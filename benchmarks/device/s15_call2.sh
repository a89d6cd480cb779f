# Session 15, H200 call 2 (issue 12). Call 1 found a host about 2x slower to compile than
# session 14's (Inductor's GPT-2 first step 26.1 s against 11.6 s) and was cut off before
# the 24-layer GPT's variants ran. Here: GPT-2-small's first step at 2.94 GiB with the
# planner's forked workers (default: 8 on 16 CPUs) and without (DSGRAPH_PLANNER_WORKERS=1),
# against Inductor's, same run, and dsgraph's backend with no pass (pipeline=: what its
# compile costs besides the passes, per stage); the 24-layer GPT at per-block checkpointing's memory with
# and without the chunked loss, against the anchor, 20 timed steps each.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 140 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache --timeout 60 \
  --configs inductor "dsgraph:pipeline=" "dsgraph:memory_budget=2.94GiB" --json $OUT/s15b_gpt2.json > $OUT/s15b_gpt2.log 2>&1
DSGRAPH_PLANNER_WORKERS=1 timeout 60 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache \
  --timeout 55 --configs "dsgraph:memory_budget=2.94GiB" --json $OUT/s15b_gpt2_serial.json > $OUT/s15b_gpt2_serial.log 2>&1
timeout 330 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --fresh-cache --below 0 --no-inductor \
  --variants "chunk_loss=False" --json $OUT/s15b_gpt24.json > $OUT/s15b_gpt24.log 2>&1
python -m benchmarks.summary "$OUT" s15b_
