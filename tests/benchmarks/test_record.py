"""The results rows a benchmark run appends (benchmarks/record.py), checked on a tiny `tokens` run."""

import datetime
import json
import os
import platform

import jax
import numpy as np
import pytest

from benchmarks import record
from benchmarks.__main__ import main

TINY = ["tokens", "--scale", "0.002", "--repeats", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run with `--json`: its printed rows and the results file it wrote."""
    directory = tmp_path_factory.mktemp("results")
    capture = pytest.MonkeyPatch()
    printed = []
    capture.setattr(record, "append", _spy(record.append, printed))
    try:
        assert main([*TINY, "--json", "--results", str(directory), "--machine", "test-box"]) == 0
    finally:
        capture.undo()
    return printed, directory


def _spy(append, seen):
    def wrapped(rows, *args, **kwargs):
        rows = list(rows)
        seen.extend(rows)
        return append(rows, *args, **kwargs)
    return wrapped


def test_one_row_per_framework_with_the_printed_figures(tiny_run):
    printed, directory = tiny_run
    assert [p.name for p in directory.iterdir()] == ["test-box.jsonl"]
    rows = record.read(directory / "test-box.jsonl")
    assert [(r["scenario"], r["framework"]) for r in rows] == [("tokens", "datarax"), ("tokens", "floor")]
    for row, seen in zip(rows, printed, strict=True):
        assert {k: v for k, v in row.items() if k not in record.METADATA_KEYS} == seen
    assert rows[0]["el_s"] > 0 and rows[0]["ratio_to_floor"] == pytest.approx(rows[0]["el_s"] / rows[1]["el_s"],
                                                                               rel=1e-3)


def test_a_row_says_how_when_and_where_it_was_measured(tiny_run):
    _, directory = tiny_run
    for row in record.read(directory / "test-box.jsonl"):
        assert row["command"] == ("python -m benchmarks " + " ".join(TINY) + " --json --results "
                                  f"{directory} --machine test-box")
        assert row["commit"] is None or len(row["commit"]) == 40
        assert row["dirty"] in (True, False, None)
        date = datetime.datetime.fromisoformat(row["date"])
        assert date.utcoffset() == datetime.timedelta(0)
        assert abs(datetime.datetime.now(datetime.timezone.utc) - date) < datetime.timedelta(days=1)
        assert row["versions"]["python"] == platform.python_version()
        assert (row["versions"]["jax"], row["versions"]["numpy"]) == (jax.__version__, np.__version__)
        assert {"jaxlib", "flax", "datarax"} <= set(row["versions"])
        machine = row["machine"]
        assert machine["key"] == "test-box"
        assert (machine["backend"], machine["devices"]) == (jax.default_backend(), len(jax.devices()))
        assert machine["device_kind"] == jax.devices()[0].device_kind and machine["cpus"] >= 1
        assert all(len(machine[k]) == 3 and min(machine[k]) >= 0 for k in ("load_avg_start", "load_avg_end"))
        assert row["options"] == {"repeats": 1, "scale": 0.002, "peers": []}
        assert row["env"]["JAX_PLATFORMS"] == os.environ["JAX_PLATFORMS"]  # set by tests/conftest.py


def test_runs_append_and_no_record_writes_nothing(tmp_path, capsys):
    for _ in range(2):
        assert main([*TINY, "--json", "--results", str(tmp_path), "--machine", "box"]) == 0
    assert len(record.read(tmp_path / "box.jsonl")) == 4
    assert f"rows appended to {tmp_path / 'box.jsonl'}" in capsys.readouterr().err
    assert main([*TINY, "--results", str(tmp_path / "none"), "--no-record"]) == 0
    assert not (tmp_path / "none").exists()
    assert "rows appended to" not in capsys.readouterr().err


@pytest.mark.parametrize("flag, env, no_record, expected", [
    ("flag-dir", "env-dir", False, "flag-dir"),
    (None, "env-dir", False, "env-dir"),
    (None, None, False, str(record.DEFAULT_RESULTS)),
    (None, "off", False, None),
    (None, "OFF", False, None),
    ("flag-dir", None, True, None),
])
def test_where_rows_go(monkeypatch, flag, env, no_record, expected):
    if env is None:
        monkeypatch.delenv(record.RESULTS_ENV, raising=False)
    else:
        monkeypatch.setenv(record.RESULTS_ENV, env)
    found = record.results_dir(flag, no_record)
    assert (None if found is None else str(found)) == expected


def test_the_default_results_folder_is_the_repositorys_and_the_suite_does_not_write_there():
    assert record.DEFAULT_RESULTS == record.REPOSITORY / "benchmarks" / "results"
    assert record.results_dir() is None  # tests/conftest.py sets DATARAX_BENCH_RESULTS=off


@pytest.mark.parametrize("backend, kind, devices, cpus, key", [
    ("cpu", "cpu", 1, 2, "cpu-2core"),
    ("cpu", "cpu", 8, 16, "cpu-16core"),
    ("tpu", "TPU v5 lite", 1, 13, "tpu-v5e"),
    ("tpu", "TPU v5 lite", 4, 112, "tpu-v5e-x4"),
    ("tpu", "TPU v4", 1, 240, "tpu-v4"),
    ("gpu", "NVIDIA H200", 1, 16, "nvidia-h200"),
    ("gpu", "", 2, 16, "gpu-x2"),
])
def test_machine_keys(backend, kind, devices, cpus, key):
    assert record.machine_key(backend, kind, devices, cpus) == key


def test_the_machine_variable_names_the_file(monkeypatch):
    monkeypatch.setenv(record.MACHINE_ENV, "lab-box")
    assert record.describe_machine()["key"] == "lab-box"
    assert record.describe_machine("flag-box")["key"] == "flag-box"


def test_a_recorder_prints_each_row_and_appends_them_when_closed(tmp_path, capsys):
    recorder = record.Recorder("python benchmarks/tpu/probe.py --quick", directory=tmp_path)
    recorder.emit(probe="layout", rate=2.5)
    recorder.emit(probe="layout", rate=3.5)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"probe": "layout", "rate": 2.5}, {"probe": "layout", "rate": 3.5}]
    assert list(tmp_path.iterdir()) == []
    path = recorder.close()
    assert recorder.close() is None  # nothing new: nothing appended twice
    rows = record.read(path)
    assert [(r["probe"], r["rate"]) for r in rows] == [("layout", 2.5), ("layout", 3.5)]
    assert {r["command"] for r in rows} == {"python benchmarks/tpu/probe.py --quick"}
    assert all(r["machine"]["load_avg_start"] == recorder.load_start for r in rows)


def test_the_commit_comes_from_the_variable_where_the_copy_has_no_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    record.commit.cache_clear()
    monkeypatch.setattr(record.subprocess, "run", no_git)
    monkeypatch.setenv(record.COMMIT_ENV, "abc1234")
    try:
        assert record.commit() == ("abc1234", None)
    finally:
        record.commit.cache_clear()


def test_the_variable_wins_over_a_git_that_may_lag_the_files(monkeypatch):
    """A lent machine's copy carried a `.git` older than its files: rows named that commit."""
    record.commit.cache_clear()
    monkeypatch.setenv(record.COMMIT_ENV, "def5678")
    try:
        assert record.commit() == ("def5678", None)
    finally:
        record.commit.cache_clear()
