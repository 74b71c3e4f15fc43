"""Goodput accounting: where the wall time of a training run went, measured honestly.

Under asynchronous dispatch the host blocks in next() even while the device is busy, so time in
next() is not a stall. The stall is *exposed device idle*: for each step i, the gap between
step i-1's result being ready (seen by a watcher thread) and step i being dispatched. Every idle
stretch of the run is attributed to what the host was doing meanwhile: waiting in next() (a
data stall), compiling, checkpointing, evaluating, fetching the first batch, or anything else.

    wall = goodput (device busy with steps) + data_stall + first_batch + compile
           + checkpoint_save + checkpoint_restore + eval + other

`steady` figures cover the steps after the first (from step 1's result to the last result),
so start-up costs do not drown the per-step picture; `window` covers the last N steps.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from datarax.core.checks import check_int
from datarax.monitoring.ledger import diagnose as diagnose_steady
from datarax.monitoring.ledger import step_ledger
from datarax.monitoring.watcher import overlap as _overlap

BUCKETS = ("goodput", "data_stall", "first_batch", "compile", "checkpoint_save", "checkpoint_restore",
           "eval", "other")
_FIELDS = ("step", "batch_size", "next_begin", "next_end", "dispatched", "ready", "compile")


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


class GoodputLedger:
    """Per-step timings and host intervals of one run (all times from `time.perf_counter()`).

    Compact (a few floats per step in `array`s), filled by `GoodputMonitor`, summarised by
    `summary()`.
    """

    def __init__(self, window: int = 100):
        check_int(window, "window", 2, why=" (steps in the rolling window)")
        self.window = window
        self.begin: float | None = None
        self.end: float | None = None
        self.steps = {name: array("d") for name in _FIELDS}
        self.intervals: list[tuple[str, float, float]] = []

    def __len__(self) -> int:
        return len(self.steps["step"])

    def start(self, now: float) -> None:
        self.begin = now

    def finish(self, now: float) -> None:
        self.end = now

    def add_step(self, step: int, batch_size: int, next_begin: float, next_end: float, dispatched: float,
                 compile_seconds: float) -> int:
        """Records a dispatched step; returns its index for `set_ready`."""
        for name, value in zip(_FIELDS, (step, batch_size, next_begin, next_end, dispatched, math.nan,
                                         compile_seconds)):
            self.steps[name].append(value)
        if compile_seconds > 0:
            self.intervals.append(("compile", dispatched - compile_seconds, dispatched))
        return len(self) - 1

    def set_ready(self, index: int, now: float) -> None:
        self.steps["ready"][index] = now

    def add_interval(self, kind: str, begin: float, end: float) -> None:
        if kind not in BUCKETS:
            raise ValueError(f"interval kind must be one of {BUCKETS}, got {kind!r}")
        self.intervals.append((kind, begin, end))

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-step fields as numpy arrays, cut to the steps whose result time is known."""
        out = {name: np.frombuffer(values, dtype=np.float64).copy() for name, values in self.steps.items()}
        known = ~np.isnan(out["ready"])
        count = int(np.argmin(known)) if not known.all() else len(known)
        return {name: values[:count] for name, values in out.items()}

    def summary(self) -> dict:
        """Totals, badput buckets, steady-state and rolling-window figures, rates and a diagnosis."""
        a = self.arrays()
        n = len(a["step"])
        begin = self.begin if self.begin is not None else (a["next_begin"][0] if n else 0.0)
        end = self.end if self.end is not None else (a["ready"][-1] if n else begin)
        if n == 0:
            wall = max(end - begin, 0.0)
            buckets = {k: 0.0 for k in BUCKETS}
            buckets["other"] = wall
            return {"steps": 0, "wall_s": wall, "buckets_s": buckets,
                    "buckets_pct": {k: _pct(v, wall) for k, v in buckets.items()},
                    "steady": {}, "window": {}, "diagnosis": "no steps completed", "per_step": {}}
        ready, dispatched = a["ready"], a["dispatched"]
        prev_ready = np.concatenate([[-np.inf], ready[:-1]])
        ledger = step_ledger(dispatched, ready, a["next_begin"], a["next_end"] - a["next_begin"])
        busy, gap, stall = ledger["busy_s"], ledger["idle_s"], ledger["stall_s"]
        # Idle segments in time order: start-up, the gaps between steps, the tail.
        starts = np.concatenate([[begin], prev_ready[1:], [ready[-1]]])
        ends = np.concatenate([[dispatched[0]], dispatched[1:], [max(end, ready[-1])]])
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        buckets = {k: 0.0 for k in BUCKETS}
        buckets["goodput"] = float(busy.sum())
        buckets["data_stall"] = float(stall.sum())
        buckets["first_batch"] = _overlap(starts, ends, a["next_begin"][0], a["next_end"][0])
        for kind, b, e in self.intervals:
            buckets[kind] += _overlap(starts, ends, b, e)
        wall = max(end - begin, float(ready[-1] - begin))
        buckets["other"] = max(wall - sum(v for k, v in buckets.items() if k != "other"), 0.0)
        per_step = {"step": a["step"].astype(int), "batch_size": a["batch_size"].astype(int),
                    "host_next_s": a["next_end"] - a["next_begin"], "exposed_idle_s": gap, "data_stall_s": stall,
                    "step_time_s": busy, "compile_s": a["compile"]}
        gaps = (prev_ready, dispatched)
        steady = self._span_stats(per_step, gaps, 1, n)
        window = self._span_stats(per_step, gaps, max(1, n - self.window), n)
        return {
            "steps": n, "wall_s": wall,
            "buckets_s": buckets, "buckets_pct": {k: _pct(v, wall) for k, v in buckets.items()},
            "first_batch_s": float(a["next_end"][0] - a["next_begin"][0]),
            "compile_s": float(a["compile"].sum()),
            "checkpoint_save_s": sum(e - b for k, b, e in self.intervals if k == "checkpoint_save"),
            "checkpoint_restore_s": sum(e - b for k, b, e in self.intervals if k == "checkpoint_restore"),
            "host_next_s": float(per_step["host_next_s"].sum()),
            "steady": steady, "window": window,
            "diagnosis": diagnose(steady, buckets, wall),
            "per_step": per_step,
        }

    def _span_stats(self, per_step: dict, gaps: tuple, lo: int, hi: int) -> dict:
        """Figures over steps [lo, hi), each measured from the previous step's result."""
        if hi - lo < 1:
            return {}
        busy = float(per_step["step_time_s"][lo:hi].sum())
        idle = float(per_step["exposed_idle_s"][lo:hi].sum())
        stall = float(per_step["data_stall_s"][lo:hi].sum())
        host = float(per_step["host_next_s"][lo:hi].sum())
        elements = float(per_step["batch_size"][lo:hi].sum())
        span = busy + idle
        starts, ends = gaps[0][lo:hi], gaps[1][lo:hi]
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        idle_by = {k: 0.0 for k in ("checkpoint_save", "eval", "compile")}
        for kind, b, e in self.intervals:
            if kind in idle_by:
                idle_by[kind] += _overlap(starts, ends, b, e)
        loop = max(idle - stall - sum(idle_by.values()), 0.0)
        return {
            "steps": hi - lo, "span_s": span, "elements": elements,
            "goodput_pct": _pct(busy, span), "exposed_idle_pct": _pct(idle, span),
            "data_stall_pct": _pct(stall, span), "host_next_pct": _pct(host, span),
            "checkpoint_idle_pct": _pct(idle_by["checkpoint_save"], span), "eval_idle_pct": _pct(idle_by["eval"], span),
            "compile_idle_pct": _pct(idle_by["compile"], span), "loop_idle_pct": _pct(loop, span),
            "step_time_s": busy / (hi - lo), "exposed_idle_s": idle / (hi - lo),
            "data_stall_s": stall / (hi - lo), "host_next_s": host / (hi - lo),
            "step_consumes_el_s": elements / busy if busy > 0 else math.inf,
            "pipeline_delivers_el_s": elements / (busy + stall) if busy + stall > 0 else math.inf,
            "achieved_el_s": elements / span if span > 0 else math.inf,
        }


