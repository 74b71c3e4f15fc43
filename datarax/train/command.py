"""`datarax train CONFIG` (the command line dispatches here): run the configured trainer; rerunning
resumes from the newest checkpoint.

Resuming needs `trainer.checkpoint_dir`: the checkpoint callback restores the newest readable
checkpoint when training begins, and targets are totals counted from step 0, so an interrupted run
continues to the same end. SIGTERM/SIGINT stop after the current step with a final checkpoint; the
exit status is then 128 + the signal number, so a scheduler sees the run as interrupted.

A progress display on stderr (a bar on a terminal, a plain line every 30 s when piped), a goodput
monitor and a JSON-lines metric logger are added unless the configuration lists its own.
`result.json` holds the final step, metrics, evaluation metrics and `params_sha256`, a hash of the
model's final state (equal hashes: bitwise-equal weights), and the guard's incidents; `run.json`,
written before training, is what `datarax replay RUN_DIR --step N` rebuilds a step's batch from
(`datarax.train.replay`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from datarax.checkpoint.hashing import state_sha256
from datarax.monitoring.writers import JsonlWriter
from datarax.train.callbacks import GoodputMonitor, MetricLogger, ProgressBar
from datarax.train.config import build_trainer, run_dir_of
from datarax.train.pretrained.finetune import finetune_summary
from datarax.train.replay import write_run_file


def default_callbacks(configured: Sequence[Any], run_dir: str, *, progress: bool | None) -> list[Any]:
    """A progress display (a bar on a terminal, plain lines otherwise; none with `progress=False`),
    a goodput monitor writing goodput.json/png and a metric logger writing metrics.jsonl into
    `run_dir`, for those kinds the configuration does not list."""
    names = {spec.factory for spec in configured}
    extra = []
    if ProgressBar not in names and progress is not False:
        extra.append(ProgressBar(mode="bar" if progress else "auto", file=sys.stderr))
    if GoodputMonitor not in names:
        extra.append(GoodputMonitor(run_dir, plot=importlib.util.find_spec("matplotlib") is not None, verbose=False))
    if MetricLogger not in names:
        extra.append(MetricLogger([JsonlWriter(os.path.join(run_dir, "metrics.jsonl"))]))
    return extra


def write_result(path: str, result: dict) -> None:
    """Writes result.json atomically (a crash never leaves half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def train(spec: Any, *, progress: bool | None = None) -> tuple[int, str]:
    """Builds and fits the trainer, writing the run's artefacts; (exit status, report text)."""
    if spec.trainer is None:
        build_trainer(spec)  # raises the "add a [trainer] table" error
    run_dir = run_dir_of(spec)
    os.makedirs(run_dir, exist_ok=True)
    run = build_trainer(spec, extra_callbacks=default_callbacks(spec.trainer.callbacks, run_dir, progress=progress))
    write_run_file(spec, run.run_dir, run.trainer.train_pipeline, run.checkpoint_dir)
    if run.finetune is not None:  # before the run, which may be long; the report repeats it
        print(f"datarax: finetune: {finetune_summary(run.finetune)}", file=sys.stderr)
    began = time.perf_counter()
    with run.trainer:  # the reader thread stops before the process exits (none left in native code)
        result = run.fit()
    report = next((cb.report for cb in run.trainer.callbacks if isinstance(getattr(cb, "report", None), dict)
                   and "diagnosis" in cb.report), None)
    goodput = None if report is None else str(report["diagnosis"])
    guard = run.trainer.guard
    write_result(os.path.join(run.run_dir, "result.json"), {
        "config": os.path.abspath(spec.path), "step": result.step, "num_steps": run.num_steps,
        "num_epochs": run.num_epochs, "resumed_from": result.resumed_from, "stop_reason": result.stop_reason,
        "metrics": result.metrics, "eval_metrics": result.eval_metrics,
        "eval_records": run.trainer.last_eval_records if result.eval_metrics else None, "goodput": goodput,
        "params_sha256": state_sha256(run.trainer.model), "checkpoint_dir": run.checkpoint_dir,
        "finetune": run.finetune, "wall_s": time.perf_counter() - began,
        "skipped_steps": None if guard is None else list(guard.skipped),
        "incidents": None if guard is None else list(guard.incidents)})
    lines = [f"config       {spec.path}"]
    if run.finetune is not None:
        lines.append(f"finetune     {finetune_summary(run.finetune)}")
    resumed = result.resumed_from
    if resumed is not None:
        lines.append(f"resumed      from the checkpoint at step {resumed}")
    target = f"{run.num_steps} steps" if run.num_steps is not None else f"{run.num_epochs} epochs"
    lines.append(f"trained      to step {result.step} (target {target})")
    if result.metrics:
        lines.append("metrics      " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(result.metrics.items())))
    if result.eval_metrics:
        lines.append("evaluation   " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(result.eval_metrics.items()))
                     + f" ({run.trainer.last_eval_records} records)")
    if goodput:
        # Every sentence of the report (headline, verdict, evaluation, across runs), one per line.
        text = str(report.get("text") or goodput).replace("\n", "\n             ")
        lines.append(f"goodput      {text}")
    if guard is not None and guard.summary() is not None and not goodput:
        lines.append(f"guard        {guard.summary()}")
    lines.append(f"run files    {run.run_dir} (metrics.jsonl, goodput.json, result.json, run.json)")
    if run.checkpoint_dir:
        lines.append(f"checkpoints  {run.checkpoint_dir} (run again to resume)")
    status = 0
    if result.stop_reason is not None:
        lines.append(f"stopped      early: {result.stop_reason} (a final checkpoint was saved if checkpointing is on)")
        signum = getattr(signal.Signals, str(result.stop_reason), None)
        status = 128 + int(signum) if signum is not None else 1
    return status, "\n".join(lines)
