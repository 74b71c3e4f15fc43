# Sourced by each run script: installs the test and benchmark dependencies into /tmp/site once per machine.
export PYTHONUNBUFFERED=1
SITE=/tmp/site
if [ ! -f $SITE/.done ]; then
  t0=$(date +%s)
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --no-compile --target $SITE \
    --index-url file:///opt/pypi/simple --find-links .whl-tpu \
    flax optax orbax-checkpoint pillow pyarrow datasets tokenizers scipy tqdm scikit-learn scikit-image \
    opencv-python-headless grain simplejpeg array-record clu mlxtend portpicker psutil tensorboardX safetensors \
    librosa soundfile matplotlib hypothesis ${EXTRA_PIP:-} 2>&1 | tail -5
  touch $SITE/.done
  echo "setup took $(( $(date +%s) - t0 )) s"
elif [ -n "${EXTRA_PIP:-}" ] && [ ! -f "$SITE/.extra-${EXTRA_PIP// /_}" ]; then
  # a warm machine set up by an earlier run: install only what this run adds
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --no-compile --target $SITE \
    --index-url file:///opt/pypi/simple --find-links .whl-tpu $EXTRA_PIP 2>&1 | tail -5
fi
[ -n "${EXTRA_PIP:-}" ] && touch "$SITE/.extra-${EXTRA_PIP// /_}"
# Installed trees carried xz-compressed in .site-tpu/ (fetch_wheels.sh) come ahead of the index's versions.
FIRST=/tmp/site-first
for tarball in .site-tpu/*.tar.xz; do
  [ -f "$tarball" ] || continue
  mark="$FIRST/.$(basename "$tarball")"
  if [ ! -f "$mark" ]; then
    mkdir -p $FIRST && tar -C $FIRST -xJf "$tarball" && touch "$mark"
  fi
  PREPEND=$FIRST:
done
export PYTHONPATH=${PREPEND:-}$PYTHONPATH:$SITE:$PWD
export NUMBA_CACHE_DIR=/tmp/numba-cache
python3 -c "import jax, flax, optax, numpy; print('jax', jax.__version__, 'flax', flax.__version__, 'numpy', numpy.__version__, jax.devices())"
python3 -c "import cv2; print('opencv', cv2.__version__, cv2.__file__)" 2>/dev/null || true
