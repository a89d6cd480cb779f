# Session 7, H200 call 4: the chunk_loss GPU tests after the workspace count was made exact.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 100 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_chunk_loss_gpu.py > $OUT/chunk_gpu.log 2>&1
grep -E "PASSED|FAILED|passed|failed|Error|assert" $OUT/chunk_gpu.log | tail -15
