# Run here (not on the TPU machine): downloads into .whl-tpu/ (git-ignored) the cp311 wheels the TPU
# machine's package index lacks; every run script then needs `carry: [".whl-tpu"]`.
# WITH_OPENCV=1 also builds .site-tpu/ (see the end).
set -eu
pip download -q --only-binary=:all: --no-deps --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl-tpu \
  grain portpicker psutil array-record simplejpeg clu mlxtend scikit-image lazy_loader soundfile
ls .whl-tpu

# OpenCV: the machine's index has 5.0.0, whose warpAffine (DecodeImage's resampling) is several
# times slower than 5.1's, which pip gives users. Its wheel (64 MB) does not travel beside the
# others (a run carries at most 64 MiB), so it travels installed and xz-compressed (41 MB) in
# .site-tpu/ (git-ignored), which setup.sh unpacks ahead of the index's version: a run that needs
# it carries [".whl-tpu", ".site-tpu"].
if [ "${WITH_OPENCV:-}" = 1 ]; then
  tmp=$(mktemp -d)
  pip install -q --no-deps --only-binary=:all: --target "$tmp" "opencv-python-headless==5.1.0.95"
  mkdir -p .site-tpu
  tar -C "$tmp" -cf - . | xz -T0 -9e > .site-tpu/opencv-python-headless-5.1.0.95.tar.xz
  rm -rf "$tmp"
  ls -la .site-tpu
fi
