# Session 27, call 2 (issue 12): call 1's buffer gap named the attention backward that runs on
# these Hopper cards, cuDNN's (not flash's, whose scratch session 26 registered): its
# workspace is now counted too. Again on the 24-layer GPT at per-block checkpointing's memory:
# the buffer gap (with the largest truth-only block's reuse chain in Inductor's wrapper and the
# emulation's pool decisions on the same nodes), the plan's peak against its prediction and the
# step against the anchor (a repeat of call 1's); then the Llama decoder against its own
# gradient checkpointing (its prediction with the cuDNN scratch counted). Fresh Inductor caches,
# each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 120 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s27b_gpt24_gap.json > $OUT/s27b_gpt24_gap.log 2>&1
timeout 200 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 90 --fresh-cache \
  --no-inductor --below 0 --variants chunk_loss=False --json $OUT/s27b_gpt24.json > $OUT/s27b_gpt24.log 2>&1
timeout 255 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s27b_llama.json > $OUT/s27b_llama.log 2>&1
(uptime) >> $OUT/host.txt
