# Session 16, H200 call 4 (issue 12): call 1's budgeted GPT-2 first steps spread 27.2 to
# 38.0 s (Inductor's 27.4 to 28.5 s), the forward and backward compiles moving most. Lead:
# Inductor compiles Triton kernels in its worker pool only once the pool has answered a first
# job, until then one by one in the compiling process; the planner's forked workers share
# the CPUs with the pool coming up. Here every first step records where its kernels were
# compiled (benchmarks/kernel_compiles.py), dsgraph warms the pool on entry as
# backend="inductor" does, and BENCH_WAIT_POOL=1 (an experiment for both backends) makes each
# graph's lowering wait for the pool. Alternating, fresh caches, each run its own process.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
for i in 1 2; do
  timeout 170 python -m benchmarks.run --workloads gpt2 --regimes none --steps 4 --fresh-cache --timeout 84 \
    --configs inductor "dsgraph:memory_budget=2.94GiB" --json $OUT/s16d_gpt2_$i.json > $OUT/s16d_gpt2_$i.log 2>&1
  BENCH_WAIT_POOL=1 timeout 170 python -m benchmarks.run --workloads gpt2 --regimes none --steps 4 --fresh-cache \
    --timeout 84 --configs inductor "dsgraph:memory_budget=2.94GiB" --json $OUT/s16d_gpt2_wait_$i.json \
    > $OUT/s16d_gpt2_wait_$i.log 2>&1
done
python -m benchmarks.summary "$OUT" s16d_
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/s16d_*.json")):
    for r in json.load(open(f))["records"]:
        g = r.get("dsgraph") or {}
        stages = [g[s]["compile_s"] for s in ("joint", "forward", "backward") if s in g]
        print(os.path.basename(f), r["config"][:24], r.get("first_step_s"), stages, r.get("first_step_kernels"))
PY
