# Session 29, call 4 (issue 12): call 3 left the gap with Inductor's mix-order reduction
# fusion off; the curves and buffers of that backward with the fusion off, to see where
# Inductor then places the fc2 weight-gradient mm (mm_169) against the emulation.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 170 python -m benchmarks.curve_diff \
  --workload gpt24 --budget 3345400832 --json $OUT/s29d_gpt24_curves_nomix.json > $OUT/s29d_gpt24_curves_nomix.log 2>&1
(uptime) >> $OUT/host.txt
