# Session 20, H200 call 1 (issue 12, evidence for choosing chunk_loss automatically; no code
# change): does the planner reach GPT-2-small's budget points without the chunked loss, and
# how fast; does the 24-layer GPT's chunked plan get faster with fewer chunks (2 against the
# automatic 5)? Every figure against its anchor in the same call.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 270 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache --timeout 60 \
  --configs inductor "dsgraph:memory_budget=4.9GiB" "dsgraph:memory_budget=4.9GiB;chunk_loss=False" \
  "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;chunk_loss=False" \
  --json $OUT/r/s20a_gpt2.json > $OUT/r/s20a_gpt2.log 2>&1
timeout 280 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --fresh-cache --below 0 --no-inductor \
  --variants "chunk_loss=False" "chunk_loss=2" --json $OUT/r/s20a_gpt24.json > $OUT/r/s20a_gpt24.log 2>&1
python -m benchmarks.summary $OUT/r s20a_ > $OUT/s20a_summary.txt 2>&1
tar -czf $OUT/s20a_results.tgz -C $OUT r; rm -rf $OUT/r
