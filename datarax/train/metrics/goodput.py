"""Goodput accounting: where the wall time of a training run went, measured honestly.

Under asynchronous dispatch the host blocks in next() even while the device is busy, so time in
next() is not a stall. The stall is *exposed device idle*: for each step i, the gap between step
i-1's result being ready (seen by a watcher thread) and step i being dispatched. Every idle stretch
is attributed to what the host was doing meanwhile: waiting in next() (a data stall), compiling,
checkpointing, evaluating, fetching the first batch, or anything else (`BUCKETS`):

    wall = goodput (device busy with steps) + data_stall + first_batch + compile
           + checkpoint_save + checkpoint_restore + eval + other

`steady` figures cover the steps after the first call (from its result to the last result), so
start-up costs do not drown the per-step picture; `window` covers the last N calls. A ledger row is
one dispatched call: one step, or K with `Trainer(steps_per_execution=K)`; its busy time, idle
before it and data wait are the call's, while step counts and per-step times count its K steps.

Every sentence of the report names its denominator: the `headline` is about the run's whole wall
time (the split the PNG timeline draws), the `diagnosis` about the steady steps, saying what share
of the wall those are. An input-bound verdict names the background reader's slowest part and the
remedies in order; every compile is listed with its cause. docs/trainers.md, "Goodput and data
stalls", defines each field of the summary.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from datarax.core.checks import check_int
from datarax.monitoring.ledger import diagnose as diagnose_steady
from datarax.monitoring.ledger import input_remedies, remedies_text, step_ledger
from datarax.monitoring.stages import describe_reader
from datarax.monitoring.watcher import overlap as _overlap

BUCKETS = ("goodput", "data_stall", "first_batch", "compile", "checkpoint_save", "checkpoint_restore",
           "eval", "other")
_FIELDS = ("step", "batch_size", "next_begin", "next_end", "dispatched", "ready", "compile", "steps")


def pct(part: float, whole: float) -> float:
    """`part` as a percentage of `whole` (0 when `whole` is not positive)."""
    return 100.0 * part / whole if whole > 0 else 0.0


SHORT_BATCH = "the epoch's short final batch"
BUCKET_WORDS = {"goodput": "device busy with training steps", "data_stall": "data stall", "first_batch": "first batch",
                "compile": "compile", "checkpoint_save": "checkpoint saves", "checkpoint_restore": "checkpoint restore",
                "eval": "evaluation", "other": "other"}


def headline(buckets: dict, wall: float, steps: int) -> str:
    """`goodput 7.0% of the run's 25.0 s wall time (300 steps); badput: compile 46.9%, ...`: the
    whole-wall split (the PNG timeline's title)."""
    badput = sorted(((k, v) for k, v in buckets.items() if k != "goodput"), key=lambda kv: -kv[1])
    parts = ", ".join(f"{BUCKET_WORDS[k]} {pct(v, wall):.1f}%" for k, v in badput if pct(v, wall) >= 0.05)
    return (f"goodput {pct(buckets.get('goodput', 0.0), wall):.1f}% of the run's {wall:.1f} s wall time "
            f"({steps} steps; device busy with training steps)" + (f"; badput: {parts}" if parts else ""))


def describe_compiles(compiles: list[dict], limit: int = 5) -> str:
    """`step 62: compiled for a batch of 16 (the epoch's short final batch), 0.46 s` for each compile."""
    if not compiles:
        return ""
    parts = [f"step {c['step']}: compiled for a batch of {c['batch_size']} ({c['cause']}), {c['seconds']:.2f} s"
             for c in compiles[:limit]]
    more = f" (and {len(compiles) - limit} more)" if len(compiles) > limit else ""
    text = "; ".join(parts) + more
    if any(c["cause"] == SHORT_BATCH for c in compiles):
        text += (" (Pipeline(drop_remainder=True) or a batch_size that divides the epoch avoids the short batch's "
                 "compile)")
    return text


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
        self.compiles: list[dict] = []
        # The background reader's breakdown (`datarax.monitoring.stages.reader_breakdown`), set by
        # the monitor when the run ends (None: not measured, e.g. a device-resident source).
        self.reader: dict | None = None

    def __len__(self) -> int:
        return len(self.steps["step"])

    def start(self, now: float) -> None:
        self.begin = now

    def finish(self, now: float) -> None:
        self.end = now

    def add_step(self, step: int, batch_size: int, next_begin: float, next_end: float, dispatched: float,
                 compile_seconds: float, compile_cause: str | None = None, steps: int = 1) -> int:
        """Records a dispatched call of `steps` steps ending at `step`, with `batch_size` records in all
        (and why it compiled, when it did); returns its index for `set_ready`."""
        for name, value in zip(_FIELDS, (step, batch_size, next_begin, next_end, dispatched, math.nan,
                                         compile_seconds, steps)):
            self.steps[name].append(value)
        if compile_seconds > 0:
            self.intervals.append(("compile", dispatched - compile_seconds, dispatched))
            cause = compile_cause or ("the first step" if len(self) == 1 else "not recorded")
            self.compiles.append({"step": int(step), "seconds": float(compile_seconds), "batch_size": int(batch_size),
                                  "cause": cause})
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
        total_steps = int(a["steps"].sum())
        begin = self.begin if self.begin is not None else (a["next_begin"][0] if n else 0.0)
        end = self.end if self.end is not None else (a["ready"][-1] if n else begin)
        if n == 0:
            wall = max(end - begin, 0.0)
            buckets = {k: 0.0 for k in BUCKETS}
            buckets["other"] = wall
            return {"steps": 0, "calls": 0, "wall_s": wall, "buckets_s": buckets,
                    "buckets_pct": {k: pct(v, wall) for k, v in buckets.items()},
                    "headline": headline(buckets, wall, 0), "compiles": list(self.compiles),
                    "reader": self.reader or {}, "steady": {}, "window": {}, "diagnosis": "no steps completed",
                    "per_step": {}}
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
        per_step = {"step": a["step"].astype(int), "steps": a["steps"].astype(int),
                    "batch_size": a["batch_size"].astype(int),
                    "host_next_s": a["next_end"] - a["next_begin"], "exposed_idle_s": gap, "data_stall_s": stall,
                    "step_time_s": busy, "compile_s": a["compile"]}
        gaps = (prev_ready, dispatched)
        steady = self._span_stats(per_step, gaps, 1, n)
        window = self._span_stats(per_step, gaps, max(1, n - self.window), n)
        if steady:
            steady["first_step"] = int(a["step"][1] - a["steps"][1] + 1)
            steady["last_step"] = int(a["step"][-1])
        return {
            "steps": total_steps, "calls": n, "wall_s": wall,
            "buckets_s": buckets, "buckets_pct": {k: pct(v, wall) for k, v in buckets.items()},
            "headline": headline(buckets, wall, total_steps),
            "first_batch_s": float(a["next_end"][0] - a["next_begin"][0]),
            "compile_s": float(a["compile"].sum()),
            "compiles": list(self.compiles),
            "checkpoint_save_s": sum(e - b for k, b, e in self.intervals if k == "checkpoint_save"),
            "checkpoint_restore_s": sum(e - b for k, b, e in self.intervals if k == "checkpoint_restore"),
            "host_next_s": float(per_step["host_next_s"].sum()),
            "reader": self.reader or {},
            "steady": steady, "window": window,
            "diagnosis": diagnose(steady, buckets, wall, reader=self.reader, compiles=self.compiles),
            "per_step": per_step,
        }

    def busy_so_far(self) -> tuple[int, int, float]:
        """`(steps with a known result, the last such step, device busy seconds over them)`: the
        cheap part of `summary` that the run history records while training."""
        a = self.arrays()
        if not len(a["step"]):
            return 0, 0, 0.0
        busy = step_ledger(a["dispatched"], a["ready"], a["next_begin"], a["next_end"] - a["next_begin"])["busy_s"]
        return int(a["steps"].sum()), int(a["step"][-1]), float(busy.sum())

    def _span_stats(self, per_step: dict, gaps: tuple, lo: int, hi: int) -> dict:
        """Figures over calls [lo, hi), each measured from the previous call's result; per-step
        figures divide by the steps they covered."""
        if hi - lo < 1:
            return {}
        steps = int(per_step["steps"][lo:hi].sum())
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
            "steps": steps, "calls": hi - lo, "span_s": span, "elements": elements,
            "goodput_pct": pct(busy, span), "exposed_idle_pct": pct(idle, span),
            "data_stall_pct": pct(stall, span), "host_next_pct": pct(host, span),
            "checkpoint_idle_pct": pct(idle_by["checkpoint_save"], span), "eval_idle_pct": pct(idle_by["eval"], span),
            "compile_idle_pct": pct(idle_by["compile"], span), "loop_idle_pct": pct(loop, span),
            "step_time_s": busy / steps, "exposed_idle_s": idle / steps,
            "data_stall_s": stall / steps, "host_next_s": host / steps,
            "step_consumes_el_s": elements / busy if busy > 0 else math.inf,
            "pipeline_delivers_el_s": elements / (busy + stall) if busy + stall > 0 else math.inf,
            "achieved_el_s": elements / span if span > 0 else math.inf,
        }


