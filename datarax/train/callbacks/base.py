"""The callback contract: a small event set, step logs, and schedules that survive a resume.

Events, in the order a run sees them (every method of `Callback` is an optional no-op):

    on_train_begin(trainer)                     before the first step; checkpoints restore here
    on_data_wait_begin(trainer, step)           the host is about to call next() for step
    on_data_wait_end(trainer, step, seconds)    next() returned after seconds
    on_step_begin(trainer, step)                the batch is in hand, the step is about to run
    on_step_end(trainer, logs)                  the step was dispatched (logs: StepLogs)
    on_eval_begin(trainer, step)                an evaluation starts
    on_eval_step_end(trainer, logs)             an eval batch was dispatched (logs.step counts its batches)
    on_eval_end(trainer, step, metrics)         the evaluation's metrics
    on_checkpoint_save(trainer, info)           a save started (info: CheckpointInfo)
    on_checkpoint_restore(trainer, info)        a restore finished
    on_train_end(trainer, logs)                 after the last step or a stop request

With `Trainer(steps_per_execution=K)` the four step events come once per call of K steps: `step`
is the call's first step in the first three, `logs.step` its last in `on_step_end`, and a
`Schedule` fires at the end of the call in which its step was crossed.

`on_step_end` never waits for the device: `logs.metrics` holds the *previous* call's metrics,
copied to the host only when a callback looks at them (`datarax.train.loop.step.HostMetrics`).
A callback that needs them only sometimes should check its schedule first and look only then,
so the host runs ahead of the device in between. `on_train_end` carries the final step's metrics.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Iterable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from datarax.core.checks import is_int, is_number

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

EVENTS = (
    "on_train_begin", "on_data_wait_begin", "on_data_wait_end", "on_step_begin", "on_step_end",
    "on_eval_begin", "on_eval_step_end", "on_eval_end", "on_checkpoint_save", "on_checkpoint_restore",
    "on_train_end",
)


@dataclasses.dataclass
class StepLogs:
    """What `on_step_end` and `on_train_end` receive.

    Attributes:
        step: the optimizer step just dispatched (1-based); the call's last with `steps_per_execution`.
        steps: the optimizer steps this call covered (`step - steps + 1` is its first).
        batch_size: records in this call's batches (all `steps` of them).
        metrics: host floats of step `metrics_step` (empty when none is available yet), read from the
            device on first use.
        metrics_step: the step `metrics` belong to (the previous call's last step), or None.
        data_wait: (begin, end) `time.perf_counter()` of the next() calls for this call.
        dispatched_at: `time.perf_counter()` right after the step was dispatched.
        compile_seconds: time spent compiling the step before this dispatch (0 when cached).
        output: a device array ready when the call is done; wait on it only off the main thread.
        epoch: the data epoch this step's batch came from.
        compile_cause: why the step compiled, when it did (e.g. "the epoch's short final batch").
        guard: with a `StepGuard`, the call's verdict as device arrays (`datarax.train.loop.guard`).
    """

    step: int
    batch_size: int = 0
    metrics: MutableMapping[str, float] = dataclasses.field(default_factory=dict)
    metrics_step: int | None = None
    data_wait: tuple[float, float] = (0.0, 0.0)
    dispatched_at: float = 0.0
    compile_seconds: float = 0.0
    output: Any = None
    epoch: int = 0
    compile_cause: str | None = None
    steps: int = 1
    guard: Any = None


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What `on_checkpoint_save` / `on_checkpoint_restore` receive.

    Attributes:
        step: the step saved or restored.
        seconds: time the training loop was blocked by the save or restore.
        began_at: `time.perf_counter()` when it started.
        directory: the checkpoint root directory.
        forced: a save outside the schedule (final or preemption save).
    """

    step: int
    seconds: float
    began_at: float
    directory: str
    forced: bool = False


class Callback:
    """Base class of callbacks: override the events you need (the module docstring lists them).

    `order` sorts callbacks per event (stable, ascending) so that producers of values run before
    the loggers that write them: producers use `order < 0` (`LearningRateLogger` -10,
    `CheckpointCallback` -100), loggers `order > 0` (`MetricLogger` 10, `ProgressBar` 20).
    `event_order` gives one event another rank (the goodput monitor sees each step first and the
    end of training last). `get_state`/`set_state` carry a callback's own state in the checkpoint
    (e.g. early stopping's patience), so a resumed run behaves as an uninterrupted one.

    Example:
        >>> class CountSteps(Callback):
        ...     def __init__(self):
        ...         self.steps = 0
        ...     def on_step_end(self, trainer, logs):
        ...         self.steps += logs.steps
        ...     def get_state(self):
        ...         return {"steps": self.steps}
        ...     def set_state(self, state):
        ...         self.steps = state["steps"]
    """

    order: int = 0

    def event_order(self, event: str) -> int:
        """This callback's rank for `event` (default: `order`)."""
        return self.order

    def on_train_begin(self, trainer: Trainer) -> None: ...

    def on_data_wait_begin(self, trainer: Trainer, step: int) -> None: ...

    def on_data_wait_end(self, trainer: Trainer, step: int, seconds: float) -> None: ...

    def on_step_begin(self, trainer: Trainer, step: int) -> None: ...

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None: ...

    def on_eval_begin(self, trainer: Trainer, step: int) -> None: ...

    def on_eval_step_end(self, trainer: Trainer, logs: StepLogs) -> None: ...

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None: ...

    def on_checkpoint_save(self, trainer: Trainer, info: CheckpointInfo) -> None: ...

    def on_checkpoint_restore(self, trainer: Trainer, info: CheckpointInfo) -> None: ...

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None: ...

    def get_state(self) -> dict | None:
        """JSON-able state saved with each checkpoint (None: nothing to save)."""
        return None

    def set_state(self, state: dict) -> None:
        """Restores what `get_state` returned."""

    def close(self) -> None:
        """Releases resources when a run ends with an exception (after on_train_end otherwise)."""


class CallbackList:
    """Dispatches events to callbacks, calling only those that override each event."""

    def __init__(self, callbacks: Iterable[Callback]):
        callbacks = list(callbacks)
        for i, cb in enumerate(callbacks):
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks[{i}] must be a trainers Callback, got {type(cb).__name__}: "
                                f"{cb!r:.80}; subclass datarax.train.callbacks.Callback")
        self.callbacks = sorted(callbacks, key=lambda cb: cb.order)
        self._handlers = {
            event: [getattr(cb, event) for cb in sorted(self.callbacks, key=lambda cb: cb.event_order(event))
                    if getattr(type(cb), event) is not getattr(Callback, event)]
            for event in EVENTS
        }

    def __iter__(self):
        return iter(self.callbacks)

    def __call__(self, event: str, *args: Any) -> None:
        for handler in self._handlers[event]:
            handler(*args)

    def states(self) -> dict[str, dict]:
        """Each stateful callback's state, keyed by `<index>:<class name>`."""
        out = {}
        for i, cb in enumerate(self.callbacks):
            state = cb.get_state()
            if state is not None:
                out[f"{i}:{type(cb).__name__}"] = state
        return out

    def set_states(self, states: dict[str, dict]) -> None:
        for i, cb in enumerate(self.callbacks):
            key = f"{i}:{type(cb).__name__}"
            if key in states:
                cb.set_state(states[key])


