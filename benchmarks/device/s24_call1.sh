# Session 24, H200 call 1 (issue 12): the transformers Llama decoder against its own
# gradient checkpointing, then dsgraph at the anchor's measured peak and 10% below it
# (monotone). Session 23's run (120 s per run) cut dsgraph off before its first step
# ended; here each run gets 270 s. Fresh Inductor caches, every run its own process; the
# JSON lands straight under $OUT (written after each run, so a cut-off run keeps the rest).
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime) > $OUT/host.txt
timeout 570 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 270 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s24a_llama.json > $OUT/s24a_llama.log 2>&1
(uptime) >> $OUT/host.txt
