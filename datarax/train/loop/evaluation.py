"""One evaluation epoch: its batches through the eval step, and their outputs reduced to metrics."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from datarax.train.callbacks.base import StepLogs
from datarax.train.loop.guardrails import batch_rows
from datarax.train.loop.step import CLU_STATE, RECORDS
from datarax.train.metrics.accumulated import Metric, add_totals, metric_scalars


def eval_epoch(pipeline: Any, values: list, step: Callable, causes: Any,
               report: Callable[[StepLogs], None]) -> tuple[list[dict], list]:
    """(outputs, valid records) of every batch of one epoch of `pipeline` through the eval `step`
    (a `TimedJit`), each batch reported as `StepLogs` (`on_eval_step_end`)."""
    outs, sizes = [], []
    iterator = iter(pipeline)
    try:
        while True:
            begin = time.perf_counter()
            batch = next(iterator, None)
            end = time.perf_counter()
            if batch is None:
                break
            out, compile_seconds = step(values, batch)
            rows = batch_rows(batch)
            sizes.append(out.pop(RECORDS, rows))  # the valid records, when some were skipped
            outs.append(out)
            cause = causes.cause(batch) if compile_seconds > 0 else None
            report(StepLogs(
                step=len(outs), batch_size=rows, data_wait=(begin, end), dispatched_at=time.perf_counter(),
                compile_seconds=compile_seconds, output=out["loss"], compile_cause=cause))
    finally:
        iterator.close()
    if not outs:
        raise ValueError("evaluate found no batches in the eval pipeline (an empty epoch); check its source")
    return outs, sizes


def eval_summary(outs: list[dict], sizes: list, metric_fns: Any) -> tuple[dict[str, float], dict[str, Any], int]:
    """(metrics, results, records) of an epoch: the loss and plain metric functions as means weighted by
    each batch's valid records (`sizes`), a `Metric`'s sums added before its one division (its full
    `result` in `results`), a CLU collection merged across batches; `records` the valid records."""
    collections = [out.pop(CLU_STATE) for out in outs if CLU_STATE in out]
    host = jax.device_get(outs)
    sizes = [int(size) for size in jax.device_get(sizes)]
    weights = np.asarray(sizes, np.float64) / max(1, sum(sizes))
    accumulated = {k: m for k, m in (metric_fns.items() if isinstance(metric_fns, Mapping) else ())
                   if isinstance(m, Metric)}
    metrics = {k: float(sum(w * float(o[k]) for w, o in zip(weights, host))) for k in host[0]
               if k not in accumulated}
    results = {}
    for name, metric in accumulated.items():
        totals = add_totals([o[name] for o in host])
        metrics.update(metric_scalars(name, metric, totals))
        results[name] = metric.result(totals)
    if collections:
        merged = functools.reduce(lambda a, b: a.merge(b), collections)
        metrics.update({k: float(v) for k, v in jax.device_get(merged.compute()).items() if k != "loss"})
    return metrics, results, int(sum(sizes))
