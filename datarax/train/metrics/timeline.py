"""A PNG timeline of a run: device busy vs. idle, what the host was doing, and goodput per step.

`timeline_data` computes everything the picture shows from the ledger and its summary (so the
figures on the plot are the report's own: the title is the report's `headline`, the lanes sum to
its buckets); `plot_timeline` only draws it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from datarax.train.metrics.goodput import GoodputLedger

_COLORS = {"device busy": "#2b8a3e", "host in next()": "#1c7ed6", "data stall": "#e03131",
           "compile": "#f08c00", "checkpoint_save": "#7048e8", "checkpoint_restore": "#ae3ec9",
           "eval": "#0c8599"}
MAX_BARS = 4000


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("the goodput timeline needs matplotlib: pip install matplotlib "
                          "(or pass plot=False to GoodputMonitor)") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def timeline_data(ledger: GoodputLedger, summary: dict | None = None) -> dict[str, Any]:
    """What `plot_timeline` draws: `title` (the summary's headline), `diagnosis`, `lanes` (name ->
    list of (start, duration) in seconds since the run began, the last `MAX_BARS` calls), and the
    per-step bars `steps`, `step_ms`, `idle_ms` (one bar per call, centred on the steps it covered
    and `widths` wide, with its times per step)."""
    summary = ledger.summary() if summary is None else summary
    a = ledger.arrays()
    t0 = ledger.begin if ledger.begin is not None else (a["next_begin"][0] if len(a["step"]) else 0.0)
    lanes: dict[str, list[tuple[float, float]]] = {k: [] for k in _COLORS}
    n = len(a["step"])
    first = max(0, n - MAX_BARS)
    if n:
        prev_ready = np.concatenate([[a["dispatched"][0]], a["ready"][:-1]])
        start = np.maximum(a["dispatched"], prev_ready)
        for i in range(first, n):
            lanes["device busy"].append((start[i] - t0, a["ready"][i] - start[i]))
            lanes["host in next()"].append((a["next_begin"][i] - t0, a["next_end"][i] - a["next_begin"][i]))
            if i > 0:
                b = max(prev_ready[i], a["next_begin"][i])
                e = min(a["dispatched"][i], a["next_end"][i])
                if e > b:
                    lanes["data stall"].append((b - t0, e - b))
    for kind, b, e in ledger.intervals:
        if kind in lanes:
            lanes[kind].append((b - t0, e - b))
    per_step = summary.get("per_step", {})
    bars = {"steps": [], "step_ms": [], "idle_ms": [], "widths": []}
    if n:
        covered = per_step["steps"][first:]
        bars = {"steps": per_step["step"][first:] - (covered - 1) / 2, "widths": covered,
                "step_ms": per_step["step_time_s"][first:] * 1e3 / covered,
                "idle_ms": per_step["exposed_idle_s"][first:] * 1e3 / covered}
    return {"title": summary.get("headline", ""), "diagnosis": summary.get("diagnosis", ""), "lanes": lanes, **bars}


def plot_timeline(ledger: GoodputLedger, path: Any, *, title: str = "training timeline",
                  summary: dict | None = None) -> Path:
    """Writes a two-panel PNG: lanes of intervals over wall time, and per-step time split.

    The top panel shows, from the run's start, when the device ran steps, when the host waited in
    next(), the exposed data stalls, compiles, checkpoint saves/restores and evaluations (the last
    `MAX_BARS` steps of a longer run), under the report's headline. The bottom panel stacks, per
    step, the device step time and the exposed idle before it, under the report's diagnosis.
    """
    plt = _import_pyplot()
    data = timeline_data(ledger, summary)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1.3, 1]})
    lanes = data["lanes"]
    names = [k for k in _COLORS if lanes[k]]
    for row, name in enumerate(reversed(names)):
        top.broken_barh(lanes[name], (row - 0.4, 0.8), facecolors=_COLORS[name])
    top.set_yticks(range(len(names)), list(reversed(names)))
    top.set_xlabel("seconds since train begin")
    top.set_title(f"{title}: {data['title']}", fontsize=8, wrap=True)
    if len(data["steps"]):
        bottom.bar(data["steps"], data["step_ms"], width=data["widths"], color=_COLORS["device busy"],
                   label="device step time")
        bottom.bar(data["steps"], data["idle_ms"], width=data["widths"], bottom=data["step_ms"],
                   color=_COLORS["data stall"], label="exposed idle before the step")
        bottom.set_xlabel("step")
        bottom.set_ylabel("ms")
        bottom.legend(loc="upper right", fontsize=8)
    bottom.set_title(data["diagnosis"], fontsize=7, wrap=True)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
