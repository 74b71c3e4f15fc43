"""What every recipe shares: the command line, the trainer set-up, result.json and plots.

A recipe is `python -m recipes.<name> [--workdir DIR] [--quick] [--seed N]`. It trains one or
more models with `datarax.train.Trainer` (a goodput monitor on every run, and an Orbax checkpoint
callback unless the recipe turns it off), writes `DIR/result.json` with its metrics and a PNG
plot, and prints a summary. Running it again with the same `--workdir` resumes every run from its
latest checkpoint (a finished run is restored and only re-evaluated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.train import ConsoleWriter, JsonlWriter, Trainer
from datarax.train.callbacks import (
    Callback,
    CheckpointCallback,
    CheckpointInfo,
    GoodputMonitor,
    MetricLogger,
    ProgressBar,
)

DEFAULT_ROOT = Path("runs")


def parse_args(name: str, description: str, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The recipe command line: --workdir, --quick, --seed, --steps and --no-compile-cache.

    `extra(parser)` may add recipe-specific options.
    """
    parser = argparse.ArgumentParser(prog=f"python -m recipes.{name}", description=description)
    parser.add_argument("--workdir", default=None,
                        help=f"checkpoints, logs, result.json and plots go here (default runs/{name}, or "
                             f"runs/{name}-quick with --quick); rerun with the same DIR to resume")
    parser.add_argument("--quick", action="store_true", help="a small configuration that finishes in under a minute")
    parser.add_argument("--seed", type=int, default=0, help="base random seed")
    parser.add_argument("--steps", type=int, default=None, help="override the number of training steps per run")
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="do not keep compiled programs in DIR/jax_cache (the cache makes reruns start fast)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.workdir is None:
        args.workdir = str(DEFAULT_ROOT / (f"{name}-quick" if args.quick else name))
    return args


QUICK_XLA_FLAG = "--xla_backend_optimization_level=0"
# Checkpoint interval on an accelerator (train_run's default there): runs a CPU takes minutes over
# take seconds on a chip, where step-count intervals would save faster than a write completes.
ACCELERATOR_CHECKPOINT_SECS = 60.0
_quick = False  # set by prepare_workdir; --quick changes train_run's defaults (see there)


