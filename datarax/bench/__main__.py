"""`python -m datarax.bench [scenario ...]`: datarax beside its floor, one JSON line per result."""

from __future__ import annotations

import argparse
import json
import sys

from datarax.bench.registry import SCENARIO_MODULES, BenchOptions, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datarax.bench", description=__doc__)
    parser.add_argument("scenarios", nargs="*", help=f"scenarios to run (default: all of {sorted(SCENARIO_MODULES)})")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per side; the median is reported")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts (e.g. 0.1 for a smoke run)")
    parser.add_argument("--vs", default="", help="comma-separated peers to run too, where supported (grain,tfdata,torch)")
    args = parser.parse_args(argv)
    names = args.scenarios or list(SCENARIO_MODULES)
    unknown = [n for n in names if n not in SCENARIO_MODULES]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIO_MODULES)}")
    if args.repeats < 1 or args.scale <= 0:
        parser.error(f"--repeats must be >= 1 and --scale > 0, got {args.repeats} and {args.scale}")
    options = BenchOptions(repeats=args.repeats, scale=args.scale,
                           peers=tuple(p for p in args.vs.split(",") if p))
    for name in names:
        for result in load(name)(options):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
