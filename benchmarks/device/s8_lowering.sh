# Session 8, H200: the lowering benchmark's layer_norm / rms_norm with each path's kernel device
# time from the profiler (kernels per call, their names, CPU time per call) beside do_bench's
# per-call figures, the tile sweep, then the GPU lowering tests.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 120 python -m benchmarks.lowering --cases layer_norm,rms_norm --repeats 3 --sweep --json $OUT/lowering.json > $OUT/lowering.log 2>&1
echo "lowering rc=$?"; tail -4 $OUT/lowering.log
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/lowering.json"))
print("torch", d.get("torch"), "triton", d.get("triton"), "copy GB/s", d.get("copy_GBps"), "by kernel", d.get("copy_kernel_GBps"),
      "seconds", d.get("seconds"))
for c in d["cases"]:
    cols = []
    for p in ("dsgraph", "dsgraph_inductor", "inductor"):
        cols.append("%s: %.1f us (%.3f) kernel %s us x%s (%s) cpu %s launch %s" % (
            p, c.get(p + "_us") or 0, c.get(p + "_of_copy") or 0, c.get(p + "_kernel_us"),
            c.get(p + "_kernels_per_call"), c.get(p + "_kernel_of_copy"), c.get(p + "_cpu_us"), c.get(p + "_launch_us")))
    print(c["case"], "|", " | ".join(cols))
    print("  config", c.get("config"), "via Inductor", c.get("dsgraph_inductor_config"), "sweep best",
          c.get("sweep_best_config"), c.get("sweep_best_us"), "us; is best:", c.get("config_is_sweep_best"),
          c.get("dsgraph_inductor_config_is_sweep_best"), "| seconds", c.get("seconds"))
    for p in ("dsgraph", "dsgraph_inductor", "inductor"):
        print("  %s kernels: %s" % (p, [n[:90] for n in c.get(p + "_kernel_names") or []]))
PY
timeout 150 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_lowering_gpu.py > $OUT/lowering_tests.log 2>&1
echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/lowering_tests.log | tail -40
