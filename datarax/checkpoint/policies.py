"""What a checkpoint directory keeps (the newest steps and the best by a metric, as Orbax
policies) and what a run does when no step can be restored (`on_damaged`).

Retention keeps the `max_to_keep` newest steps and, with `keep_best=k`, also the k best by
`best_metric` (the value the trainer had when the step was saved): Orbax's own policies composed,
`AnyPreservationPolicy([LatestN(max_to_keep), BestN(k)])`, with Orbax's `best_fn` so that the
manager writes each step's metric and `best_step()` reads it back after a restart. A step saved
before the metric has a value is kept only while it is among the newest.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import orbax.checkpoint as ocp

from datarax.core.checks import check_int

ON_DAMAGED = ("refuse", "start_fresh")
BEST_MODES = ("min", "max")
# What `on_damaged=None` falls back to, so a command line run can choose without code changes.
ON_DAMAGED_ENV = "DATARAX_ON_DAMAGED_CHECKPOINTS"


class _MissingMetricsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "did not provide metrics" not in record.getMessage()


@contextlib.contextmanager
def quiet_missing_metrics():
    """Hides Orbax's warning for a step saved before the ranking metric has a value (an expected
    case here: such a step is kept only while it is among the newest)."""
    absl_logger, quiet = logging.getLogger("absl"), _MissingMetricsFilter()
    absl_logger.addFilter(quiet)
    try:
        yield
    finally:
        absl_logger.removeFilter(quiet)


def metric_value(metrics: dict) -> float:
    """Orbax's `best_fn`: a step's metrics hold exactly one value, the ranking metric's."""
    (value,) = metrics.values()
    return float(value)


def retention(max_to_keep: int | None, keep_best: int | None, best_mode: str):
    """The Orbax preservation policy: the newest `max_to_keep` (None: all), and the `keep_best` best."""
    policies = ocp.checkpoint_managers
    if max_to_keep is None:
        return None  # Orbax's default keeps every step
    latest = policies.LatestN(max_to_keep)
    if keep_best is None:
        return latest
    # BestN sorts ascending (descending with reverse) and keeps the last n: the largest for "max".
    best = policies.BestN(get_metric_fn=metric_value, reverse=best_mode == "min", n=keep_best,
                          keep_checkpoints_without_metrics=False)
    return policies.AnyPreservationPolicy([latest, best])


def check_max_to_keep(max_to_keep: Any) -> int | None:
    return check_int(max_to_keep, "max_to_keep", 1, allow_none=True, why=" (keep all)")


def check_best(keep_best: Any, best_metric: Any, best_mode: Any) -> tuple[int | None, str | None, str]:
    """(keep_best, best_metric, best_mode) checked: a metric named "eval/<name>" or "train/<name>",
    given exactly when keep_best is."""
    check_int(keep_best, "keep_best", 1, allow_none=True, why=" (None keeps only the newest)")
    if (keep_best is None) != (best_metric is None):
        raise ValueError(f"keep_best and best_metric go together, got keep_best={keep_best!r}, best_metric="
                         f"{best_metric!r}; e.g. keep_best=3, best_metric='eval/loss'")
    if best_metric is not None and (not isinstance(best_metric, str) or not best_metric.startswith(("eval/", "train/"))
                                    or best_metric.endswith("/")):
        raise ValueError(f"best_metric must be 'eval/<metric>' or 'train/<metric>', got {best_metric!r}")
    if best_mode not in BEST_MODES:
        raise ValueError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
    return keep_best, best_metric, best_mode


def resolve_on_damaged(on_damaged: str | None) -> str:
    """`on_damaged` checked; None becomes $DATARAX_ON_DAMAGED_CHECKPOINTS, else "refuse"."""
    where = "on_damaged"
    if on_damaged is None:
        on_damaged = os.environ.get(ON_DAMAGED_ENV) or "refuse"
        where = f"the environment variable {ON_DAMAGED_ENV}"
    if on_damaged not in ON_DAMAGED:
        raise ValueError(f"{where} must be 'refuse' or 'start_fresh', got {on_damaged!r}")
    return on_damaged
