"""The benchmark suite: `python -m datarax.bench [scenario ...]` (see docs/benchmarks.md)."""
