# Session 30, call 2 (issue 12): the 24-layer GPT at per-block checkpointing's memory with the
# loss chunks refitted to the plan's peak, against the chunks sized from the budget
# (checkpoint{refit=0}), the unchunked loss and the anchor (per-block torch.utils.checkpoint).
# The budget is the anchor's peak measured in sessions 21-29 (3,345,400,832 B on H100 and
# H200); the anchor runs here too. Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
B=3345400832
timeout 560 python -m benchmarks.run --workloads gpt24 --regimes none --steps 20 --fresh-cache --timeout 110 \
  --configs "dsgraph:memory_budget=$B" "dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}" \
  "dsgraph:memory_budget=$B;chunk_loss=false" "dsgraph:memory_budget=$B" \
  --json $OUT/s30b_gpt24.json > $OUT/s30b_gpt24.log 2>&1
timeout 120 python -m benchmarks.run --workloads gpt24_ckpt --regimes none --steps 20 --fresh-cache --timeout 110 \
  --configs inductor --json $OUT/s30b_anchor.json > $OUT/s30b_anchor.log 2>&1
(uptime) >> $OUT/host.txt
