"""The bad-step check inside the compiled train step (`datarax.train.callbacks.StepGuard` is its host side).

Each step computes the gradients' global norm and judges the step bad when the loss or that norm is
not finite, or, with `spike=k`, when the loss exceeds k times the median of the last `window` good
losses (judged once `warmup` good steps were seen; meant for a non-negative loss). A bad step's
update is not applied: the step returns the values it was given (parameters, optimizer state,
moving average, batch statistics), as optax's `apply_if_finite` does, decided by a `jnp.where`
inside the program, so a good step costs no host work. Under `action="stop"` a bad step also holds
every later step (they change nothing) until the host has seen it, stopped the run and moved the
trainer back to the step before it (`Trainer.rewind`), so the state and the data stream agree.

`GuardState` counts bad steps and remembers the newest one; every step returns its counters under
`GUARD` (one int32 vector, `COUNTERS` names its entries) and the newest bad step's loss, gradient
norm and threshold (`VALUES`), cumulative, so the last step of a call of several carries them all.
Under float16 loss scaling a non-finite gradient is the loss scale's business (it skips the step
and halves the scale), so the guard checks the loss only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax.core.checks import check_choice, check_int, check_number, field

ACTIONS = ("stop", "skip")
GUARD = "__guard__"  # the step output entry the trainer hands to the StepGuard, not a metric
COUNTERS = ("step", "bad", "consecutive", "last_bad", "reason", "halted")
VALUES = ("loss", "grad_norm", "threshold")
REASONS = {1: "non-finite loss", 2: "non-finite gradient norm", 3: "loss spike"}


@dataclasses.dataclass(frozen=True)
class StepGuardConfig:
    """What counts as a bad step and what happens then (`datarax.train.callbacks.StepGuard`).

    Attributes:
        action: "stop" (the run stops at the bad step, the state as after the step before it) or
            "skip" (the step's update is dropped and training goes on; counted and reported).
        spike: k: a loss above k times the running median of good losses is bad too (None: only
            non-finite values are).
        window: good losses in the running median.
        warmup: good steps seen before spikes are judged.
        max_consecutive: under "skip", this many bad steps in a row stop the run.
        images: write a PNG of the batch's images with each incident.
    """

    action: str = "stop"
    spike: float | None = None
    window: int = 100
    warmup: int = 20
    max_consecutive: int = 3
    images: bool = True

    def __post_init__(self):
        check_choice(*field(self, "action"), ACTIONS)
        if self.spike is not None:
            check_number(*field(self, "spike"), 1.0, open_low=True)
        check_int(*field(self, "window"), 1, high=100_000)
        check_int(*field(self, "warmup"), 1)
        if self.warmup > self.window:
            raise ValueError(f"StepGuardConfig.warmup must be <= window ({self.window}), got {self.warmup}: the "
                             "median is taken over at most window losses")
        check_int(*field(self, "max_consecutive"), 1)


class GuardValue(nnx.Variable):
    """The guard's state (never a parameter; not checkpointed: a run starts counting afresh)."""


class GuardState(nnx.Module):
    """The counters of `GUARD`, the newest bad step's `VALUES`, and the ring of recent good losses."""

    def __init__(self, window: int):
        for name in COUNTERS:
            setattr(self, name, GuardValue(jnp.asarray(-1 if name == "last_bad" else 0, jnp.int32)))
        for name in VALUES:
            setattr(self, name, GuardValue(jnp.asarray(jnp.nan, jnp.float32)))
        self.losses = GuardValue(jnp.zeros((window,), jnp.float32))
        self.good = GuardValue(jnp.asarray(0, jnp.int32))  # good losses seen (the ring holds the last `window`)


def check_step(guard: GuardState, config: StepGuardConfig, loss: jax.Array, grads: Any, check_grads: bool
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Judges one step (traced inside it) and updates `guard`; returns whether its update may apply and
    the `GUARD` output."""
    loss = jnp.asarray(loss, jnp.float32)
    norm = optax.tree.norm(grads).astype(jnp.float32)
    window = guard.losses.shape[0]
    filled = jnp.minimum(guard.good[...], window)
    threshold = jnp.asarray(jnp.inf, jnp.float32)
    if config.spike is not None:
        ordered = jnp.sort(jnp.where(jnp.arange(window) < filled, guard.losses[...], jnp.inf))
        median = ordered[jnp.maximum(filled - 1, 0) // 2]
        threshold = jnp.where(filled >= config.warmup, config.spike * median, jnp.inf)
    finite_norm = jnp.isfinite(norm) if check_grads else jnp.asarray(True)
    reason = jnp.where(~jnp.isfinite(loss), 1, jnp.where(~finite_norm, 2, jnp.where(loss > threshold, 3, 0)))
    good, halted = reason == 0, guard.halted[...] > 0
    applies = good & ~halted
    step = guard.step[...] + 1
    guard.step[...] = step
    guard.losses[...] = jnp.where(applies, guard.losses[...].at[guard.good[...] % window].set(loss), guard.losses[...])
    guard.good[...] = guard.good[...] + applies.astype(jnp.int32)
    judged = ~halted  # a held step is neither good nor bad: the host is about to undo it
    newly_bad = judged & ~good
    guard.bad[...] = guard.bad[...] + newly_bad.astype(jnp.int32)
    guard.consecutive[...] = jnp.where(newly_bad, guard.consecutive[...] + 1,
                                       jnp.where(judged, 0, guard.consecutive[...]))
    guard.last_bad[...] = jnp.where(newly_bad, step, guard.last_bad[...])
    guard.reason[...] = jnp.where(newly_bad, reason, guard.reason[...]).astype(jnp.int32)
    for name, value in (("loss", loss), ("grad_norm", norm), ("threshold", threshold)):
        getattr(guard, name)[...] = jnp.where(newly_bad, value, getattr(guard, name)[...])
    if config.action == "stop":
        guard.halted[...] = (halted | newly_bad).astype(jnp.int32)
    counters = jnp.stack([getattr(guard, name)[...] for name in COUNTERS])
    values = jnp.stack([getattr(guard, name)[...] for name in VALUES])
    return applies, {"counters": counters, "values": values}


def guard_positions(paths: list[tuple]) -> list[bool]:
    """Which of a `TrainState` binding's values are the guard's own (always taken from the step)."""
    return [path[0] == "guard" for path in paths]


def reset_guard(guard: GuardState, step: int, *, keep_losses: bool) -> None:
    """Starts the guard at `step` with no bad step held (`keep_losses`: keep the running median's ring)."""
    def put(variable: GuardValue, value: Any) -> None:
        old = variable.get_value()
        new = np.asarray(value, old.dtype)
        # On the old value's device and layout, so the next step's inputs compile as before.
        variable.set_value(jax.device_put(new, old.sharding) if getattr(old, "committed", False) else jnp.asarray(new))

    for name in COUNTERS:
        put(getattr(guard, name), {"step": step, "last_bad": -1}.get(name, 0))
    for name in VALUES:
        put(getattr(guard, name), np.nan)
    if not keep_losses:
        put(guard.losses, np.zeros(guard.losses.shape))
        put(guard.good, 0)
