"""Benchmark scenarios, one per module; each exposes run(options) -> list of result dicts."""
