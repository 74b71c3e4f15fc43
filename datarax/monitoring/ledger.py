"""The exposed-idle ledger: how long the device waited before each step, and why.

For step i the device is idle from step i-1's result being ready until step i is dispatched
(*exposed idle*); the part the host spent inside `next()` is a *data stall*. `PipelineMonitor`
and the training kit's `GoodputMonitor` both feed `step_ledger` and name what they see with
`diagnose` (input-, host-, compute- or consumer-bound, or undetermined; docs/monitoring.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

INPUT_BOUND_PCT = 10.0


def time_inside(starts: np.ndarray, durations: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Total time inside the sorted, disjoint intervals `[starts, starts + durations]` before each `t`."""
    t = np.asarray(t, np.float64)
    if starts.size == 0:
        return np.zeros_like(t)
    before = np.concatenate([[0.0], np.cumsum(durations)])  # time inside intervals 0..k-1
    k = np.searchsorted(starts, t, side="right")  # intervals that began by t
    last = np.maximum(k - 1, 0)
    inside = before[last] + np.clip(t - starts[last], 0.0, durations[last])
    return np.where(k > 0, inside, 0.0)


def step_ledger(dispatched: np.ndarray, ready: np.ndarray, wait_starts: np.ndarray,
                wait_durations: np.ndarray) -> dict[str, np.ndarray]:
    """Per-step device busy time, exposed idle before the step and the data-stall part of that idle.

    Args:
        dispatched: when each step was dispatched (seconds, one clock, increasing).
        ready: when each step's result was ready (same clock).
        wait_starts / wait_durations: the host's calls into `next()`, sorted and disjoint.

    Returns:
        `busy_s`, `idle_s` and `stall_s`, one value per step. Step 0 has no idle: what came
        before it (building, compiling, the first batch) is start-up, not a gap between steps.
    """
    dispatched = np.asarray(dispatched, np.float64)
    ready = np.asarray(ready, np.float64)
    if dispatched.shape != ready.shape:
        raise ValueError(f"dispatched and ready must have one entry per step, got {dispatched.size} and {ready.size}")
    if ready.size == 0:
        return {"busy_s": ready.copy(), "idle_s": ready.copy(), "stall_s": ready.copy()}
    prev_ready = np.concatenate([[ready[0]], ready[:-1]])
    busy = ready - np.maximum(dispatched, np.concatenate([[-np.inf], ready[:-1]]))
    idle = np.clip(dispatched - prev_ready, 0.0, None)
    idle[0] = 0.0
    starts = np.asarray(wait_starts, np.float64)
    durations = np.asarray(wait_durations, np.float64)
    stall = np.where(idle > 0, time_inside(starts, durations, dispatched) - time_inside(starts, durations, prev_ready),
                     0.0)
    return {"busy_s": busy, "idle_s": idle, "stall_s": np.clip(stall, 0.0, idle)}


def rate_text(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:,.0f}"


# What to do about an input-bound run, in one place for every report that gives advice.
REMEDIES = {
    "decode_once": "decode once: `datarax materialize ROOT DIR --max-side N` writes a reduced copy of an image "
                   "folder that later epochs read instead of decoding again (random crops stay random)",
    "threads": "more host parallelism: `num_threads=` of DecodeImage / DecodeAudio, `num_workers=` of HostMap "
               "(in worker processes: where `executor=\"auto\"` picked threads, `datarax inspect` says why), "
               "`ThreadedSource(source, num_threads=...)` for reads",
    "prefetch": "a deeper prefetch, `Pipeline(prefetch=...)`: it absorbs uneven batch times, not a slow average",
    "device_resident": "a device-resident source (`MemorySource(device_resident=True)` over decoded arrays that fit "
                       "in device memory): the gather runs inside the compiled step, with no reader",
}
# The order to try them in, by the kind of work of the reader's slowest part (None: not measured).
REMEDY_ORDER = {
    None: ("decode_once", "threads", "prefetch", "device_resident"),
    "image_decode": ("decode_once", "threads", "prefetch", "device_resident"),
    "read": ("threads", "decode_once", "prefetch", "device_resident"),
    "decode": ("threads", "prefetch", "device_resident"),
    "python": ("threads", "prefetch", "device_resident"),
    "other": ("threads", "prefetch", "device_resident"),
    "copy": ("device_resident", "prefetch"),
}


def input_remedies(slowest_work: str | None = None) -> list[str]:
    """The remedies for an input-bound run, in the order to try them, given the kind of work of
    the reader's slowest part (`datarax.monitoring.stages.WORK`; None when it was not measured)."""
    return [REMEDIES[key] for key in REMEDY_ORDER.get(slowest_work, REMEDY_ORDER[None])]


def remedies_text(remedies: list[str]) -> str:
    """`remedies, in order: 1) ...; 2) ...`"""
    return "remedies, in order: " + "; ".join(f"{i}) {text}" for i, text in enumerate(remedies, 1))


def diagnose(*, stall_pct: float, idle_pct: float, step_s: float, span: str, consumes_el_s: float | None = None,
             delivers_el_s: float | None = None, host_parts: Mapping[str, float] | None = None,
             host_next_pct: float | None = None, input_detail: str = "") -> str:
    """The verdict on a stretch of steps, in one line with the numbers behind it.

    Every percentage is of the same stretch, which `span` names so the sentence states its
    denominator (e.g. "of the steady steps' 10.4 s (steps 2-300)").

    Args:
        stall_pct: exposed data stall, percent of the stretch's time.
        idle_pct: all exposed idle (data stall included), percent.
        step_s: mean device time per step.
        span: the denominator, as words following a percentage.
        consumes_el_s / delivers_el_s: elements per second the step consumes and the pipeline
            delivers (busy + stall), when the element counts are known.
        host_parts: percent of the time each kind of other host work idled the device.
        host_next_pct: percent of the time the host was inside `next()`, to say when that
            time overlapped device work and is not a stall.
        input_detail: appended to an input-bound verdict (the slowest reader part, remedies).
    """
    host = max(idle_pct - stall_pct, 0.0)
    if stall_pct >= INPUT_BOUND_PCT and stall_pct >= host:
        text = f"input-bound: the device was idle waiting for data {stall_pct:.0f}% {span}"
        if delivers_el_s is not None and consumes_el_s is not None:
            text += (f"; the pipeline delivers {rate_text(delivers_el_s)} el/s, the step consumes "
                     f"{rate_text(consumes_el_s)} el/s")
        return text + (f"; {input_detail}" if input_detail else "")
    if host >= INPUT_BOUND_PCT:
        parts = dict(host_parts) if host_parts else {"other host work": host}
        detail = ", ".join(f"{name} {pct:.0f}%" for name, pct in sorted(parts.items(), key=lambda kv: -kv[1])
                           if pct >= 0.5)
        return (f"host-bound: the device was idle between steps {host:.0f}% {span} while the host did "
                f"other work ({detail}), and waited for data {stall_pct:.0f}%; the step takes {1e3 * step_s:.2f} ms")
    consumes = f"consumes {rate_text(consumes_el_s)} el/s" if consumes_el_s is not None else \
        f"takes {1e3 * step_s:.2f} ms"
    text = f"compute-bound: exposed data stall {stall_pct:.1f}% {span}; the step {consumes} and the pipeline keeps up"
    if host_next_pct is not None and host_next_pct >= stall_pct + 10:
        text += (f" (the host waited in next() {host_next_pct:.0f}% of that time, overlapped with device work, so "
                 "it is not a stall)")
    return text
