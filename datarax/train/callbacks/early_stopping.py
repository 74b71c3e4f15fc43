"""EarlyStopping: stops training when a monitored metric stops improving."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from datarax.core.checks import check_int, is_number
from datarax.train.callbacks.base import Callback, StepLogs

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer


class EarlyStopping(Callback):
    """Requests a stop after `patience` checks without an improvement of `monitor`.

    Checked after every evaluation (`eval/<name>`) or on every call's metrics (`train/<name>`, which
    reads them from the device every call). The best value and the wait count travel in checkpoints,
    so a resumed run stops where an uninterrupted one would.

    Args:
        monitor: the metric, e.g. "eval/loss" or "train/accuracy".
        mode: "min" (lower is better) or "max".
        patience: checks without improvement before stopping.
        min_delta: the smallest change that counts as an improvement.
    """

    order = 5

    def __init__(self, monitor: str = "eval/loss", *, mode: str = "min", patience: int = 3, min_delta: float = 0.0):
        if not isinstance(monitor, str) or not monitor.startswith(("eval/", "train/")) or monitor.endswith("/"):
            raise ValueError(f"monitor must be 'eval/<metric>' or 'train/<metric>', got {monitor!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        check_int(patience, "patience", 1)
        if not is_number(min_delta) or min_delta < 0:
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        self.monitor = monitor
        self.kind, self.name = monitor.split("/", 1)
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_at: int | None = None

    def _check(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        if self.name not in metrics:
            raise KeyError(f"EarlyStopping monitors {self.monitor!r} but the {self.kind} metrics are "
                           f"{sorted(metrics)}; pass monitor='{self.kind}/<one of those>'")
        value = metrics[self.name]
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_at = step
            trainer.request_stop(f"early_stopping: {self.monitor} did not improve on {self.best:.6g} "
                                 f"for {self.patience} checks")

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self.kind == "train" and logs.metrics_step is not None and logs.metrics:
            self._check(trainer, logs.metrics_step, logs.metrics)

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        if self.kind == "eval":
            self._check(trainer, step, metrics)

    def get_state(self) -> dict:
        return {"best": self.best if math.isfinite(self.best) else None, "wait": self.wait}

    def set_state(self, state: dict) -> None:
        best = state.get("best")
        self.best = (math.inf if self.mode == "min" else -math.inf) if best is None else float(best)
        self.wait = int(state.get("wait", 0))
