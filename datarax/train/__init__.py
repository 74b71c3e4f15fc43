"""datarax.train: a Flax NNX training kit for datarax pipelines (the top floor of the package).

The kit depends on the rest of datarax and nothing else in datarax imports it (the command line
loads it inside `datarax train`). Importing it registers the `[trainer]` table and the `callback`
component kind with `datarax.config`.

`Trainer` runs a jitted, buffer-donating train step over a datarax pipeline; the callbacks in
`datarax.train.callbacks` checkpoint (one Orbax checkpoint for model, optimizer and data
iterator), monitor goodput and data stalls, log metrics and show progress. docs/trainers.md is
the guide.
"""

from datarax.monitoring.writers import ConsoleWriter as ConsoleWriter
from datarax.monitoring.writers import JsonlWriter as JsonlWriter
from datarax.train import config as config  # registers [trainer] with datarax.config
from datarax.train.checkpointing.checkpointer import Checkpointer as Checkpointer
from datarax.train.config import build_trainer as build_trainer
from datarax.train.config import load_trainer as load_trainer
from datarax.train.loop.guardrails import ShortFinalBatchWarning as ShortFinalBatchWarning
from datarax.train.loop.guardrails import TrainerWarning as TrainerWarning
from datarax.train.loop.guardrails import UnknownEpochLengthWarning as UnknownEpochLengthWarning
from datarax.train.loop.guardrails import UnshuffledTrainingWarning as UnshuffledTrainingWarning
from datarax.train.loop.optimizers import joint_optimizer as joint_optimizer
from datarax.train.loop.trainer import FitResult as FitResult
from datarax.train.loop.trainer import Trainer as Trainer
from datarax.train.metrics.accumulated import ConfusionMatrix as ConfusionMatrix
from datarax.train.metrics.accumulated import Metric as Metric
from datarax.train.metrics.accumulated import PerClassAccuracy as PerClassAccuracy
from datarax.train.metrics.accumulated import Perplexity as Perplexity
from datarax.train.metrics.goodput import GoodputLedger as GoodputLedger
from datarax.train.metrics.writers import TensorBoardWriter as TensorBoardWriter

__all__ = [
    'Checkpointer', 'ConfusionMatrix', 'ConsoleWriter', 'FitResult', 'GoodputLedger', 'JsonlWriter', 'Metric',
    'PerClassAccuracy', 'Perplexity', 'ShortFinalBatchWarning', 'TensorBoardWriter', 'Trainer', 'TrainerWarning',
    'UnknownEpochLengthWarning', 'UnshuffledTrainingWarning', 'build_trainer', 'joint_optimizer', 'load_trainer',
]
