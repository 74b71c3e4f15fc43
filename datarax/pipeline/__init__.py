"""Pipelines: linear stage chains and DAGs, compiled into one program per batch."""

from datarax.control.retry import RetryPolicy as RetryPolicy
from datarax.pipeline.buckets import BucketedPipeline as BucketedPipeline
from datarax.pipeline.caching import CachingIterator as CachingIterator
from datarax.pipeline.chain import Chain as Chain
from datarax.pipeline.dag import DagError as DagError
from datarax.pipeline.dag import DagProgram as DagProgram
from datarax.pipeline.iterator import PipelineIterator as PipelineIterator
from datarax.pipeline.pipeline import Pipeline as Pipeline
from datarax.pipeline.scan import ScanBatch as ScanBatch
from datarax.pipeline.scan import ScanRunner as ScanRunner
from datarax.pipeline.scan import scan_epoch as scan_epoch
from datarax.pipeline.state import IteratorStateError as IteratorStateError
from datarax.sources.subset import SubsetSource as SubsetSource