def diagnose(steady: dict, buckets: dict, wall: float) -> str:
    """The shared verdict (`datarax.monitoring.ledger.diagnose`) on the steady steps, plus the
    largest start-up or checkpoint badput when it takes 10% of the run."""
    if not steady:
        return "too few steps to tell (need at least 2)"
    host = max(steady["exposed_idle_pct"] - steady["data_stall_pct"], 0.0)
    parts = {"checkpoint saves": steady.get("checkpoint_idle_pct", 0.0),
             "evaluation": steady.get("eval_idle_pct", 0.0), "recompiles": steady.get("compile_idle_pct", 0.0),
             "loop overhead (callbacks, logging, dispatch)": steady.get("loop_idle_pct", host)}
    text = diagnose_steady(stall_pct=steady["data_stall_pct"], idle_pct=steady["exposed_idle_pct"],
                           step_s=steady["step_time_s"], consumes_el_s=steady["step_consumes_el_s"],
                           delivers_el_s=steady["pipeline_delivers_el_s"], host_parts=parts,
                           host_next_pct=steady["host_next_pct"])
    other = {k: v for k, v in buckets.items() if k not in ("goodput", "data_stall")}
    worst = max(other, key=other.get)
    if wall > 0 and other[worst] / wall >= 0.10:
        text += f"; largest other badput: {worst} {100 * other[worst] / wall:.0f}% of the run's wall time"
    return text
