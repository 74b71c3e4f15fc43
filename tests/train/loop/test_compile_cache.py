"""JAX's persistent compilation cache: a second process loads what the first compiled (no new entries)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from toml_jobs import write_job
from xla_flags import one_device_env

from datarax.train.loop.compile_cache import default_cache_dir

REPO = Path(__file__).resolve().parents[3]

CHILD = """
import sys
import jax
import optax
from flax import nnx
sys.path.insert(0, {helpers!r})
from trainer_helpers import loss_fn, points
from datarax import Pipeline
from datarax.sources import MemorySource
from datarax.train import Trainer

mode, width = sys.argv[1], int(sys.argv[2])
if mode == "user":  # the user configured JAX's cache themselves: the trainer keeps it
    jax.config.update("jax_compilation_cache_dir", sys.argv[3])
setting = True if mode in ("default", "user") else sys.argv[3]
pipeline = Pipeline(MemorySource(shuffle=True, data=points(32)), batch_size=8)
model = nnx.Linear(4, width, rngs=nnx.Rngs(0))
def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"] % width).mean()

trainer = Trainer(model, optax.sgd(0.1), pipeline, loss, compilation_cache=setting)
trainer.fit(num_steps=3)
print(trainer.compilation_cache_dir)
"""


def environment(**extra: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    one_device_env(env)  # one CPU device, compiled as the suite compiles
    env.pop("DATARAX_COMPILATION_CACHE", None)
    env.update(extra)
    return env


def run_child(script: Path, *args: str, **env: str) -> str:
    done = subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=environment(**env),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def entries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


@pytest.fixture
def child(tmp_path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(helpers=str(Path(__file__).resolve().parents[2])))
    return script


def test_a_second_process_reads_the_cache_instead_of_compiling(tmp_path, child):
    """A second process with the same program and cache directory loads every program (no new
    entries); the directory comes from `compilation_cache=path` or from $DATARAX_COMPILATION_CACHE
    (the second process is the variable's test: one process doing the work of two)."""
    cache = tmp_path / "cache"
    assert run_child(child, "path", "3", str(cache)) == str(cache)
    first = entries(cache)
    assert any(name.startswith("jit_step-") for name in first)  # the train step itself is cached
    assert run_child(child, "default", "3", DATARAX_COMPILATION_CACHE=str(cache)) == str(cache)
    assert entries(cache) == first  # every program was found in the cache: none was written again
    run_child(child, "path", "5", str(cache))  # the control: another model is compiled and written
    assert len(entries(cache) - first) > 0


def test_the_default_directory_and_the_users_own(tmp_path, child):
    """With neither a path nor the variable the cache is $XDG_CACHE_HOME/datarax/jax; the variable
    set to "off" turns it off; a directory the user gave JAX is kept (the variable's directory:
    test_a_second_process_reads_the_cache_instead_of_compiling)."""
    xdg = tmp_path / "xdg"
    assert run_child(child, "default", "3", XDG_CACHE_HOME=str(xdg)) == str(xdg / "datarax" / "jax")
    assert entries(xdg / "datarax" / "jax")
    assert run_child(child, "default", "3", DATARAX_COMPILATION_CACHE="off") == "None"
    mine, before = tmp_path / "mine", entries(xdg / "datarax" / "jax")
    assert run_child(child, "user", "5", str(mine), XDG_CACHE_HOME=str(xdg)) == str(mine)
    assert entries(xdg / "datarax" / "jax") == before  # the user's choice stood (with JAX's own thresholds)


@pytest.mark.parametrize("value, fallback, expected", [
    ("off", None, None), ("0", "/runs/a/jax_cache", None), ("/tmp/c", "/runs/a/jax_cache", "/tmp/c"),
    ("", "/runs/a/jax_cache", "/runs/a/jax_cache"),
])
def test_default_cache_dir(monkeypatch, value, fallback, expected):
    monkeypatch.setenv("DATARAX_COMPILATION_CACHE", value)
    got = default_cache_dir(fallback)
    assert (None if got is None else str(got)) == expected


def test_datarax_train_keeps_the_cache_in_the_run_directory_and_prints_progress_when_piped(tmp_path):
    write_job(tmp_path)  # run.toml: 4 steps of a linear regression, its helpers beside it
    command = [sys.executable, "-m", "datarax.cli.main", "train", "run.toml"]
    env = environment(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    cache = tmp_path / "runs" / "run" / "jax_cache"
    written = entries(cache)
    assert any(name.startswith("jit_step-") for name in written)
    # stderr is a pipe here: plain progress lines, not a bar, and not silence until the end.
    lines = first.stderr.splitlines()
    assert "training from step 0 to step 4; the first step compiles" in lines
    assert any(line.startswith("step 1/4 (25%) | ") for line in lines)
    assert any(line.startswith("step 4/4 (100%) | ") for line in lines)
    assert "\r" not in first.stderr
    again = subprocess.run([*command, "--set", "trainer.run_dir=runs/other"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert entries(tmp_path / "runs" / "other" / "jax_cache")  # a fresh run directory gets its own cache
    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert entries(cache) == written  # the rerun loaded every program from the run's cache


@pytest.fixture
def no_persistent_cache():
    """JAX with no persistent cache for one test (the suite's conftest gives each test process one)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", before)
    compilation_cache.reset_cache()


def write_config_job(folder: Path, module: str, in_factory: str = "pass") -> str:
    """Writes `folder/<module>.py` (data, a linear model whose factory first runs `in_factory`, an MSE loss,
    and a list `seen`) and returns a one-step job's TOML over it, its `[trainer]` table last."""
    (folder / f"{module}.py").write_text(textwrap.dedent(f"""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from flax import nnx

        seen = []

        def make_data():
            return {{"x": np.ones((16, 4), np.float32), "y": np.zeros(16, np.float32)}}

        def make_model(rngs):
            {in_factory}
            return nnx.Linear(4, 1, rngs=rngs)

        def mse(model, batch):
            return jnp.mean((model(batch["x"])[:, 0] - batch["y"]) ** 2)
    """))
    return textwrap.dedent(f"""
        allow = ["{module}"]
        batch_size = 8
        [source.memory]
        data = "{module}:make_data"
        shuffle = true
        [trainer]
        model = "{module}:make_model"
        loss = "{module}:mse"
        optimizer = {{ sgd = {{ learning_rate = 0.1 }} }}
        steps = 1
    """)


def test_the_trainer_table_switches_the_cache_off_and_names_a_bad_value(tmp_path, no_persistent_cache):
    from datarax.config import ConfigError, load_spec
    from datarax.train import build_trainer

    base = write_config_job(tmp_path, "cc_helpers")
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "off.toml").write_text(base + "compilation_cache = false\n")
        run = build_trainer(load_spec(tmp_path / "off.toml"))
        assert run.trainer.compilation_cache_dir is None  # JAX left alone (no cache in this test process)
        (tmp_path / "bad.toml").write_text(base + "compilation_cache = 3\n")
        with pytest.raises(ConfigError, match=r"trainer\.compilation_cache"):
            load_spec(tmp_path / "bad.toml")
    finally:
        sys.path.remove(str(tmp_path))


def test_the_cache_is_on_before_the_model_is_built(tmp_path, no_persistent_cache):
    # The model's initializers run op by op, each a small program: a rerun (a resume) loads them.
    from datarax.config import load_spec
    from datarax.train import build_trainer

    # The factory notes JAX's cache directory when it runs.
    base = write_config_job(tmp_path, "cc_seen", "seen.append(jax.config.jax_compilation_cache_dir)")
    (tmp_path / "run.toml").write_text(base + 'compilation_cache = "cache"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        run = build_trainer(load_spec(tmp_path / "run.toml"))
        import cc_seen

        assert cc_seen.seen == [str(tmp_path / "cache")] == [run.trainer.compilation_cache_dir]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cc_seen", None)
