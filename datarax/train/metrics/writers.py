"""The experiment trackers' metric writers: TensorBoard, Weights & Biases, MLflow.

A writer is anything with `write_scalars(step, scalars)` (and optionally `flush()`/`close()`), the
interface of `clu.metric_writers.MetricWriter`, so a CLU writer can be passed as is; the console
and JSON-lines writers, shared with the pipeline monitor, are `datarax.monitoring.writers`.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datarax.core.checks import require
from datarax.core.construct import resolve_config


def _summary_writer_class():
    for module in ("tensorboardX", "torch.utils.tensorboard"):
        try:
            return importlib.import_module(module).SummaryWriter
        except ImportError:
            pass
    raise ImportError("TensorBoardWriter needs a TensorBoard event writer: pip install tensorboardX "
                      "(torch.utils.tensorboard also works)")


def tensorboard_available() -> bool:
    """Whether an event writer package is installed (checked without importing it: torch is slow to import)."""
    def found(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return found("tensorboardX") or (found("torch") and found("tensorboard"))


class TensorBoardWriter:
    """Writes scalars as TensorBoard events into `logdir` (tensorboardX or torch.utils.tensorboard)."""

    def __init__(self, logdir: Any):
        self._writer = _summary_writer_class()(str(logdir))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, float(value), int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


WANDB_MODES = ("offline", "online", "disabled")


def _check_strings(config: Any, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    for field in required + optional:
        value = getattr(config, field)
        if (value is not None or field in required) and not (isinstance(value, str) and value):
            raise ValueError(f"{type(config).__name__}.{field} must be a non-empty string, got {value!r}")


@dataclasses.dataclass(frozen=True)
class WandbWriterConfig:
    """Where `WandbWriter` logs.

    Attributes:
        project: the Weights & Biases project.
        name: the run's display name (default: one wandb makes up).
        run_id: the run's id; a rerun with the same id continues that run (`resume="allow"`),
            as a resumed training run should (default: a new id each time).
        dir: the folder wandb writes its `wandb/` run folders into (default: the working directory).
        mode: "offline" (the default: the run is written to `dir` only, `wandb sync` uploads it
            later), "online" or "disabled".
    """

    project: str
    name: str | None = None
    run_id: str | None = None
    dir: str | None = None
    mode: str = "offline"

    def __post_init__(self):
        _check_strings(self, ("project",), ("name", "run_id", "dir"))
        if self.mode not in WANDB_MODES:
            raise ValueError(f"WandbWriterConfig.mode must be one of {WANDB_MODES}, got {self.mode!r}")


class WandbWriter:
    """Logs scalars to a Weights & Biases run (`pip install 'datarax[wandb]'`), started when the writer is made.

    The run finishes at `close()` or the process's exit (the trainer does not close writers: one may
    outlive a `fit`). Each `write_scalars` is one `run.log(scalars, step=step)`; wandb merges a step's
    train and eval scalars into one history row and ignores a step lower than one it has (a resumed
    run's repeated steps). Settings: those of `WandbWriterConfig`.

    Example:
        >>> writer = WandbWriter(project="exp1", dir="runs/exp1")  # doctest: +SKIP
    """

    def __init__(self, config: WandbWriterConfig | None = None, **settings: Any):
        self.config = resolve_config(WandbWriterConfig, config, settings, "WandbWriter")
        wandb = require("wandb", owner="WandbWriter", extra="wandb")
        cfg = self.config
        if cfg.dir is not None:
            Path(cfg.dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=cfg.project, name=cfg.name, id=cfg.run_id, dir=cfg.dir, mode=cfg.mode,
                              resume="allow" if cfg.run_id is not None else None,
                              settings=wandb.Settings(silent=True, console="off"))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log({k: float(v) for k, v in scalars.items()}, step=int(step))

    def flush(self) -> None:
        pass  # wandb writes in its own process; `close` waits for it

    def close(self) -> None:
        self.run.finish()
        wandb = require("wandb", owner="WandbWriter", extra="wandb")
        if wandb.run is None:
            # `finish` can return before wandb's service has written the run's file; with no other
            # run open, stopping the service waits for it, so the run is complete on disk now.
            wandb.teardown()


@dataclasses.dataclass(frozen=True)
class MlflowWriterConfig:
    """Where `MlflowWriter` logs.

    Attributes:
        tracking_uri: the MLflow tracking store, e.g. "sqlite:///mlflow.db", "file:///abs/mlruns"
            (MLflow 3 refuses a file store unless `MLFLOW_ALLOW_FILE_STORE=true` is set) or a
            server's "http://host:5000".
        experiment: the experiment's name (created when missing).
        run_name: the run's name (default: one MLflow makes up).
        run_id: log into this existing run instead of creating one (a resumed training run).
    """

    tracking_uri: str
    experiment: str = "Default"
    run_name: str | None = None
    run_id: str | None = None

    def __post_init__(self):
        _check_strings(self, ("tracking_uri", "experiment"), ("run_name", "run_id"))


class MlflowWriter:
    """Logs scalars as metrics of an MLflow run (`pip install 'datarax[mlflow]'`), with its own `MlflowClient`.

    MLflow's global active run is left alone. Each `write_scalars` is one `log_batch` of all its
    scalars at `step`; `close()` (or the process's exit) marks the run finished. `run_id` is the run's
    id (to resume into it, or to read it back). Settings: those of `MlflowWriterConfig`.

    Example:
        >>> writer = MlflowWriter(tracking_uri="sqlite:///mlflow.db", experiment="exp1")  # doctest: +SKIP
    """

    def __init__(self, config: MlflowWriterConfig | None = None, **settings: Any):
        self.config = resolve_config(MlflowWriterConfig, config, settings, "MlflowWriter")
        tracking = require("mlflow.tracking", owner="MlflowWriter", extra="mlflow", package="mlflow")
        self._entities = require("mlflow.entities", owner="MlflowWriter", extra="mlflow", package="mlflow")
        cfg = self.config
        self.client = tracking.MlflowClient(tracking_uri=cfg.tracking_uri)
        if cfg.run_id is not None:
            self.run_id = cfg.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(cfg.experiment)
            experiment_id = experiment.experiment_id if experiment is not None else \
                self.client.create_experiment(cfg.experiment)
            self.run_id = self.client.create_run(experiment_id, run_name=cfg.run_name).info.run_id
        self._open = True
        atexit.register(self.close)  # the trainer does not close writers: mark the run finished at exit

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._entities.Metric(k, float(v), now, int(step)) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def flush(self) -> None:
        pass  # log_batch returns once the store has the metrics

    def close(self) -> None:
        if self._open:
            self._open = False
            atexit.unregister(self.close)
            self.client.set_terminated(self.run_id)
