"""executor="auto" and the process-wide worker pools: which executor a host stage picks and why,
scripts with and without their `__main__` guard (real subprocesses), pools shared by stages of the
same settings and stopped with their last user, and rebuilt pipelines that leave nothing behind."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
from PIL import Image

from datarax import Pipeline
from datarax.control import processes
from datarax.control.processes import choose_executor, live_pools, main_guards
from datarax.host import DecodeAudio, DecodeImage, HostMap
from datarax.sources import ImageFolderSource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTPUTS = {"y": ((), "int64")}


def doubled(record, rng):
    return {"y": int(record["x"]) * 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (40 + 3 * i, 50, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.jpg")
    return str(root)


def test_asked_for_is_kept_and_auto_says_why():
    assert choose_executor("threads", "S").executor == "threads"
    assert choose_executor("processes", "S").executor == "processes"
    assert str(choose_executor("threads", "S")) == "threads (as configured)"
    assert choose_executor("auto", "S").executor == "processes"  # pytest's main module runs under its guard


def test_auto_picks_threads_on_one_core(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    choice = choose_executor("auto", "DecodeImage")
    assert choice.executor == "threads" and "one core" in choice.reason


def test_auto_picks_threads_for_a_function_workers_cannot_import():
    stage = HostMap(lambda record, rng: {"y": 0}, outputs=OUTPUTS)
    assert stage.executor.executor == "threads"
    assert "cannot be sent to worker processes (AttributeError" in stage.executor.reason
    assert HostMap(doubled, outputs=OUTPUTS).executor.executor == "processes"


@pytest.mark.parametrize("source,line", [
    ('if __name__ == "__main__":\n    pass\n', [(1, 2)]),
    ("if '__main__' == __name__:\n    x = 1\n    y = 2\n", [(1, 3)]),
    ("def main():\n    pass\nif __name__ == '__main__': main()\n", [(3, 3)]),
    ("if __name__ != '__main__':\n    pass\nif True:\n    pass\n", []),
])
def test_guards_are_found_in_the_scripts_source(tmp_path, source, line):
    path = tmp_path / "script.py"
    path.write_text(source)
    assert main_guards(str(path)) == line


SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.sources import ImageFolderSource

def build():
    stage = DecodeImage(16)
    batch = next(iter(Pipeline(ImageFolderSource({folder!r}), [stage], batch_size=4)))
    print(json.dumps({{"executor": stage.executor.executor, "reason": stage.executor.reason,
                      "shape": list(batch["image"].shape)}}))
{tail}
"""


@pytest.mark.parametrize("tail,executor,reason", [
    ("build()", "threads", "builds the pipeline at line 13, outside `if __name__ == '__main__':`"),
    ("if __name__ == '__main__':\n    build()", "processes", "auto: worker processes"),
])
def test_a_script_gets_processes_only_under_its_guard(tmp_path, folder, tail, executor, reason):
    """Real scripts: unguarded, worker processes would run the script again, so auto takes threads
    and says where; guarded, it takes processes, and the workers decode the batch."""
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(root=ROOT, folder=folder, tail=tail))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["executor"] == executor and reason in result["reason"] and result["shape"] == [4, 16, 16, 3]


def test_python_c_has_no_script_to_run_again(folder):
    code = SCRIPT.format(root=ROOT, folder=folder, tail="build()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["executor"] == "processes"


def test_stages_of_the_same_settings_share_workers_and_the_last_close_stops_them(folder):
    settings = {"size": 12, "crop": "random_resized", "num_threads": 2, "max_decode_bytes": 123_456_789}
    # Settings and seeds travel with each batch: any DecodeImage of this worker count and budget shares.
    a, b = DecodeImage(**settings, seed=1), DecodeImage(**{**settings, "size": 13, "seed": 2})
    other = DecodeImage(**{**settings, "max_decode_bytes": 123_456_788})  # another budget: its own workers
    pipelines = [Pipeline(ImageFolderSource(folder), [s], batch_size=4) for s in (a, b, other)]
    try:
        batches = [np.asarray(next(iter(pipeline))["image"]) for pipeline in pipelines]
        assert a.worker_pids == b.worker_pids and len(a.worker_pids) == 2
        assert not set(other.worker_pids) & set(a.worker_pids)
        assert a.budget is b.budget  # one budget for the workers they share
        assert batches[1].shape == (4, 13, 13, 3)  # each stage's own settings, on the same workers
        alone = Pipeline(ImageFolderSource(folder), [DecodeImage(**{**settings, "size": 13, "seed": 2},
                                                                 executor="threads")], batch_size=4)
        np.testing.assert_array_equal(batches[1], np.asarray(next(iter(alone))["image"]))
        alone.close()
        pids = a.worker_pids
        pipelines[0].close()
        assert a.worker_pids == [] and b.worker_pids == pids and all(psutil.pid_exists(p) for p in pids)
        pipelines[1].close()
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)
    finally:
        for pipeline in pipelines:
            pipeline.close()


