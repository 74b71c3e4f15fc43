# Run J (prepared, not yet run): first the tests over what changed on the host and device paths
# since the chip last ran them (DeviceCopies under the reader, the Trainer's FusedSteps), then the
# full vision recipe (one seed) with the pipeline inside each 60-step call and checkpoints by time.
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== tests"; JAX_PLATFORMS=tpu,cpu timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  -rfE --tb=short --durations=30 tests/control/test_device_copies.py tests/train/loop/test_fused.py \
  tests/core tests/pipeline > $OUT/tests.log 2>&1; echo "rc $?"
tail -3 $OUT/tests.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-250; grep -A12 "slowest 30" $OUT/tests.log | cut -c1-200
date -u
echo "== vision"; timeout ${VISION_S:-190} python3 -m recipes.vision --seeds 1 --workdir /tmp/vision > $OUT/vision.log 2>&1; echo "rc $?"
grep -v Warn $OUT/vision.log | tail -12 | cut -c1-400
cp /tmp/vision/seed0-augmented/goodput.json $OUT/ 2>/dev/null
echo "== busy probe"; timeout ${PROBE_S:-50} python3 benchmarks/tpu/busy_probe.py --runs 1; echo "rc $?"
date -u
