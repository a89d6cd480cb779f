# Session 18, H200 call 2 (experiment, issue 12's first step): does compile_ahead gain once
# the two compiles share the CPUs' kernel-compile threads? Alternating first steps with fresh
# caches: Inductor; compile_ahead with the worker's kernel pool at 8 threads (this process
# 16); compile_ahead with both at 8 (TORCHINDUCTOR_COMPILE_THREADS=8 for the run); dsgraph
# 2.94 GiB without the worker. The worker's thread count is an experiment-only hook that
# this script patches into the machine's copy of dsgraph/compile/ahead_worker.py (not on main).
export PYTHONUNBUFFERED=1
python - <<'PY'
p = "dsgraph/compile/ahead_worker.py"
s = open(p).read()
a = "        key = compat.inductor_ahead.torch_key()"
s = s.replace(a, '        if os.environ.get("BENCH_AHEAD_THREADS"):\n'
                 '            env["TORCHINDUCTOR_COMPILE_THREADS"] = os.environ["BENCH_AHEAD_THREADS"]\n' + a)
open(p, "w").write(s)
PY
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
B="dsgraph:memory_budget=2.94GiB"
run() { tag=$1; shift; timeout 120 env "$@" python -m benchmarks.run --workloads gpt2 --regimes none --steps 4 --fresh-cache --timeout 80 --configs "$CFG" --json $OUT/r/s18b_${tag}.json > $OUT/r/s18b_${tag}.log 2>&1; }
for i in 1 2; do
  CFG=inductor run ind_$i X=1
  CFG="$B;compile_ahead=true" run ahead_w8_$i BENCH_AHEAD_THREADS=8
  CFG="$B;compile_ahead=true" run ahead_both8_$i TORCHINDUCTOR_COMPILE_THREADS=8
  CFG="$B" run plain_$i X=1
done
python - > $OUT/s18b_summary.txt 2>&1 <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/r/s18b_*.json")):
    for r in json.load(open(f))["records"]:
        g = r.get("dsgraph") or {}
        stages = {s: g[s]["compile_s"] for s in ("joint", "forward", "backward") if s in g}
        ahead = {k: v for k, v in (g.get("backward") or {}).get("memory", {}).items() if k.startswith("compile_ahead")}
        print(os.path.basename(f), r["config"][:50], "first", r.get("first_step_s"), "step", r.get("step_ms"), stages, ahead)
PY
tar -czf $OUT/s18b_results.tgz -C $OUT r; rm -rf $OUT/r
