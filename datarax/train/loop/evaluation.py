"""One evaluation epoch's per-batch outputs reduced to its metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from datarax.train.loop.step import CLU_STATE
from datarax.train.metrics.accumulated import Metric, add_totals, metric_scalars


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
        merged = collections[0]
        for collection in collections[1:]:
            merged = merged.merge(collection)
        metrics.update({k: float(v) for k, v in jax.device_get(merged.compute()).items() if k != "loss"})
    return metrics, results, int(sum(sizes))
