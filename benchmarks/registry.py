"""The benchmark scenario registry. Scenarios live one per module in `benchmarks.scenarios`."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

SCENARIO_MODULES = {
    "cifar": "benchmarks.scenarios.cifar",
    "tokens": "benchmarks.scenarios.tokens",
    "dag": "benchmarks.scenarios.dag",
    "scan": "benchmarks.scenarios.scan",
    "augment_chain": "benchmarks.scenarios.augment_chain",
    "rrc224": "benchmarks.scenarios.rrc224",
    "arrayrecord": "benchmarks.scenarios.arrayrecord",
    "hf_parquet": "benchmarks.scenarios.hf_parquet",
    "sharded": "benchmarks.scenarios.sharded",
    "remote": "benchmarks.scenarios.remote",
    "jpeg": "benchmarks.scenarios.jpeg",
    "jpeg_cache": "benchmarks.scenarios.jpeg_cache",
    "host_map": "benchmarks.scenarios.host_map",
    "text": "benchmarks.scenarios.text",
    "overhead": "benchmarks.scenarios.overhead",
    "train_step": "benchmarks.scenarios.train_step",
    "accumulate": "benchmarks.scenarios.accumulate",
}


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """Options every scenario receives.

    Attributes:
        repeats: timed epochs per side (the median is reported).
        scale: multiplies the scenario's record count (use < 1 for a quick smoke run).
        peers: peer frameworks to run beside datarax where the scenario supports them.
    """

    repeats: int = 5
    scale: float = 1.0
    peers: tuple[str, ...] = ()

    def records(self, n: int) -> int:
        return max(1, int(n * self.scale))


def load(name: str) -> Callable[[BenchOptions], list[dict]]:
    if name not in SCENARIO_MODULES:
        raise KeyError(f"unknown benchmark scenario {name!r}; choose from {sorted(SCENARIO_MODULES)}")
    return importlib.import_module(SCENARIO_MODULES[name]).run
