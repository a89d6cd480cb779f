# Session 16, H200 call 3 (issue 12): the transformers Llama-family decoder at its own
# gradient checkpointing's memory (session 15 reached only the anchor), fresh caches.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 400 python -m benchmarks.planner_zoo --models llama --steps 10 --fresh-cache --below 0 \
  --no-inductor --timeout 190 --json $OUT/s16c_llama.json > $OUT/s16c_llama.log 2>&1
python -m benchmarks.summary "$OUT" s16c_
