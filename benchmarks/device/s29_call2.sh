# Session 29, call 2 (issue 12): call 1's curves of the 24-layer GPT's chunked-plan backward
# part by about 4 MiB from the first steps on and by tens of MB around some matmuls, but
# curves alone do not say which buffers: again with each curve's buffers (Inductor's
# memory timeline: name, bytes allocated and freed, first and last step; the emulation's:
# node, bytes, steps, input or output or freeable) and the emulated kernel order.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 170 python -m benchmarks.curve_diff --workload gpt24 --budget 3345400832 \
  --json $OUT/s29b_gpt24_curves.json > $OUT/s29b_gpt24_curves.log 2>&1
(uptime) >> $OUT/host.txt
