# Session 26, call 2 (issue 12): part of session 25 call 1 repeated at main, a second run of
# each point (ResNet-50 left out: the session's device time left no room for it): GPT-2-small's
# two budget points against Inductor without a budget (also checks that the "predicted" column
# now counts the CUDA BLAS workspaces), then the MLP against Inductor's budget 0.9, dsgraph at
# the anchor's measured peak and 10% below it. Fresh Inductor caches, each run its own process,
# JSON straight under $OUT (written after each run).
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 170 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 80 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s26b_gpt2.json > $OUT/s26b_gpt2.log 2>&1
timeout 110 python -m benchmarks.planner_zoo --models mlp --steps 30 --timeout 50 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s26b_mlp.json > $OUT/s26b_mlp.log 2>&1
(uptime) >> $OUT/host.txt
