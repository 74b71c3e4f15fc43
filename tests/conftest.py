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

# JAX's persistent compilation cache, one per test process (each xdist worker its own, so no two
# processes write one file), in a temporary directory made for this session and removed after it.
# Many tests compile programs another test already compiled (a new Pipeline, Trainer or jit of the
# same function traces anew): the compiled program is then read back instead of compiled again,
# bitwise the same executable. That takes about a fifth off the suite's CPU time.
# DATARAX_TEST_JAX_CACHE=off leaves JAX's cache alone.
_CACHE_ENV = "DATARAX_TEST_JAX_CACHE"


def pytest_configure(config):
    import tempfile

    if os.environ.get(_CACHE_ENV, "").lower() == "off":
        return
    if not os.environ.get(_CACHE_ENV):  # the main process; xdist's workers inherit the variable
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="datarax-tests-jax-cache-")
        config._datarax_jax_cache = os.environ[_CACHE_ENV]
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None and getattr(config.option, "numprocesses", None):
        return  # xdist's controller runs no test
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(os.environ[_CACHE_ENV], worker or "main"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    import shutil

    directory = getattr(config, "_datarax_jax_cache", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(_CACHE_ENV, None)
