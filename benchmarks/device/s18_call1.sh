# Session 18, H200 call 1 (issue 12, the first step with a budget): compile_ahead with
# dsgraph's own worker (compile/ahead_worker.py: one spawned interpreter started at the
# backend's entry; Inductor's worker pool imported torch twice before its first job).
# First the GPU tests of compile_ahead (served, bitwise equal to the in-process compile
# under deterministic algorithms, the same checked plan), then alternating first steps with
# fresh caches: Inductor, dsgraph 2.94 GiB with compile_ahead, dsgraph 2.94 GiB without,
# each run its own process. Everything comes back in one tarball and one summary.
set -x
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_compile_ahead_gpu.py > $OUT/r/s18a_gpu_tests.log 2>&1
echo "gpu tests rc=$?" >> $OUT/r/s18a_gpu_tests.log
for i in ${ROUNDS:-1 2 3}; do
  timeout 170 python -m benchmarks.run --workloads gpt2 --regimes none --steps 4 --fresh-cache --timeout 80 \
    --configs inductor "dsgraph:memory_budget=2.94GiB;compile_ahead=true" "dsgraph:memory_budget=2.94GiB" \
    --json $OUT/r/s18a_gpt2_$i.json > $OUT/r/s18a_gpt2_$i.log 2>&1
done
{
tail -3 $OUT/r/s18a_gpu_tests.log
python -m benchmarks.summary "$OUT/r" s18a_
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/r/s18a_gpt2_*.json")):
    for r in json.load(open(f))["records"]:
        g = r.get("dsgraph") or {}
        stages = {s: g[s]["compile_s"] for s in ("joint", "forward", "backward") if s in g}
        ahead = {k: v for k, v in (g.get("backward") or {}).get("memory", {}).items() if k.startswith("compile_ahead")}
        print(os.path.basename(f), r["config"][:50], "first", r.get("first_step_s"), "step", r.get("step_ms"),
              "peak", r.get("peak_gib"), stages, ahead)
PY
} > $OUT/s18a_summary.txt 2>&1
tar -czf $OUT/s18a_results.tgz -C $OUT r
rm -rf $OUT/r
