"""A PNG timeline of a run: device busy vs. idle, what the host was doing, and goodput per step.

`timeline_data` computes everything the picture shows from the ledger and its summary (so the
figures on the plot are the report's own: the title is the report's `headline`, the lanes sum to
its buckets); `plot_timeline` only draws it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from datarax.train.metrics.goodput import GoodputLedger

_COLORS = {"device busy": "#2b8a3e", "host in next()": "#1c7ed6", "data stall": "#e03131",
           "compile": "#f08c00", "checkpoint_save": "#7048e8", "checkpoint_restore": "#ae3ec9",
           "eval": "#0c8599"}
MAX_BARS = 4000
FIG_W, FIG_H = 11.0, 6.5  # inches, drawn at 100 dpi
LEFT, RIGHT = 1.7, 0.2  # margins in inches: the longest lane name ("checkpoint_restore") fits on the left
# A title is centred over its panel: its lines may be twice the panel centre's distance to the right edge.
TITLE_W = FIG_W - LEFT + RIGHT - 0.2
CHAR_EM = 0.6  # DejaVu Sans' mean character width in ems, a little over, so a line never runs past the edge


def _figure_class():
    # A bare Figure draws with Agg when saved to PNG: no pyplot (its import and global figure
    # registry), and the user's matplotlib backend is left as it is.
    try:
        import matplotlib  # noqa: F401  (the package itself: a submodule imported before may still be cached)
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the goodput timeline needs matplotlib: pip install matplotlib "
                          "(or pass plot=False to GoodputMonitor)") from exc
    return Figure


def _wrapped(text: str, fontsize: float) -> tuple[str, int]:
    """`text` wrapped to the figure's width at `fontsize` points, and its number of lines.

    Wrapping here, by the font's average character width, costs nothing; matplotlib's `wrap=True`
    measures the text word by word at every draw, and a layout engine then draws it once more.
    """
    lines = textwrap.wrap(text, width=max(20, int(TITLE_W * 72 / (fontsize * CHAR_EM)))) or [""]
    return "\n".join(lines), len(lines)


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
    figure_class = _figure_class()
    data = timeline_data(ledger, summary)
    top_title, top_lines = _wrapped(f"{title}: {data['title']}", 8)
    bottom_title, bottom_lines = _wrapped(data["diagnosis"], 7)
    # Fixed margins in inches (lane names on the left, tick labels and an axis label below each
    # panel), the titles' heights from their line counts: no layout pass measures the text.
    line = 1.25 / 72
    top_head, bottom_head = 0.12 + top_lines * 8 * line, 0.1 + bottom_lines * 7 * line
    under = 0.55  # tick labels and the axis label under a panel
    panels = FIG_H - top_head - under - bottom_head - under
    top_h, bottom_h = panels * 1.3 / 2.3, panels / 2.3
    fig = figure_class(figsize=(FIG_W, FIG_H))
    left, width = LEFT / FIG_W, 1 - (LEFT + RIGHT) / FIG_W
    top = fig.add_axes((left, (under + bottom_h + bottom_head + under) / FIG_H, width, top_h / FIG_H))
    bottom = fig.add_axes((left, under / FIG_H, width, bottom_h / FIG_H))
    lanes = data["lanes"]
    names = [k for k in _COLORS if lanes[k]]
    for row, name in enumerate(reversed(names)):
        top.broken_barh(lanes[name], (row - 0.4, 0.8), facecolors=_COLORS[name])
    top.set_yticks(range(len(names)), list(reversed(names)))
    top.set_xlabel("seconds since train begin")
    top.set_title(top_title, fontsize=8)
    if len(data["steps"]):
        from matplotlib.collections import PolyCollection
        from matplotlib.patches import Patch

        # One collection per series (a bar chart makes an artist per bar: seconds for MAX_BARS steps).
        x = np.asarray(data["steps"], float)
        half = np.asarray(data["widths"], float) / 2
        step_ms, idle_ms = np.asarray(data["step_ms"], float), np.asarray(data["idle_ms"], float)
        series = (("device step time", "device busy", np.zeros_like(step_ms), step_ms),
                  ("exposed idle before the step", "data stall", step_ms, step_ms + idle_ms))
        for label, color, low, high in series:
            boxes = np.stack([np.stack([x - half, low], -1), np.stack([x - half, high], -1),
                              np.stack([x + half, high], -1), np.stack([x + half, low], -1)], 1)
            bottom.add_collection(PolyCollection(boxes, facecolors=_COLORS[color], linewidths=0, label=label))
        bottom.set_xlim(x[0] - half[0] - 0.5, x[-1] + half[-1] + 0.5)
        top_ms = float(np.max(step_ms + idle_ms))
        bottom.set_ylim(0, 1.05 * top_ms if top_ms > 0 else 1.0)
        bottom.set_xlabel("step")
        bottom.set_ylabel("ms")
        bottom.legend(handles=[Patch(color=_COLORS[color], label=label) for label, color, _, _ in series],
                      loc="upper right", fontsize=8)
    bottom.set_title(bottom_title, fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
