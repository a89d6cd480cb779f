# Session 9, H200 call 1: GPT-2-small budget points with and without lower_triton (issue 14's
# end-to-end effect and recomputation overhead), each config in its own process with its own
# fresh Inductor cache (first step cold for every config, issue 12's 1.3x first-step target),
# Inductor's anchor in the same run.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 540 python -m benchmarks.run --workloads gpt2 --regimes none --steps 8 --timeout 130 --fresh-cache \
  --configs inductor "dsgraph:memory_budget=4.9GiB" "dsgraph:memory_budget=4.9GiB;lower_triton=true" \
  "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;lower_triton=true" \
  "dsgraph:memory_budget=2GiB;lower_triton=true" \
  --json $OUT/gpt2_lowering.json > $OUT/gpt2_lowering.log 2>&1
echo "run rc=$?"; grep -v Warning $OUT/gpt2_lowering.log | tail -12
