"""`datarax train CONFIG` (the command line dispatches here): run the configured trainer; rerunning resumes from the newest checkpoint.

Resuming needs `trainer.checkpoint_dir`: the trainer's checkpoint callback restores the newest
readable checkpoint (model, optimizer and data iterator) when training begins, and targets are
totals counted from step 0, so an interrupted run continues to the same end. SIGTERM/SIGINT stop
after the current step with a final checkpoint; the exit status is then 128 + the signal number
(so a scheduler sees the run as interrupted and can restart it).

A progress bar (stderr, when it is a terminal) and a goodput monitor are added unless the
configuration lists its own.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

from datarax.train.callbacks import GoodputMonitor, ProgressBar
from datarax.train.config import build_trainer


def default_callbacks(configured: Sequence[Any], *, progress: bool | None) -> list[Any]:
    """A progress bar and a goodput monitor, for those kinds the configuration does not list."""
    names = {spec.factory for spec in configured}
    extra = []
    progress_cls = ProgressBar
    show = sys.stderr.isatty() if progress is None else progress
    if progress_cls not in names and show:
        try:
            extra.append(progress_cls())
        except ImportError:  # tqdm missing: training works without a bar
            pass
    goodput_cls = GoodputMonitor
    if goodput_cls not in names:
        extra.append(goodput_cls(plot=False, verbose=False))
    return extra


def _goodput_line(callbacks: Sequence[Any]) -> str | None:
    for cb in callbacks:
        report = getattr(cb, "report", None)
        if isinstance(report, dict) and "diagnosis" in report:
            return str(report["diagnosis"])
    return None


def _resumed_step(callbacks: Sequence[Any]) -> int | None:
    for cb in callbacks:
        restored = getattr(cb, "restored", None)
        if restored is not None:
            return int(restored.step)
    return None


def train(spec: Any, *, progress: bool | None = None) -> tuple[int, str]:
    """Builds and fits the trainer; (exit status, report text)."""
    if spec.trainer is not None:
        extra = default_callbacks(spec.trainer.callbacks, progress=progress)
    else:
        extra = []
    run = build_trainer(spec, extra_callbacks=extra)
    result = run.fit()
    callbacks = list(run.trainer.callbacks)
    lines = [f"config       {spec.path}"]
    resumed = _resumed_step(callbacks)
    if resumed is not None:
        lines.append(f"resumed      from the checkpoint at step {resumed}")
    target = f"{run.num_steps} steps" if run.num_steps is not None else f"{run.num_epochs} epochs"
    lines.append(f"trained      to step {result.step} (target {target})")
    if result.metrics:
        lines.append("metrics      " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(result.metrics.items())))
    goodput = _goodput_line(callbacks)
    if goodput:
        lines.append(f"goodput      {goodput}")
    if run.checkpoint_dir:
        lines.append(f"checkpoints  {run.checkpoint_dir} (run again to resume)")
    status = 0
    if result.stop_reason is not None:
        lines.append(f"stopped      early: {result.stop_reason} (a final checkpoint was saved if checkpointing is on)")
        signum = getattr(signal.Signals, str(result.stop_reason), None)
        status = 128 + int(signum) if signum is not None else 1
    return status, "\n".join(lines)
