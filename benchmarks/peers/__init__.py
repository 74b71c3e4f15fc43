"""Peer frameworks (Grain, tf.data, the PyTorch DataLoader) doing a scenario's work, for comparison.

One module per peer (`grain_peer`, `tfdata_peer`, `torch_peer`), each mapping scenario names to
workloads in `WORKLOADS`; `runner.peer_rows` runs them after a scenario (see `runner` for how a
scenario opts in). Frameworks are imported only when their workload runs.
"""

from benchmarks.peers.common import PeerOptions as PeerOptions
from benchmarks.peers.runner import PEER_MODULES as PEER_MODULES
from benchmarks.peers.runner import Recipe as Recipe
from benchmarks.peers.runner import check_peers as check_peers
from benchmarks.peers.runner import peer_rows as peer_rows
from benchmarks.peers.runner import recipe_for as recipe_for
from benchmarks.peers.runner import run_isolated as run_isolated
from benchmarks.peers.runner import run_peer as run_peer
