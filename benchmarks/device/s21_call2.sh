# Session 21, H200 call 2 (issue 12): the 24-layer GPT at per-block checkpointing's memory,
# chunk_loss="auto" (the loss choice) against the loss forced chunked and the anchor, same
# call; the session-20 planner figures predicted the unchunked plan (9.89 against 10.10 ms).
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 560 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --fresh-cache --below 0 --no-inductor \
  --timeout 170 --variants "chunk_loss=True" --json $OUT/r/s21b_gpt24.json > $OUT/r/s21b_gpt24.log 2>&1
python -m benchmarks.summary $OUT/r s21b_ > $OUT/s21b_summary.txt 2>&1
tar -czf $OUT/s21b_results.tgz -C $OUT r; rm -rf $OUT/r
