# Session 30, call 3 (issue 12): GPT-2-small at 2.94 GiB, the refitted loss chunks (9 -> 4 in
# call 2) against checkpoint{refit=0} again, interleaved, after an untimed warm-up run (call
# 2's first run, on a host just started, had a 32 s first step against 21 s for the others).
# Fresh Inductor caches, each run its own process, JSON written after each run.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
B=2.94GiB
R="dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}"
timeout 60 python -m benchmarks.run --workloads gpt2 --regimes none --steps 2 --timeout 55 \
  --configs "dsgraph:memory_budget=$B" --json $OUT/s30c_warmup.json > $OUT/s30c_warmup.log 2>&1
timeout 330 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 75 \
  --configs "$R" "dsgraph:memory_budget=$B" "$R" "dsgraph:memory_budget=$B" \
  --json $OUT/s30c_gpt2.json > $OUT/s30c_gpt2.log 2>&1
(uptime) >> $OUT/host.txt
