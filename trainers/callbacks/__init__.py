"""Callbacks for `trainers.Trainer`: the event contract and the built-in callbacks."""

from trainers.callbacks.base import Callback as Callback
from trainers.callbacks.base import CheckpointInfo as CheckpointInfo
from trainers.callbacks.base import Schedule as Schedule
from trainers.callbacks.base import StepLogs as StepLogs
from trainers.callbacks.checkpoint import CheckpointCallback as CheckpointCallback
from trainers.callbacks.early_stopping import EarlyStopping as EarlyStopping
from trainers.callbacks.goodput import GoodputMonitor as GoodputMonitor
from trainers.callbacks.lr_logger import LearningRateLogger as LearningRateLogger
from trainers.callbacks.metric_logger import MetricLogger as MetricLogger
from trainers.callbacks.progress import ProgressBar as ProgressBar
