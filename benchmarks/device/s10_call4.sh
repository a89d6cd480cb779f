# Session 10, H200 call 4: dsgraph's capacity probe at batch 28 with 2.5 GiB of the 16 GiB
# cap left outside the budget (call 3: budget cap - 1 GiB ran out of memory at 14.09 GiB
# allocated + 1.11 GiB reserved and not allocated), then the GPU zoo test for the two models
# that failed in call 2 (BERT: the per-tensor check relative to eager; resnet18: the pool's
# parameter handles), after their fixes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 125 python -m benchmarks.chunk_loss --part capacity --backends dsgraph --batches 28 --reserve-gib 2.5 \
  --steps 6 --timeout 120 --deadline-s 20 --json $OUT/capacity_dsgraph_r25.json > $OUT/capacity_dsgraph_r25.log 2>&1
echo "dsgraph rc=$?"; grep -E "^capacity|^\|" $OUT/capacity_dsgraph_r25.log | tail -5
python -c "import json,os; d=json.load(open(os.environ['OUT']+'/capacity_dsgraph_r25.json')); print(json.dumps(d['capacity'])[:900])"
timeout 125 python -m pytest -v -p no:cacheprovider tests/gpu/test_model_zoo.py -k "bert or resnet18" > $OUT/zoo_test.log 2>&1
echo "zoo test rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|^E " $OUT/zoo_test.log | cut -c1-250 | tail -10
