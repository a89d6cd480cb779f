# Session 15, H200 call 1 (issue 12): GPT-2-small's budget points with the planner's forked
# evaluation workers (first steps); the 24-layer GPT at per-block checkpointing's memory
# with and without the chunked loss (and with 2 chunks), Inductor without a budget as the
# reference of recomputation's cost; the MLP at Inductor's budget-0.9 memory with 30 timed
# steps (session 14's 8 were bimodal); Llama after the descent change (session 14 measured
# it before). Every run its own process, fresh Inductor caches, same run as its anchor.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
nproc > $OUT/nproc.txt
timeout 140 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache --timeout 100 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s15a_gpt2.json > $OUT/s15a_gpt2.log 2>&1
timeout 250 python -m benchmarks.planner_zoo --models gpt24 --steps 10 --fresh-cache --below 0 \
  --variants "chunk_loss=False" "chunk_loss=2" --json $OUT/s15a_gpt24.json > $OUT/s15a_gpt24.log 2>&1
timeout 60 python -m benchmarks.planner_zoo --models mlp --steps 30 --fresh-cache --below 0 --no-inductor \
  --json $OUT/s15a_mlp.json > $OUT/s15a_mlp.log 2>&1
timeout 130 python -m benchmarks.planner_zoo --models llama --steps 6 --fresh-cache --below 0 --no-inductor \
  --json $OUT/s15a_llama.json > $OUT/s15a_llama.log 2>&1
python -m benchmarks.summary "$OUT" s15a_
