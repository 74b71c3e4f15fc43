"""ProgressBar: a tqdm bar on a terminal, periodic plain lines anywhere else.

On a terminal the bar redraws in place, so anything else printed meanwhile must go through the
bar's writer: the trainer's `ConsoleWriter` does (`datarax.monitoring.writers.write_line`), and
while the bar is shown Python warnings and the `datarax` and root loggers' console handlers are
routed through it too. Piped into a file or `tee`, a bar prints nothing readable until the end;
there the callback writes one plain line every `every_secs` seconds (or `every_steps` steps):

    step 120/1000 (12%) | 1,234 el/s | loss 0.4123 | 0:01:02 elapsed | eta 0:08:10
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datarax.core.checks import check_choice
from datarax.monitoring.writers import write_line
from datarax.train.callbacks.base import Callback, Schedule, StepLogs

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

MODES = ("auto", "bar", "lines")


def _clock_text(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@contextlib.contextmanager
def _through_bar(file: Any):
    """Routes warnings and console log records through tqdm's writer while a bar is drawn."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file_=None, line=None):
        write_line(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"), file)

    warnings.showwarning = showwarning
    try:
        with logging_redirect_tqdm(loggers=[logging.root, logging.getLogger("datarax")]):
            yield
    finally:
        warnings.showwarning = shown


class ProgressBar(Callback):
    """Shows progress from the resumed step to the target: a tqdm bar on a terminal, plain lines elsewhere.

    Throughput (el/s) is host-side: the elements of the last `window` calls over the wall time they
    took. The metric is read from the device only when it is shown (once per bar redraw, tqdm's
    `mininterval`, or per plain line), so the host runs ahead between reads.

    Args:
        window: calls (steps, or K steps each with `steps_per_execution=K`) averaged for el/s.
        metric: the train metric shown beside it (one call late, like all metrics).
        mode: "bar" (tqdm), "lines" (plain periodic lines) or "auto" (default): a bar on a terminal.
        every_secs / every_steps: how often a plain line is written in "lines" mode (default every
            30 s); the first step and the end always get one.
        file: where to write (default stderr).
        clock: seconds for the lines' schedule and elapsed time (`time.monotonic`).
        **tqdm_kwargs: passed to `tqdm.tqdm` in "bar" mode (e.g. `disable=True`).

    Example:
        >>> bar = ProgressBar()                                  # a bar, or lines when piped
        >>> lines = ProgressBar(mode="lines", every_steps=100)   # a plain line every 100 steps
    """

    order = 20

    def __init__(self, *, window: int = 50, metric: str = "loss", mode: str = "auto", every_secs: float | None = None,
                 every_steps: int | None = None, file: Any = None, clock: Callable[[], float] = time.monotonic,
                 **tqdm_kwargs: Any):
        check_choice(mode, "ProgressBar mode", MODES)
        self.file = tqdm_kwargs.pop("file", None) if file is None else file
        self._tqdm = None
        if mode != "lines":
            try:
                import tqdm

                self._tqdm = tqdm.tqdm
            except ImportError as exc:
                if mode == "bar":
                    raise ImportError("ProgressBar(mode='bar') needs tqdm: pip install tqdm") from exc
        if every_secs is None and every_steps is None:
            every_secs = 30.0
        self.schedule = Schedule(every_steps=every_steps, every_secs=every_secs)
        self.mode = mode
        self.window = window
        self.metric = metric
        self.clock = clock
        self.tqdm_kwargs = {"dynamic_ncols": True, "mininterval": 0.5, **tqdm_kwargs}
        self.bar = None
        self._redirect: contextlib.ExitStack | None = None
        self._recent: collections.deque = collections.deque(maxlen=window + 1)
        self._began = 0.0
        self._start_step = 0
        self._last_line_step: int | None = None
        self._metric_text: str | None = None  # the bar's metric, refreshed once per redraw interval
        self._metric_read_at = -float("inf")

    @property
    def stream(self) -> Any:
        return sys.stderr if self.file is None else self.file

    def uses_bar(self) -> bool:
        """Whether this run shows a tqdm bar (else plain lines)."""
        if self.mode == "lines" or self._tqdm is None:
            return False
        return self.mode == "bar" or bool(getattr(self.stream, "isatty", lambda: False)())

    def on_train_begin(self, trainer: Trainer) -> None:
        self.close()
        self._recent.clear()
        self._began = self.clock()
        self._start_step = trainer.step
        self._last_line_step = None
        self._metric_text, self._metric_read_at = None, -float("inf")
        self.schedule.reset(trainer.step, now=self._began)
        resumed_from = getattr(trainer, "resumed_from", None)
        if not self.uses_bar():
            note = f" (resumed from the checkpoint at step {resumed_from})" if resumed_from is not None else ""
            target = f"step {trainer.target_step}" if trainer.target_step is not None else \
                f"the start of epoch {trainer.target_epoch}"
            write_line(f"training from step {trainer.step} to {target}{note}; the first step compiles", self.stream)
            return
        self._redirect = contextlib.ExitStack()
        self._redirect.enter_context(_through_bar(self.stream))
        self.bar = self._tqdm(total=trainer.target_step, initial=trainer.step, unit="step", file=self.stream,
                              **self.tqdm_kwargs)
        if resumed_from is not None:
            self.bar.write(f"resumed from the checkpoint at step {resumed_from}", file=self.stream)
        # The first step's dispatch builds and compiles it: say so instead of sitting still.
        self.bar.set_postfix_str("compiling the first step", refresh=True)

    def throughput(self) -> float:
        """Elements per second over the window: the batches after the first, over the time since it."""
        if len(self._recent) < 2:
            return 0.0
        elapsed = self._recent[-1][0] - self._recent[0][0]
        return sum(size for _, size in list(self._recent)[1:]) / max(elapsed, 1e-9)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._recent.append((logs.dispatched_at, logs.batch_size))
        now = self.clock()
        if self.bar is not None:
            postfix = {"el/s": f"{self.throughput():,.0f}"}
            if logs.metrics_step is not None and now - self._metric_read_at >= self.tqdm_kwargs["mininterval"]:
                self._metric_read_at = now
                if self.metric in logs.metrics:
                    self._metric_text = f"{logs.metrics[self.metric]:.4g}"
            if self._metric_text is not None:
                postfix[self.metric] = self._metric_text
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(logs.steps)
            return
        if self.schedule.due(logs.step, now=now) or logs.step - logs.steps == self._start_step:
            self._line(trainer, logs.step, logs.metrics, now)

    def line(self, trainer: Trainer, step: int, metrics: dict[str, float], now: float) -> str:
        """`step 120/1000 (12%) | 1,234 el/s | loss 0.4123 | 0:01:02 elapsed | eta 0:08:10`."""
        target = trainer.target_step
        parts = [f"step {step}/{target} ({100 * step / target:.0f}%)" if target else f"step {step}"]
        if len(self._recent) >= 2:
            parts.append(f"{self.throughput():,.0f} el/s")
        if self.metric in metrics:
            parts.append(f"{self.metric} {metrics[self.metric]:.4g}")
        elapsed = now - self._began
        parts.append(f"{_clock_text(elapsed)} elapsed")
        done = step - self._start_step
        if target and done > 0 and step < target:
            parts.append(f"eta {_clock_text(elapsed / done * (target - step))}")
        return " | ".join(parts)

    def _line(self, trainer: Trainer, step: int, metrics: dict[str, float], now: float) -> None:
        write_line(self.line(trainer, step, metrics, now), self.stream)
        self._last_line_step = step

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self.bar is None and self._last_line_step != trainer.step:
            self._line(trainer, trainer.step, logs.metrics, self.clock())
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            bar.close()
        if self._redirect is not None:
            redirect, self._redirect = self._redirect, None
            redirect.close()
