# Session 14, H200 call 4 (issue 12): where the 24-layer GPT's plan at per-block
# checkpointing's memory loses its 1.5-1.7 ms: kernel-by-kernel profiles of the anchor
# (per-block torch.utils.checkpoint through Inductor) and dsgraph at the anchor's measured
# peak (3,345,400,832 B), one process, 3 profiled steps each.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
timeout 200 python -m benchmarks.profile_step --workload gpt24_ckpt --configs inductor --steps 3 --top 60 \
  --json $OUT/s14d_prof_anchor.json > $OUT/s14d_prof_anchor.log 2>&1; tail -3 $OUT/s14d_prof_anchor.log
timeout 200 python -m benchmarks.profile_step --workload gpt24 --configs "dsgraph:memory_budget=3345400832" --steps 3 --top 60 \
  --json $OUT/s14d_prof_dsgraph.json > $OUT/s14d_prof_dsgraph.log 2>&1; tail -3 $OUT/s14d_prof_dsgraph.log
