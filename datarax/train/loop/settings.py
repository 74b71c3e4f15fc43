"""The checks of the `Trainer`'s plain settings, shared with the `[trainer]` table of a configuration file."""

from __future__ import annotations

from typing import Any

from datarax.core.checks import check_bool, check_int
from datarax.train.loop.ema import check_decay
from datarax.train.loop.param_sharding import PARAM_SHARDINGS
from datarax.train.loop.precision import check_precision


def check_settings(*, accumulate_steps: Any = 1, steps_per_execution: Any = 1, precision: Any = "f32",
                   param_sharding: Any = None, ema_decay: Any = None, allow_config_change: Any = False,
                   train_pipeline_params: Any = False) -> None:
    """Raises the `Trainer`'s error for the first setting that is out of its range."""
    check_bool(train_pipeline_params, "train_pipeline_params")
    check_bool(allow_config_change, "allow_config_change")
    check_int(accumulate_steps, "accumulate_steps", 1, why=" (micro-batches per step)")
    check_int(steps_per_execution, "steps_per_execution", 1, why=" (optimizer steps per jitted call)")
    check_precision(precision)
    if param_sharding is not None and param_sharding not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding must be one of {PARAM_SHARDINGS} or None, got {param_sharding!r}")
    if ema_decay is not None:
        check_decay(ema_decay)
