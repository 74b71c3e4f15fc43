"""examples/train_demo.py, killed with SIGKILL at random points and rerun, ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY, DELAY_MS = 80, 10, 20
ARGS = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--batch-size", "16", "--num-records", "320",
        "--input-delay-ms", str(DELAY_MS), "--log-every", "1000", "--no-progress", "--no-plot"]
TIMEOUT = 300
DEMO = REPO / "examples" / "train_demo.py"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One compilation cache for every run: only the first run compiles."""
    return tmp_path_factory.mktemp("jax_cache")


def demo_command(workdir: Path, cache: Path) -> list[str]:
    return [sys.executable, str(DEMO), "--workdir", str(workdir), *ARGS, "--compile-cache", str(cache)]


def environment() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # one CPU device is all the demo needs
    return env


def run_to_end(workdir: Path, log: Path, cache: Path) -> dict:
    with open(log, "a") as out:
        subprocess.run(demo_command(workdir, cache), cwd=REPO, env=environment(), stdout=out, stderr=subprocess.STDOUT,
                       timeout=TIMEOUT, check=True)
    return json.loads((workdir / "result.json").read_text())


def checkpoint_steps(workdir: Path) -> set[int]:
    directory = workdir / "checkpoints"
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.exists() else set()


def start_and_wait_for_a_new_checkpoint(workdir: Path, log: Path, cache: Path) -> tuple[subprocess.Popen, int]:
    """Starts the demo and returns once it has written a checkpoint of its own (or exited)."""
    before = checkpoint_steps(workdir)
    out = open(log, "a")
    proc = subprocess.Popen(demo_command(workdir, cache), cwd=REPO, env=environment(), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        new = checkpoint_steps(workdir) - before
        if new:
            return proc, max(new)
        time.sleep(0.01)
    return proc, max(checkpoint_steps(workdir) | {0})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> dict:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    return run_to_end(workdir, workdir / "log.txt", cache)


def test_sigkill_at_three_random_points_then_rerun_is_bitwise_exact(tmp_path, reference, cache):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    log = tmp_path / "log.txt"
    workdir = tmp_path / "run"
    kills = []
    for _ in range(3):
        proc, step = start_and_wait_for_a_new_checkpoint(workdir, log, cache)
        remaining_s = (STEPS - step) * DELAY_MS / 1000
        time.sleep(rng.uniform(0.0, 0.8 * remaining_s))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills.append(step)
        proc.wait(timeout=TIMEOUT)
    result = run_to_end(workdir, log, cache)
    assert len(kills) >= 2, f"the demo finished before most kills ({kills}, seed {seed}); see {log}"
    assert result["step"] == STEPS
    assert result["resumed_from"] is not None
    assert result["params_sha256"] == reference["params_sha256"], f"seed {seed}, kills after {kills}"
    assert result["eval_metrics"] == reference["eval_metrics"]


def test_sigterm_saves_and_exits_zero(tmp_path, cache):
    log = tmp_path / "log.txt"
    proc, _ = start_and_wait_for_a_new_checkpoint(tmp_path, log, cache)
    assert proc.poll() is None, log.read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "stopped by SIGTERM at step" in text
    stopped_at = int(text.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert max(checkpoint_steps(tmp_path)) == stopped_at  # the forced save, whatever the schedule
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--steps", "-1"], "--steps must be >= 0, got -1"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
])
def test_demo_argument_errors(tmp_path, capsys, argv, message):
    main = runpy.run_path(str(DEMO), run_name="train_demo")["main"]
    with pytest.raises(SystemExit):
        main(["--workdir", str(tmp_path), *argv])
    assert message in capsys.readouterr().err
