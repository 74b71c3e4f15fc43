"""Real multi-process runs through `jax.distributed` on this machine (CPU devices, gloo collectives).

Each test starts N worker processes (`multihost_worker.py`) and checks them against a
single-process run of the same pipeline in this test process:

* union: the rows the processes hold in step s, put together, are the single-process batch s
  (records, augmented values and order), with every process running the same number of steps;
* a jitted reduction over each global batch sees every process's rows;
* elastic resume: a checkpoint written by 1 process continues the same stream on N processes,
  and one written by N processes continues it on 1;
* replay: one process rebuilds any step's global batch of the N-process run (`Pipeline.replay`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import multihost_worker as worker
import numpy as np
import orbax.checkpoint as ocp
import pytest

from datarax.batching import batch_at
from datarax.checkpoint import IteratorRestore, IteratorSave
from datarax.sharding import DataSharding

WORKER = Path(worker.__file__)
LAUNCH_TIMEOUT_S = 150
# The per-record maths is the same whatever the layout, but XLA may vectorise a batch of 2 rows
# differently from one of 8: bitwise equal on some machines, 1 ulp apart on others (seen on a 16-core x86 box).
AUGMENT_TOL = dict(rtol=1e-6, atol=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`num_processes` worker processes started in their own sessions; all are killed on exit."""

    def __init__(self, tmp_path: Path, num_processes: int, devices_per_process: int, extra: list[str]):
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}"}
        port, self.out, self.logs = free_port(), tmp_path / "result", []
        self.procs: list[subprocess.Popen] = []
        try:
            for i in range(num_processes):
                self.logs.append(tmp_path / f"worker{i}.log")
                cmd = [sys.executable, str(WORKER), "--port", str(port), "--num-processes", str(num_processes),
                       "--process-id", str(i), "--out", str(self.out), *extra]
                with open(self.logs[-1], "w") as log:
                    self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                       start_new_session=True, cwd=WORKER.parent))
        except BaseException:
            self.kill()
            raise

    def results(self) -> list[dict]:
        """Waits (bounded) for every worker and returns each one's results."""
        for p in self.procs:
            p.wait(timeout=LAUNCH_TIMEOUT_S)
        failed = [i for i, p in enumerate(self.procs) if p.returncode != 0]
        if failed:
            tail = self.logs[failed[0]].read_text()[-3000:]
            pytest.fail(f"worker processes {failed} exited with {[self.procs[i].returncode for i in failed]}:\n{tail}")
        return [json.loads(Path(f"{self.out}.{i}.json").read_text()) for i in range(len(self.procs))]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def reference() -> list[dict]:
    """The single-process, unsharded stream: short final batches, no mask."""
    batches = list(worker.build().epochs(worker.EPOCHS))
    return [{"id": np.asarray(b["id"]), "x": np.asarray(b["x"])} for b in batches]


def assemble(results: list[dict], phase: str, step: int) -> dict:
    """The global batch of `step` put together from every process's rows."""
    rows: dict[int, dict] = {}
    for result in results:
        part = result[phase][step]
        for i, r in enumerate(part["rows"]):
            rows.setdefault(r, {k: part[k][i] for k in ("id", "x", "mask")})
    assert sorted(rows) == list(range(worker.BATCH)), f"step {step}: the processes hold rows {sorted(rows)}"
    return {k: np.array([rows[r][k] for r in range(worker.BATCH)]) for k in ("id", "x", "mask")}


def check_stream(results: list[dict], phase: str, want: list[dict]) -> None:
    lengths = {len(r[phase]) for r in results}
    assert lengths == {len(want)}, f"{phase}: processes ran {lengths} steps, the single-process stream has {len(want)}"
    for step, ref in enumerate(want):
        got = assemble(results, phase, step)
        mask = got["mask"].astype(bool)
        np.testing.assert_array_equal(got["id"][mask], ref["id"])
        np.testing.assert_allclose(got["x"][mask].astype(np.float32), ref["x"], **AUGMENT_TOL)
        assert not mask[len(ref["id"]):].any() and mask[:len(ref["id"])].all()
        totals = {r[phase][step]["total"] for r in results}
        assert totals == {int(ref["id"].sum())}, f"{phase} step {step}: global reductions {totals}"


def check_replay(results: list[dict], saved_state: dict, saved_at: int) -> None:
    """Steps of the N-process run replayed by this one process (`Pipeline.replay`, placed by `batch_at`
    from the run's start and from the state the N processes saved): the same global batches."""
    pipeline = worker.build(DataSharding.data_parallel())
    per_epoch, length = len(pipeline), len(pipeline.sampler)
    for step in (0, per_epoch - 1, per_epoch, 2 * per_epoch - 1):  # each epoch's first and short last batch
        for epoch, position, offset in ((0, 0, step), (saved_state["epoch"], saved_state["position"],
                                                       step - saved_at)):
            where = batch_at(length, worker.BATCH, drop_remainder=False, epoch=epoch, position=position, offset=offset)
            replayed = pipeline.replay(*where[:2])
            got = assemble(results, "fresh", step)
            np.testing.assert_array_equal(replayed.batch["id"], got["id"])
            np.testing.assert_array_equal(replayed.batch["mask"], got["mask"].astype(bool))
            np.testing.assert_allclose(replayed.batch["x"], got["x"].astype(np.float32), **AUGMENT_TOL)
            np.testing.assert_array_equal(replayed.record_ids, got["id"])


