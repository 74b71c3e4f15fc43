"""Results rows: what a benchmark measured, with how, when and where, one JSON line each.

Every run of `python -m benchmarks` (and of the chip's probes) appends one line per framework per
scenario to `benchmarks/results/<machine>.jsonl`: the row the runner prints with `--json`
(scenario, framework, `el_s`, `ratio_to_datarax`, `ratio_to_floor`, `first_batch_s`, quality
such as `psnr_db`, `settings` ...) plus

    command    the command line that reproduces it, e.g. "python -m benchmarks cifar --repeats 3"
    env        the environment variables that change what runs (JAX_PLATFORMS, XLA_FLAGS), if set
    commit     the checkout's git commit (DATARAX_BENCH_COMMIT where the copy has no .git)
    dirty      whether tracked files differed from that commit (None when unknown)
    date       when the row was written, UTC, ISO 8601
    versions   python, jax, jaxlib, flax, numpy, datarax and every peer framework installed
    machine    key, platform, processor, cpus, backend, device_kind, devices, and the load
               average (1, 5, 15 minutes) at the run's start and when the row was written
    options    repeats, scale, peers

Where the rows go: `--results DIR`, else `$DATARAX_BENCH_RESULTS`, else `benchmarks/results/`;
`--no-record` or `DATARAX_BENCH_RESULTS=off` writes none (the test suite sets it off). The file's
name is the machine key (`machine_key`), or `--machine` / `$DATARAX_BENCH_MACHINE`.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS_ENV = "DATARAX_BENCH_RESULTS"
MACHINE_ENV = "DATARAX_BENCH_MACHINE"
COMMIT_ENV = "DATARAX_BENCH_COMMIT"
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
REPOSITORY = Path(__file__).resolve().parents[1]

# Distributions whose versions a row names; absent ones are left out.
PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax", "numpy", "datarax", "grain", "tensorflow", "tensorflow-cpu",
            "torch", "torchvision", "datasets", "pyarrow", "webdataset", "tokenizers", "array-record", "simplejpeg",
            "opencv-python-headless", "pillow")
# Settings that change what runs without showing in the command line.
ENV_KEYS = ("JAX_PLATFORMS", "XLA_FLAGS")
# Device kinds under the names their vendors sell them by.
DEVICE_ALIASES = {"tpu v5 lite": "tpu-v5e", "tpu v6 lite": "tpu-v6e"}
METADATA_KEYS = ("command", "env", "commit", "dirty", "date", "versions", "machine", "options", "recorded")


def results_dir(flag: str | None = None, no_record: bool = False) -> Path | None:
    """Where rows go: the `--results` flag, else `$DATARAX_BENCH_RESULTS`, else benchmarks/results; None: none."""
    if no_record:
        return None
    chosen = flag or os.environ.get(RESULTS_ENV) or str(DEFAULT_RESULTS)
    return None if chosen.lower() == "off" else Path(chosen)


def machine_key(backend: str, device_kind: str, devices: int, cpus: int | None) -> str:
    """The results file's name for a machine: `cpu-2core`, `tpu-v5e`, `tpu-v5e-x4`, `nvidia-h200`.

    >>> machine_key("cpu", "cpu", 1, 2), machine_key("tpu", "TPU v5 lite", 1, 13)
    ('cpu-2core', 'tpu-v5e')
    """
    if backend == "cpu":
        return f"cpu-{cpus}core"
    kind = device_kind.strip().lower()
    name = DEVICE_ALIASES.get(kind) or re.sub(r"[^a-z0-9]+", "-", kind).strip("-") or backend
    return name if devices == 1 else f"{name}-x{devices}"


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine(key: str | None = None) -> dict[str, Any]:
    """The machine as a run finds it at its start; `key` (else `$DATARAX_BENCH_MACHINE`) names its results file."""
    import jax

    devices = jax.devices()
    info = {"platform": platform.platform(), "processor": cpu_model(), "cpus": os.cpu_count(),
            "backend": jax.default_backend(), "device_kind": devices[0].device_kind, "devices": len(devices),
            "load_avg_start": load_average()}
    info["key"] = key or os.environ.get(MACHINE_ENV) or machine_key(info["backend"], info["device_kind"],
                                                                    info["devices"], info["cpus"])
    return info


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


@functools.cache
def commit() -> tuple[str | None, bool | None]:
    """`(commit, dirty)` of the checkout the benchmarks run from: `$DATARAX_BENCH_COMMIT` when set (a
    lent machine's copy may carry a `.git` older than its files: the commit sent is the one to
    name; dirty unknown), else git's."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], None

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return os.environ.get(COMMIT_ENV) or None, None


def command_line(prog: str, argv: Sequence[str]) -> str:
    """The command as a user types it: `python -m benchmarks cifar --repeats 3`."""
    return " ".join([prog, *map(shlex.quote, argv)])


def with_metadata(row: dict, command: str, machine: dict, options: dict | None = None) -> dict:
    """`row` with the command, commit, date, versions, machine (`describe_machine`'s, at the run's start)
    and options a results line carries."""
    sha, dirty = commit()
    machine = {**machine, "load_avg_end": load_average()}
    out = {**row, "command": command}
    env = {k: os.environ[k] for k in ENV_KEYS if os.environ.get(k)}
    if env:
        out["env"] = env
    out.update(commit=sha, dirty=dirty,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               versions=versions(), machine=machine, options=options or {})
    return out


def append(rows: Iterable[dict], directory: Path | None, command: str, machine: dict,
           options: dict | None = None) -> Path | None:
    """Appends `rows` with their metadata to `directory/<machine key>.jsonl`; the file, or None if not recording."""
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{machine['key']}.jsonl"
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(with_metadata(row, command, machine, options)) + "\n")
    return path


def read(path: Path) -> list[dict]:
    """The rows of one results file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Recorder:
    """Prints each row as a JSON line and appends the rows to the results when the process exits,
    for the scripts beside the runner (benchmarks/tpu's probes).

    The machine is described at the end, so a probe that measures without JAX in its process (or
    before opening the chip) is not disturbed by the description; the load average is the start's.

    >>> recorder = Recorder("python benchmarks/tpu/probe.py", directory=None)
    >>> recorder.emit(probe="noop", rate=1.0)
    {"probe": "noop", "rate": 1.0}
    """

    def __init__(self, command: str, directory: Path | None | str = "default"):
        self.command = command
        self.directory = results_dir() if directory == "default" else directory
        self.load_start = load_average()
        self.rows: list[dict] = []
        atexit.register(self.close)

    def emit(self, **row: Any) -> None:
        print(json.dumps(row), flush=True)
        self.rows.append(row)

    def close(self) -> Path | None:
        """Appends the rows emitted since the last call; the results file, or None."""
        rows, self.rows = self.rows, []
        if self.directory is None or not rows:
            return None
        machine = {**describe_machine(), "load_avg_start": self.load_start}
        return append(rows, self.directory, self.command, machine)
