"""`python -m benchmarks.peers PEER SCENARIO ...`: one peer workload, one JSON line (used by the runner)."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.peers.common import PeerOptions
from benchmarks.peers.runner import PEER_MODULES, run_peer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("peer", choices=sorted(PEER_MODULES))
    parser.add_argument("workload", help="the workload (scenario) name")
    parser.add_argument("--data", required=True, help="import path module:function of make_data(n, *data_args)")
    parser.add_argument("--data-args", default="[]", help="JSON list of extra make_data arguments")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    from datarax.config.registry import import_object

    data = import_object(args.data)(args.records, *json.loads(args.data_args))
    options = PeerOptions(batch_size=args.batch, repeats=args.repeats, seed=args.seed, workers=args.workers)
    print(json.dumps(run_peer(args.peer, args.workload, data, options)), flush=True)
    return 0


# The guard matters: Grain's worker processes are spawned and re-import this module.
if __name__ == "__main__":
    sys.exit(main())
