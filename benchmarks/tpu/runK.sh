# Run K (prepared, not yet run; after run J): where `datarax[processes]` loses to
# `decode_limit[processes]` on the 13 cores (worker counts, the reader's split with DeviceCopies),
# then `jpeg` itself, then `train_step` with its progress lines.
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== decode workers"; timeout ${WORKERS_S:-150} python3 benchmarks/tpu/decode_workers.py --repeats 2 > $OUT/workers.txt 2>$OUT/workers.err; echo "rc $?"
cut -c1-400 $OUT/workers.txt; tail -3 $OUT/workers.err | cut -c1-300
date -u
echo "== jpeg"; timeout ${JPEG_S:-130} python3 -m benchmarks jpeg --repeats 2 > $OUT/jpeg.txt 2>$OUT/jpeg.err; echo "rc $?"
cut -c1-300 $OUT/jpeg.txt
date -u
echo "== train_step"; timeout ${TRAIN_S:-270} python3 -m benchmarks train_step --scale 0.25 --repeats 2 > $OUT/train_step.txt 2>$OUT/train_step.err; echo "rc $?"
cut -c1-300 $OUT/train_step.txt; grep "^train_step:" $OUT/train_step.err
date -u
