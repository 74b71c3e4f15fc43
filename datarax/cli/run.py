"""`datarax run CONFIG`: iterate a configured pipeline and report throughput, goodput and a sample batch.

Goodput is the share of wall time spent delivering batches at the steady rate; the rest (badput)
is building the pipeline and the first batch, compilation included.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from datarax.cli.progress import bar


@dataclasses.dataclass
class RunReport:
    """What a run measured."""

    build_s: float
    first_batch_s: float
    steady_s: float
    batches: int
    records: int
    steady_records: int
    epochs: int
    sample: dict[str, Any]

    @property
    def wall_s(self) -> float:
        return self.build_s + self.first_batch_s + self.steady_s

    @property
    def el_s(self) -> float:
        """Steady-state records per second (every batch after the first)."""
        return self.steady_records / self.steady_s if self.steady_s > 0 else float("nan")

    @property
    def goodput(self) -> float:
        return self.steady_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"epochs": self.epochs, "batches": self.batches, "records": self.records, "el_s": round(self.el_s, 1),
                "goodput": round(self.goodput, 4), "wall_s": round(self.wall_s, 4), "build_s": round(self.build_s, 4),
                "first_batch_s": round(self.first_batch_s, 4), "sample": self.sample}


def summarize(batch: dict[str, Any]) -> dict[str, dict]:
    """Per field: dtype, shape and, for numbers, min / max / mean."""
    out = {}
    for name, value in batch.items():
        leaves = jax.tree.leaves(value)
        if len(leaves) != 1:
            out[name] = {"structure": str(jax.tree.map(lambda x: (str(x.dtype), tuple(x.shape)), value))}
            continue
        arr = np.asarray(leaves[0])
        info: dict[str, Any] = {"dtype": arr.dtype.name, "shape": list(arr.shape)}
        if arr.size and (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            as_float = arr.astype(np.float64)
            info.update(min=float(as_float.min()), max=float(as_float.max()), mean=round(float(as_float.mean()), 6))
        out[name] = info
    return out


def run_pipeline(build, *, epochs: int, max_batches: int | None = None, progress: bool | None = None) -> RunReport:
    """Builds the pipeline with `build()`, iterates `epochs` epochs (or `max_batches`), and times it."""
    start = time.perf_counter()
    pipeline = build()
    build_s = time.perf_counter() - start
    per_epoch = len(pipeline)
    total = per_epoch * epochs if max_batches is None else min(max_batches, per_epoch * epochs)
    progress_bar = bar(total, desc="datarax run", unit="batch", enabled=progress)
    batches = records = steady_records = 0
    first_batch_s = 0.0
    sample: dict = {}
    iterator = pipeline.epochs(epochs)
    try:
        start = time.perf_counter()
        last = None
        for batch in iterator:
            size = int(jax.tree.leaves(batch)[0].shape[0])
            if batches == 0:
                jax.block_until_ready(batch)
                first_batch_s = time.perf_counter() - start
                sample = summarize(batch)
                start = time.perf_counter()
            else:
                steady_records += size
            last = batch
            batches += 1
            records += size
            progress_bar.update(1)
            if batches >= total:
                break
        jax.block_until_ready(last)
        steady_s = time.perf_counter() - start if batches > 1 else 0.0
    finally:
        iterator.close()
        progress_bar.close()
    return RunReport(build_s, first_batch_s, steady_s, batches, records, steady_records, epochs, sample)


def format_report(report: RunReport, config_path: str) -> str:
    lines = [f"config       {config_path}",
             f"ran          {report.batches:,} batches, {report.records:,} records"
             f" ({report.epochs} epoch{'s' if report.epochs != 1 else ''})"]
    if report.batches > 1:
        lines.append(f"throughput   {report.el_s:,.0f} el/s (steady state, after the first batch)")
    else:
        lines.append("throughput   n/a (a single batch: no steady state to time)")
    lines.append(f"goodput      {100 * report.goodput:.1f}% of {report.wall_s:.2f} s wall time delivered batches "
                 f"(badput: build {report.build_s:.2f} s, first batch incl. compile {report.first_batch_s:.2f} s)")
    lines.append("sample batch (the first)")
    width = max((len(k) for k in report.sample), default=0)
    for name, info in report.sample.items():
        if "dtype" not in info:
            lines.append(f"  {name:<{width}}  {info['structure']}")
            continue
        stats = (f"  min {info['min']:.4g}  max {info['max']:.4g}  mean {info['mean']:.4g}" if "min" in info else "")
        lines.append(f"  {name:<{width}}  {info['dtype']} {tuple(info['shape'])}{stats}")
    return "\n".join(lines)
