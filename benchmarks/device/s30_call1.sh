# Session 30, call 1 (issue 12): the loss chunks refitted to the plan's peak
# (recompute/workspace_fit.py: fewer, larger chunks where the plan peaks elsewhere) against
# the chunks chunk_loss sized from the budget (checkpoint{refit=0}), on GPT-2-small at both
# budget points, interleaved, with Inductor without a budget as the reference. Fresh Inductor
# caches, each run its own process, JSON straight under $OUT.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
B=2.94GiB
C=4.9GiB
timeout 540 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 80 \
  --configs inductor "dsgraph:memory_budget=$B" "dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}" \
  "dsgraph:memory_budget=$B" "dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}" \
  "dsgraph:memory_budget=$C" "dsgraph:memory_budget=$C;pipeline=lifetimes,chunk_loss,checkpoint{budget=$C,refit=0}" \
  --json $OUT/s30a_gpt2.json > $OUT/s30a_gpt2.log 2>&1
(uptime) >> $OUT/host.txt
