"""`datarax replay RUN_DIR --step N`: the batch a configured run's step N received, rebuilt bitwise.

`datarax train` writes `run.json` into the run directory when it starts: the configuration file,
its overrides and allow list, a sha256 of the file, the checkpoint directory, and the training
pipeline's fingerprint and draw keys (`datarax.pipeline.replay.draw_keys`). `replay_run` builds the
pipeline again from that configuration (no model), finds the cursor of step N by arithmetic from
the nearest checkpoint's iterator state (the newest before N, else the oldest after it; the run's
start when there is none) and replays that one batch (`Pipeline.replay`). It refuses, naming the
reason and the fix, where the batch could differ: the configuration file changed since the run
started, the rebuilt pipeline's fingerprint or draw keys differ from the run's or the checkpoint's
(another source, dataset size, seed, sampler or stages), or the source is a stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from datarax.batching import batch_at
from datarax.checkpoint.integrity import verify_iterator
from datarax.checkpoint.orbax import finalized_steps, read_state
from datarax.checkpoint.trees import structure_differences
from datarax.pipeline.replay import ReplayedBatch, ReplayError, check_replayable, draw_keys
from datarax.pipeline.state import IteratorStateError, check_state
from datarax.train.loop.step import EPOCH, RECORD_IDS

RUN_FILE = "run.json"


def file_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_run_file(spec: Any, run_dir: str | os.PathLike, pipeline: Any, checkpoint_dir: str | None) -> Path:
    """Writes `run.json` (see the module docstring) for a run of `spec` about to train `pipeline`."""
    record = {"config": os.path.abspath(spec.path), "overrides": list(spec.overrides),
              "allow": list(spec.allow.modules), "config_sha256": file_sha256(spec.path),
              "checkpoint_dir": checkpoint_dir, "pipeline_fingerprint": pipeline.fingerprint,
              "pipeline_structure": pipeline.structure_parts, "pipeline_keys": draw_keys(pipeline),
              "train_pipeline_params": bool(spec.trainer.section.train_pipeline_params)}
    path = Path(run_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{RUN_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)
    return path


@dataclasses.dataclass(frozen=True)
class RunReplay:
    """A replayed step of a configured run: the batch, and where its cursor was found."""

    step: int
    replayed: ReplayedBatch
    found_from: str  # "the checkpoint at step 40000", "the run's start (no checkpoint)"
    config: str


def read_run_file(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        raise ReplayError(f"{run_dir} has no {RUN_FILE}: `datarax replay` reads the run directory of a run started "
                          "by `datarax train` (it writes run.json when it starts); from Python, call "
                          "trainer.replay(step) on the trainer")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ReplayError(f"{path} is not valid JSON ({exc}); run `datarax train` again to rewrite it") from exc


def replay_run(run_dir: str | os.PathLike, step: int) -> RunReplay:
    """The batch step `step` of the run in `run_dir` received (see the module docstring)."""
    import datarax.train.config  # noqa: F401 - registers [trainer], so the configuration validates
    from datarax.config import build_pipeline, load_spec

    record = read_run_file(run_dir)
    config = record["config"]
    if not os.path.isfile(config):
        raise ReplayError(f"the run's configuration {config} is gone; replay rebuilds the pipeline from it: restore "
                          "the file")
    if file_sha256(config) != record["config_sha256"]:
        raise ReplayError(f"the configuration {config} changed since the run started (sha256 "
                          f"{record['config_sha256'][:12]}... then, {file_sha256(config)[:12]}... now), so the "
                          "pipeline built from it may give other batches; restore the file as the run had it "
                          "(e.g. from version control)")
    spec = load_spec(config, overrides=record["overrides"], allow=record["allow"])
    pipeline = build_pipeline(spec)
    try:
        check_replayable(pipeline)
        _check_same(pipeline, record, "the run")
        loader = pipeline.raw_loader(ids_key=RECORD_IDS, epoch_key=EPOCH) \
            if record.get("train_pipeline_params") else pipeline
        epoch, position, found = _cursor(loader, record.get("checkpoint_dir"), step, pipeline)
        replayed = loader.replay(epoch, position)
    finally:
        pipeline.close()
    return RunReplay(step, replayed, found, config)


def _check_same(pipeline: Any, saved: dict[str, Any], whose: str) -> None:
    """Refuses when `pipeline` is not the one `saved` (run.json or checkpoint metadata) describes."""
    fingerprint = saved.get("pipeline_fingerprint")
    if fingerprint is not None and fingerprint != pipeline.fingerprint:
        differs = structure_differences(saved.get("pipeline_structure"), pipeline.structure_parts)
        raise ReplayError(f"the pipeline built now is not {whose}'s: "
                          + (f"its {differs}" if differs else f"fingerprint {fingerprint!r} then, "
                             f"{pipeline.fingerprint!r} now")
                          + " (the dataset or the configuration changed); restore them as they were to replay")
    keys = saved.get("pipeline_keys")
    if keys is not None and keys != draw_keys(pipeline):
        raise ReplayError(f"the pipeline built now draws from other keys than {whose}'s (its stages' seeds or the "
                          "run's seed changed), so every augmentation would differ; restore the seeds to replay")


def _cursor(loader: Any, directory: str | None, step: int, pipeline: Any) -> tuple[int, int, str]:
    """`(epoch, position, found from)` of step `step`'s batch."""
    steps = finalized_steps(directory)  # read without taking the run's lock
    before = [s for s in steps if s < step]
    base = before[-1] if before else next((s for s in steps if s >= step), None)
    if base is None:
        epoch, position, found = 0, 0, "the run's start (no checkpoint)"
        base = 0
    else:
        where = os.path.join(directory, str(base))
        try:
            meta = json.loads(Path(where, "meta", "metadata").read_text())
            state = read_state(os.path.join(where, "iterator"))
            verify_iterator(meta, state)
            check_state(state, fingerprint=loader.fingerprint, epoch_length=len(loader.sampler),
                        num_records=len(loader.source), batch_size=loader.batch_size)
        except (OSError, ValueError, IteratorStateError) as exc:
            raise ReplayError(f"checkpoint step {base} in {directory} cannot place step {step}: {exc}") from exc
        _check_same(pipeline, meta, f"checkpoint step {base}")
        epoch, position, found = state["epoch"], state["position"], f"the checkpoint at step {base}"
    try:
        epoch, position, _ = batch_at(len(loader.sampler), loader.batch_size, drop_remainder=loader.drop_remainder,
                                      epoch=epoch, position=position, offset=step - base - 1)
    except ValueError as exc:
        raise ReplayError(f"step {step} cannot be placed from {found}: {exc}") from exc
    return epoch, position, found
