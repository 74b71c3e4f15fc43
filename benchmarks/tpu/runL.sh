# Run L (prepared, not yet run; after runs J and K): `cifar` (its user-function datarax row, the
# built-in ops, the limit and the host peers, tf.data among them), `augment_chain` and `overhead`
# at full scale, as run A ran them before the lowering work; then `scan` with its Trainer rows.
set -u
EXTRA_PIP=tensorflow-cpu . benchmarks/tpu/setup.sh
date -u
echo "== bench"; timeout ${BENCH_S:-420} python3 -m benchmarks cifar augment_chain overhead --repeats 3 --json --no-progress > $OUT/bench.jsonl 2> $OUT/bench.err; echo "rc $?"
cut -c1-600 $OUT/bench.jsonl; tail -5 $OUT/bench.err | cut -c1-300
date -u
echo "== scan"; timeout ${SCAN_S:-90} python3 -m benchmarks scan --repeats 3 --json --no-progress > $OUT/scan.jsonl 2> $OUT/scan.err; echo "rc $?"
cut -c1-600 $OUT/scan.jsonl
date -u
