"""Control of data movement: background prefetching."""

from datarax.control.prefetch import Prefetcher as Prefetcher
