# Session 14, H200 call 3 (issue 12): the MLP at Inductor's budget-0.9 memory (its target,
# last measured in session 12 with the window thinning) and the 24-layer GPT again at
# per-block checkpointing's memory (the repeat of call 1), anchors in the same run.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 200 python -m benchmarks.planner_zoo --models mlp --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14c_zoo_mlp.json 2>&1 | grep -v Warn | tee $OUT/s14c_zoo_mlp.log)
(timeout 200 python -m benchmarks.planner_zoo --models gpt24 --steps 8 --timeout 100 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s14c_zoo_gpt24.json 2>&1 | grep -v Warn | tee $OUT/s14c_zoo_gpt24.log)
python -m benchmarks.summary "$OUT" s14c_
