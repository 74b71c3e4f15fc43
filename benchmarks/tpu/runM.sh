# Run M: the tests that failed in run J (backend-aware now), the full vision recipe at its new 300
# steps a call, `train_step` with the datarax rounds first and each host peer on its own (its
# loader stopped after it), then `cifar` (the user-function row, the built-in ops, the limit and
# the host peers with tf.data) at a quarter of the records. Each part writes its log to $OUT as
# it goes, so a part cut by its time limit still reports.
set -u
EXTRA_PIP=tensorflow-cpu . benchmarks/tpu/setup.sh
date -u
echo "== tests"; JAX_PLATFORMS=tpu,cpu timeout ${TEST_S:-60} python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  -rfE --tb=short tests/control/test_device_copies.py tests/train/loop/test_fused.py > $OUT/tests.log 2>&1; echo "rc $?"
tail -3 $OUT/tests.log | cut -c1-300; grep -E "^(FAILED|ERROR|E )" $OUT/tests.log | cut -c1-250 | head -20
date -u
echo "== vision"; timeout ${VISION_S:-90} python3 -m recipes.vision --seeds 1 --workdir /tmp/vision > $OUT/vision.log 2>&1; echo "rc $?"
grep -v Warn $OUT/vision.log | tail -6 | cut -c1-500
cp /tmp/vision/seed0-augmented/goodput.json $OUT/ 2>/dev/null
date -u
echo "== train_step"; timeout ${TRAIN_S:-200} python3 -m benchmarks train_step --scale 0.25 --repeats 2 > $OUT/train_step.txt 2>$OUT/train_step.err; echo "rc $?"
cut -c1-400 $OUT/train_step.txt; grep "^train_step:" $OUT/train_step.err
date -u
echo "== cifar"; timeout ${CIFAR_S:-150} python3 -m benchmarks cifar --scale 0.25 --repeats 2 > $OUT/cifar.txt 2>$OUT/cifar.err; echo "rc $?"
cut -c1-400 $OUT/cifar.txt; tail -3 $OUT/cifar.err | cut -c1-300
date -u
