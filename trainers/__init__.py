"""trainers: a Flax NNX training kit for datarax pipelines (depends on datarax, never the reverse).

`Trainer` runs a jitted, buffer-donating train step over a datarax pipeline; callbacks in
`trainers.callbacks` checkpoint (one Orbax checkpoint for model + optimizer + iterator), monitor
goodput and data stalls, log metrics and show progress. See docs/trainers.md.
"""

from trainers.checkpointing import CheckpointMismatchError as CheckpointMismatchError
from trainers.checkpointing import CheckpointRestoreError as CheckpointRestoreError
from trainers.checkpointing import CheckpointSaveError as CheckpointSaveError
from trainers.checkpointing import Checkpointer as Checkpointer
from trainers.checkpointing import CorruptCheckpointWarning as CorruptCheckpointWarning
from trainers.goodput import GoodputLedger as GoodputLedger
from trainers.hashing import state_sha256 as state_sha256
from trainers.optimizers import joint_optimizer as joint_optimizer
from trainers.trainer import FitResult as FitResult
from trainers.trainer import Trainer as Trainer
from trainers.writers import ConsoleWriter as ConsoleWriter
from trainers.writers import JsonlWriter as JsonlWriter
from trainers.writers import TensorBoardWriter as TensorBoardWriter
