"""Test environment: CPU only, 8 fake devices for sharding tests, small shapes everywhere."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("USE_TORCH", "0")
os.environ.setdefault("USE_TF", "0")
# The Trainer turns JAX's persistent compilation cache on by default (in ~/.cache); tests that
# check the cache give it a directory of their own.
os.environ.setdefault("DATARAX_COMPILATION_CACHE", "off")
