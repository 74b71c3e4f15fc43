"""trainers: a Flax NNX training kit for datarax pipelines (depends on datarax, never the reverse)."""

from trainers.checkpointing import Checkpointer as Checkpointer
from trainers.trainer import FitResult as FitResult
from trainers.trainer import Trainer as Trainer
