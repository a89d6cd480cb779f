# Session 26, call 2 (issue 12): GPT-2-small's two budget points against Inductor without a
# budget at main, a second run of session 25's (also checks that the "predicted" column now
# counts the CUDA BLAS workspaces), then what is live at the peak of the 24-layer GPT's chunked
# plan at per-block checkpointing's memory (call 1: 1.3% above its prediction), from the CUDA
# allocator's history. ResNet-50 and the MLP left out: the session's device time left no room.
# Fresh Inductor caches, each run its own process, JSON straight under $OUT.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 170 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 80 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/s26b_gpt2.json > $OUT/s26b_gpt2.log 2>&1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 200 python -m benchmarks.alloc_replay --workload gpt24 --budget 3345400832 \
  --stacks python --top 40 --json $OUT/s26b_gpt24_replay.json > $OUT/s26b_gpt24_replay.log 2>&1
(uptime) >> $OUT/host.txt
