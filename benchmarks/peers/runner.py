"""Running a benchmark scenario's work in peer frameworks, beside datarax's own numbers.

After a scenario has run, the bench runner calls `peer_rows(scenario, rows, options)`; for each
peer named in `options.peers` it redoes the scenario's work in that framework, in a fresh
Python process (so each loader has the machine to itself and TensorFlow or torch never load
into the datarax process), and returns one row per peer:

    {"scenario": "cifar", "framework": "torch", "el_s": 1042.7,
     "ratio_to_datarax": 0.012, "ratio_to_floor": 0.011, "settings": "...", ...}

`ratio_to_datarax` is the peer's rate over datarax's (below 1: the peer is slower).

How a scenario opts in (docs/benchmarks.md (Peers) has the full recipe):

1. its module exposes `NUM_RECORDS`, `BATCH` and a deterministic `make_data(n) -> dict of
   arrays`, or a `peer_recipe(options) -> Recipe | list[Recipe]` when its data is made
   differently or it reports several rows (one recipe per row), and
2. each peer module maps the scenario name to a function in its `WORKLOADS` dict:
   `fn(data, PeerOptions) -> Loader`, a loader whose `epoch()` yields one epoch of numpy
   batches doing the scenario's work in that framework's idiom (the runner times it).

A peer without a workload for a scenario yields a row with `skipped` saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

PEER_MODULES = {
    "grain": "benchmarks.peers.grain_peer",
    "numpy": "benchmarks.peers.numpy_peer",
    "tfdata": "benchmarks.peers.tfdata_peer",
    "torch": "benchmarks.peers.torch_peer",
}
PEER_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a peer needs to redo a scenario's work: which workload, how to make its data, what batch.

    Attributes:
        workload: the key of the peers' `WORKLOADS` dicts (usually the scenario's name).
        make_data: import path `module:function` of a deterministic `make_data(n, *data_args)`.
        num_records: records per epoch (after `--scale`).
        batch_size: records per batch.
        row: the scenario result row the peer's row sits beside (default: `workload`), for
            scenarios that report several rows (e.g. one per image size).
        data_args: extra positional arguments of `make_data` after `n` (JSON-able).
    """

    workload: str
    make_data: str
    num_records: int
    batch_size: int
    row: str | None = None
    data_args: tuple = ()

    @property
    def row_name(self) -> str:
        return self.row or self.workload


def check_peers(peers: Sequence[str]) -> tuple[str, ...]:
    """Validates peer names (for `--vs`)."""
    unknown = [p for p in peers if p not in PEER_MODULES]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown} in --vs; choose from {', '.join(PEER_MODULES)} "
                         "(comma-separated, e.g. --vs grain,torch)")
    return tuple(peers)


def peer_module(peer: str) -> Any:
    """A peer's module (cheap: frameworks are imported only when a workload runs)."""
    return importlib.import_module(PEER_MODULES[check_peers([peer])[0]])


def workload(peer: str, scenario: str) -> Callable | None:
    return peer_module(peer).WORKLOADS.get(scenario)


def run_peer(peer: str, scenario: str, data: dict, options: Any) -> dict:
    """Times a peer's loader for `scenario` in this process: `{"el_s", "el_s_runs", "settings"}`.

    Raises:
        KeyError: the peer has no workload for the scenario.
    """
    from benchmarks.peers.common import time_loader

    fn = workload(peer, scenario)
    if fn is None:
        raise KeyError(f"the {peer} peer has no workload for scenario {scenario!r}; it has "
                       f"{sorted(peer_module(peer).WORKLOADS)}")
    return time_loader(fn(data, options), options.repeats, paths=data.get("path"))


def installed(peer: str) -> bool:
    return importlib.util.find_spec(peer_module(peer).MODULE) is not None


def _augment_chain_recipes(module: Any, options: Any) -> list[Recipe]:
    return [Recipe("augment_chain", f"{module.__name__}:make_data", options.records(records), batch,
                   row=f"augment_chain_{side}", data_args=(side,)) for side, records, batch in module.SIZES]


# Recipes for scenarios whose modules do not (yet) declare `peer_recipe` themselves.
KNOWN_RECIPES: dict[str, Callable[[Any, Any], list[Recipe]]] = {"augment_chain": _augment_chain_recipes}


def recipe_for(scenario: str, options: Any) -> list[Recipe]:
    """The peer recipes of a scenario (see the module docstring); empty if it has none."""
    from benchmarks.registry import SCENARIO_MODULES

    module = importlib.import_module(SCENARIO_MODULES[scenario])
    custom = getattr(module, "peer_recipe", None)
    if custom is not None:
        recipes = custom(options)
        return [recipes] if isinstance(recipes, Recipe) else list(recipes)
    if scenario in KNOWN_RECIPES:
        return KNOWN_RECIPES[scenario](module, options)
    if all(hasattr(module, name) for name in ("NUM_RECORDS", "BATCH", "make_data")):
        return [Recipe(scenario, f"{module.__name__}:make_data", options.records(module.NUM_RECORDS), module.BATCH)]
    return []