def steady_span(steady: dict, wall: float) -> str:
    """The denominator of the steady figures, in words: `of the 10.45 s of steady training (steps
    2-300, timed from step 1's result; 42% of the run's 25.00 s wall time)`."""
    steps = (f"steps {steady['first_step']}-{steady['last_step']}, timed from step {steady['first_step'] - 1}'s "
             "result" if "first_step" in steady else "the steps after the first")
    return (f"of the {steady['span_s']:.2f} s of steady training ({steps}; "
            f"{pct(steady['span_s'], wall):.0f}% of the run's {wall:.2f} s wall time)")


def input_detail(reader: dict | None) -> str:
    """The slowest part of the reader and the remedies in order (for an input-bound verdict)."""
    described = describe_reader(reader) if reader else ""
    remedies = remedies_text(input_remedies(reader.get("slowest_work") if reader else None))
    return f"{described}; {remedies}" if described else remedies


def diagnose(steady: dict, buckets: dict, wall: float, *, reader: dict | None = None,
             compiles: list[dict] | None = None) -> str:
    """The shared verdict (`datarax.monitoring.ledger.diagnose`) on the steady steps, plus the
    largest start-up or checkpoint badput when it takes 10% of the run, and every compile after
    the first with its cause."""
    if not steady:
        return "too few steps to tell (need at least 2)"
    host = max(steady["exposed_idle_pct"] - steady["data_stall_pct"], 0.0)
    parts = {"checkpoint saves": steady.get("checkpoint_idle_pct", 0.0),
             "evaluation": steady.get("eval_idle_pct", 0.0), "recompiles": steady.get("compile_idle_pct", 0.0),
             "loop overhead (callbacks, logging, dispatch)": steady.get("loop_idle_pct", host)}
    text = diagnose_steady(stall_pct=steady["data_stall_pct"], idle_pct=steady["exposed_idle_pct"],
                           step_s=steady["step_time_s"], consumes_el_s=steady["step_consumes_el_s"],
                           delivers_el_s=steady["pipeline_delivers_el_s"], host_parts=parts,
                           host_next_pct=steady["host_next_pct"], span=steady_span(steady, wall),
                           input_detail=input_detail(reader))
    other = {k: v for k, v in buckets.items() if k not in ("goodput", "data_stall")}
    worst = max(other, key=other.get)
    if wall > 0 and other[worst] / wall >= 0.10:
        text += f"; largest other badput: {BUCKET_WORDS[worst]} {100 * other[worst] / wall:.0f}% of the run's wall time"
    later = [c for c in (compiles or []) if c["cause"] != "the first step"]
    if later:
        text += f"; recompiles: {describe_compiles(later)}"
    return text