def prepare_workdir(args: argparse.Namespace, fast_compile: bool = True) -> Path:
    """Creates the work directory, removes a stale result.json and turns on the compile cache.

    With --quick, XLA compiles with its backend optimisations off (unless XLA_FLAGS already sets
    the level, or `fast_compile` is False): on a small CPU that cuts the compile time, which
    dominates a short run, by about a third, at the price of slower steps (a recipe whose quick
    run is dominated by its steps, such as crepe_finetune's convolutions, passes False); and
    `train_run` saves one checkpoint per run (at its end) and draws no goodput.png unless told
    otherwise. Call this before any JAX computation.
    """
    global _quick
    _quick = bool(args.quick)
    if args.quick and fast_compile and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {QUICK_XLA_FLAG}".strip()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "result.json").unlink(missing_ok=True)
    if not args.no_compile_cache:
        # Every run of a recipe (and every rerun) with the same program loads it instead of compiling.
        jax.config.update("jax_compilation_cache_dir", str(workdir / "jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return workdir


@dataclasses.dataclass
class RunOutcome:
    """What `train_run` returns besides the trainer.

    Attributes:
        step: the step the run reached.
        resumed_from: the checkpoint step it resumed from, or None for a fresh start.
        train_metrics: the final step's metrics.
        eval_metrics: the evaluation after training ({} without an eval pipeline).
        eval_before: the evaluation of the freshly built model, before any restore or step
            ({} unless asked for).
        goodput: the compact goodput summary of this invocation (see `goodput_digest`).
        seconds: wall time of this invocation of the run.
        best_step: with `keep_best`, the step restored before `eval_metrics` were taken (the
            lowest validation `keep_best` metric among the evaluated steps).
    """

    step: int
    resumed_from: int | None
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    eval_before: dict[str, float]
    goodput: dict[str, Any]
    seconds: float
    best_step: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def goodput_digest(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The few goodput figures a recipe prints and records: diagnosis, buckets, throughput."""
    if not report or not report.get("steps"):
        return {"steps": 0, "diagnosis": (report or {}).get("diagnosis", "no steps ran (restored a finished run)")}
    steady = report.get("steady") or {}
    return {
        "steps": report["steps"],
        "wall_s": report.get("wall_s"),
        "diagnosis": report.get("diagnosis"),
        "buckets_pct": report.get("buckets_pct", {}),
        "compile_s": report.get("compile_s"),
        "first_batch_s": report.get("first_batch_s"),
        "checkpoint_save_s": report.get("checkpoint_save_s"),
        "steady_el_per_s": steady.get("achieved_el_s"),
        "step_consumes_el_per_s": steady.get("step_consumes_el_s"),
        "steady_step_ms": 1000 * steady["step_time_s"] if "step_time_s" in steady else None,
        "steady_busy_pct": steady.get("goodput_pct"),
        "steady_s": steady.get("span_s"),
        "steps_per_call": report["steps"] / report["calls"] if report.get("calls") else None,
    }


def describe_goodput(digest: Mapping[str, Any]) -> str:
    """One or two printable lines for a goodput digest."""
    if not digest.get("steps"):
        return f"goodput: {digest['diagnosis']}"
    pct = digest["buckets_pct"]
    parts = ", ".join(f"{k} {v:.1f}%" for k, v in pct.items() if v >= 0.05)
    rate = digest.get("steady_el_per_s")
    rate_text = f"{rate:,.0f} el/s" if rate is not None and math.isfinite(rate) else "n/a"
    busy = digest.get("steady_busy_pct")
    steady = "" if busy is None else (
        f"; steady: device busy {busy:.1f}% of {digest['steady_s']:.2f} s, {digest['steady_step_ms']:.2f} ms a step"
        + (f" ({digest['steps_per_call']:.3g} steps a call)" if (digest.get("steps_per_call") or 1) > 1 else ""))
    return (f"goodput: {parts} of {digest['wall_s'] or 0:.1f} s wall{steady}; steady throughput {rate_text}\n"
            f"         {digest['diagnosis']}")


def train_run(run_dir: Path, model: nnx.Module, optimizer: optax.GradientTransformation, pipeline: Pipeline,
              loss_fn: Callable, *, steps: int, eval_pipeline: Pipeline | None = None,
              metrics: Mapping[str, Callable] | None = None, joint: bool = False, checkpoint_every: int | None = None,
              log_every: int | None = None, label: str = "", callbacks: Sequence[Callback] = (),
              eval_before: bool = False, checkpoint: bool = True, goodput_plot: bool | None = None,
              eval_every: int | None = None, keep_best: str | None = None,
              steps_per_execution: int = 1) -> tuple[Trainer, RunOutcome]:
    """Trains one model with checkpoints (resuming from `run_dir/checkpoints`) and a goodput monitor.

    Args:
        run_dir: this run's directory (checkpoints, metrics.jsonl, goodput.json/png).
        model, optimizer, pipeline, loss_fn, eval_pipeline, metrics, joint: as for `datarax.train.Trainer`
            (`joint` is `train_pipeline_params`).
        steps: total steps to reach (a resumed run stops where an uninterrupted one would).
        checkpoint_every: steps between checkpoints (default: four per run; with --quick, one, at the end:
            the run still resumes from it, and short runs do not spend their time saving; on an
            accelerator, every `ACCELERATOR_CHECKPOINT_SECS` of training and at the end: there a
            step is 10-100x faster than on the CPU, and a quarter of a run can be shorter than one
            checkpoint write, which would then hold the chip up).
        log_every: steps between metric lines (default: ten per run).
        label: a prefix for printed lines.
        callbacks: more callbacks for the trainer.
        eval_before: also evaluate the model as built, before training (and before a resume
            restores it), e.g. to report the untrained loss.
        checkpoint: save Orbax checkpoints (and resume from them). A recipe that trains hundreds
            of few-second runs turns this off and resumes at run granularity instead: the saves
            would cost more than the runs.
        goodput_plot: draw the run's goodput.png (with matplotlib); the goodput.json is always written.
            Default: draw it, except with --quick (about a second a run, longer than many quick runs train).
        eval_every: evaluate `eval_pipeline` every this many steps while training.
        keep_best: with `eval_every`, a metric such as "eval/perplexity": a checkpoint is saved at
            every evaluation, the best by this metric (lowest) is kept beside the latest
            (`CheckpointCallback(keep_best=1)`), and it is restored after training, so
            `eval_metrics` and the returned trainer hold the best evaluated step, not the last.
        steps_per_execution: optimizer steps per jitted call (`Trainer(steps_per_execution=...)`);
            the default checkpoint and log intervals are rounded to multiples of it, so they land
            on their steps.
    """
    if keep_best is not None and (eval_every is None or eval_pipeline is None or not checkpoint):
        raise ValueError("train_run: keep_best needs eval_every, an eval_pipeline and checkpoint=True")
    # Absolute, so the paths the recipe prints and writes into result.json do not depend on the cwd.
    run_dir = Path(run_dir).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    best = {"keep_best": 1, "best_metric": keep_best} if keep_best is not None else {}
    if keep_best is not None:
        every = {"every_steps": eval_every}
    elif checkpoint_every is not None:
        every = {"every_steps": checkpoint_every}
    elif _quick or not on_accelerator():
        every = {"every_steps": call_multiple(steps if _quick else steps // 4, steps_per_execution)}
    else:
        every = {"every_secs": ACCELERATOR_CHECKPOINT_SECS}
    checkpoints = [CheckpointCallback(run_dir / "checkpoints", **every, max_to_keep=2, **best)] if checkpoint else []
    if goodput_plot is None:
        goodput_plot = not _quick
    goodput = GoodputMonitor(run_dir, plot=goodput_plot and plotting_available(), verbose=False)
    logger = MetricLogger([_PrefixedConsole(label), JsonlWriter(run_dir / "metrics.jsonl")],
                          every_steps=log_every or call_multiple(steps // 10, steps_per_execution))
    shown = [_AnnounceResume(label)]
    if sys.stderr.isatty():  # a progress bar (with "compiling" before the first step) on a terminal only
        shown.append(ProgressBar())
    trainer = Trainer(model, optimizer, pipeline, loss_fn, eval_pipeline=eval_pipeline, metrics=metrics,
                      callbacks=[*checkpoints, goodput, logger, *shown, *callbacks], train_pipeline_params=joint,
                      eval_every_steps=eval_every, steps_per_execution=steps_per_execution)
    began = time.perf_counter()
    before = trainer.evaluate() if eval_before and eval_pipeline is not None else {}
    with trainer:  # the training reader stops here, not at interpreter exit
        result = trainer.fit(num_steps=steps)
    if result.stop_reason is not None:
        print(f"{label}stopped by {result.stop_reason} at step {result.step}; the checkpoint is saved, run the "
              "same command again to resume", flush=True)
        raise SystemExit(0)
    best_step = None
    if keep_best is not None:
        shown[0].trained = True
        restored = checkpoints[0].load_best(trainer)
        if restored is None:
            raise RuntimeError(f"{label}no checkpoint in {run_dir / 'checkpoints'} carries {keep_best}")
        best_step = restored.step
    eval_metrics = trainer.evaluate() if eval_pipeline is not None else {}
    outcome = RunOutcome(result.step, result.resumed_from, dict(result.metrics), eval_metrics, before,
                         goodput_digest(goodput.report), time.perf_counter() - began, best_step)
    return trainer, outcome


def on_accelerator() -> bool:
    """Whether JAX runs on an accelerator (train_run's checkpoint rule; a test or probe may replace it)."""
    return jax.default_backend() != "cpu"


def call_multiple(interval: int, steps_per_execution: int) -> int:
    """`interval` rounded to the nearest multiple of `steps_per_execution` (at least one call)."""
    return max(1, round(interval / steps_per_execution)) * steps_per_execution


class _AnnounceResume(Callback):
    """Prints the resume when it happens, before any training log of the resumed run."""

    def __init__(self, label: str):
        self.label = label
        self.trained = False  # set once training is over: a restore then brings back the best step

    def on_checkpoint_restore(self, trainer: Trainer, info: CheckpointInfo) -> None:
        what = "restored the best validation step" if self.trained else "resumed from checkpoint step"
        print(f"{self.label}{what} {info.step} ({info.seconds:.2f} s to restore)", flush=True)


class _PrefixedConsole(ConsoleWriter):
    """A console writer whose lines start with the run's label."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        parts = " | ".join(f"{k} {v:.4g}" for k, v in sorted(scalars.items()))
        print(f"{self.label}step {step} | {parts}", flush=True)


def _finite(value: Any, where: str) -> Any:
    """Checks that every float in `value` is finite (metrics that are NaN must fail loudly)."""
    if isinstance(value, Mapping):
        return {k: _finite(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"result {where} is {value}: the recipe diverged or measured nothing; see the log above")
    return value


def _jsonable(value: Any) -> Any:
    """Like `_finite` but turns non-finite floats into None (for diagnostics such as rates)."""
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_result(workdir: Path, name: str, metrics: Mapping[str, Any], details: Mapping[str, Any],
                 args: argparse.Namespace) -> Path:
    """Writes `workdir/result.json` atomically.

    `metrics` are the headline numbers and must be finite; `details` (per-run records, goodput,
    configuration) may hold None for figures that do not exist.
    """
    record = {"recipe": name, "quick": bool(args.quick), "seed": args.seed,
              "command": " ".join(["python -m", f"recipes.{name}"] + sys.argv[1:]),
              "metrics": _finite(dict(metrics), "metrics"), **_jsonable(dict(details))}
    path = workdir / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend, or None when matplotlib is missing."""
    if not plotting_available():
        print("matplotlib is not installed: no plot written (pip install matplotlib)", flush=True)
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)


def read_curve(run_dir: Path, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` from a run's metrics.jsonl; later lines win (resumed runs repeat steps)."""
    path = run_dir / "metrics.jsonl"
    values: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if key in row:
                values[int(row["step"])] = float(row[key])
    steps = sorted(values)
    return steps, [values[s] for s in steps]


def mean_std(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value), min and max."""
    x = np.asarray(values, np.float64)
    return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max()), "n": len(values)}


def interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean and the half-width of its two-sided t-interval over seeds (`None` for one value).

    `mean +- half` is the usual small-sample interval, `t_{(1+level)/2, n-1} * sd / sqrt(n)`.
    """
    from scipy import stats

    x = np.asarray(values, np.float64)
    n = len(x)
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    return {"mean": float(x.mean()), "half": half, "n": n, "values": [float(v) for v in x]}


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """The per-seed differences `a - b`, their mean with its t-interval, and how many are > 0 / < 0."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    out = interval(d, level)
    out |= {"positive": int((d > 0).sum()), "negative": int((d < 0).sum())}
    return out


def describe_interval(stats: Mapping[str, Any], digits: int = 2) -> str:
    """`mean +- half` (or the mean alone for one seed)."""
    if stats["half"] is None:
        return f"{stats['mean']:.{digits}f} (one seed)"
    return f"{stats['mean']:.{digits}f} +- {stats['half']:.{digits}f}"
