# Session 22, H200 call 2 (issue 12): ResNet-50 b128 again (call 1's anchor, Inductor's
# budget 0.5, hit that call's 100 s run limit on a slow host): the anchor, dsgraph at its
# measured peak and 10% below it (monotone), with longer limits. The BatchNorm plans
# changed in session 21 (looped reductions priced, row statistics saved).
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pip install -q --no-build-isolation --no-deps -e . > $OUT/r/pip.log 2>&1
nproc > $OUT/r/nproc.txt; uptime >> $OUT/r/nproc.txt
timeout 560 python -m benchmarks.planner_zoo --models resnet50 --steps 10 --timeout 180 --fresh-cache \
  --no-inductor --below 0.9 --json $OUT/r/s22b_resnet50.json > $OUT/r/s22b_resnet50.log 2>&1
python -m benchmarks.summary $OUT/r s22b_ > $OUT/s22b_summary.txt 2>&1
tar -czf $OUT/s22b_results.tgz -C $OUT r; rm -rf $OUT/r
