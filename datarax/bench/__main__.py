"""`python -m datarax.bench [scenario ...] [--vs grain,tfdata,torch]`: datarax beside its floor and its peers.

One JSON line per result: each scenario's own rows, then one row per peer named in `--vs`.
"""

from __future__ import annotations

import argparse
import json
import sys

from datarax.bench.peers.runner import check_peers, peer_rows
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
    try:
        peers = check_peers([p.strip() for p in args.vs.split(",") if p.strip()])
    except ValueError as exc:
        parser.error(str(exc))
    options = BenchOptions(repeats=args.repeats, scale=args.scale, peers=peers)
    for name in names:
        results = load(name)(options)
        for result in results:
            print(json.dumps(result), flush=True)
        for result in peer_rows(name, results, options):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
