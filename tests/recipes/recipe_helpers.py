"""Runs a recipe's --quick mode in a subprocess, as a user would, and reads its result.json."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 400  # --quick takes well under a minute on 2 idle cores; the margin is for loaded CI machines


def environment() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", HF_DATASETS_OFFLINE="1")
    env.pop("XLA_FLAGS", None)  # one CPU device is all a recipe needs; --quick sets its own compile flag
    return env


def run_recipe(name: str, workdir: Path, *args: str) -> tuple[dict, str]:
    """`python -m recipes.<name> --quick --workdir <workdir> *args`; returns (result.json, stdout)."""
    command = [sys.executable, "-m", f"recipes.{name}", "--quick", "--workdir", str(workdir), *args]
    proc = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    path = workdir / "result.json"
    assert path.is_file(), f"{path} was not written:\n{proc.stdout[-2000:]}"
    return json.loads(path.read_text()), proc.stdout


def assert_finite_metrics(result: dict) -> dict:
    metrics = result["metrics"]
    assert metrics, "result.json has no metrics"
    for key, value in metrics.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), f"metric {key} = {value!r}"
    return metrics


def assert_plot(result: dict) -> None:
    assert result["plot"] and Path(result["plot"]).stat().st_size > 1000, f"no plot: {result['plot']!r}"
