"""WandbWriter and MlflowWriter: what each tracker stored, read back offline, equals what was logged.

wandb (offline mode) writes a run as a `.wandb` transaction log: LevelDB's log framing (32 KiB
blocks of records, each a 7-byte header then a payload, long payloads split FIRST/MIDDLE/LAST)
around wandb's own `Record` protobufs, after a 7-byte `:W&B` header. wandb no longer ships a
Python reader for it (`wandb sync` is Go code), so `wandb_history` undoes the framing and parses
each record with wandb's own protobuf class. MLflow is read back through `MlflowClient` on a local
file store.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import optax
import pytest
from toml_jobs import write_job
from trainer_helpers import METRICS, loss_fn, make_setup

from datarax.train import Trainer
from datarax.train.callbacks import MetricLogger
from datarax.train.metrics.writers import MlflowWriter, WandbWriter

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path):
    """The `Record` protobufs of a `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:HEADER]
    pos, parts = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        assert kind in (FULL, FIRST, MIDDLE, LAST), kind
        parts.append(data[pos + HEADER:pos + HEADER + length])
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """step -> the scalars of its history row (wandb's own `_step`, `_runtime`... left out)."""
    import json

    files = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    rows = {}
    for record in wandb_records(files[0]):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        rows[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


LOGGED = [(1, {"train/loss": 0.1 + 0.2, "train/accuracy": 1 / 3}), (2, {"train/loss": 2.0 ** -40}),
          (2, {"eval/loss": 1e300}), (5, {"train/loss": -0.0, "train/accuracy": 7.0})]


def expected_rows(logged) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for step, scalars in logged:
        rows.setdefault(step, {}).update(scalars)
    return rows


def test_wandb_offline_run_holds_exactly_the_logged_scalars(tmp_path):
    pytest.importorskip("wandb", reason="WandbWriter needs the `wandb` package: pip install 'datarax[wandb]'")
    writer = WandbWriter(project="datarax-test", name="unit", dir=str(tmp_path))
    for step, scalars in LOGGED:
        writer.write_scalars(step, scalars)
    writer.close()
    # One history row per step: a step's train and eval scalars are merged.
    assert wandb_history(tmp_path) == expected_rows(LOGGED)


def mlflow_store(tmp_path, monkeypatch) -> str:
    pytest.importorskip("mlflow", reason="MlflowWriter needs the `mlflow` package: pip install 'datarax[mlflow]'")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a local file store
    return (tmp_path / "mlruns").as_uri()


def mlflow_history(uri: str, run_id: str) -> dict[int, dict[str, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    rows: dict[int, dict[str, float]] = {}
    for name in client.get_run(run_id).data.metrics:
        for metric in client.get_metric_history(run_id, name):
            rows.setdefault(metric.step, {})[name] = metric.value
    return rows


def test_mlflow_file_store_holds_exactly_the_logged_metrics(tmp_path, monkeypatch):
    uri = mlflow_store(tmp_path, monkeypatch)
    from mlflow.tracking import MlflowClient

    writer = MlflowWriter(tracking_uri=uri, experiment="datarax-test", run_name="unit")
    for step, scalars in LOGGED:
        writer.write_scalars(step, scalars)
    writer.close()
    assert mlflow_history(uri, writer.run_id) == expected_rows(LOGGED)
    run = MlflowClient(tracking_uri=uri).get_run(writer.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "unit"
    # A second writer on the run's id logs into the same run (a resumed training run).
    again = MlflowWriter(tracking_uri=uri, run_id=writer.run_id)
    again.write_scalars(9, {"train/loss": 0.5})
    again.close()
    assert mlflow_history(uri, writer.run_id) == {**expected_rows(LOGGED), 9: {"train/loss": 0.5}}


def test_trackers_record_what_the_jsonl_writer_records_in_a_training_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="WandbWriter needs the `wandb` package: pip install 'datarax[wandb]'")
    uri = mlflow_store(tmp_path, monkeypatch)
    import json

    from datarax.monitoring.writers import JsonlWriter

    wandb_writer = WandbWriter(project="datarax-test", dir=str(tmp_path / "wandb_dir"))
    mlflow_writer = MlflowWriter(tracking_uri=uri)
    jsonl = JsonlWriter(tmp_path / "metrics.jsonl")
    setup = make_setup()
    trainer = Trainer(setup.model, optax.adam(0.05), setup.pipeline, loss_fn, metrics=METRICS,
                      eval_pipeline=setup.eval_pipeline, eval_every_steps=3,
                      callbacks=[MetricLogger([jsonl, wandb_writer, mlflow_writer], every_steps=2)])
    with trainer:
        trainer.fit(6)
    wandb_writer.close()
    mlflow_writer.close()
    reference: dict[int, dict[str, float]] = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        record.pop("time")
        reference.setdefault(step, {}).update(record)
    assert {"train/loss", "train/accuracy", "eval/loss"} <= set().union(*reference.values())
    assert wandb_history(tmp_path / "wandb_dir") == reference
    assert mlflow_history(uri, mlflow_writer.run_id) == reference


@pytest.mark.parametrize("make, config, match", [
    (WandbWriter, dict(project="p", mode="online2"), r"WandbWriterConfig.mode must be one of \('offline'"),
    (WandbWriter, dict(project=""), "WandbWriterConfig.project must be a non-empty string"),
    (MlflowWriter, dict(tracking_uri=""), "MlflowWriterConfig.tracking_uri must be a non-empty string"),
    (MlflowWriter, dict(tracking_uri="sqlite:///x.db", run_name=3), "MlflowWriterConfig.run_name must be"),
])
def test_writer_settings_are_checked_before_the_package_is_needed(make, config, match):
    with pytest.raises(ValueError, match=match):
        make(**config)


@pytest.mark.parametrize("make, settings, extra", [
    (WandbWriter, dict(project="p"), "wandb"),
    (MlflowWriter, dict(tracking_uri="sqlite:///x.db"), "mlflow"),
])
def test_a_missing_tracker_package_names_its_extra(monkeypatch, make, settings, extra):
    monkeypatch.setitem(sys.modules, "wandb" if extra == "wandb" else "mlflow.tracking", None)
    with pytest.raises(ImportError, match=rf"needs the `{extra}` package: pip install 'datarax\[{extra}\]'"):
        make(**settings)


KEYS = "callbacks = [{ metric_logger = { every_steps = 1, writers = [WRITERS] } }]"
REJECTED = [  # (the writer tables, the error after "<path>: ")
    ('{ wandb = { project = "p", mode = "online2" } }',
     "trainer.callbacks[0].metric_logger.writers[0].wandb.mode is rejected by WandbWriterConfig: "
     "WandbWriterConfig.mode must be one of ('offline', 'online', 'disabled'), got 'online2'"),
    ('{ wandb = { mode = "offline" } }', "trainer.callbacks[0].metric_logger.writers[0].wandb.project is required"),
    ('{ mlflow = { tracking_uri = "sqlite:///m.db", experiment = "" } }',
     "trainer.callbacks[0].metric_logger.writers[0].mlflow.experiment is rejected by MlflowWriterConfig"),
    ('{ jsonl = { path = "m.jsonl" } }, { mlflw = { tracking_uri = "x" } }',
     "trainer.callbacks[0].metric_logger.writers[1].mlflw is not a known writer"),
]


@pytest.fixture
def folder(tmp_path):
    return tmp_path


@pytest.mark.parametrize("writers, error", REJECTED, ids=[str(i) for i in range(len(REJECTED))])
def test_validate_rejects_bad_writer_settings_at_their_key(folder, capsys, writers, error):
    from datarax.cli.main import main

    path = write_job(folder, KEYS.replace("WRITERS", writers))
    assert main(["validate", str(path)]) == 1
    assert f"datarax: error: {path}: {error}" in capsys.readouterr().err


def test_train_logs_to_both_trackers_from_the_file(folder, capsys, monkeypatch):
    pytest.importorskip("wandb", reason="WandbWriter needs the `wandb` package: pip install 'datarax[wandb]'")
    uri = mlflow_store(folder, monkeypatch)
    import json

    from datarax.cli.main import main

    writers = (f'{{ jsonl = {{ path = "m.jsonl" }} }}, {{ wandb = {{ project = "p", dir = "tracked" }} }}, '
               f'{{ mlflow = {{ tracking_uri = "{uri}", experiment = "toml" }} }}')
    path = write_job(folder, KEYS.replace("WRITERS", writers))
    monkeypatch.chdir(folder.parent)  # paths are relative to the file, not the working directory
    assert main(["validate", str(path)]) == 0
    assert main(["train", str(path), "--no-progress"]) == 0
    import wandb
    from mlflow.tracking import MlflowClient

    wandb.teardown()  # finishes the writer's run and waits for its file, as the process's exit would
    reference = {}
    for line in (folder / "m.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        reference[step] = {k: v for k, v in record.items() if k != "time"}
    assert sorted(reference) == [1, 2, 3, 4]
    assert wandb_history(folder / "tracked") == reference
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("toml").experiment_id])
    assert mlflow_history(uri, run.info.run_id) == reference


def test_the_tracker_docs_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="WandbWriter needs the `wandb` package: pip install 'datarax[wandb]'")
    pytest.importorskip("mlflow", reason="MlflowWriter needs the `mlflow` package: pip install 'datarax[mlflow]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the block sets it too; monkeypatch restores it
    text = (Path(__file__).resolve().parents[3] / "docs" / "trainers.md").read_text()
    section = text[text.index("\n## Experiment trackers\n"):]
    blocks = re.findall(r"```python\n(.*?)```", section[:section.index("\n## ", 1)], re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/trainers.md", "exec"), {})
