"""StepGuard: a bad step (non-finite loss or gradient norm, or a loss spike) stops the run or is skipped,
and names its records in an incident."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from datarax.core.errors import DataraxWarning
from datarax.pipeline.replay import ReplayError
from datarax.train.callbacks.base import Callback, StepLogs
from datarax.train.loop.guard import COUNTERS, REASONS, VALUES, StepGuardConfig, reset_guard

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

INCIDENTS = "incidents"
KEPT_CURSORS = 8  # iterator states kept from the newest calls' starts (a stop goes back at most two calls)


class IncidentWarning(DataraxWarning):
    """An incident could not be written in full (the run still stops or skips as configured)."""


class StepGuard(Callback):
    """Guards every training step against a non-finite loss or gradient norm and, with `spike`, a loss
    far above its running median; on a bad step writes an incident and stops, or skips the step.

    The check runs inside the compiled step (`datarax.train.loop.guard`): a bad step's update is
    dropped there, parameters and optimizer state untouched. The host reads each call's verdict one
    call late, as loggers read metrics (and at once before a checkpoint is saved, so none holds a bad
    step). On a bad step N it writes `<directory>/incidents/step-N.json` (with the batch as
    `step-N.npz` and its images as `step-N.png`; `datarax.train.incidents`), rebuilt by
    `Trainer.replay`, then:

    * `action="stop"`: the run stops with the model as after step N - 1 (every step after N was
      held), the trainer's step and data iterator moved back there (`Trainer.rewind`), so the final
      checkpoint is step N - 1's and a resumed run reads step N's batch again;
    * `action="skip"`: training goes on; skipped steps are counted (`skipped`), reported in the
      goodput summary, and `max_consecutive` bad steps in a row stop the run.

    Pass it among the trainer's callbacks (the trainer compiles the check into its step when one is
    there); a configured run (`[trainer]`) has one unless `guard = false`.

    Args:
        directory: the run directory; incidents go into its `incidents/` folder.
        config: a `StepGuardConfig`; or its fields as keyword settings (`action`, `spike`, `window`,
            `warmup`, `max_consecutive`, `images`), which `StepGuardConfig` documents.

    Example:
        >>> guard = StepGuard("runs/exp1", action="skip", spike=10.0)
        >>> guard.config.max_consecutive
        3
    """

    def event_order(self, event: str) -> int:
        # Before the checkpoint callback (-100) saves at a step end or at the end of training.
        return -200 if event in ("on_step_end", "on_train_end") else self.order

    def __init__(self, directory: Any, config: StepGuardConfig | None = None, *, action: str = "stop",
                 spike: float | None = None, window: int = 100, warmup: int = 20, max_consecutive: int = 3,
                 images: bool = True):
        settings = {"action": action, "spike": spike, "window": window, "warmup": warmup,
                    "max_consecutive": max_consecutive, "images": images}
        if config is None:
            config = StepGuardConfig(**settings)
        elif not isinstance(config, StepGuardConfig):
            raise TypeError(f"StepGuard config must be a StepGuardConfig or None, got {type(config).__name__}")
        elif settings != dataclasses.asdict(StepGuardConfig()):
            raise TypeError("StepGuard takes a StepGuardConfig or keyword settings, not both; put the settings in "
                            "the config")
        self.config = config
        self.directory = Path(directory) / INCIDENTS
        self.incidents: list[str] = []
        self.skipped: list[int] = []  # the skipped steps this fit (of a call of several steps, its last bad one)
        self.skipped_count = 0  # every skipped step this fit
        self._pending: tuple[int, Any] | None = None  # (last step, verdict) of the newest call not read yet
        self._seen = 0  # bad steps handled this fit
        self._cursors: dict[int, dict] = {}  # the iterator state before each recent call's first step

    def on_train_begin(self, trainer: Trainer) -> None:
        reset_guard(trainer.guard_state, trainer.step, keep_losses=False)
        self._pending, self._seen, self._cursors = None, 0, {}
        self.incidents, self.skipped, self.skipped_count = [], [], 0

    def on_data_wait_begin(self, trainer: Trainer, step: int) -> None:
        self._cursors[step] = trainer.iterator.get_state()
        for old in sorted(self._cursors)[:-KEPT_CURSORS]:
            del self._cursors[old]

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        previous, self._pending = self._pending, (logs.step, logs.guard)
        if previous is not None:
            self._judge(trainer, previous)

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self.settle(trainer)

    def settle(self, trainer: Trainer) -> None:
        """Reads the newest call's verdict now (waiting for it) and handles a bad step in it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._judge(trainer, pending)

    def _judge(self, trainer: Trainer, call: tuple[int, Any]) -> None:
        last, out = call
        if out is None:
            return
        counters = dict(zip(COUNTERS, np.asarray(jax.device_get(out["counters"])).tolist()))
        new = counters["bad"] - self._seen
        if new <= 0:
            return
        self._seen = counters["bad"]
        values = dict(zip(VALUES, np.asarray(jax.device_get(out["values"])).tolist()))
        step = int(counters["last_bad"])
        if self.config.spike is None:
            del values["threshold"]
        verdict = {"reason": REASONS[counters["reason"]], "action": self.config.action,
                   **{k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}}
        if self.config.action == "skip":
            verdict["consecutive_bad_steps"] = counters["consecutive"]
        if new > 1:
            verdict["bad_steps_in_call"] = f"{new} bad steps in the call ending at step {last}; this is the last"
        # Under "stop" every step from this one on was held: the parameters are those after step - 1.
        path = self._write(trainer, step, verdict, step - 1 if self.config.action == "stop" else trainer.step)
        what = f"step {step}: {verdict['reason']} (loss {values['loss']:.6g}, gradient norm {values['grad_norm']:.6g}" \
               + (f", threshold {values['threshold']:.6g}" if verdict["reason"] == REASONS[3] else "") + ")"
        if self.config.action == "stop":
            moved = self._rewind(trainer, step)
            trainer.request_stop(f"{what}; stopped with the model as after step {step - 1}{moved}; incident {path}")
            return
        self.skipped.append(step)
        self.skipped_count += new
        if counters["consecutive"] >= self.config.max_consecutive:
            trainer.request_stop(f"{counters['consecutive']} bad steps in a row (max_consecutive="
                                 f"{self.config.max_consecutive}), the last {what}; incidents "
                                 + ", ".join(self.incidents[-counters['consecutive']:]))

    def _rewind(self, trainer: Trainer, step: int) -> str:
        """Moves the trainer back to the end of step - 1; "" or why the data iterator stayed."""
        try:
            trainer.rewind(step - 1, self._cursors.get(step))
        except (TypeError, ValueError) as exc:  # a stream without the state at hand
            return f" (the data iterator stays after step {trainer.step}: {exc})"
        return ""

    def _write(self, trainer: Trainer, step: int, verdict: dict, params_at: int) -> str:
        from datarax.train.incidents import write_incident, write_verdict

        try:
            path = write_incident(trainer, self.directory, step, verdict, images=self.config.images,
                                  params_at=params_at)
        except ReplayError as exc:  # a stream: the verdict without the batch
            path = write_verdict(self.directory, step, {**verdict, "records": f"not replayed: {exc}"})
        except Exception as exc:  # the stop or skip must still happen; say what is missing
            warnings.warn(f"StepGuard could not write the incident of step {step} in full ({type(exc).__name__}: "
                          f"{exc}); writing the verdict alone", IncidentWarning, stacklevel=2)
            path = write_verdict(self.directory, step, {**verdict, "records": f"not written: {exc}"})
        self.incidents.append(str(path))
        return str(path)

    def summary(self) -> str | None:
        """One sentence on this fit's bad steps (None when there were none)."""
        if not self.incidents:
            return None
        if self.skipped:
            steps = ", ".join(map(str, sorted(set(self.skipped))[:10]))
            return (f"{self.skipped_count} step(s) skipped by the guard (steps {steps}); incidents in "
                    f"{self.directory}")
        return f"the guard stopped the run at a bad step; incident {self.incidents[-1]}"
