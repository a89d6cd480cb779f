# Session 22, H200 call 3 (issue 12): the zoo table at main, the transformer anchors: the
# transformers Llama decoder against its own gradient checkpointing, the 24-layer GPT
# against per-block torch.utils.checkpoint (with chunk_loss=False as well: session 21's
# faster plan there), each with a budget 10% below the anchor's peak (monotone). Fresh
# Inductor caches, every run its own process.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 300 python -m benchmarks.planner_zoo --models gpt24 --steps 20 --timeout 110 --fresh-cache \
  --no-inductor --below 0.9 --variants "chunk_loss=False" --json $OUT/r/s22c_gpt24.json > $OUT/r/s22c_gpt24.log 2>&1
timeout 260 python -m benchmarks.planner_zoo --models llama --steps 8 --timeout 120 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/r/s22c_llama.json > $OUT/r/s22c_llama.log 2>&1
python -m benchmarks.summary $OUT/r s22c_ > $OUT/s22c_summary.txt 2>&1
tar -czf $OUT/s22c_results.tgz -C $OUT r; rm -rf $OUT/r
