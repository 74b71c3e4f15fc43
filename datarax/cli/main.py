"""The `datarax` command line: run, train, replay, validate, inspect, preview, materialize, bench, version.

Configuration commands take `--set key.path=value` (repeatable) and `--allow MODULE` (repeatable);
bad input exits 1 with one line per problem on stderr, usage errors exit 2. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

PROG = "datarax"


def _config_parser(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("config", help="a TOML configuration file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value, e.g. --set batch_size=64 --set 'stages[1].brightness.max_delta=0.3'")
    parser.add_argument("--allow", dest="allow", action="append", default=[], metavar="MODULE",
                        help="a module of yours (with its submodules) that the file may name by import path, "
                             "added to its allow list; repeatable or comma-separated")
    return parser


def _progress(args) -> bool | None:
    return False if getattr(args, "no_progress", False) else None


def _load_spec(args):
    """The validated configuration; the training kit is loaded first so a `[trainer]` table validates."""
    import datarax.train.config  # noqa: F401 - imported to register [trainer] and the callback kind
    from datarax.config import load_spec

    allow = [name.strip() for text in args.allow for name in text.split(",") if name.strip()]
    return load_spec(args.config, overrides=args.overrides, allow=allow)


def cmd_validate(args) -> int:
    """Checks the file, then builds what it describes as `train` would (`check_pipeline`: files
    read only as far as checking needs; the model abstractly, the loss traced on the batch)."""
    from datarax.cli.describe import spec_text
    from datarax.config.build import check_pipeline

    spec = _load_spec(args)
    short: list[str] = []
    pipelines = check_pipeline(spec, short)
    if spec.trainer is not None:
        from datarax.train.config import check_trainer
        from datarax.train.loop.guardrails import check_training_pipeline

        check_trainer(spec, pipelines[0])
        # What training would warn about, said now (as warnings: the file is still OK); the epoch's
        # short batch only when the whole training data was read.
        check_training_pipeline(pipelines[0], epoch_known=not short)
    shape = (f"DAG of {len(spec.dag.nodes)} nodes" if spec.dag is not None else f"{len(spec.stages)} stage(s)")
    hosts = len(spec.host_stages)
    if hosts:
        device = shape if spec.dag is not None else f"{len(spec.stages) - hosts} stage(s)"
        shape = f"{hosts} host stage(s) + {device}"
    extras = [name for name, present in (("sampler", spec.sampler), ("sharding", spec.sharding),
                                         ("eval", spec.eval), ("trainer", spec.trainer)) if present is not None]
    print(f"{args.config}: OK ({spec.source.name} source, {shape}, batch_size {spec.run.batch_size}"
          + (f", with {', '.join(extras)}" if extras else "") + ")")
    print(f"  batch: {spec_text(pipelines[0].output_spec())}")
    if len(pipelines) > 1:
        print(f"  eval batch: {spec_text(pipelines[1].output_spec())}")
    for line in spec.overrides:
        print(f"  override: {line}")
    return 0


def cmd_inspect(args) -> int:
    from datarax.cli.describe import describe
    from datarax.config import build_pipeline

    spec = _load_spec(args)
    pipeline = build_pipeline(spec)
    labels = [f"stages[{i}] {s.name}" for i, s in enumerate(spec.stages)]
    text = describe(pipeline, config_path=args.config, stage_labels=labels, dag=spec.dag is not None)
    if spec.eval is not None:
        evaluation = build_pipeline(spec.eval)
        labels = [f"eval.stages[{i}] {s.name}" for i, s in enumerate(spec.eval.stages)]
        text += "\n\n[eval]\n" + describe(evaluation, stage_labels=labels, dag=spec.eval.dag is not None)
    print(text)
    return 0


def cmd_preview(args) -> int:
    from datarax.cli.preview import write_preview
    from datarax.config import build_pipeline

    spec = _load_spec(args)
    pipeline = build_pipeline(spec)
    out = args.out if args.out is not None else os.path.splitext(args.config)[0] + "-preview.png"
    report = write_preview(pipeline, out, count=args.n, field=args.field, label=args.label)
    print(report)
    return 0


def cmd_run(args) -> int:
    from datarax.cli.run import format_report, run_pipeline
    from datarax.config import build_pipeline

    spec = _load_spec(args)
    epochs = args.epochs if args.epochs is not None else spec.run.epochs
    report = run_pipeline(lambda: build_pipeline(spec), epochs=epochs, max_batches=args.batches,
                          progress=_progress(args))
    if args.json:
        print(json.dumps({"config": args.config, **report.as_dict()}))
    else:
        print(format_report(report, args.config))
    return 0


def cmd_train(args) -> int:
    from datarax.cli.wording import config_terms
    from datarax.train.command import train

    spec = _load_spec(args)
    status, text = train(spec, progress=_progress(args))
    print(config_terms(text))
    return status


def cmd_replay(args) -> int:
    """Prints the batch of step `--step` of the run in RUN_DIR (`datarax.cli.replay`)."""
    from datarax.cli.replay import replay_command
    from datarax.cli.wording import config_terms

    if args.step < 1:
        raise ValueError(f"--step must be a training step >= 1 (steps count from 1), got {args.step}")
    print(config_terms(replay_command(args.run_dir, args.step, out=args.out, show=args.show, field=args.field)))
    return 0


BENCH_FROM_CHECKOUT = ("the benchmark suite is not installed with datarax; it runs from a source checkout: "
                       "run `datarax bench` (or `python -m benchmarks`) in the repository's root folder")


def _benchmarks_folder() -> str:
    """The checkout holding `benchmarks/`: the working directory, else the one datarax is installed from."""
    import datarax

    candidates = [os.getcwd(), os.path.dirname(os.path.dirname(os.path.abspath(datarax.__file__)))]
    for root in candidates:
        if os.path.isfile(os.path.join(root, "benchmarks", "__main__.py")):
            return root
    raise RuntimeError(BENCH_FROM_CHECKOUT)


def cmd_bench(argv: Sequence[str]) -> int:
    """Runs `python -m benchmarks ARGV` in the checkout, as its own process (its parser, help and rows)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=_benchmarks_folder()).returncode


