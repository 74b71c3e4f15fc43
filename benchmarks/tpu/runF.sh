# Run F: the user-function probe (with the lowered slices), the run-C failures again, and the
# benchmarks that did not finish in run A (augment_chain, train_step at a quarter of the records).
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== userfn probe"; timeout 120 python3 benchmarks/tpu/userfn_probe.py 2>&1 | grep -v Warn | tee $OUT/userfn.jsonl
echo "== run C failures"; JAX_PLATFORMS=tpu,cpu timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --tb=short \
  tests/pipeline/test_caching.py tests/pipeline/test_dispatch.py tests/pipeline/test_pipeline.py tests/operators/test_lowering.py \
  > $OUT/tests-runC-failures.log 2>&1; echo "rc $?"; tail -15 $OUT/tests-runC-failures.log | cut -c1-300
date -u
echo "== augment_chain"; timeout 120 python3 -m benchmarks augment_chain --repeats 3 --json --no-progress > $OUT/augment_chain.jsonl 2>$OUT/augment_chain.err; echo "rc $?"
cut -c1-400 $OUT/augment_chain.jsonl; tail -3 $OUT/augment_chain.err
echo "== train_step"; timeout 150 python3 -m benchmarks train_step --scale 0.25 --repeats 2 --json --no-progress > $OUT/train_step.jsonl 2>$OUT/train_step.err; echo "rc $?"
cut -c1-500 $OUT/train_step.jsonl; tail -3 $OUT/train_step.err
date -u
