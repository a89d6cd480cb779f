# Session 16, H200 call 1 (issue 12): GPT-2-small's first step with a budget against
# Inductor's, alternating in one run (session 15's host gave 1.54x in one pair and 25.76 s
# for the same budgeted config in another: a single pair does not settle it), each run its
# own process with a fresh Inductor cache; then the 4.9 GiB point.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
for i in 1 2 3; do
  timeout 180 python -m benchmarks.run --workloads gpt2 --regimes none --steps 10 --fresh-cache --timeout 88 \
    --configs inductor "dsgraph:memory_budget=2.94GiB" --json $OUT/s16a_gpt2_$i.json > $OUT/s16a_gpt2_$i.log 2>&1
done
timeout 85 python -m benchmarks.run --workloads gpt2 --regimes none --steps 10 --fresh-cache --timeout 80 \
  --configs "dsgraph:memory_budget=4.9GiB" --json $OUT/s16a_gpt2_49.json > $OUT/s16a_gpt2_49.log 2>&1
python -m benchmarks.summary "$OUT" s16a_
