"""Float64 reference checks run on the host's CPU, whatever the default backend.

A TPU has no float64 FFT and emulates (or refuses) float64 arithmetic, so a float64 comparison
there measures the emulation, not datarax. Arrays made inside the block are placed on the CPU,
and programs on them run there; on a CPU-only machine the block is plain `float64_on_cpu()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def float64_on_cpu(enabled: bool = True) -> Iterator[None]:
    """x64 on (when `enabled`) and the CPU as the default device, for the block."""
    with jax.enable_x64(enabled), jax.default_device(jax.devices("cpu")[0]):
        yield
