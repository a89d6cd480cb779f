# Session 27, call 3 (issue 12): call 2 traced the 24-layer GPT's chunked plan's -0.99% to one
# pool hand-over the emulation refuses by 7.3 MB of its own peak estimate; here Inductor's own
# decision on it (its estimate's peak, the peak in between), recorded while it compiles
# (benchmarks.planner_gap.inductor_pool_decisions). Then the first step with an overrun of the
# smallest plan warned at once (call 2: a second compile, 50 s against the anchor's 23 s);
# and which attention kernels the Llama decoder's GPU graph holds (call 2: its peak 0.45% over
# the prediction, untraced). Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 130 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s27c_gpt24_gap.json > $OUT/s27c_gpt24_gap.log 2>&1
timeout 90 python -m benchmarks.attention_ops --workload llama > $OUT/s27c_llama_attention.txt 2>&1
timeout 150 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 90 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s27c_gpt24.json > $OUT/s27c_gpt24.log 2>&1
(uptime) >> $OUT/host.txt
