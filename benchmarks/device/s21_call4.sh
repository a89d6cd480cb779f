# Session 21, H200 call 4 (issue 12, item 6): where the 24-layer GPT's step time goes, kernel
# by kernel: Inductor without a budget, dsgraph's unchunked plan at per-block
# checkpointing's memory (9.89 ms of recomputation predicted), and the per-block anchor. The
# device-time differences to Inductor's step are each plan's measured recomputation cost.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 300 python -m benchmarks.profile_step --workload gpt24 --steps 3 --top 60 \
  --configs inductor "dsgraph:memory_budget=3345400832;chunk_loss=False" \
  --json $OUT/r/s21d_gpt24.json > $OUT/r/s21d_gpt24.log 2>&1
timeout 200 python -m benchmarks.profile_step --workload gpt24_ckpt --steps 3 --top 60 --configs inductor \
  --json $OUT/r/s21d_gpt24_ckpt.json > $OUT/r/s21d_gpt24_ckpt.log 2>&1
tail -5 $OUT/r/*.log
tar -czf $OUT/s21d_results.tgz -C $OUT r; rm -rf $OUT/r
