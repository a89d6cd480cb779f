# Session 24, H200 call 3 (issue 12; ran on the H100 that call 2 got): ResNet-50 b128
# again, 30 timed steps (call 2's 10 steps spread 30.9-40.0 ms), the anchor (Inductor's
# budget 0.5), dsgraph at its measured peak and 10% below it.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
timeout 540 python -m benchmarks.planner_zoo --models resnet50 --steps 30 --timeout 170 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/s24c_resnet50.json > $OUT/s24c_resnet50.log 2>&1
(uptime) >> $OUT/host.txt
