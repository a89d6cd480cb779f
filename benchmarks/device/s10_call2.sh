# Session 10, H200 call 2: the model zoo's three models never measured (T5, resnet18,
# vit_b_16), one process each, one after the other (stage seconds in the logs); the GPU zoo
# test (every zoo model through check_training_step's fp64 rule) runs at the same time in a
# background process: its GPU work is small and bursty, but the zoo's step times of this
# call were measured next to it.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 520 python -m pytest -v -p no:cacheprovider tests/gpu/test_model_zoo.py > $OUT/zoo_test.log 2>&1; echo "zoo test rc=$?" >> $OUT/zoo_test.log) &
for m in t5 resnet18 vit_b_16; do
  timeout 170 python -m benchmarks.model_zoo $OUT/zoo_$m.json --models $m --repeats 5 --warmup 2 > $OUT/zoo_$m.log 2>&1
  echo "zoo $m rc=$?"; grep -E "s$" $OUT/zoo_$m.log | grep -v Warn | tail -8 | cut -c1-200
done
wait
python - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/zoo_*.json")):
    d = json.load(open(f))
    for m in d["models"]:
        print({k: m.get(k) for k in ('model', 'seconds', 'stage_seconds', 'parity_worst_ratio', 'speedup_vs_inductor', 'peak_ratio_vs_inductor', 'error')})
        print('  inductor', str(m.get('inductor'))[:300]); print('  dsgraph', str(m.get('dsgraph'))[:300])
PY
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $OUT/zoo_test.log | cut -c1-200 | tail -14
