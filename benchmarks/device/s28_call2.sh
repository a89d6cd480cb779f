# Session 28, call 2 (issue 12): call 1 cut short for device time (no machine in nine tries):
# the 24-layer GPT's chunked plan against Inductor's plan with torch 2.11's peak estimate
# followed (session 27: -0.99%), then that workload at its anchor's memory with the first
# step, as far as the time allows. Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 120 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s28b_gpt24_gap.json > $OUT/s28b_gpt24_gap.log 2>&1
timeout 150 python -m benchmarks.planner_zoo --models gpt24 --steps 12 --timeout 100 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s28b_gpt24.json > $OUT/s28b_gpt24.log 2>&1
(uptime) >> $OUT/host.txt
