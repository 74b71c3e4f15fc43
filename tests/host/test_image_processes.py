"""DecodeImage(executor="processes"): worker processes read the files and decode them, with the
threaded stage's output, errors, budget and fingerprint."""

from __future__ import annotations

import copy
import os
import pathlib
import shutil

import numpy as np
import pytest

from datarax import Pipeline
from datarax.host import DecodeImage, SkippedRecordWarning, WorkerCrashError
from datarax.host.image import DecodeJob
from datarax.host.stage import HostStageSource
from datarax.sources import ImageFolderSource, RecordError
from tests.host.test_image import CASES, bad_files, run, write_cases, write_png


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A class-folder tree of every kind of image file DecodeImage reads (two classes)."""
    root = tmp_path_factory.mktemp("tree")
    cases = write_cases(tmp_path_factory.mktemp("cases"))
    for i, name in enumerate(CASES):
        target = root / f"class{i % 2}"
        target.mkdir(exist_ok=True)
        shutil.copy(cases[name], target / f"{i:02d}_{name}")
    return str(root)


def epochs(stage: DecodeImage, root: str, count: int = 2, pids: list | None = None) -> list[dict[str, np.ndarray]]:
    pipeline = Pipeline(ImageFolderSource(root=root, shuffle=True, seed=3), [stage], batch_size=4)
    try:
        batches = [{k: np.asarray(v) for k, v in b.items()} for b in pipeline.epochs(count)]
        if pids is not None:
            pids += stage.worker_pids
        return batches
    finally:
        pipeline.close()


def test_processes_read_the_files_and_give_the_threads_batches(folder, monkeypatch):
    threads = epochs(DecodeImage(size=24, crop="random_resized", num_threads=2), folder)
    stage = DecodeImage(size=24, crop="random_resized", executor="processes", num_threads=2)
    reads = []
    original = ImageFolderSource.get_batch
    monkeypatch.setattr(ImageFolderSource, "get_batch",
                        lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
    in_flight = []  # as each batch is read: (was it started ahead, how many batches the workers have)
    original_read = DecodeImage._in_processes

    def spy(self, batch, data, ctx, out):
        flights = self._batches._flights
        in_flight.append(([f[0] for f in flights].count(self._key(ctx)), len(flights)))
        return original_read(self, batch, data, ctx, out)

    monkeypatch.setattr(DecodeImage, "_in_processes", spy)
    pids = []
    got = epochs(stage, folder, pids=pids)  # closing the pipeline stops the workers
    assert not reads  # the source handed references: the workers read the files
    # Only the first of the 8 batches was not decoded ahead; from the second on, the batch after it
    # is in flight too while it is read (a worker done with its part takes that batch's next part).
    assert in_flight == [(0, 0)] + [(1, 2)] * 6 + [(1, 1)]
    assert len(pids) == 2 and stage.worker_pids == []
    assert len(got) == len(threads) == 8
    for a, b in zip(got, threads):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(got[0]["image"], got[4]["image"])  # the epochs differ
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("per", [2, 3])
def test_finer_chunks_give_the_same_batches_in_more_blocks(folder, per, monkeypatch):
    """`chunks_per_worker` cuts each batch into that many blocks a worker (the chip host's probe
    sweeps it); the rows are the threaded stage's whatever the cut."""
    threads = epochs(DecodeImage(size=24, crop="random_resized", num_threads=2), folder, count=1)
    stage = DecodeImage(size=24, crop="random_resized", executor="processes", num_threads=2)
    monkeypatch.setattr(stage, "chunks_per_worker", per)
    blocks = []
    original = DecodeImage._chunks
    monkeypatch.setattr(DecodeImage, "_chunks", lambda self, data, ctx: blocks.append(
        [(low, high) for low, high, _ in original(self, data, ctx)]) or original(self, data, ctx))
    got = epochs(stage, folder, count=1)
    for cut in blocks:  # contiguous blocks over the batch's rows, per * workers of them (at most one a row)
        rows = cut[-1][1]
        assert cut[0][0] == 0 and all(x[1] == y[0] for x, y in zip(cut, cut[1:]))
        assert len(cut) == min(per * 2, rows)
    for a, b in zip(got, threads, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_bytes_from_any_source_decode_as_on_threads(tmp_path):
    """Records that are bytes already travel to the workers; every kind of file, EXIF included."""
    cases = write_cases(tmp_path)
    paths = [cases[n] for n in CASES]
    stage = DecodeImage(size=20, crop="random_resized", executor="processes", num_threads=3)
    try:
        np.testing.assert_array_equal(run(stage, paths)["image"],
                                      run(DecodeImage(size=20, crop="random_resized"), paths)["image"])
        assert stage.reads_files == "image"
        assert stage.structure() == DecodeImage(size=20, crop="random_resized").structure()
        other = copy.deepcopy(stage)  # a copy builds its own workers
        np.testing.assert_array_equal(run(other, paths[:3])["image"], run(stage, paths[:3])["image"])
        other.close()
    finally:
        stage.close()
    assert DecodeImage(size=20, executor="processes", out_field="view").reads_files is None


def test_bad_files_are_named_and_skipped_as_on_threads(tmp_path):
    (tmp_path / "cases").mkdir()
    paths = bad_files(tmp_path, write_cases(tmp_path / "cases"))
    files = [paths["good.jpg"], paths["truncated.jpg"], paths["corrupt.jpg"]]
    stage = DecodeImage(size=16, executor="processes", num_threads=2)
    skip = DecodeImage(size=16, executor="processes", num_threads=2, on_error="skip")
    try:
        with pytest.raises(RecordError, match=rf"record 1 \({paths['truncated.jpg']}\).*on_error='skip'"):
            run(stage, files)
        with pytest.warns(SkippedRecordWarning) as caught:
            out = run(skip, files)
        threads = DecodeImage(size=16, on_error="skip")
        with pytest.warns(SkippedRecordWarning) as caught_threads:
            want = run(threads, files)
        assert [str(w.message) for w in caught] == [str(w.message) for w in caught_threads]
        np.testing.assert_array_equal(out["image_ok"], [True, False, False])
        np.testing.assert_array_equal(out["image"], want["image"])
        assert skip.skipped == 2
    finally:
        stage.close()
        skip.close()


def test_a_file_gone_since_the_scan_fails_the_batch_with_the_sources_error(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        write_png(root / "a" / f"{i}.png", (40, 30))
    source = ImageFolderSource(root=str(root))
    stage = DecodeImage(size=8, executor="processes", num_threads=2)
    host = HostStageSource(source, [stage])
    try:
        assert host.read(np.arange(4), 0)["image"].shape == (4, 8, 8, 3)
        pathlib.Path(source.paths[2]).unlink()
        with pytest.raises(FileNotFoundError, match=r"ImageFolderSource record 2: the file is gone"):
            host.read(np.arange(4), 0)
        with pytest.raises(FileNotFoundError, match=r"ImageFolderSource record 2: the file is gone"):
            HostStageSource(source, [DecodeImage(size=8)]).read(np.arange(4), 0)
    finally:
        host.close()


def test_the_workers_share_one_budget(tmp_path):
    paths = [write_png(tmp_path / f"{i}.png", (1000 + 10 * i, 900)) for i in range(6)]  # ~3.6 MB each to decode
    one = run(DecodeImage(size=24, num_threads=1, backend="pillow"), paths)["image"]
    stage = DecodeImage(size=24, num_threads=3, max_decode_bytes=5 * 2**20, backend="pillow", executor="processes")
    try:
        np.testing.assert_array_equal(run(stage, paths)["image"], one)
        assert 0 < stage.budget.peak <= 5 * 2**20  # one decode at a time across the three workers
        assert stage.held_bytes() == 5 * 2**20
        big = write_png(tmp_path / "big.png", (2000, 1500), "RGBA")
        with pytest.raises(RecordError, match=r"DecodeImage: record 1 .* needs about 22.9 MiB to decode"):
            run(stage, [paths[0], big])
    finally:
        stage.close()


def test_a_bad_executor_is_named():
    with pytest.raises(ValueError, match=r"executor.*'threads', 'processes'"):
        DecodeImage(size=8, executor="fork")


def test_a_batch_decoded_ahead_but_not_read_next_is_dropped(folder):
    source = ImageFolderSource(root=folder)
    stage = DecodeImage(size=16, crop="random_resized", executor="processes", num_threads=2)
    host, threads = HostStageSource(source, [stage]), HostStageSource(source, [DecodeImage(size=16,
                                                                                           crop="random_resized")])
    a, b, d = np.array([0, 1, 2]), np.array([3, 4, 5, 6]), np.array([7, 8])
    try:
        host.upcoming(a, 0)
        for ids, epoch in [(b, 0), (d, 0), (a, 0), (a, 1)]:  # A decoded ahead while B is read, then dropped for D
            got, want = host.read(ids, epoch), threads.read(ids, epoch)
            np.testing.assert_array_equal(got["image"], want["image"])
            np.testing.assert_array_equal(got["label"], want["label"])
    finally:
        host.close()
        threads.close()


class InProcessPool:
    """A stand-in for the worker pool that runs each chunk here at submit; its first `result` fails
    as a crash of the job `crashed(job asked for, jobs submitted)` names, losing every job."""

    def __init__(self, job, crashed):
        self.job, self.crashed, self.done, self.submitted = job, crashed, {}, []

    def submit(self, outputs, chunks):
        views = outputs.views(outputs.rows)
        job_id = len(self.submitted)
        self.done[job_id] = [self.job(task, {k: v[low:high] for k, v in views.items()}) for low, high, task in chunks]
        self.submitted.append(job_id)
        return job_id

    def result(self, job_id):
        if self.crashed is not None:
            victim, self.crashed = self.crashed(job_id, self.submitted), None
            self.done.clear()
            raise WorkerCrashError("a worker died", job=victim)
        return self.done.pop(job_id)

    def forget(self, job_id):
        self.done.pop(job_id, None)

    def close(self):
        self.done.clear()


@pytest.mark.parametrize("victim", ["the batch read", "the batch after"])
def test_a_crash_fails_its_own_batch_and_a_batch_it_did_not_touch_decodes_afresh(folder, victim):
    source = ImageFolderSource(root=folder)
    stage = DecodeImage(size=16, crop="random_resized", executor="processes", num_threads=2)
    crashed = (lambda asked, submitted: asked) if victim == "the batch read" else (lambda asked, submitted: asked + 1)
    stage._batches.pool = pool = InProcessPool(DecodeJob(stage.config), crashed)
    host, threads = HostStageSource(source, [stage]), HostStageSource(source, [DecodeImage(size=16,
                                                                                           crop="random_resized")])
    a, b = np.array([0, 1, 2]), np.array([3, 4, 5, 6])
    try:
        host.upcoming(a, 0)  # a starts behind b, then the pool fails while b is collected
        if victim == "the batch read":
            with pytest.raises(WorkerCrashError):
                host.read(b, 0)
            assert stage._batches._flights == []
        for ids in (b, a):
            np.testing.assert_array_equal(host.read(ids, 0)["image"], threads.read(ids, 0)["image"])
        assert len(pool.submitted) == 4  # b and a, lost; b and a again
    finally:
        host.close()
        threads.close()
