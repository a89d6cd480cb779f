# Session 12, H200 call 2 (issue 12): the planner against its anchors, continued: the
# transformers Llama decoder (its own gradient checkpointing) and ResNet-50 at batch 128
# (Inductor's activation_memory_budget=0.5). Fresh Inductor cache per run. About 9.5 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 570 python -m benchmarks.planner_zoo --models llama,resnet50 --steps 6 --timeout 170 --fresh-cache \
  --json $OUT/s12_zoo2.json 2>&1 | grep -v Warn | tee $OUT/s12_zoo2.log
echo "zoo rc=${PIPESTATUS[0]}"
