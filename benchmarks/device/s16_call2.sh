# Session 16, H200 call 2 (issue 12): GPT-2-small against each of Inductor's budget points
# (activation_memory_budget 0.9, 0.5, 0.1: the anchor), dsgraph with memory_budget set to
# the anchor's measured peak, each run its own process, fresh caches.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 560 python -m benchmarks.planner_zoo --models gpt2@0.9,gpt2@0.5,gpt2@0.1 --steps 10 --fresh-cache --below 0 \
  --no-inductor --timeout 90 --json $OUT/s16b_gpt2_points.json > $OUT/s16b_gpt2_points.log 2>&1
python -m benchmarks.summary "$OUT" s16b_
