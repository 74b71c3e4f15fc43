"""The benchmark scenario registry. Scenarios live one per module in `datarax.bench.scenarios`."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

SCENARIO_MODULES = {
    "cifar": "datarax.bench.scenarios.cifar",
    "tokens": "datarax.bench.scenarios.tokens",
    "dag": "datarax.bench.scenarios.dag",
    "scan": "datarax.bench.scenarios.scan",
    "augment_chain": "datarax.bench.scenarios.augment_chain",
    "arrayrecord": "datarax.bench.scenarios.arrayrecord",
    "hf_parquet": "datarax.bench.scenarios.hf_parquet",
    "sharded": "datarax.bench.scenarios.sharded",
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
