# Session 31, call 1 (issue 12): the vision transformer of the zoo (ViT-B/16, dropout 0.1,
# batch 128, bf16 autocast) against per-block torch.utils.checkpoint: the anchor, Inductor,
# dsgraph at the anchor's measured peak and at 0.9 of it (benchmarks.planner_zoo), then the
# anchor and dsgraph at its peak again, interleaved. Fresh Inductor caches, each run its
# own process, JSON written after each run.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 400 python -m benchmarks.planner_zoo --models vit --steps 20 --fresh-cache --timeout 120 \
  --json $OUT/s31a_vit_zoo.json > $OUT/s31a_vit_zoo.log 2>&1
B=$(python -c "import json; r=[r for r in json.load(open('$OUT/s31a_vit_zoo.json'))['records'] if r['role']=='anchor']; print(r[0]['peak_allocated_bytes'])" 2>/dev/null)
if [ -n "$B" ]; then
  timeout 170 python -m benchmarks.run --workloads vit --regimes none --steps 20 --fresh-cache --timeout 80 \
    --configs "dsgraph:memory_budget=$B" --json $OUT/s31a_vit_again.json > $OUT/s31a_vit_again.log 2>&1
  timeout 100 python -m benchmarks.run --workloads vit_ckpt --regimes none --steps 20 --fresh-cache --timeout 80 \
    --configs inductor --json $OUT/s31a_vit_ckpt_again.json > $OUT/s31a_vit_ckpt_again.log 2>&1
fi
(uptime) >> $OUT/host.txt
