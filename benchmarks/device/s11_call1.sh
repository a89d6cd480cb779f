# Session 11, H200 call 1 (issue 16): the GPU zoo test for all 8 models after session 10's
# fixes (resnet18's pooled convolution weights, BERT's per-tensor check relative to the fp64
# scale), in a background process; in the foreground the zoo benchmark for the three models
# without (or with stale) figures: T5 (ran past 170 s in session 10), resnet18 (failed on the
# pool bug), vit_b_16 (its prediction with the pool, fixed since). About 9.5 minutes.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(timeout 545 python -m pytest -v -p no:cacheprovider tests/gpu/test_model_zoo.py > $OUT/zoo_test.log 2>&1; echo "zoo test rc=$?" >> $OUT/zoo_test.log) &
for spec in t5:290 resnet18:140 vit_b_16:115; do
  m=${spec%%:*}; t=${spec##*:}
  timeout $t python -m benchmarks.model_zoo $OUT/zoo_$m.json --models $m --repeats 5 --warmup 2 > $OUT/zoo_$m.log 2>&1
  echo "zoo $m rc=$?"; grep -E "s$" $OUT/zoo_$m.log | grep -v Warn | tail -8 | cut -c1-200
done
wait
python - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/zoo_*.json")):
    d = json.load(open(f))
    for m in d["models"]:
        print({k: m.get(k) for k in ('model', 'seconds', 'stage_seconds', 'parity_worst_ratio', 'speedup_vs_inductor', 'peak_ratio_vs_inductor', 'error')})
        print('  inductor', str(m.get('inductor'))[:300]); print('  dsgraph', str(m.get('dsgraph'))[:400])
PY
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=|^E " $OUT/zoo_test.log | cut -c1-220 | tail -24
