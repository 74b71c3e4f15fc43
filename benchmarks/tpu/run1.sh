set -u
. benchmarks/tpu/setup.sh
echo "== probe"; timeout 150 python3 benchmarks/tpu/probe.py 2>&1 | tee $OUT/probe.jsonl | grep -v Warning
echo "== tests"; JAX_PLATFORMS=tpu,cpu timeout 250 python3 -m pytest tests/operators tests/core -v -p no:cacheprovider -o addopts="" -rf > $OUT/tests.log 2>&1; tail -40 $OUT/tests.log | cut -c1-300
grep -E "FAILED|ERROR" $OUT/tests.log | cut -c1-200 | head -60
echo "== decode"; timeout 120 python3 benchmarks/tpu/decode_probe.py 2>&1 | tee $OUT/decode.jsonl
timeout 40 python3 benchmarks/tpu/decode_probe.py --with-jax 2>&1 | tee -a $OUT/decode.jsonl
nproc; cat /proc/loadavg; df -h /tmp | tail -1; mount | grep -E " /tmp | / " | head
