# Session 15, H200 call 3 (issue 12): call 2 measured GPT-2-small's 2.94 GiB first step with
# the planner's 8 forked workers at 33.96 s against 34.53 s without (planning 3.97 against
# 7.64 s), the forward and backward compiles after the planning 2.7 and 2.9 s longer. An A/B,
# alternating, fresh caches, 2 steps each (first steps, not step times).
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
for i in 1 2; do
  for w in 1 8; do
    DSGRAPH_PLANNER_WORKERS=$w timeout 48 python -m benchmarks.run --workloads gpt2 --regimes none --steps 2 \
      --fresh-cache --timeout 46 --configs "dsgraph:memory_budget=2.94GiB" --json $OUT/s15c_w${w}_$i.json \
      > $OUT/s15c_w${w}_$i.log 2>&1
  done
done
python -m benchmarks.summary "$OUT" s15c_
