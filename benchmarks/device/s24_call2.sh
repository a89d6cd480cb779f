# Session 24, H200 call 2 (issue 12): ResNet-50 b128 against Inductor's budget 0.5 (the
# anchor; not measured since session 14, session 21's BatchNorm plan change is in), then
# the 24-layer GPT against per-block checkpointing with the budget 10% below it (the
# monotone check session 23's run did not reach). Each model: the anchor, dsgraph at its
# measured peak, dsgraph at 0.9x. JSON straight under $OUT, written after each run.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime) > $OUT/host.txt
timeout 250 python -m benchmarks.planner_zoo --models resnet50 --steps 10 --timeout 120 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s24b_resnet50.json > $OUT/s24b_resnet50.log 2>&1
timeout 320 python -m benchmarks.planner_zoo --models gpt24 --steps 10 --timeout 120 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s24b_gpt24.json > $OUT/s24b_gpt24.log 2>&1
(uptime) >> $OUT/host.txt
