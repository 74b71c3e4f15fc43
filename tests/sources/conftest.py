"""Keeps `datasets` from importing torch/TensorFlow when they happen to be installed (seconds each)."""

import os

os.environ.setdefault("USE_TORCH", "0")
os.environ.setdefault("USE_TF", "0")
