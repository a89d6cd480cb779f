# Session 28, call 3 (issue 12): call 2 showed the emulation's peak estimate of the 24-layer
# GPT's chunked-plan backward now equal to Inductor's (412,090,368 B) with torch 2.11's rule
# followed, yet the hand-over of mm_176 still refused: the estimate between its free and its
# allocation is 25,939,952 B higher in the emulation. Both curves, step by step, to find where.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python -m benchmarks.curve_diff --workload gpt24 --budget 3345400832 \
  --json $OUT/s28c_gpt24_curves.json > $OUT/s28c_gpt24_curves.log 2>&1
