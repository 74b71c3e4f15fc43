"""`python -m benchmarks [SCENARIO ...] [--vs grain,tfdata,torch] [--json] [--plot FILE]`.

datarax beside its hand-written floor and, with `--vs`, the same work in peer frameworks (each in
a fresh process). Prints one row per framework per scenario as a table, or as JSON lines with
`--json` (the machine line then goes to stderr), and appends each row, with its command, commit,
versions and machine, to `benchmarks/results/<machine>.jsonl` (`benchmarks.record`; `--results`,
`--machine`, `--no-record`). `datarax bench ...` runs this same command from a checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from benchmarks import record
from benchmarks.peers.runner import check_peers
from benchmarks.record import MACHINE_ENV, RESULTS_ENV
from benchmarks.registry import SCENARIO_MODULES, BenchOptions


def build_parser(prog: str = "python -m benchmarks") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="run the benchmark suite, optionally against peer "
                                                            "frameworks (see docs/benchmarks.md)")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"scenarios to run (default: all): {', '.join(SCENARIO_MODULES)}")
    parser.add_argument("--vs", default="", help="peers to run too, comma-separated: grain,tfdata,torch")
    parser.add_argument("--json", action="store_true", help="one JSON line per framework per scenario")
    parser.add_argument("--plot", metavar="FILE", default=None, help="write a bar chart (needs matplotlib)")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per side (the median is reported)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts (e.g. 0.1 for a smoke run)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--results", metavar="DIR", default=None,
                        help=f"append the rows to DIR/<machine>.jsonl (default: ${RESULTS_ENV}, "
                             "else benchmarks/results)")
    parser.add_argument("--machine", metavar="KEY", default=None,
                        help=f"the results file's name (default: ${MACHINE_ENV}, else e.g. cpu-2core, tpu-v5e)")
    parser.add_argument("--no-record", action="store_true", help="write no results rows")
    return parser


def run(args: argparse.Namespace, command: str = "python -m benchmarks") -> int:
    """Runs parsed arguments; bad values raise ValueError with a one-line message.

    `command` is the command line the results rows name (what reproduces them).
    """
    from benchmarks.report import emit_json, format_table, machine, plot, run_bench

    names = args.scenarios or list(SCENARIO_MODULES)
    unknown = [n for n in names if n not in SCENARIO_MODULES]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(sorted(SCENARIO_MODULES))}")
    if args.repeats < 1 or args.scale <= 0:
        raise ValueError(f"--repeats must be >= 1 and --scale > 0, got {args.repeats} and {args.scale}")
    peers = check_peers([p.strip() for p in args.vs.split(",") if p.strip()])
    options = BenchOptions(repeats=args.repeats, scale=args.scale, peers=peers)
    directory = record.results_dir(args.results, args.no_record)
    described = record.describe_machine(args.machine)
    info = machine(described)
    load = "n/a" if info["load_avg_1min"] is None else f"{info['load_avg_1min']:.1f}"
    print(f"machine: {info['cpus']} CPUs ({info['processor']}), {info['platform']}, python {info['python']}, "
          f"jax {info['jax']} on {info['backend']} x{info['devices']}, load average {load}",
          file=sys.stderr if args.json else sys.stdout, flush=True)
    progress = False if args.no_progress else None
    settings = {"repeats": args.repeats, "scale": args.scale, "peers": list(peers)}

    def land(row: dict) -> None:
        if args.json:
            emit_json(row)
        record.append([row], directory, command, described, settings)  # as it lands: a run cut short keeps its rows

    rows = run_bench(names, options, progress=progress, emit=land)
    if not args.json:
        print(format_table(rows))
    if args.plot:
        caption = (f"median of {args.repeats} timed epochs per side, --scale {args.scale}; {info['cpus']} CPUs "
                   f"({info['processor']}), jax {info['jax']} on {info['backend']}, load average {load}")
        plot(rows, args.plot, caption=caption)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if directory is not None and rows:
        print(f"rows appended to {directory / (info['key'] + '.jsonl')}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m benchmarks") -> int:
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        return run(args, record.command_line(prog, argv))
    except (ValueError, RuntimeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
