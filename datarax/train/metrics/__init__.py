"""What a run measures and where it goes: metrics summed over batches, goodput (with its history
across restarts and a timeline picture) and the experiment trackers' writers."""

from datarax.train.metrics.accumulated import ConfusionMatrix as ConfusionMatrix
from datarax.train.metrics.accumulated import Metric as Metric
from datarax.train.metrics.accumulated import PerClassAccuracy as PerClassAccuracy
from datarax.train.metrics.accumulated import Perplexity as Perplexity
from datarax.train.metrics.goodput import GoodputLedger as GoodputLedger
from datarax.train.metrics.writers import TensorBoardWriter as TensorBoardWriter
