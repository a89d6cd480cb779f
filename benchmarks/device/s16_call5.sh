# Session 16, H200 call 5 (issue 12): call 4 found every first-step kernel compiled in
# Inductor's pool (the lead refuted); the budgeted backward stage took 10.6-11.0 s against
# at most 5.8 s for Inductor's backward. cProfile of one first step each, fresh caches.
set -x
export PYTHONUNBUFFERED=1
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/pip.log 2>&1
for c in inductor "dsgraph:memory_budget=2.94GiB"; do
  n=$(echo $c | cut -c1-7)
  TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python -m cProfile -o $OUT/s16e_$n.prof -m benchmarks.measure \
    --workload gpt2 --config "$c" --steps 2 > $OUT/s16e_$n.log 2>&1
  python -c "import pstats,sys; s=pstats.Stats(sys.argv[1]); s.sort_stats('cumulative').print_stats(70)" \
    $OUT/s16e_$n.prof > $OUT/s16e_${n}_cum.txt 2>&1
done
grep -h first_step $OUT/s16e_*.log | cut -c1-400
