"""Writing runs down: one protocol for the console and JSON lines, used by the pipeline monitor,
the trainer and the command line.

A writer has `write_scalars(step, scalars)` (the interface of `clu.metric_writers.MetricWriter`,
so a CLU writer can be passed as is) and, to take a pipeline monitor's reports,
`write_summary(summary)`; `flush()` and `close()` are optional. `ConsoleWriter` prints lines
through `write_line`, which keeps them above a progress bar being drawn; `JsonlWriter` appends
one JSON object a write.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from datarax.monitoring.monitor import format_summary


def write_line(text: str, file: TextIO | None = None) -> None:
    """Prints `text` and a newline to `file` (default stdout) above any progress bar being drawn
    (tqdm's writer: it clears the bar, prints the line and redraws the bar below it)."""
    file = sys.stdout if file is None else file
    try:
        import tqdm
    except ImportError:
        print(text, file=file, flush=True)
        return
    tqdm.tqdm.write(text, file=file)
    file.flush()


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
    """Prints lines to a stream (default stdout), above any progress bar being drawn: a trainer's
    `step 120 | train/loss 0.4123 | ...` and a pipeline monitor's summaries (`format_summary`)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def write_line(self, text: str) -> None:
        write_line(text, self.stream or sys.stdout)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        parts = " | ".join(f"{k} {_format(v)}" for k, v in sorted(scalars.items()))
        self.write_line(f"step {step} | {parts}")

    def write_summary(self, summary: dict) -> None:
        self.write_line(format_summary(summary))

    def flush(self) -> None:
        (self.stream or sys.stdout).flush()

    def close(self) -> None:
        self.flush()


class JsonlWriter:
    """Appends one JSON object per write, with the wall-clock `time`: a trainer's
    `{"step": 120, "time": ..., "train/loss": 0.41, ...}`, a pipeline monitor's summaries.

    The file is opened per write, so a killed run leaves every completed line intact. A resumed
    run appends: steps between the last checkpoint and a crash appear twice, the later line wins.
    """

    def __init__(self, path: Any):
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"JsonlWriter path {str(self.path)!r} is a directory; pass a file path "
                                    "such as 'runs/metrics.jsonl'")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write_record(self, record: Mapping[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(record)) + "\n")

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.write_record({"step": int(step), "time": time.time(), **{k: float(v) for k, v in scalars.items()}})

    def write_summary(self, summary: dict) -> None:
        self.write_record({"time": time.time(), **summary})

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
