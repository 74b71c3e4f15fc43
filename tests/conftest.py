"""Test environment: CPU only, 8 fake devices for sharding tests, small shapes everywhere."""

import os

import pytest
from xla_flags import suite_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight CPU devices, and XLA:CPU's LLVM optimisations off: see tests/xla_flags.py.
os.environ.setdefault("XLA_FLAGS", suite_flags())
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("USE_TORCH", "0")
os.environ.setdefault("USE_TF", "0")
# The Trainer turns JAX's persistent compilation cache on by default (in ~/.cache); tests that
# check the cache give it a directory of their own.
os.environ.setdefault("DATARAX_COMPILATION_CACHE", "off")
# A benchmark run appends its rows to benchmarks/results/ (benchmarks/record.py); tests that run one
# must not add rows there, and the tests of the rows name a tmp_path.
os.environ.setdefault("DATARAX_BENCH_RESULTS", "off")

# JAX's persistent compilation cache, one per test process (each xdist worker its own, so no two
# processes write one file), in a temporary directory made for this session and removed after it.
# Many tests compile programs another test already compiled (a new Pipeline, Trainer or jit of the
# same function traces anew): the compiled program is then read back instead of compiled again,
# bitwise the same executable. That takes about a fifth off the suite's CPU time.
# DATARAX_TEST_JAX_CACHE=off leaves JAX's cache alone.
_CACHE_ENV = "DATARAX_TEST_JAX_CACHE"


def pytest_configure(config):
    import tempfile

    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "load" and not any(
            arg.startswith(("--dist", "-d")) for arg in config.invocation_params.args):
        # Under -n with no --dist of the user's: xdist's worksteal scheduler (see SLOW_MODULES below).
        # Set here, not in pyproject's addopts, so that `-p no:xdist` (docs/tpu.md) still parses.
        config.option.dist = "worksteal"
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


# Modules with tests of ten seconds or more (a recipe's --quick run, real SIGKILLs of child
# processes, many child processes) run first: under `python -m pytest -n 2` (xdist's worksteal
# scheduler, set in pytest_configure) the suite then ends on short tests, which the idle worker takes over, so
# both workers finish together instead of one waiting for the other's last long test (by name
# order the suite would end on tests/train/test_demo.py). Whole modules move, in the order
# collected, so a module-scoped fixture is still built once.
SLOW_MODULES = (
    "tests/recipes/test_crepe_finetune.py",
    "tests/recipes/test_learned_preprocessing.py",
    "tests/recipes/test_audio_synthesis.py",
    "tests/recipes/test_text_lm.py",
    "tests/recipes/test_hf_finetune.py",
    "tests/recipes/test_learned_augmentation.py",
    "tests/recipes/test_vision.py",
    "tests/recipes/test_hypergradient.py",
    "tests/train/test_demo.py",
    "tests/docs/test_config_twins.py",
    "tests/train/loop/test_compile_cache.py",
    "tests/train/metrics/test_goodput.py",
    "tests/train/checkpointing/test_trainer_checkpointing.py",
    "tests/train/checkpointing/test_checkpoint_integrity.py",
    "tests/sharding/test_multihost.py",
    "tests/pipeline/test_pipeline.py",
    "tests/control/test_prefetch.py",
    "tests/sources/test_grain_interop.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    first = [item for item in items if item.nodeid.split("::")[0] in rank]
    first.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: each module keeps its order
    items[:] = first + [item for item in items if item.nodeid.split("::")[0] not in rank]
