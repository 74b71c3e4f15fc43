"""Profiler: a `jax.profiler` trace of training steps N..M, with the input pipeline's spans named.

Three kinds of named spans (`jax.profiler.TraceAnnotation`) are always in the code, at about half
a microsecond each when no trace is active:

    datarax/next               the trainer's next(iterator): how long the step waited for data
    datarax/step               dispatching the compiled train step (compiling it, the first time)
    datarax/host_stage/<name>  one host stage on one batch, on the pipeline's background reader
                               thread (<name> is the stage's label: DecodeImage, Tokenize#1)

In the trace viewer (TensorBoard's profile plugin, xprof, or ui.perfetto.dev for the
`perfetto_trace.json.gz` written with `create_perfetto_trace=True`) the main thread shows
`datarax/next` and `datarax/step` alternating and the host stages sit on the reader thread. A long
`datarax/next` while the reader is busy in a host stage means the step waits for decoding; a
short one means the input keeps up, and the device rows show where the step's time goes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax

from datarax.core.checks import is_int
from datarax.core.construct import resolve_config
from datarax.train.callbacks.base import Callback, StepLogs

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

NEXT = "datarax/next"
STEP = "datarax/step"
HOST_STAGE = "datarax/host_stage/"  # + the stage's label


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    """What `Profiler` traces and where it writes.

    Attributes:
        log_dir: the trace goes to `<log_dir>/plugins/profile/<timestamp>/` (`jax.profiler`'s
            layout, which TensorBoard and xprof read).
        start_step: the first step traced (1-based, as `trainer.step` counts), from its
            `next(iterator)` on.
        stop_step: the last step traced; the trace stops when its device work is done.
        create_perfetto_trace: also write `perfetto_trace.json.gz` (opens in ui.perfetto.dev).
    """

    log_dir: str
    start_step: int
    stop_step: int
    create_perfetto_trace: bool = False

    def __post_init__(self):
        if not isinstance(self.log_dir, (str, os.PathLike)) or not str(self.log_dir):
            raise ValueError(f"ProfilerConfig.log_dir must be a directory path, got {self.log_dir!r}")
        if not is_int(self.start_step) or self.start_step < 1:
            raise ValueError(f"ProfilerConfig.start_step must be an integer >= 1 (steps count from 1), "
                             f"got {self.start_step!r}")
        if not is_int(self.stop_step) or self.stop_step < self.start_step:
            raise ValueError(f"ProfilerConfig.stop_step must be an integer >= start_step = {self.start_step!r}, "
                             f"got {self.stop_step!r}; to trace one step give stop_step = start_step")
        if not isinstance(self.create_perfetto_trace, bool):
            raise ValueError(f"ProfilerConfig.create_perfetto_trace must be True or False, "
                             f"got {self.create_perfetto_trace!r}")


class Profiler(Callback):
    """Captures one `jax.profiler` trace of steps `start_step` to `stop_step` (whole calls with `steps_per_execution`).

    The trace starts before step `start_step` asks for its batch and stops once `stop_step` has
    finished on the device (the one place this callback waits for it). A run that resumes inside
    the window traces from the step it resumes at; one that resumes past it, or ends before
    `start_step`, traces nothing. Only one trace can run in a process at a time. Settings: those of
    `ProfilerConfig`, as a config or as keywords.

    Attributes:
        trace_dir: the folder the trace was written to, once it has stopped (else None).

    Example:
        >>> profiler = Profiler(log_dir="runs/exp1/profile", start_step=10, stop_step=12)
        >>> profiler.config.stop_step
        12
    """

    config_class = ProfilerConfig
    order = -100  # the trace starts before other callbacks act on the first traced step

    def __init__(self, config: ProfilerConfig | None = None, **settings: Any):
        self.config = resolve_config(ProfilerConfig, config, settings, "Profiler")
        self.trace_dir: str | None = None
        self._active = False
        self._before: set[str] = set()

    def event_order(self, event: str) -> int:
        # Stop the trace after every other callback has handled the last traced step.
        return 100 if event in ("on_step_end", "on_train_end") else self.order

    def _profile_root(self) -> str:
        return os.path.join(os.fspath(self.config.log_dir), "plugins", "profile")

    def _listing(self) -> set[str]:
        root = self._profile_root()
        return set(os.listdir(root)) if os.path.isdir(root) else set()

    def on_data_wait_begin(self, trainer: Trainer, step: int) -> None:
        cfg = self.config
        # A call of steps_per_execution steps begins at `step`; trace it when it reaches start_step.
        last = step + getattr(trainer, "steps_per_execution", 1) - 1
        if self._active or self.trace_dir is not None or last < cfg.start_step or step > cfg.stop_step:
            return
        self._before = self._listing()
        try:
            jax.profiler.start_trace(os.fspath(cfg.log_dir), create_perfetto_trace=cfg.create_perfetto_trace)
        except RuntimeError as exc:
            raise RuntimeError(f"Profiler could not start a trace at step {step}: {exc}; only one jax.profiler "
                               "trace can run at a time, so stop the other one (or drop one Profiler)") from exc
        self._active = True

    def _stop(self) -> None:
        self._active = False
        jax.profiler.stop_trace()
        new = sorted(self._listing() - self._before)
        self.trace_dir = os.path.join(self._profile_root(), new[-1]) if new else None

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self._active and logs.step >= self.config.stop_step:
            jax.block_until_ready(logs.output)  # the last step's device work belongs in the trace
            self._stop()

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self._active:
            self._stop()

    def close(self) -> None:
        if self._active:
            self._stop()
