# Session 19, H200 call 1 (issue 12): the figures again at main after session 18 (no planner
# change since session 16), on this session's host: the 24-layer GPT at per-block
# checkpointing's memory with the chunked loss (auto) and without it, against the anchor,
# 20 timed steps each (does session 15's "unchunked 2.6% faster, both faster than
# per-block" reproduce?); GPT-2-small's 2.94 GiB and 4.9 GiB points against Inductor.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 150 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --fresh-cache --timeout 60 \
  --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=4.9GiB" \
  --json $OUT/r/s19a_gpt2.json > $OUT/r/s19a_gpt2.log 2>&1
timeout 340 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --fresh-cache --below 0 --no-inductor \
  --variants "chunk_loss=False" --json $OUT/r/s19a_gpt24.json > $OUT/r/s19a_gpt24.log 2>&1
python -m benchmarks.summary $OUT/r s19a_ > $OUT/s19a_summary.txt 2>&1
tar -czf $OUT/s19a_results.tgz -C $OUT r; rm -rf $OUT/r