def single_process_save(directory: Path, steps: int) -> dict:
    """Runs `steps` steps in this (single) process over its 8 devices and saves the iterator."""
    it = worker.build(DataSharding.data_parallel()).epochs(worker.EPOCHS)
    for _ in range(steps):
        next(it)
    with ocp.CheckpointManager(directory) as mngr:
        mngr.save(steps, args=ocp.args.Composite(iterator=IteratorSave(it)), force=True)
    state = it.get_state()
    it.close()
    return state


def single_process_resume(directory: Path) -> list[dict]:
    it = worker.build(DataSharding.data_parallel()).epochs(worker.EPOCHS)
    with ocp.CheckpointManager(directory) as mngr:
        mngr.restore(mngr.latest_step(), args=ocp.args.Composite(iterator=IteratorRestore(it)))
    rest = []
    for batch in it:
        mask = np.asarray(batch["mask"])
        rest.append({"id": np.asarray(batch["id"])[mask], "x": np.asarray(batch["x"])[mask]})
    return rest


CASES = [
    # (processes, devices per process, mesh, extra worker flags, source)
    pytest.param(2, 2, "data", [], "memory", id="2proc-device-resident-1d-mesh"),
    pytest.param(4, 2, "data,model", ["--host-resident"], "memory", id="4proc-host-resident-2d-mesh"),
    # ShardedSource: parquet shards on file://, each process reading the blocks its rows touch
    pytest.param(4, 1, "data", ["--host-resident"], "sharded", id="4proc-sharded-parquet"),
]


@pytest.mark.parametrize("num_processes,devices,mesh,extra,source", CASES)
def test_multihost_union_augmentation_and_elastic_resume(tmp_path, monkeypatch, num_processes, devices, mesh, extra,
                                                         source):
    if source == "sharded":
        (tmp_path / "shards").mkdir()
        worker.write_shards(str(tmp_path / "shards"))
        monkeypatch.setenv(worker.SHARDS_ENV, str(tmp_path / "shards"))
    save_one, save_many = 2, 5
    one_state = single_process_save(tmp_path / "by_one", save_one)
    flags = ["--mesh", mesh, *extra, "--save-at", str(save_many), "--save-dir", str(tmp_path / "by_many"),
             "--restore-dir", str(tmp_path / "by_one")]
    with Cluster(tmp_path, num_processes, devices, flags) as cluster:
        want = reference()  # while the workers start
        results = cluster.results()

    assert [r["process_index"] for r in results] == list(range(num_processes))
    assert {r["process_count"] for r in results} == {num_processes}
    assert {r["steps_per_epoch"] for r in results} == {len(worker.build())}
    # The state is global: the fingerprint does not depend on the process count or layout.
    assert {r["fingerprint"] for r in results} == {worker.build().fingerprint}
    check_stream(results, "fresh", want)
    check_replay(results, results[0]["saved_state"], save_many)  # N -> 1: the same global batches

    # 1 -> N: the processes continue the single process's stream.
    assert {r["restored_step"] for r in results} == {save_one}
    check_stream(results, "resumed", want[save_one:])

    # N -> 1: every process saved the same state, and one process continues from it.
    states = [r["saved_state"] for r in results]
    assert all(s == states[0] for s in states)
    assert states[0]["fingerprint"] == one_state["fingerprint"]
    files = sorted(p.name for p in (tmp_path / "by_many").rglob("process_*-of-*.json"))
    assert files == [f"process_{i}-of-{num_processes}.json" for i in range(num_processes)]
    rest = single_process_resume(tmp_path / "by_many")
    assert len(rest) == len(want) - save_many
    for got, ref in zip(rest, want[save_many:]):
        np.testing.assert_array_equal(got["id"], ref["id"])
        np.testing.assert_allclose(got["x"], ref["x"], **AUGMENT_TOL)



def test_a_failing_test_kills_every_worker_process_group(tmp_path):
    with pytest.raises(RuntimeError, match="test failed mid-run"):
        with Cluster(tmp_path, 2, 1, ["--save-at", "1", "--save-dir", str(tmp_path / "ckpt")]) as cluster:
            procs = cluster.procs
            raise RuntimeError("test failed mid-run")
    for p in procs:
        assert p.returncode == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)  # nothing of the group is left
