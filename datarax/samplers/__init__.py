"""Samplers: which records make up each batch, in O(1) memory and resumable by arithmetic."""

from datarax.samplers.base import Sampler as Sampler
from datarax.samplers.block import BlockShuffleSampler as BlockShuffleSampler
from datarax.samplers.feistel import FeistelPermutation as FeistelPermutation
from datarax.samplers.simple import RangeSampler as RangeSampler
from datarax.samplers.simple import SequentialSampler as SequentialSampler
from datarax.samplers.simple import ShuffleSampler as ShuffleSampler
from datarax.samplers.simple import default_sampler as default_sampler
from datarax.samplers.weighted import WeightedSampler as WeightedSampler
from datarax.samplers.windowed import EpochAwareSampler as EpochAwareSampler
from datarax.samplers.windowed import SlidingWindowSampler as SlidingWindowSampler
