# Session 10, H200 call 3: issue 15's capacity table. A 24-layer GPT (d=1024) at 1024
# tokens per row under a 16 GiB cap: Inductor at batches 10, 12, 14, 16 until one does not
# train, then dsgraph (memory_budget = cap - 1 GiB) at twice Inductor's largest batch and
# four rows above it; tokens per second of each largest batch.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 300 python -m benchmarks.chunk_loss --part capacity --backends inductor --batches 10,12,14,16 \
  --steps 6 --timeout 110 --deadline-s 250 --json $OUT/capacity_inductor.json > $OUT/capacity_inductor.log 2>&1
echo "inductor rc=$?"; grep -E "^capacity|^\|" $OUT/capacity_inductor.log | tail -8
L=$(python -c "import json,os; print(json.load(open(os.environ['OUT']+'/capacity_inductor.json'))['capacity'][0]['largest_batch'])" 2>/dev/null \
  || python -c "import json,os; d=json.load(open(os.environ['OUT']+'/capacity_inductor.json')); print(d)" | head -c 600)
echo "inductor largest=$L"
case "$L" in ''|*[!0-9]*) L=12;; esac
timeout 280 python -m benchmarks.chunk_loss --part capacity --backends dsgraph --batches $((2*L)),$((2*L+4)) \
  --steps 6 --timeout 140 --deadline-s 140 --json $OUT/capacity_dsgraph.json > $OUT/capacity_dsgraph.log 2>&1
echo "dsgraph rc=$?"; grep -E "^capacity|^\|" $OUT/capacity_dsgraph.log | tail -8
python - <<'PY'
import json, os
for b in ("inductor", "dsgraph"):
    try:
        d = json.load(open(os.environ["OUT"] + f"/capacity_{b}.json"))
    except Exception as e:
        print(b, "no json", e); continue
    print(b, json.dumps({k: v for k, v in d.items() if k != "environment"})[:1500])
PY
