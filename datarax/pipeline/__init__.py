"""Pipelines: linear stage chains and DAGs, compiled into one program per batch."""

from datarax.pipeline.chain import Chain as Chain
from datarax.pipeline.iterator import PipelineIterator as PipelineIterator
from datarax.pipeline.pipeline import Pipeline as Pipeline
from datarax.pipeline.state import IteratorStateError as IteratorStateError
