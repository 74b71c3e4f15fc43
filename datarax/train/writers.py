"""Metric writers: console, JSON lines, TensorBoard, and any CLU-style `MetricWriter`.

A writer is anything with `write_scalars(step, scalars)` (and optionally `flush()`/`close()`),
the interface of `clu.metric_writers.MetricWriter`, so a CLU writer can be passed as is.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from datarax.cli.progress import write_line


@runtime_checkable
class MetricWriter(Protocol):
    """The writer interface (CLU's `MetricWriter.write_scalars`)."""

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None: ...


def check_writer(writer: Any, where: str) -> MetricWriter:
    if not callable(getattr(writer, "write_scalars", None)):
        raise TypeError(f"{where} must have write_scalars(step, scalars) (a trainers writer or a CLU "
                        f"MetricWriter), got {type(writer).__name__}: {writer!r:.80}")
    return writer


def _format(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ConsoleWriter:
    """Prints `step 120 | train/loss 0.4123 | ...` lines (to stdout by default), above a progress bar."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        parts = " | ".join(f"{k} {_format(v)}" for k, v in sorted(scalars.items()))
        # Through tqdm's writer: on a terminal with a ProgressBar the line goes above the bar, not into it.
        write_line(f"step {step} | {parts}", self.stream or sys.stdout)

    def flush(self) -> None:
        (self.stream or sys.stdout).flush()

    def close(self) -> None:
        self.flush()


class JsonlWriter:
    """Appends one JSON object per write: `{"step": 120, "time": ..., "train/loss": 0.41, ...}`.

    The file is opened per write, so a killed run leaves every completed line intact. A resumed
    run appends: steps between the last checkpoint and a crash appear twice, the later line wins.
    """

    def __init__(self, path: Any):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        record = {"step": int(step), "time": time.time(), **{k: float(v) for k, v in scalars.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _summary_writer_class():
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    raise ImportError("TensorBoardWriter needs a TensorBoard event writer: pip install tensorboardX "
                      "(torch.utils.tensorboard also works)")


def tensorboard_available() -> bool:
    """Whether an event writer package is installed (checked without importing it: torch is slow to import)."""
    def found(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return found("tensorboardX") or (found("torch") and found("tensorboard"))


class TensorBoardWriter:
    """Writes scalars as TensorBoard events into `logdir` (tensorboardX or torch.utils.tensorboard)."""

    def __init__(self, logdir: Any):
        self._writer = _summary_writer_class()(str(logdir))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, float(value), int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
