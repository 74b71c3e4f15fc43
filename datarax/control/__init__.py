"""Control of data movement: background prefetching, the thread pool (`pool`) and the process pool
(`processes`) the host stages run on, memory budgets and retries."""

from datarax.control.prefetch import Prefetcher as Prefetcher
