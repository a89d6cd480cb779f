# Session 22, H200 call 1 (issue 12): the zoo table at main (after session 21's looped-
# reduction pricing and the saved row statistics, which change the BatchNorm plans):
# ResNet-50 b128 and the MLP, each against its anchor in the same run with a budget 10%
# below the anchor's peak (monotone), then GPT-2-small's two budget points against
# Inductor. Fresh Inductor caches, every run its own process.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 230 python -m benchmarks.planner_zoo --models resnet50 --steps 10 --timeout 100 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/r/s22a_resnet50.json > $OUT/r/s22a_resnet50.log 2>&1
timeout 90 python -m benchmarks.planner_zoo --models mlp --steps 30 --timeout 40 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/r/s22a_mlp.json > $OUT/r/s22a_mlp.log 2>&1
timeout 200 python -m benchmarks.run --workloads gpt2 --regimes none --steps 10 --fresh-cache --timeout 90 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/r/s22a_gpt2.json > $OUT/r/s22a_gpt2.log 2>&1
python -m benchmarks.summary $OUT/r s22a_ > $OUT/s22a_summary.txt 2>&1
tar -czf $OUT/s22a_results.tgz -C $OUT r; rm -rf $OUT/r
