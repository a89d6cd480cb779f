# Session 27, call 1 (issue 12): the flash-attention backward's scratch, counted since session 26
# (074314a), checked on the GPU. The 24-layer GPT at per-block checkpointing's memory (its plan
# now differs: the old one is priced 34 MB over the budget): peak against prediction and budget,
# step time against the anchor, with chunk_loss=False too; then the planner's step model against
# Inductor's own plan of that partition buffer by buffer (session 26: about 9 MB below it, CUDA
# only); then GPT-2-small's 2.94 GiB point (its prediction now counts the same scratch: still
# matched?). Call 2's Llama left for later: machines were scarce. Fresh Inductor caches, each
# run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 230 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 100 --fresh-cache \
  --no-inductor --below 0 --variants chunk_loss=False --json $OUT/s27a_gpt24.json > $OUT/s27a_gpt24.log 2>&1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 170 python -m benchmarks.budget_gap --workload gpt24 --budgets 3345400832 \
  --no-session --json $OUT/s27a_gpt24_gap.json > $OUT/s27a_gpt24_gap.log 2>&1
timeout 150 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 75 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" --json $OUT/s27a_gpt2.json > $OUT/s27a_gpt2.log 2>&1
(uptime) >> $OUT/host.txt
