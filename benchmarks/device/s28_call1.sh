# Session 28, call 1 (issue 12): torch 2.11's Inductor peak estimate frees each graph output at
# step 0 (2.13 does not), so its pool and its peak-memory reorder see a backward lowered by the
# parameter gradients not yet made; the emulation now does the same on torch < 2.13
# (compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START). Checked here: the 24-layer GPT's chunked plan
# against Inductor's plan (session 27: -0.99%, traced to one hand-over the 2.13 estimate
# refuses); then that workload at its anchor's memory, measured, with
# the first step (session 27's fix: no second compile after an overrun of the smallest plan,
# not yet measured on a GPU). Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 130 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s28a_gpt24_gap.json > $OUT/s28a_gpt24_gap.log 2>&1
timeout 200 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 110 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s28a_gpt24.json > $OUT/s28a_gpt24.log 2>&1
(uptime) >> $OUT/host.txt
