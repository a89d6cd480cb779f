# Session 29, call 1 (issue 12): session 28's call 3, never run: Inductor's peak-estimate curve
# of the 24-layer GPT's chunked-plan backward against the emulation's, step by step, to find
# where the emulated curve is 26 MB high at the one refused hand-over (mm_176). Then the Llama
# decoder against its own gradient checkpointing, not measured on a GPU since the op counter
# follows Inductor's CSE (session 28). Fresh Inductor caches, each run its own process.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python -m benchmarks.curve_diff --workload gpt24 --budget 3345400832 \
  --json $OUT/s29a_gpt24_curves.json > $OUT/s29a_gpt24_curves.log 2>&1
timeout 255 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0 --json $OUT/s29a_llama.json > $OUT/s29a_llama.log 2>&1
(uptime) >> $OUT/host.txt
