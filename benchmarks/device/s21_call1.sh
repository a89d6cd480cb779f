# Session 21, H200 call 1 (issue 12): chunk_loss="auto" under a budget now plans the step
# with and without the chunked loss and compiles the plan predicted to recompute less
# (passes/loss_choice.py). GPT-2-small at its two budget points, auto against the loss
# forced chunked, against Inductor in the same call; step time and the first step (the
# choice costs one or two more compiles).
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 560 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache --timeout 150 \
  --configs inductor "dsgraph:memory_budget=4.9GiB" "dsgraph:memory_budget=4.9GiB;chunk_loss=True" \
  "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;chunk_loss=True" \
  --json $OUT/r/s21a_gpt2.json > $OUT/r/s21a_gpt2.log 2>&1
python -m benchmarks.summary $OUT/r s21a_ > $OUT/s21a_summary.txt 2>&1
tar -czf $OUT/s21a_results.tgz -C $OUT r; rm -rf $OUT/r
