# Run C: the user-function probe, then the TPU test command's core and pipeline half.
set -u
. benchmarks/tpu/setup.sh
python3 -c "import soundfile; print('soundfile', soundfile.__version__, soundfile.__libsndfile_version__)" 2>&1 | tail -1
date -u
echo "== userfn probe"; timeout 150 python3 benchmarks/tpu/userfn_probe.py 2>&1 | grep -v Warn | tee $OUT/userfn.jsonl
date -u
echo "== tests core pipeline"; JAX_PLATFORMS=tpu,cpu timeout ${TEST_S:-330} python3 -m pytest tests/core tests/pipeline -q -p no:cacheprovider -o addopts="" -rfE --tb=short > $OUT/tests-core-pipeline.log 2>&1; echo "rc $?"
tail -5 $OUT/tests-core-pipeline.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/tests-core-pipeline.log | cut -c1-250 | head -60
date -u