def cmd_materialize(argv: Sequence[str]) -> int:
    """`datarax materialize ...`: `datarax.host.decode_once.materialize_main` (its parser, help and summary)."""
    from datarax.host.decode_once import materialize_main

    return materialize_main(argv)


def version_text() -> str:
    """`datarax 0.1.0 (jax 0.10.2, flax 0.12.8, python 3.11.7)`, read from package metadata, so
    answering it imports neither JAX nor Flax."""
    import platform
    from importlib import metadata

    import datarax

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"datarax {datarax.__version__} (jax {installed('jax')}, flax {installed('flax')}, "
            f"python {platform.python_version()})")


def cmd_version(args) -> int:
    print(version_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Compiled, resumable JAX data pipelines.",
                                     epilog="See docs/cli.md and docs/config.md.")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--version", action="version", version=version_text(), help="print versions and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = _config_parser(sub, "run", "iterate the pipeline; report throughput, goodput and a sample batch")
    run.add_argument("--epochs", type=int, default=None, help="epochs to run (default: the config's epochs)")
    run.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    run.add_argument("--json", action="store_true", help="print the report as one JSON object")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(handler=cmd_run)
    train = _config_parser(sub, "train", "run the configured trainer (resumes from checkpoint_dir)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=cmd_train)
    replay = sub.add_parser("replay", help="rebuild the batch a training step received: its records, their origins, "
                                           "every stage's draws", description="Rebuild, bitwise, the batch step N of "
                                           "a run received, from the run's configuration and checkpoints.")
    replay.add_argument("run_dir", help="the run directory of a `datarax train` run (it holds run.json)")
    replay.add_argument("--step", type=int, required=True, help="the training step (1-based)")
    replay.add_argument("--out", default=None, help="write the batch's fields to this .npz")
    replay.add_argument("--show", default=None,
                        help="write a PNG grid of the batch's images, captioned 'row: record id'")
    replay.add_argument("--field", default=None, help="the field --show draws (default: the first image-like field)")
    replay.set_defaults(handler=cmd_replay)
    _config_parser(sub, "validate", "check a configuration file").set_defaults(handler=cmd_validate)
    _config_parser(sub, "inspect", "show element spec, host stages, per-stage shapes, the graph and the fingerprint"
                   ).set_defaults(handler=cmd_inspect)
    preview = _config_parser(sub, "preview", "write a PNG grid of the pipeline's output images (or spectrograms of "
                                             "its audio) for a look at the augmentation")
    preview.add_argument("--out", default=None, help="the PNG to write (default: CONFIG's name + -preview.png)")
    preview.add_argument("--n", type=int, default=16, help="records to show (default 16)")
    preview.add_argument("--field", default=None, help="the field to draw (default: the first image-like field, "
                                                       "else the first audio-like one)")
    preview.add_argument("--label", default=None, help="the integer field to caption each tile with (default: a "
                                                       "field named label, labels, class or cls, when there is one)")
    preview.set_defaults(handler=cmd_preview)
    # Listed for --help only: main() hands everything after `materialize` or `bench` to its own parser.
    sub.add_parser("materialize", add_help=False, help="decode an image folder once into a reduced ArrayRecord cache "
                                                       "(datarax materialize --help lists its options)")
    sub.add_parser("bench", add_help=False, help="run the benchmark suite from a checkout (datarax bench --help "
                                                 "lists its scenarios and options)")
    sub.add_parser("version", help="print versions").set_defaults(handler=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (the console script exits with it)."""
    import warnings

    from datarax.cli import wording

    previous = wording.install()  # warnings as one line each, in the configuration's terms
    try:
        return _main(argv)
    finally:
        warnings.showwarning = previous


def _main(argv: Sequence[str] | None) -> int:
    from datarax.cli.wording import config_terms
    from datarax.config.schema import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    words = [i for i, word in enumerate(argv) if not word.startswith("-")]
    if words and argv[words[0]] in ("bench", "materialize"):
        args = build_parser().parse_args(argv[:words[0]] + ["version"])  # datarax's own options, e.g. --traceback
        rest = argv[words[0] + 1:]
        args.handler = (lambda _: cmd_bench(rest)) if argv[words[0]] == "bench" else (lambda _: cmd_materialize(rest))
    else:
        args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        if args.traceback:
            raise
        where = exc.source or getattr(args, "config", None)
        for problem in exc.problems:
            print(f"{PROG}: error: {where + ': ' if where else ''}{config_terms(problem)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`datarax inspect ... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (MemoryError, ValueError, TypeError, KeyError, OSError, ImportError, RuntimeError, EOFError) as exc:
        if args.traceback:
            raise
        # One line, the first of the message, prefixed with the file the command was given.
        config = getattr(args, "config", None)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else None
        message = config_terms(first or type(exc).__name__) if not isinstance(exc, MemoryError) else (
            f"out of memory ({first or 'an allocation failed'}); lower batch_size or prefetch, or the sizes of the "
            "stages' outputs")
        print(f"{PROG}: error: {config + ': ' if config else ''}{message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