def run_isolated(peer: str, recipe: Recipe, *, repeats: int, seed: int = 0, workers: int | None = None,
                 timeout: float = PEER_TIMEOUT_S) -> dict:
    """Runs one peer workload in a fresh process (`python -m benchmarks.peers`); its result dict.

    Failures come back as `{"error": "..."}` rather than exceptions, so one broken framework
    does not stop the rest of a benchmark run.
    """
    command = [sys.executable, "-m", "benchmarks.peers", peer, recipe.workload, "--data", recipe.make_data,
               "--data-args", json.dumps(list(recipe.data_args)), "--records", str(recipe.num_records),
               "--batch", str(recipe.batch_size), "--repeats", str(repeats), "--seed", str(seed)]
    if workers is not None:
        command += ["--workers", str(workers)]
    env = dict(os.environ)
    if holds_accelerator():
        # One program at a time can open a TPU, and this benchmark holds it: the peer's JAX runs on
        # the CPU (its batches end in host memory). `host_rows` times peers feeding the chip.
        env["JAX_PLATFORMS"] = "cpu"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"{peer} did not finish {recipe.row_name} within {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"{peer} failed on {recipe.row_name} (exit {done.returncode}): {tail[0]}"}
    result = json.loads(lines[-1])
    if holds_accelerator():
        result["settings"] = f"{result.get('settings', '')} (own process, JAX on the CPU: the benchmark holds the chip)"
    return result


def holds_accelerator() -> bool:
    """Whether this process's JAX runs on an accelerator (which a peer process then cannot open)."""
    jax = sys.modules.get("jax")
    return jax is not None and jax.default_backend() != "cpu"


@contextlib.contextmanager
def processes_off_the_chip() -> Iterator[None]:
    """Worker processes started in the block run JAX on the CPU (this process keeps the chip)."""
    before = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("JAX_PLATFORMS", None)
        else:
            os.environ["JAX_PLATFORMS"] = before


def host_rows(scenario: str, data: dict, base: dict, repeats: int, variants: Sequence[tuple[str, str, Any]],
              batch_size: int) -> list[dict]:
    """Peers run in this process the way their users feed an accelerator: the loader works on the
    host and every batch is `device_put` to this process's device (the chip). One row per
    `(peer, label, workers)` variant that is installed and has a workload for `scenario`;
    `base` is the scenario's datarax row (for the ratios)."""
    from benchmarks.peers.common import PeerOptions, time_loader

    rows = []
    for peer, label, workers in variants:
        fn = workload(peer, scenario)
        if fn is None or not installed(peer):
            continue
        with processes_off_the_chip():
            loader = None
            try:
                loader = fn(data, PeerOptions(batch_size, repeats, workers=workers))
                result = time_loader(loader, repeats)
            except Exception as exc:  # one broken framework must not stop the run: its row says why
                rows.append({"scenario": scenario, "framework": label, "error": f"{type(exc).__name__}: {exc}"})
                continue
            finally:
                if loader is not None:
                    loader.close()  # its threads or worker processes take no cores from the next peer
        rows.append({"scenario": scenario, "framework": label, "el_s": round(result["el_s"], 1),
                     "ratio_to_datarax": ratio(result["el_s"], base.get("datarax_el_s")),
                     "ratio_to_floor": ratio(result["el_s"], base.get("floor_el_s")),
                     "el_s_runs": result["el_s_runs"], "settings": f"{result['settings']}; host -> device_put"})
    return rows


def ratio(value: float | None, base: float | None) -> float | None:
    """`value / base` to 4 significant digits (None when either is missing)."""
    return None if not value or not base else float(f"{value / base:.4g}")


def peer_rows(scenario: str, rows: Sequence[dict], options: Any,
              run: Callable[..., dict] | None = None) -> list[dict]:
    """One row per peer in `options.peers` per peer recipe of a scenario that has produced `rows`.

    `run(peer, recipe, repeats=...)` times one peer (default `run_isolated`).
    """
    run = run_isolated if run is None else run
    if not options.peers:
        return []
    recipes = recipe_for(scenario, options)
    out = []
    for recipe in recipes or [None]:
        name = recipe.row_name if recipe is not None else scenario
        base = next((r for r in rows if r.get("scenario") == name), {})
        for peer in check_peers(options.peers):
            label = getattr(peer_module(peer), "LABELS", {}).get(recipe.workload, peer) if recipe else peer
            row: dict[str, Any] = {"scenario": name, "framework": label, "el_s": None, "ratio_to_datarax": None,
                                   "ratio_to_floor": None}
            if recipe is None or workload(peer, recipe.workload) is None:
                row["skipped"] = (f"no {peer} workload for scenario {scenario!r} yet (see "
                                  "benchmarks/peers/runner.py for how a scenario opts in)")
            elif not installed(peer):
                row["error"] = f"{peer} is not installed: {peer_module(peer).INSTALL} (or pip install 'datarax[bench]')"
            else:
                result = run(peer, recipe, repeats=options.repeats)
                if "error" in result:
                    row["error"] = result["error"]
                else:
                    row.update(el_s=round(result["el_s"], 1),
                               ratio_to_datarax=ratio(result["el_s"], base.get("datarax_el_s")),
                               ratio_to_floor=ratio(result["el_s"], base.get("floor_el_s")),
                               el_s_runs=result.get("el_s_runs"), settings=result.get("settings"),
                               **{k: result[k] for k in ("psnr_db", "psnr_p10_db") if k in result},
                               records=recipe.num_records, batch_size=recipe.batch_size)
            out.append(row)
    return out
