"""Data sources: random-access record stores that return whole batches per call."""

from datarax.core.source import DataSourceModule as DataSourceModule
from datarax.sources.memory import MemorySource as MemorySource
from datarax.sources.memory import MemorySourceConfig as MemorySourceConfig
