# Session 29, call 3 (issue 12): call 2's buffers place the 24-layer GPT's gap in the
# schedule, not the pool rule: Inductor's CUDA mix-order reduction fusion
# (config.mix_order_reduction, on by default in torch 2.11; a FusedMixOrderReductions node
# joins a LayerNorm backward's column sums with the next one's reductions) runs the fc2
# weight-gradient mm after the GELU backward, so its 64 MiB input lives on and the wrapper
# pool's free order changes; the emulation has no such fusion. A check of that cause: the same
# plan against Inductor with the fusion off (TORCHINDUCTOR_MIX_ORDER_REDUCTION=0), then on.
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
(nproc; uptime; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv) > $OUT/host.txt
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python -m benchmarks.budget_gap \
  --workload gpt24 --budgets 3345400832 --no-session --json $OUT/s29c_gpt24_gap_nomix.json > $OUT/s29c_gpt24_gap_nomix.log 2>&1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python -m benchmarks.budget_gap \
  --workload gpt24 --budgets 3345400832 --no-session --json $OUT/s29c_gpt24_gap.json > $OUT/s29c_gpt24_gap.log 2>&1
(uptime) >> $OUT/host.txt