def _positive(name: str, value: Any, integer: bool) -> Any:
    if value is None:
        return None
    if not (is_int(value) if integer else is_number(value)) or value <= 0:
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
    return value


class Schedule:
    """When a periodic callback fires: every N steps, every T seconds, and/or on listed steps.

    Firing is decided by *crossing*, not equality: `every_steps=10` fires on the first step at or
    past each multiple of 10, and `on_steps=(25,)` fires on the first step >= 25 seen after a
    step < 25. A run resumed at step 37 therefore fires next at 40, never at 37 again, and a jump
    over several boundaries fires once.

    Example:
        >>> s = Schedule(every_steps=10)
        >>> s.reset(step=37, now=0.0)
        >>> [step for step in range(38, 52) if s.due(step, now=0.0)]
        [40, 50]
    """

    def __init__(self, every_steps: int | None = None, every_secs: float | None = None,
                 on_steps: Sequence[int] = ()):
        self.every_steps = _positive("every_steps", every_steps, integer=True)
        self.every_secs = _positive("every_secs", every_secs, integer=False)
        if isinstance(on_steps, (int, str)) or not all(is_int(s) for s in on_steps):
            raise TypeError(f"on_steps must be a sequence of ints, got {on_steps!r}; pass on_steps=(100, 200)")
        self.on_steps = tuple(sorted(on_steps))
        self._last_step = 0
        self._last_time = 0.0

    @property
    def active(self) -> bool:
        return self.every_steps is not None or self.every_secs is not None or bool(self.on_steps)

    def reset(self, step: int, now: float | None = None) -> None:
        """Starts counting from `step` (the step a run begins or resumes at)."""
        self._last_step = step
        self._last_time = time.monotonic() if now is None else now

    def due(self, step: int, now: float | None = None) -> bool:
        """Whether to fire at `step`; call once per step, with steps increasing."""
        prev, self._last_step = self._last_step, step
        now = time.monotonic() if now is None else now
        fire = ((self.every_steps is not None and step // self.every_steps > prev // self.every_steps)
                or bisect.bisect_right(self.on_steps, step) > bisect.bisect_right(self.on_steps, prev)
                or (self.every_secs is not None and now - self._last_time >= self.every_secs))
        if fire:
            self._last_time = now
        return fire
