# Session 30, call 2 (issue 12). Call 1 found no refit: every plan's exact peak was at the loss
# op's step. The refit's target is now the budget less 2% (REFIT_SLACK) where the plan peaks
# below it (GPT-2 at 2.94 GiB: 2.858 GB predicted of 3.157 GB). Here: the op alone against its
# chunk count at GPT-2's and the 24-layer GPT's shapes; GPT-2-small at both budget points with
# the refit and with checkpoint{refit=0}, interleaved; the 24-layer GPT at per-block
# checkpointing's memory (3,345,400,832 B, its anchor's peak in sessions 21-29) the same way.
# Fresh Inductor caches, each run its own process, JSON straight under $OUT.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 60 python -m benchmarks.chunk_count --shapes 16384x768,8192x1024 --counts 1,2,3,4,5,6,9 \
  --json $OUT/s30b_chunk_count.json > $OUT/s30b_chunk_count.log 2>&1
B=2.94GiB
C=4.9GiB
timeout 300 python -m benchmarks.run --workloads gpt2 --regimes none --steps 20 --fresh-cache --timeout 80 \
  --configs "dsgraph:memory_budget=$B" "dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}" \
  "dsgraph:memory_budget=$B" "dsgraph:memory_budget=$B;pipeline=lifetimes,chunk_loss,checkpoint{budget=$B,refit=0}" \
  "dsgraph:memory_budget=$C" "dsgraph:memory_budget=$C;pipeline=lifetimes,chunk_loss,checkpoint{budget=$C,refit=0}" \
  --json $OUT/s30b_gpt2.json > $OUT/s30b_gpt2.log 2>&1
G=3345400832
timeout 200 python -m benchmarks.run --workloads gpt24 --regimes none --steps 20 --fresh-cache --timeout 95 \
  --configs "dsgraph:memory_budget=$G" "dsgraph:memory_budget=$G;pipeline=lifetimes,chunk_loss,checkpoint{budget=$G,refit=0}" \
  --json $OUT/s30b_gpt24.json > $OUT/s30b_gpt24.log 2>&1
(uptime) >> $OUT/host.txt
