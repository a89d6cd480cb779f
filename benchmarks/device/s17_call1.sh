# Session 17, H200 call 1 (issue 12, the first step with a budget): the backward compiled in
# Inductor's worker while the forward compiles (compile_ahead; on by default for CUDA graphs when
# these calls ran, off by default since: see docs/BENCHMARKS.md, session 17).
# First the GPU tests (served, bitwise equal to the in-process compile, same checked plan),
# then alternating first steps with fresh caches: Inductor, dsgraph 2.94 GiB (compile_ahead
# auto) and dsgraph 2.94 GiB with compile_ahead=false, each run its own process. Call 1 ran
# this twice before the fixes of its findings (poisoned V.interpreter; the embedding backward
# under deterministic algorithms; the worker forked, its kernel pool ready before a graph).
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 300 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_compile_ahead_gpu.py > $OUT/s17a_gpu_tests.log 2>&1
echo "gpu tests rc=$?" >> $OUT/s17a_gpu_tests.log
for i in 1 2 3; do
  timeout 200 python -m benchmarks.run --workloads gpt2 --regimes none --steps 4 --fresh-cache --timeout 80 \
    --configs inductor "dsgraph:memory_budget=2.94GiB" "dsgraph:memory_budget=2.94GiB;compile_ahead=false" \
    --json $OUT/s17a_gpt2_$i.json > $OUT/s17a_gpt2_$i.log 2>&1
done
python -m benchmarks.summary "$OUT" s17a_
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/s17a_gpt2_*.json")):
    for r in json.load(open(f))["records"]:
        g = r.get("dsgraph") or {}
        stages = {s: g[s]["compile_s"] for s in ("joint", "forward", "backward") if s in g}
        ahead = {k: v for k, v in (g.get("backward") or {}).get("memory", {}).items() if k.startswith("compile_ahead")}
        print(os.path.basename(f), r["config"][:50], "first", r.get("first_step_s"), "step", r.get("step_ms"),
              "peak", r.get("peak_gib"), stages, ahead)
PY
# does the worker hold a CUDA context (GPU memory of its own) after the compile?
python - > $OUT/s17a_smi.txt 2>&1 <<'PY'
import os, subprocess
from tests.e2e.test_compile_ahead import _step
_step({}, "cuda")
print("this process", os.getpid())
print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"], capture_output=True, text=True).stdout)
PY