def eval_goodput(ledgers: list[GoodputLedger], reader: dict | None = None) -> dict:
    """Evaluation's own account and verdict, over every evaluation of the run (one ledger each).

    An evaluation's time splits like training's: device busy with eval steps, waiting for data (its
    first batch included), compiling, and the rest (reading metrics back, callbacks). The verdict is
    the shared one, with the evaluations' total time as its stated denominator.
    """
    summaries = [ledger.summary() for ledger in ledgers]
    summaries = [s for s in summaries if s["steps"]]
    if not summaries:
        return {}
    wall = float(sum(s["wall_s"] for s in summaries))
    busy = float(sum(s["buckets_s"]["goodput"] for s in summaries))
    data = float(sum(s["buckets_s"]["data_stall"] + s["buckets_s"]["first_batch"] for s in summaries))
    compile_s = float(sum(s["buckets_s"]["compile"] for s in summaries))
    other = max(wall - busy - data - compile_s, 0.0)
    steps = int(sum(s["steps"] for s in summaries))
    elements = float(sum(s["per_step"]["batch_size"].sum() for s in summaries))
    span = f"of the evaluation's {wall:.2f} s" if len(summaries) == 1 else \
        f"of the {len(summaries)} evaluations' {wall:.2f} s"
    verdict = diagnose_steady(stall_pct=pct(data, wall), idle_pct=pct(wall - busy, wall),
                              step_s=busy / steps if steps else 0.0,
                              consumes_el_s=elements / busy if busy > 0 else math.inf,
                              delivers_el_s=elements / (busy + data) if busy + data > 0 else math.inf,
                              host_parts={"compiles": pct(compile_s, wall), "other host work": pct(other, wall)},
                              span=span, input_detail=input_detail(reader))
    compiles = [c for ledger in ledgers for c in ledger.compiles]
    return {"evaluations": len(summaries), "steps": steps, "wall_s": wall,
            "buckets_s": {"busy": busy, "data_wait": data, "compile": compile_s, "other": other},
            "buckets_pct": {"busy": pct(busy, wall), "data_wait": pct(data, wall), "compile": pct(compile_s, wall),
                            "other": pct(other, wall)},
            "compiles": compiles, "reader": reader or {}, "verdict": f"evaluation: {verdict}"}
