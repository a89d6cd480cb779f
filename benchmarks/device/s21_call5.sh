# Session 21, H200 call 5 (issue 12): call 3 again after the planner saves the softmax row statistics (the cost model prices a looped reduction's own pass over its input; `cheap` keeps row statistics) - the 24-layer GPT at per-block memory
# (3,345,400,832 B, the anchor's peak in sessions 20 and 21), the unchunked plan (what
# chunk_loss="faster" chose in call 2; chunk_loss=False gives the same plan in one compile)
# against the anchor, interleaved twice in one call (anchor, dsgraph, anchor, dsgraph), 30
# timed steps each, so the host's drift shows in the anchor's two runs.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
for i in 1 2; do
  timeout 140 python -m benchmarks.run --workloads gpt24_ckpt --configs inductor --regimes none --steps 30 \
    --fresh-cache --timeout 130 --json $OUT/r/s21e_anchor$i.json > $OUT/r/s21e_anchor$i.log 2>&1
  timeout 140 python -m benchmarks.run --workloads gpt24 --configs "dsgraph:memory_budget=3345400832;chunk_loss=False" \
    --regimes none --steps 30 --fresh-cache --timeout 130 --json $OUT/r/s21e_dsgraph$i.json > $OUT/r/s21e_dsgraph$i.log 2>&1
done
python -m benchmarks.summary $OUT/r s21e_ > $OUT/s21e_summary.txt 2>&1
tar -czf $OUT/s21e_results.tgz -C $OUT r; rm -rf $OUT/r
