# Run here (not on the TPU machine): downloads into .whl-tpu/ (git-ignored) the cp311 wheels the TPU
# machine's package index lacks; every run script then needs `carry: [".whl-tpu"]`.
set -eu
pip download -q --only-binary=:all: --no-deps --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl-tpu \
  grain portpicker psutil array-record simplejpeg clu mlxtend scikit-image lazy_loader soundfile
ls .whl-tpu
