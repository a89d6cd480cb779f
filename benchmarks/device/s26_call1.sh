# Session 26, call 1 (issue 12; session 25 call 2 rerun, it never got a machine): the zoo table at main, part 2: the 24-layer GPT against
# per-block torch.utils.checkpoint (dsgraph at its peak, with chunk_loss=False too, and 10%
# below it), then the transformers Llama decoder against its own gradient checkpointing
# (at its peak and 10% below). Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 290 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 100 --fresh-cache \
  --no-inductor --below 0.9 --variants chunk_loss=False --json $OUT/s26a_gpt24.json > $OUT/s26a_gpt24.log 2>&1
timeout 270 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 130 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s26a_llama.json > $OUT/s26a_llama.log 2>&1
(uptime) >> $OUT/host.txt
