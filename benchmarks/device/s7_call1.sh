# Session 7, H200 call 1: the planner's Inductor prediction against Inductor's plan on CUDA
# (planner_truth), the GPU test tier without the zoo file, the model zoo benchmark.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv > $OUT/smi.txt
timeout 150 python -m benchmarks.planner_truth --layers 4 --json $OUT/truth.json 2>&1 | grep -v Warning | tail -4
timeout 170 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_lowering_gpu.py \
  tests/gpu/test_chunk_loss_gpu.py > $OUT/gpu_tests.log 2>&1; tail -25 $OUT/gpu_tests.log
timeout 230 python -m benchmarks.model_zoo $OUT/zoo.json --repeats 5 --warmup 2 > $OUT/zoo.log 2>&1; tail -15 $OUT/zoo.log
