# Run G: decoding on the 13 host cores in worker processes (`jpeg`'s `[processes]` rows), then the
# two benchmarks that ran past their slots in run F, printing progress as they go (stderr kept).
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== jpeg"; timeout 170 python3 -m benchmarks jpeg --repeats 3 > $OUT/jpeg.txt 2>$OUT/jpeg.err; echo "rc $?"
cat $OUT/jpeg.txt | cut -c1-250; tail -c 600 $OUT/jpeg.err
date -u
echo "== augment_chain"; timeout 150 python3 -m benchmarks augment_chain --scale 0.25 --repeats 2 > $OUT/augment_chain.txt 2>$OUT/augment_chain.err; echo "rc $?"
cat $OUT/augment_chain.txt | cut -c1-250; tail -c 800 $OUT/augment_chain.err
date -u
echo "== train_step"; timeout 190 python3 -m benchmarks train_step --scale 0.25 --repeats 2 > $OUT/train_step.txt 2>$OUT/train_step.err; echo "rc $?"
cat $OUT/train_step.txt | cut -c1-250; tail -c 800 $OUT/train_step.err
date -u
