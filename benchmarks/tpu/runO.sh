# Run O (prepared, not yet run): the TPU test command as one process. Cold it took about 11
# minutes on the chip (runs D and E), past the lent machine's 10 minutes a command; since then
# the operator tests that ran op by op run jitted, which took the command's compiles on the CPU
# from 4,258 to 2,430 and its time there from 448 s to 286 s (docs/tpu.md), so first try it cold:
#   bash benchmarks/tpu/runO.sh                  (PART=all: the documented command, one process)
# and, if it runs out of time, fill one persistent compilation cache on the machine in two
# commands, then run it again in one process with that cache (DATARAX_TEST_JAX_CACHE):
#   PART=operators bash benchmarks/tpu/runO.sh
#   PART=rest bash benchmarks/tpu/runO.sh
#   bash benchmarks/tpu/runO.sh
# `JPEG_S=130` re-runs `jpeg` after PART=all (its work ratio now measured with OpenCV on one
# thread, as a worker runs it).
set -u
. benchmarks/tpu/setup.sh
export DATARAX_TEST_JAX_CACHE=/tmp/datarax-tpu-test-cache JAX_PLATFORMS=tpu,cpu
mkdir -p $DATARAX_TEST_JAX_CACHE
REST="tests/core tests/pipeline tests/control/test_device_copies.py tests/train/loop/test_fused.py"
case ${PART:-all} in
  operators) TESTS="tests/operators" ;;
  rest) TESTS="$REST" ;;
  *) TESTS="tests/operators $REST" ;;
esac
date -u
echo "== tests ($TESTS; cache $(du -sh $DATARAX_TEST_JAX_CACHE | cut -f1))"
t0=$(date +%s)
timeout ${TEST_S:-560} python3 -m pytest $TESTS -p no:xdist -q -p no:cacheprovider -o addopts="" -rfE \
  --tb=short --durations=40 > $OUT/tests-${PART:-all}.log 2>&1; echo "rc $? in $(( $(date +%s) - t0 )) s"
tail -2 $OUT/tests-${PART:-all}.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/tests-${PART:-all}.log | cut -c1-250
grep -A20 "slowest 40" $OUT/tests-${PART:-all}.log | cut -c1-200
date -u
if [ "${PART:-all}" = all ] && [ -n "${JPEG_S:-}" ]; then
  echo "== jpeg"; timeout $JPEG_S python3 -m benchmarks jpeg --repeats 2 > $OUT/jpeg.txt 2>$OUT/jpeg.err; echo "rc $?"
  cut -c1-300 $OUT/jpeg.txt
fi
