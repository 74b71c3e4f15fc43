# Run H: the tests changed after run D (its four failures, and the both-formulation tests that now
# force the per-record side on every backend), then `jpeg` with the worker processes taking chunks
# off one queue and the next batch started before this one is read, and its one-thread row.
set -u
. benchmarks/tpu/setup.sh
date -u
echo "== changed tests"; JAX_PLATFORMS=tpu,cpu timeout 75 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  --tb=short "tests/operators/test_audio_waveform.py::test_gain_scales_by_db" \
  "tests/operators/test_image_color.py::test_gamma_matches_skimage" \
  "tests/operators/test_image_batched.py::test_a_pipeline_gives_the_same_batches_in_both_formulations" \
  "tests/operators/test_image_batched.py::test_gradients_through_a_learnable_shift_agree" \
  "tests/operators/test_image_batched.py::test_warp_operators_agree_in_both_formulations_and_their_gradients_too" \
  "tests/operators/test_lowering.py::test_user_operators_give_the_same_batches_and_no_gather_in_the_batched_formulation" \
  "tests/operators/test_lowering.py::test_a_user_functions_field_error_reads_the_same_in_the_batched_formulation" \
  > $OUT/tests-changed.log 2>&1; echo "rc $?"
tail -3 $OUT/tests-changed.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/tests-changed.log | cut -c1-250
date -u
echo "== jpeg"; timeout ${JPEG_S:-130} python3 -m benchmarks jpeg --repeats ${REPEATS:-2} > $OUT/jpeg.txt 2>$OUT/jpeg.err; echo "rc $?"
cut -c1-250 $OUT/jpeg.txt; grep -v -i "hugepage\|warnings.warn" $OUT/jpeg.err | tail -5 | cut -c1-300
date -u
