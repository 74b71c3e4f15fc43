# Run D: the TPU test command's operators half.
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== tests operators"; JAX_PLATFORMS=tpu,cpu timeout ${TEST_S:-540} python3 -m pytest tests/operators -v -p no:cacheprovider -o addopts="" -rfE --tb=line > $OUT/tests-operators.log 2>&1; echo "rc $?"
tail -8 $OUT/tests-operators.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/tests-operators.log | cut -c1-250 | head -80
date -u