def test_a_closed_stage_used_again_takes_the_workers_again(folder):
    stage = DecodeImage(12, num_threads=2, max_decode_bytes=98_765_432)
    pipeline = Pipeline(ImageFolderSource(folder), [stage], batch_size=4)
    first = np.asarray(next(iter(pipeline))["image"])
    pipeline.close()
    assert stage.worker_pids == []
    np.testing.assert_array_equal(np.asarray(next(iter(pipeline))["image"]), first)
    assert len(stage.worker_pids) == 2
    pipeline.close()


def counts() -> tuple[int, int]:
    gc.collect()
    children = [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    return len(children), threading.active_count()


def test_a_hundred_rebuilt_pipelines_leave_no_more_processes_or_threads_than_one(folder):
    """A pipeline built per epoch, the old one dropped unclosed as a loop drops it: the new one
    takes the old one's workers, and nothing piles up."""

    def make():
        return Pipeline(ImageFolderSource(folder, shuffle=True), [DecodeImage(10, crop="random_resized",
                                                                              max_decode_bytes=55_555_555)],
                        batch_size=4)

    pipeline = make()
    next(iter(pipeline))
    one = counts()
    pids = pipeline.source.stages[0].worker_pids
    for _ in range(100):
        pipeline = make()
        next(iter(pipeline))
    assert pipeline.source.stages[0].worker_pids == pids  # the same workers all along
    # A dropped pipeline's reader thread ends once it sees the stop, which may be a moment after the
    # drop: wait for the counts to come back (the bound only guards against a hang).
    def within() -> bool:
        now = counts()
        return now[0] <= one[0] and now[1] <= one[1]

    deadline = time.monotonic() + 60
    while not within() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert within(), (counts(), one)
    pools = live_pools()
    pipeline.close()
    del pipeline
    gc.collect()
    assert live_pools() == pools - 1


def test_audio_and_host_maps_choose_too():
    assert DecodeAudio(length=100, num_threads=2).executor.executor == "processes"
    assert DecodeAudio(length=100, num_threads=1).executor.executor == "threads"  # the reader thread decodes
    assert str(DecodeAudio(length=100, executor="threads").executor) == "threads (as configured)"


def test_a_script_run_as_a_module_is_checked_by_its_file(tmp_path, folder):
    package = tmp_path / "job"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SCRIPT.format(root=ROOT, folder=folder, tail=textwrap.dedent("build()")))
    proc = subprocess.run([sys.executable, "-m", "job.train"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["executor"] == "threads"


def test_pools_are_keyed_by_kind_workers_and_budget():
    key = processes.lease(doubled, 2, "x")
    try:
        assert processes.lease(doubled, 2, "x").pool is key.pool
        assert processes.lease(OUTPUTS, 2, "x").pool is key.pool  # another job of the same kind
        assert processes.lease(doubled, 3, "x").pool is not key.pool
        assert processes.lease(doubled, 2, "y").pool is not key.pool
        assert processes.lease(doubled, 2, "x", (10**9, "x")).pool is not key.pool
    finally:
        key.close()


MODULE_MAIN = """
import json
import os
import sys

sys.path.insert(0, {root!r})
from job import heavy  # noqa: F401  (stands for JAX and a recipe's libraries: it notes each process importing it)
from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.sources import ImageFolderSource

if __name__ == "__main__":
    workers = []
    for size in (12, 13):  # each pipeline's workers start after the last one's stopped
        stage = DecodeImage(size, executor="processes", num_threads=2)
        pipeline = Pipeline(ImageFolderSource({folder!r}), [stage], batch_size=4)
        assert next(iter(pipeline))["image"].shape == (4, size, size, 3)
        workers += stage.worker_pids
        pipeline.close()
    print(json.dumps({{"main": os.getpid(), "workers": workers}}))
"""


def test_workers_of_a_main_module_run_with_python_m_find_its_imports_loaded(tmp_path, folder):
    """`python -m job.train`: the forkserver imports the main module once, so no worker imports
    what it imports itself (about a second per worker start where that is JAX)."""
    package = tmp_path / "job"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "heavy.py").write_text(f"import os\nwith open({str(tmp_path / 'imported')!r}, 'a') as f:\n"
                                      "    f.write(f'{os.getpid()}\\n')\n")
    (package / "train.py").write_text(MODULE_MAIN.format(root=ROOT, folder=folder))
    proc = subprocess.run([sys.executable, "-m", "job.train"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    imported = [int(line) for line in (tmp_path / "imported").read_text().split()]
    assert len(result["workers"]) == 4 and not set(result["workers"]) & set(imported)
    assert result["main"] in imported and len(imported) == 2  # the main process and the forkserver
