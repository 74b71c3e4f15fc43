"""The benchmark suite: `python -m benchmarks [scenario ...]` (see docs/benchmarks.md)."""
