# Run I (prepared, not yet run): `train_step` with its progress lines (stderr kept) in a slot long
# enough for the ResNet's compile and the host peers' worker processes, then the vision recipe.
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== train_step"; timeout ${TRAIN_S:-330} python3 -m benchmarks train_step --scale 0.25 --repeats 2 > $OUT/train_step.txt 2>$OUT/train_step.err; echo "rc $?"
cut -c1-300 $OUT/train_step.txt; grep "^train_step:" $OUT/train_step.err
date -u
echo "== vision"; timeout ${VISION_S:-170} python3 -m recipes.vision --seeds 1 --workdir /tmp/vision > $OUT/vision.log 2>&1; echo "rc $?"
grep -v Warn $OUT/vision.log | tail -12 | cut -c1-400
date -u
