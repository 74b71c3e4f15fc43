"""Goodput across restarts: every run of one job, and the work a kill threw away.

`RunHistory` keeps one record per run (a *segment*: start step, restored step, last step, wall and
busy seconds, and the same at each checkpoint save) in `<run dir>/goodput_history.json`, rewritten
atomically while the run trains, so a run killed by SIGKILL leaves how far it got. When the next
run resumes from step R, the previous run's work past R is *lost*. `cumulative` adds the runs up:

    goodput = (sum of busy_s - lost busy_s) / sum of wall_s

with the time between runs reported beside it. After a run that did not finish, the lost work is
"at least" what was recorded (with `unrecorded_s`, the time from its last record to the next
start) or "unknown", never "none". A fresh start after a finished run begins a new history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from datarax.train.metrics.goodput import pct

HISTORY = "goodput_history.json"
MAX_MARKS = 64  # checkpoint marks kept per segment (the newest)


class RunHistory:
    """The segments of one job in `directory/goodput_history.json` (the module docstring has the rules)."""

    def __init__(self, directory: Any):
        self.path = Path(directory) / HISTORY
        self.segments: list[dict] = self._load()
        self.current: dict | None = None

    def _load(self) -> list[dict]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []  # a damaged history only loses the cumulative figures, never the run
        segments = data.get("segments") if isinstance(data, dict) else None
        return [s for s in segments if isinstance(s, dict)] if isinstance(segments, list) else []

    def begin(self, *, began_at: float, start_step: int, resumed_from: int | None) -> None:
        """Starts this run's segment (kept in memory until the first `update`)."""
        if resumed_from is None and start_step == 0 and self.segments and self.segments[-1].get("finished"):
            self.segments = []  # a new job in the same directory
        self.current = {"began_at": began_at, "start_step": int(start_step), "resumed_from": resumed_from,
                        "last_step": int(start_step), "wall_s": 0.0, "busy_s": 0.0, "finished": False,
                        "checkpoints": []}

    def update(self, *, last_step: int, wall_s: float, busy_s: float, finished: bool = False,
               checkpoint: int | None = None) -> None:
        """Records this run's progress (and a checkpoint saved now), then rewrites the file."""
        segment = self.current
        if segment is None:
            raise RuntimeError("RunHistory.update before begin")
        segment.update(last_step=int(last_step), wall_s=float(wall_s), busy_s=float(busy_s),
                       finished=bool(finished))
        if checkpoint is not None:
            segment["checkpoints"] = [*segment["checkpoints"], [int(checkpoint), float(wall_s), float(busy_s)]][
                -MAX_MARKS:]
        self.write()

    def all_segments(self) -> list[dict]:
        """The earlier segments and this run's (once it recorded progress)."""
        return self.segments + ([self.current] if self.current is not None and self.current["wall_s"] > 0 else [])

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"segments": self.all_segments()}, indent=1))
        os.replace(tmp, self.path)


def _mark_at(segment: dict, step: int) -> tuple[float, float]:
    """(wall_s, busy_s) of `segment` when it had step `step` saved (0, 0 when it began at or after it)."""
    best = (0.0, 0.0)
    for mark_step, wall_s, busy_s in segment.get("checkpoints", []):
        if mark_step <= step:
            best = (wall_s, busy_s)
    return best


def cumulative(segments: list[dict]) -> dict:
    """The job's goodput over its runs, with the work lost at each restart (see the module docstring)."""
    if not segments:
        return {}
    wall = float(sum(s["wall_s"] for s in segments))
    busy = float(sum(s["busy_s"] for s in segments))
    lost_steps, lost_s, lost_busy, between, unrecorded = 0, 0.0, 0.0, 0.0, 0.0
    restarts = []
    for prev, cur in zip(segments, segments[1:]):
        resumed = cur["resumed_from"] if cur.get("resumed_from") is not None else cur["start_step"]
        gap = max(cur["began_at"] - (prev["began_at"] + prev["wall_s"]), 0.0)
        between += gap
        finished = bool(prev.get("finished"))
        steps = seconds = busy_lost = 0
        if prev["last_step"] > resumed:
            wall_at, busy_at = _mark_at(prev, resumed)
            steps, seconds, busy_lost = (prev["last_step"] - resumed, max(prev["wall_s"] - wall_at, 0.0),
                                         max(prev["busy_s"] - busy_at, 0.0))
        lost_steps, lost_s, lost_busy = lost_steps + steps, lost_s + seconds, lost_busy + busy_lost
        unrecorded += 0.0 if finished else gap
        restarts.append({"resumed_from": resumed, "lost_steps": steps, "lost_s": seconds,
                         "killed_at_step": prev["last_step"], "finished": finished,
                         "unrecorded_s": 0.0 if finished else gap})
    useful = max(busy - lost_busy, 0.0)
    runs = f"{len(segments)} runs" if len(segments) != 1 else "1 run"
    text = (f"across {runs} ({wall:.1f} s inside fit, plus {between:.1f} s between runs): goodput "
            f"{pct(useful, wall):.1f}% of the runs' time inside fit")
    killed = [r for r in restarts if not r["finished"]]
    after = (f"what a killed run did after its last record is unknown (up to {unrecorded:.1f} s before the next run "
             "began; its record is rewritten every history_every_secs)")
    if lost_steps:
        text += (f"; {lost_steps} steps (at least; {lost_s:.1f} s, {pct(lost_s, wall):.1f}% of that time) were "
                 "trained again after a restart: the work done since the last checkpoint before a kill")
        text += f", and {after}" if killed else ""
    elif killed:
        text += (f"; the work lost at a restart is unknown: the run killed at step {killed[-1]['killed_at_step']} had "
                 f"recorded nothing past the checkpoint the next resumed from, and {after}")
    elif len(segments) > 1:
        text += "; no work was lost at a restart (each run before one ended cleanly at the step the next resumed from)"
    return {"runs": len(segments), "wall_s": wall, "between_runs_s": between, "busy_s": busy,
            "goodput_s": useful, "goodput_pct": pct(useful, wall), "lost_steps": lost_steps, "lost_s": lost_s,
            "lost_busy_s": lost_busy, "lost_pct": pct(lost_s, wall), "lost_known": not killed,
            "unrecorded_s": unrecorded, "restarts": restarts, "text": text}
