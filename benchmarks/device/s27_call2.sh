# Session 27, call 2 (issue 12): the second, CUDA-only prediction gap of the 24-layer GPT at
# per-block checkpointing's memory (session 26: the planner's step model about 9 MB below
# Inductor's own plan of the same partition), buffer by buffer at Inductor's peak step
# (benchmarks.budget_gap on the rebuilt partition, no session run); then the Llama decoder
# against its own gradient checkpointing at its peak (its prediction with the attention scratch
# counted). Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 220 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s27b_gpt24_gap.json > $OUT/s27b_gpt24_gap.log 2>&1
timeout 250 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s27b_llama.json > $OUT/s27b_llama.log 2>&1
(uptime) >> $OUT/host.txt
