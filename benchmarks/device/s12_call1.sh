# Session 12, H200 call 1 (issue 12): the planner against its anchors with the planner as it
# is now (the table was last measured in session 6): the MLP (Inductor's budget 0.9 point)
# and the 24-layer GPT (per-block torch.utils.checkpoint). Each run in its own process with a
# fresh Inductor cache, so first steps include cold kernel compiles for every config alike.
# The JSON is rewritten after each run. About 9.5 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 570 python -m benchmarks.planner_zoo --models mlp,gpt24 --steps 8 --timeout 160 --fresh-cache \
  --json $OUT/s12_zoo1.json 2>&1 | grep -v Warn | tee $OUT/s12_zoo1.log
echo "zoo rc=${PIPESTATUS[0]}"
