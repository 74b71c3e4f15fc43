"""`datarax replay RUN_DIR --step N`: print the records a training step received, where each came from
and what every stochastic stage drew for it; `--out` writes the batch as `.npz`, `--show` a labelled
PNG grid of its images (as `datarax preview` draws them). docs/troubleshooting.md has an example.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

MAX_VALUES = 6  # values of one drawn parameter printed per record; longer ones are summarised


def value_text(value: Any) -> str:
    """A drawn parameter of one record, short: `17.1`, `True`, `[3, 5, 28, 28]`."""
    array = np.asarray(value)
    if array.dtype.kind == "f":
        array = np.round(array.astype(np.float64), 4)
    if array.ndim == 0:
        return str(array.item())
    flat = array.reshape(-1).tolist()
    text = ", ".join(map(str, flat[:MAX_VALUES]))
    return f"[{text}{', ...' if len(flat) > MAX_VALUES else ''}]"


def format_replay(result: Any) -> str:
    """The report of a `datarax.train.replay.RunReplay`: the batch's place, then one block per record."""
    replayed = result.replayed
    fields = ", ".join(f"{k} {v.dtype.name}{list(v.shape)}" for k, v in replayed.batch.items())
    lines = [f"step {result.step}: epoch {replayed.epoch}, position {replayed.position}, {replayed.num_valid} records "
             f"(found from {result.found_from})", f"batch: {fields}"]
    nonfinite = replayed.nonfinite()
    for entry in replayed.records():
        row = entry["row"]
        lines.append(f"row {row}  record {entry['record_id']}  {entry['origin']}")
        for problem in nonfinite.get(row, []):
            lines.append(f"    not finite: {problem}")
        for stage, drawn in entry["draws"].items():
            if drawn is None:
                lines.append(f"    {stage}: its draws are not described (a user function's generator)")
            else:
                lines.append(f"    {stage}: " + ", ".join(f"{k} {value_text(v)}" for k, v in drawn.items()))
    return "\n".join(lines)


def replay_command(run_dir: str, step: int, *, out: str | None = None, show: str | None = None,
                   field: str | None = None) -> str:
    """Replays step `step` of the run in `run_dir`; returns the report (with the files written)."""
    from datarax.train.incidents import write_batch, write_images
    from datarax.train.replay import replay_run

    result = replay_run(run_dir, step)
    text = format_replay(result)
    if out is not None:
        text += f"\nwrote {write_batch(result.replayed, out)} (the batch's fields, bitwise)"
    if show is not None:
        drawn = write_images(result.replayed, show, field)
        if drawn is None:
            raise ValueError(f"--show {show}: the batch has no image (H, W[, 1|3|4]) or audio field to draw "
                             f"({', '.join(result.replayed.batch)}); name one with --field")
        text += f"\nwrote {os.fspath(show)}: field {drawn!r}, each tile captioned 'row: record id'"
    return text
