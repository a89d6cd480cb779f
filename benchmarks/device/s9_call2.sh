# Session 9, H200 call 2: where the 2.94 GiB point's time goes, kernel by kernel, against
# Inductor (with and without lower_triton; issues 12 and 14), then the zoo models no session
# has measured on the H200 (issue 16), each in its own process.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 230 python -m benchmarks.profile_step --workload gpt2 --steps 3 --top 60 --configs inductor \
  "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;lower_triton=true" \
  --json $OUT/profile_294.json > $OUT/profile_294.log 2>&1
echo "profile rc=$?"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/profile_294.json"))
for c in (d if isinstance(d, list) else d.get("configs", d.get("profiles", []))):
    print(c["config"], "total ms", c["total_ms"], "launches", c["launches"])
    for k in c["kernels"][:14]:
        print("   %7.3f ms x%5.1f %s" % (k["ms"], k["per_step"], k["name"][:110]))
PY
for m in t5 resnet18 vit_b_16; do
  timeout 105 python -m benchmarks.model_zoo $OUT/zoo_$m.json --models $m --repeats 5 --warmup 2 > $OUT/zoo_$m.log 2>&1
  echo "$m rc=$?"
done
python - <<'PY'
import json, os, glob
for p in sorted(glob.glob(os.environ["OUT"] + "/zoo_*.json")):
    d = json.load(open(p))
    for m in d["models"]:
        i, s = m.get("inductor") or {}, m.get("dsgraph") or {}
        f = lambda x: "%.1f" % ((x or 0) / 1e6)
        print(m["model"], "ind", round(i.get("ms") or 0, 2), f(i.get("peak_bytes")),
              "| ds", round(s.get("ms") or 0, 2), f(s.get("peak_bytes")),
              "budget", f((m.get("options") or {}).get("memory_budget")), "par", m.get("parity_worst_ratio"),
              (m.get("error") or "")[:200])
PY
for m in t5 resnet18 vit_b_16; do grep -E "Error|error" $OUT/zoo_$m.log | grep -v Warning | tail -3; done
