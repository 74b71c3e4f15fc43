"""The training loop: the `Trainer`, its jitted step and what the step is made of (precision,
masking of skipped records, the parameters' moving average, sharding, start-up checks)."""

from datarax.train.loop.trainer import FitResult as FitResult
from datarax.train.loop.trainer import Trainer as Trainer
