"""What the Trainer checks before it trains: set-ups that run, but train worse or slower than meant.

Each finding is a `TrainerWarning` subclass whose message names the pipeline, what goes wrong and
the fix; ignore one on purpose with `warnings.filterwarnings("ignore", category=...)`:

* `UnshuffledTrainingWarning`: the training pipeline reads its records in the same order every
  epoch (its sampler does not permute, e.g. a source built without `shuffle=True`);
* `ShortFinalBatchWarning`: the epoch ends in a short batch, whose new shape compiles the train
  step a second time (in every process: each restart pays it again);
* `UnknownEpochLengthWarning`: `fit(num_epochs=...)` on a stream whose epoch length is unknown;
  an epoch then ends only when the stream does.

`CompileCauses` names why a step compiled (the first step, the epoch's short final batch, a new
batch shape), which the goodput report prints beside each compile.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax

from datarax.core.errors import DataraxWarning
from datarax.host.stage import HostStageSource
from datarax.samplers.base import Sampler
from datarax.samplers.simple import RangeSampler, SequentialSampler, ShuffleSampler
from datarax.sources.stream import StreamSourceModule


class TrainerWarning(DataraxWarning):
    """A Trainer set-up that runs but trains worse or slower than intended (see the subclasses)."""


class UnshuffledTrainingWarning(TrainerWarning):
    """The training pipeline visits its records in the same order every epoch."""


class ShortFinalBatchWarning(TrainerWarning):
    """The training epoch ends in a short batch, which compiles the train step again."""


class UnknownEpochLengthWarning(TrainerWarning):
    """`fit(num_epochs=...)` on a stream whose epochs have no known length."""


def shuffles(sampler: Sampler, source: Any) -> bool | None:
    """Whether `sampler` (over `source`) visits records in a fresh order each epoch; None: cannot tell."""
    if isinstance(sampler, ShuffleSampler):
        return True
    if isinstance(source, StreamSourceModule):
        setting = getattr(getattr(source, "config", None), "shuffle", None)
        return setting if isinstance(setting, bool) else None
    if isinstance(sampler, (SequentialSampler, RangeSampler)):
        return False
    setting = getattr(sampler, "shuffle", None)
    return setting if isinstance(setting, bool) else None


def check_training_pipeline(pipeline: Any, name: str = "train_pipeline", *, epoch_known: bool = True) -> None:
    """Warns (`UnshuffledTrainingWarning`, `ShortFinalBatchWarning`) about a training pipeline;
    `epoch_known=False` (a pipeline over a sample of its data) skips the short-batch check."""
    # Host stages fold into a HostStageSource; the user knows the source it reads.
    source = type(pipeline.source.source if isinstance(pipeline.source, HostStageSource) else pipeline.source).__name__
    if shuffles(pipeline.sampler, pipeline.source) is False:
        warnings.warn(
            f"{name} reads {source} in the same order every epoch (its sampler, "
            f"{type(pipeline.sampler).__name__}, does not shuffle): each epoch's batches are the same, and data "
            "stored sorted (by class, by length, by file) trains badly. Fix: build the source with shuffle=True "
            f"(e.g. {source}(shuffle=True, seed=0, ...), or `shuffle = true` in a config file's source table), or "
            "pass Pipeline(..., sampler=ShuffleSampler(len(source), seed=0))", UnshuffledTrainingWarning, stacklevel=3)
    short = short_final_batch(pipeline) if epoch_known else 0
    if short:
        records = len(pipeline.sampler)
        divisors = [d for d in range(max(1, pipeline.batch_size // 2), 2 * pipeline.batch_size + 1)
                    if records % d == 0][:3]
        hint = f" (e.g. {', '.join(map(str, divisors))})" if divisors else ""
        warnings.warn(
            f"{name}'s epoch of {records} records ends in a short batch of {short} (batch_size="
            f"{pipeline.batch_size}): its new shape compiles the train step a second time, in every process, so "
            "each restart pays it again, and the goodput report counts it as a compile. Fix: Pipeline(..., "
            f"drop_remainder=True) (drops {short} records per epoch, other ones each epoch when shuffled), or a "
            f"batch_size that divides {records}{hint}", ShortFinalBatchWarning, stacklevel=3)


def short_final_batch(pipeline: Any) -> int:
    """Records in the training epoch's short final batch as the step sees it (0: none, or padded to
    the full shape as a sharded pipeline's is, or every batch of that size, or unknown for a stream
    of unknown length)."""
    if pipeline.drop_remainder or pipeline.sharding is not None or not epoch_length_known(pipeline):
        return 0
    records = len(pipeline.sampler)
    # An epoch shorter than one batch is all one shape: nothing compiles twice.
    return records % pipeline.batch_size if records > pipeline.batch_size else 0


def epoch_length_known(pipeline: Any) -> bool:
    """Whether the pipeline's epochs have a known number of batches (`len(pipeline)` works)."""
    return not (isinstance(pipeline.source, StreamSourceModule) and pipeline.source.num_records() is None)


def warn_unknown_epoch_length(pipeline: Any, num_epochs: int) -> None:
    warnings.warn(
        f"fit(num_epochs={num_epochs}) on {type(pipeline.source).__name__}, a stream whose epoch length is unknown: "
        f"the trainer stops when epoch {num_epochs} would begin, which it learns only when the stream ends; if the "
        "stream never ends (a repeated or generated dataset) neither does fit, and the progress bar has no total. "
        "Fix: fit(num_steps=N), or give the source its epoch length (num_records=...)",
        UnknownEpochLengthWarning, stacklevel=3)


def batch_rows(batch: Any) -> int:
    leaves = jax.tree.leaves(batch)
    return int(leaves[0].shape[0]) if leaves and getattr(leaves[0], "shape", ()) else 0


class CompileCauses:
    """Names why a jitted step compiled, from the batches it compiled for."""

    def __init__(self, full_rows: int, what: str = "step"):
        self.full_rows = full_rows
        self.what = what
        self._seen: set = set()

    def cause(self, batch: Any) -> str:
        """Why the call with `batch` compiled (call it only for calls that did)."""
        leaves, treedef = jax.tree.flatten(batch)
        signature = (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
        first, seen = not self._seen, signature in self._seen
        self._seen.add(signature)
        rows = batch_rows(batch)
        if first:
            return f"the first {self.what}"
        if seen:
            return "a batch shape compiled before: a change in the state's dtypes or the jit cache was cleared"
        if rows < self.full_rows:
            return "the epoch's short final batch"
        return "a new batch shape: " + ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in leaves[:3])
