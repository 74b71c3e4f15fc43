"""Incidents: what a `StepGuard` writes when a step goes bad, and the files `datarax replay` writes.

`incidents/step-N.json` holds the step, its batch's cursor `(epoch, position)`, why it was bad (the
loss, the gradient norm, the spike threshold), what the guard did, and one entry per record ranked
by blame: records holding NaN or infinity after the pipeline first, then by their own loss (largest
first) where the loss can be computed per record. Each entry names the record's origin (file, row,
shard) and every stochastic stage's draws for it. `step-N.npz` is the batch itself, `step-N.png`
its images (or spectrograms) captioned by row and record id. docs/troubleshooting.md reads one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.monitoring.pictures import choose_field, save_grid
from datarax.pipeline.replay import ReplayedBatch
from datarax.train.loop.masking import per_record, record_mask, takes_mask
from datarax.train.loop.step import EPOCH, RECORD_IDS, split_loss

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

INCIDENTS = "incidents"


def write_batch(replayed: ReplayedBatch, path: str | os.PathLike) -> Path:
    """The batch's fields as one `.npz` (`numpy.load` gives them back bitwise)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **replayed.batch)
    return path


def write_images(replayed: ReplayedBatch, path: str | os.PathLike, field: str | None = None) -> str | None:
    """A PNG grid of the batch's image field (else its audio field, as spectrograms), each tile captioned
    `row: record id`; returns the field drawn, or None when the batch has neither (nothing written)."""
    try:
        name, kind = choose_field(replayed.batch, field)
    except ValueError:
        if field is not None:
            raise
        return None
    first = replayed.record_ids if replayed.record_ids.ndim == 1 else replayed.record_ids[:, 0]
    save_grid(replayed.batch[name], kind, [f"{row}: {int(i)}" for row, i in enumerate(first)], path)
    return name


def record_losses(trainer: Trainer, replayed: ReplayedBatch, params_at: int) -> tuple[np.ndarray | None, str]:
    """`(losses[rows], note)`: each record's own loss under the model's parameters now (those after
    step `params_at`, which the note names), from one call of
    the loss function when it returns one loss per record, else per record (a batch of one each); None
    and the reason when it cannot be computed (a model with batch statistics, a loss over the batch)."""
    batch = {k: jnp.asarray(v) for k, v in replayed.batch.items()}
    graphdef, state = nnx.split(trainer.model)

    def losses(state, batch):
        model = nnx.merge(graphdef, state)  # a copy: its random streams advance, the trainer's do not
        data = batch
        if trainer.joint:
            data = dict(batch)
            ids, epoch = data.pop(RECORD_IDS), data.pop(EPOCH)
            data = trainer.train_pipeline.transform(data, record_ids=ids, epoch=epoch[0])
        loss_fn = trainer.loss_fn
        if takes_mask(loss_fn):
            def loss_fn(model, data, fn=trainer.loss_fn):
                mask = record_mask(data)
                rows = len(next(iter(data.values())))
                return fn(model, data, mask=jnp.ones((rows,), bool) if mask is None else mask)
        whole, _ = split_loss(loss_fn(model, data))
        if getattr(whole, "shape", None) == (len(replayed.origins),):  # the loss gives one per record
            return whole.astype(jnp.float32)
        return per_record(loss_fn, model, data, split_loss)[0]

    try:
        values = np.asarray(jax.jit(losses)(state, batch))
    except (ValueError, TypeError) as exc:
        return None, f"not computed: {str(exc).splitlines()[0]}"
    return values, f"each record's loss alone, with the parameters after step {params_at}"


def ranked(replayed: ReplayedBatch, losses: np.ndarray | None) -> list[dict[str, Any]]:
    """The batch's records as `ReplayedBatch.records` gives them, with `loss` and `not_finite`, most
    to blame first: non-finite records, then non-finite losses, then larger losses."""
    bad = replayed.nonfinite()
    records = replayed.records()
    for entry in records:
        row = entry["row"]
        entry["not_finite"] = bad.get(row, [])
        loss = None if losses is None else float(losses[row])
        entry["loss"] = loss if loss is None or math.isfinite(loss) else str(loss)

    def blame(entry: dict) -> tuple:
        loss = entry["loss"]
        value = -math.inf if loss is None else (math.inf if isinstance(loss, str) else loss)
        return (not entry["not_finite"], -value, entry["row"])

    return sorted(records, key=blame)


def write_incident(trainer: Trainer, directory: str | os.PathLike, step: int, verdict: dict[str, Any],
                   images: bool = True, params_at: int | None = None) -> Path:
    """Replays step `step` and writes `step-<step>.json` (with `.npz` and `.png`) into `directory`;
    `verdict` (reason, loss, gradient norm, threshold, action) goes into the JSON as it is. The
    records' own losses use the model's parameters now, those after step `params_at` (None: the
    trainer's step)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    replayed = trainer.replay(step)
    losses, note = record_losses(trainer, replayed, trainer.step if params_at is None else params_at)
    files = {"batch": write_batch(replayed, directory / f"step-{step}.npz").name}
    if images:
        drawn = write_images(replayed, directory / f"step-{step}.png")
        if drawn is not None:
            files["images"] = f"step-{step}.png ({drawn})"
    return write_verdict(directory, step, {
        "epoch": replayed.epoch, "position": replayed.position, "num_valid": replayed.num_valid, **verdict,
        "record_losses": note, "files": files, "records": ranked(replayed, losses)})


def write_verdict(directory: str | os.PathLike, step: int, incident: dict[str, Any]) -> Path:
    """Writes `step-<step>.json` (`{"step": step, **incident}`) into `directory` atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step}.json"
    tmp = directory / f".step-{step}.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"step": step, **incident}, indent=1, default=str))
    os.replace(tmp, path)
    return path
