"""The Profiler callback and the trace annotations: read back from the perfetto trace jax.profiler writes."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from toml_jobs import write_job
from trainer_helpers import loss_fn, points

from datarax import Pipeline
from datarax.host.stage import HostStage, HostStageSource
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import Profiler, ProfilerConfig
from datarax.train.callbacks.profiler import HOST_STAGE, NEXT, STEP


class Shift(HostStage):
    """Adds `delta` to x on the host (a stage that does real work, so the reader runs it)."""

    def __init__(self, delta: float):
        self.delta = delta

    def output_spec(self, input_spec):
        return dict(input_spec)

    def __call__(self, batch, ctx):
        return {**batch, "x": batch["x"] + np.float32(self.delta)}


def trace_events(trace_dir: str | Path) -> list[dict]:
    """The complete ("X") events of the one perfetto trace in `trace_dir`."""
    files = list(Path(trace_dir).glob("*perfetto_trace.json.gz"))
    assert len(files) == 1, list(Path(trace_dir).iterdir())
    with gzip.open(files[0]) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def datarax_counts(events: list[dict]) -> dict[str, int]:
    return dict(collections.Counter(e["name"] for e in events if e["name"].startswith("datarax/")))


def only_trace(log_dir: Path) -> Path:
    runs = list((log_dir / "plugins" / "profile").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def test_each_host_stage_call_is_one_named_span(tmp_path):
    source = HostStageSource(MemorySource(data=points(16)), [Shift(1.0), Shift(2.0), Shift(3.0)])
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        batches = [source.read(np.arange(4) + 4 * i, epoch=0) for i in range(3)]
    np.testing.assert_array_equal(batches[2]["x"], points(16)["x"][8:12] + np.float32(6.0))
    # Three stages of one kind are told apart by their position (as in the timing reports).
    assert datarax_counts(trace_events(only_trace(tmp_path))) == {f"{HOST_STAGE}Shift#{i}": 3 for i in range(3)}


PREFETCH = 2  # batches the reader may hold queued (Pipeline's default)


def make_trainer(callbacks) -> Trainer:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=points(64))
    pipeline = Pipeline(source, [Shift(0.5)], batch_size=8, prefetch=PREFETCH)
    return Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, callbacks=callbacks)


WINDOWS = [(1, 1), (2, 6), (7, 20)]  # the last runs past the end of an 8-step fit: traced to step 8


@pytest.mark.parametrize("start, stop", WINDOWS)
def test_profiler_traces_exactly_steps_start_to_stop(tmp_path, start, stop):
    profiler = Profiler(log_dir=str(tmp_path), start_step=start, stop_step=stop, create_perfetto_trace=True)
    trainer = make_trainer([profiler])
    with trainer:
        trainer.fit(8)
    trace = only_trace(tmp_path)
    assert profiler.trace_dir == str(trace)
    assert list(trace.glob("*.xplane.pb")), list(trace.iterdir())
    events = trace_events(trace)
    traced = len(range(start, min(stop, 8) + 1))
    counts = datarax_counts(events)
    assert counts[NEXT] == counts[STEP] == traced
    assert set(counts) - {f"{HOST_STAGE}Shift"} == {NEXT, STEP}
    # next() and the step alternate on the training thread; the host stage runs on the reader thread.
    main = sorted((e["ts"], e["name"]) for e in events if e["name"] in (NEXT, STEP))
    assert [name for _, name in main] == [NEXT, STEP] * traced
    assert len({e["tid"] for e in events if e["name"] in (NEXT, STEP)}) == 1
    stage_threads = {e["tid"] for e in events if e["name"] == f"{HOST_STAGE}Shift"}
    assert stage_threads.isdisjoint(e["tid"] for e in events if e["name"] == STEP)
    # The reader runs ahead of the steps, so which of its reads fall inside the window depends on the
    # threads' timing, except for this many: before the window it can have begun at most the start - 1
    # batches the steps took, the PREFETCH queued, one waiting to be queued and one the source was told
    # is next (`upcoming`); by the window's end the steps have taken min(stop, 8). So (2, 6) sees at
    # least one (a window of 3 steps might see none). The exact per-read count is
    # test_each_host_stage_call_is_one_named_span.
    inside = max(0, min(stop, 8) - (start + PREFETCH + 1))
    assert inside <= counts.get(f"{HOST_STAGE}Shift", 0) <= 12


def test_a_window_the_run_never_reaches_writes_no_trace(tmp_path):
    profiler = Profiler(ProfilerConfig(log_dir=str(tmp_path), start_step=9, stop_step=12))
    with make_trainer([profiler]) as trainer:
        trainer.fit(4)
    assert profiler.trace_dir is None and not (tmp_path / "plugins").exists()


BAD = [  # (settings, the field the error names, words of the message)
    (dict(log_dir="", start_step=1, stop_step=2), "log_dir", "must be a directory path"),
    (dict(log_dir="p", start_step=0, stop_step=2), "start_step", "must be an integer >= 1"),
    (dict(log_dir="p", start_step=1.5, stop_step=2), "start_step", "must be an integer >= 1"),
    (dict(log_dir="p", start_step=5, stop_step=4), "stop_step", "must be an integer >= start_step = 5"),
    (dict(log_dir="p", start_step=1, stop_step=2, create_perfetto_trace="yes"), "create_perfetto_trace",
     "must be True or False"),
]


@pytest.mark.parametrize("settings, field, words", BAD, ids=[b[1] for b in BAD])
def test_profiler_settings_are_checked(settings, field, words):
    with pytest.raises(ValueError, match=f"ProfilerConfig.{field} {words}"):
        Profiler(**settings)


def test_profiler_takes_a_config_or_settings_not_both(tmp_path):
    with pytest.raises(TypeError, match="not both"):
        Profiler(ProfilerConfig(log_dir=str(tmp_path), start_step=1, stop_step=1), start_step=2)


KEYS = "callbacks = [{ profiler = PROFILER }]"
GOOD = '{ log_dir = "profile", start_step = 2, stop_step = 3, create_perfetto_trace = true }'
REJECTED = [  # (the profiler table, the error after "<path>: ")
    ('{ log_dir = "profile", start_step = 0, stop_step = 3 }',
     "trainer.callbacks[0].profiler.start_step is rejected by ProfilerConfig: ProfilerConfig.start_step must be an "
     "integer >= 1"),
    ('{ log_dir = "profile", start_step = 4, stop_step = 3 }',
     "trainer.callbacks[0].profiler.stop_step is rejected by ProfilerConfig: ProfilerConfig.stop_step must be an "
     "integer >= start_step = 4, got 3"),
    ('{ log_dir = "profile", start_step = "2", stop_step = 3 }', "trainer.callbacks[0].profiler.start_step"),
    ('{ start_step = 2, stop_step = 3 }', "trainer.callbacks[0].profiler.log_dir is required"),
    ('{ log_dir = "profile", start_step = 2, stop_step = 3, steps = 4 }',
     "trainer.callbacks[0].profiler.steps is not a known"),
]


@pytest.fixture
def folder(tmp_path):
    return tmp_path


@pytest.mark.parametrize("table, error", REJECTED, ids=[r[1].split(" ")[0] + str(i) for i, r in enumerate(REJECTED)])
def test_validate_rejects_bad_profiler_settings_at_their_key(folder, capsys, table, error):
    from datarax.cli.main import main

    path = write_job(folder, KEYS.replace("PROFILER", table))
    assert main(["validate", str(path)]) == 1
    assert f"datarax: error: {path}: {error}" in capsys.readouterr().err


def test_train_profiles_from_the_file_into_a_folder_beside_it(folder, capsys, monkeypatch):
    from datarax.cli.main import main

    path = write_job(folder, KEYS.replace("PROFILER", GOOD))
    monkeypatch.chdir(folder.parent)  # log_dir is relative to the file, not the working directory
    assert main(["validate", str(path)]) == 0
    assert main(["train", str(path), "--no-progress"]) == 0
    counts = datarax_counts(trace_events(only_trace(folder / "profile")))
    assert counts == {NEXT: 2, STEP: 2}

