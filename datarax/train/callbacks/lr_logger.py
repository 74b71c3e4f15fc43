"""LearningRateLogger: adds the learning rate to each step's logged metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from datarax.train.callbacks.base import Callback, StepLogs

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer


def find_learning_rate(optimizer: nnx.Optimizer) -> nnx.Variable | None:
    """The `learning_rate` hyperparameter Variable of an `optax.inject_hyperparams` optimizer."""
    for path, value in nnx.iter_graph(optimizer):
        if isinstance(value, nnx.Variable) and path and path[-1] == "learning_rate" and "hyperparams" in path:
            return value
    return None


class LearningRateLogger(Callback):
    """Puts `learning_rate` into `logs.metrics`, so `MetricLogger` writes it as `train/learning_rate`.

    With `schedule` (the optax schedule given to the optimizer) the rate of step s is `schedule(s - 1)`,
    evaluated `chunk` steps at a time: a per-step evaluation on the main thread would queue behind the
    running step and stall the host. Without it the optimizer must be built with
    `optax.inject_hyperparams`; the value is then copied on the device every call and read one call
    late with the metrics, when something reads them.
    """

    order = -10  # before MetricLogger writes the logs
    chunk = 4096

    def __init__(self, schedule: Callable[[Any], Any] | None = None):
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be an optax schedule (callable on the step count), got {schedule!r:.80}")
        self.schedule = schedule
        self._variable = None
        self._pending = None
        self._table_start, self._table = 0, np.zeros((0,))

    def on_train_begin(self, trainer: Trainer) -> None:
        self._pending = None
        if self.schedule is not None:
            self._scheduled(trainer.step)  # evaluate the first chunk before any step is in flight
        else:
            self._variable = find_learning_rate(trainer.optimizer)
            if self._variable is None:
                raise ValueError("LearningRateLogger found no learning_rate in the optimizer state; pass "
                                 "schedule=<the optax schedule>, or build the optimizer with "
                                 "optax.inject_hyperparams(optax.adam)(learning_rate=...)")

    def _scheduled(self, count: int) -> float:
        offset = count - self._table_start
        if not 0 <= offset < len(self._table):
            counts = np.arange(count, count + self.chunk)
            values = np.asarray(jax.device_get(self.schedule(counts)), np.float64)
            self._table_start, self._table = count, np.broadcast_to(values, counts.shape)
            offset = 0
        return float(self._table[offset])

    def _value(self, step: int) -> Any:
        """The rate of `step`: a float, or a device scalar that the metrics read with the rest."""
        if self.schedule is not None:
            return self._scheduled(step - 1)
        pending, self._pending = self._pending, None
        return pending

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.metrics_step is not None:
            value = self._value(logs.metrics_step)
            if value is not None:
                logs.metrics["learning_rate"] = value
        if self.schedule is None:
            # A copy: the next step donates (deletes) the optimizer's own array.
            self._pending = jax.device_put(self._variable.get_value(), may_alias=False)

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.metrics_step is not None:
            value = self._value(logs.metrics_step)
            if value is not None:
                logs.metrics["learning_rate"] = float(value)
