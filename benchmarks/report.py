"""Running scenarios and reporting them: one row per framework per scenario (datarax, its
hand-written floor, then each peer) with el/s and the ratios to datarax and to the floor, as a
table, JSON lines or a bar chart.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers.runner import ratio

_DETAIL_KEYS = ("records", "batch_size", "first_batch_s", "rebuild_first_batch_s", "backend")


def framework_rows(name: str, rows: Sequence[dict]) -> list[dict]:
    """A scenario's own rows as `datarax` and `floor` framework rows."""
    out = []
    for row in rows:
        if "datarax_el_s" not in row or "floor_el_s" not in row:
            out.append({"scenario": row.get("scenario", name), "framework": "datarax", **row})
            continue
        ours, floor = row["datarax_el_s"], row["floor_el_s"]
        details = {k: row[k] for k in _DETAIL_KEYS if k in row}
        extra = {k: v for k, v in row.items() if k not in (*_DETAIL_KEYS, "scenario", "datarax_el_s", "floor_el_s",
                                                           "ratio", "datarax_runs", "floor_runs",
                                                           "floor_first_batch_s")}
        out.append({"scenario": row["scenario"], "framework": "datarax", "el_s": ours, "ratio_to_datarax": 1.0,
                    "ratio_to_floor": ratio(ours, floor),
                    "el_s_runs": row.get("datarax_runs"), **details, **extra})
        out.append({"scenario": row["scenario"], "framework": "floor", "el_s": floor,
                    "ratio_to_datarax": ratio(floor, ours), "ratio_to_floor": 1.0,
                    "el_s_runs": row.get("floor_runs"), "first_batch_s": row.get("floor_first_batch_s")})
    return out


def machine(info: dict[str, Any]) -> dict[str, Any]:
    """The report's first line's facts, from `benchmarks.record.describe_machine`'s `info`."""
    import jax

    load = info["load_avg_start"]
    return {"cpus": info["cpus"], "processor": info["processor"], "load_avg_1min": None if load is None else load[0],
            "python": platform.python_version(), "jax": jax.__version__, "backend": info["backend"],
            "devices": info["devices"], "platform": info["platform"], "key": info["key"]}


def _progress(enabled: bool | None) -> Callable[[str], None]:
    """`show(text)`: rewrites one status line on stderr when it is a terminal (or `enabled=True`)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        return lambda text: None
    return lambda text: print(f"\r\033[K{text}", end="" if text else "\n", file=sys.stderr, flush=True)


def run_bench(names: Sequence[str], options: Any, *, progress: bool | None = None,
              emit: Callable[[dict], None] | None = None) -> list[dict]:
    """Runs `names` (and `options.peers`); returns framework rows, passing each to `emit` as it lands."""
    from benchmarks.peers.runner import peer_rows
    from benchmarks.registry import load

    steps = len(names) * (1 + len(options.peers))
    show = _progress(progress)
    rows: list[dict] = []

    def land(new: list[dict]) -> None:
        rows.extend(new)
        for row in new:
            if emit is not None:
                emit(row)

    done = 0
    try:
        for name in names:
            show(f"datarax bench {done}/{steps} runs, {name}: datarax")
            results = load(name)(options)
            land(framework_rows(name, results))
            done += 1
            for peer in options.peers:
                show(f"datarax bench {done}/{steps} runs, {name}: {peer}")
                land(peer_rows(name, results, dataclasses.replace(options, peers=(peer,))))
                done += 1
    finally:
        show("")
    return rows


def _number(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(rows: Sequence[dict]) -> str:
    """A fixed-width table; rows without a rate show why (skipped or error)."""
    header = ("scenario", "framework", "el/s", "vs datarax", "vs floor", "notes")
    body = []
    for r in rows:
        note = r.get("error") or r.get("skipped") or r.get("settings") or ""
        if r.get("psnr_db") is not None:
            note = f"PSNR {r['psnr_db']:.1f} dB (p10 {r['psnr_p10_db']:.1f}); {note}"
        body.append((str(r.get("scenario")), str(r.get("framework")), _number(r.get("el_s"), ",.0f"),
                     _number(r.get("ratio_to_datarax"), ".3f", "x"), _number(r.get("ratio_to_floor"), ".3f", "x"),
                     note))
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *body):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [row[i].rjust(widths[i]) for i in range(2, len(widths))]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return "\n".join(lines)


COLORS = {"datarax": "#1f77b4", "floor": "#7f7f7f", "grain": "#2ca02c", "tfdata": "#ff7f0e", "torch": "#d62728"}


def plot_layout(rows: Sequence[dict]) -> tuple[list[str], list[str], dict, dict]:
    """(scenarios, frameworks, rates, notes): a bar for each rate, a note where a side has none."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    rates = {(r["scenario"], r["framework"]): r["el_s"] for r in rows if r.get("el_s")}
    notes = {}
    for r in rows:
        if not r.get("el_s"):
            reason = r.get("error") or r.get("skipped") or "no result"
            notes[(r["scenario"], r["framework"])] = "not installed" if "not installed" in reason else "no run"
    return scenarios, frameworks, rates, notes


def plot(rows: Sequence[dict], path: str, *, caption: str = "") -> None:
    """A grouped bar chart of el/s (log scale): one group per scenario, one colour per framework
    (datarax first), "not installed" / "no run" written where a framework has no bar, and a
    caption saying how the numbers were taken (repeats, scale, machine)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib (or pip install 'datarax[bench]')") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios, frameworks, rates, notes = plot_layout(rows)
    width = 0.8 / max(len(frameworks), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(scenarios) * max(len(frameworks), 1) / 2), 5.0))
    low = min(rates.values(), default=1.0)
    for i, fw in enumerate(frameworks):
        xs = [j + i * width for j, s in enumerate(scenarios) if (s, fw) in rates]
        ys = [rates[(s, fw)] for s in scenarios if (s, fw) in rates]
        ax.bar(xs, ys, width, color=COLORS.get(fw, "C%d" % i), edgecolor="black" if fw == "datarax" else None)
        for j, s in enumerate(scenarios):
            if (s, fw) in notes:
                ax.text(j + i * width, low, notes[(s, fw)], rotation=90, ha="center", va="bottom", fontsize=7,
                        color=COLORS.get(fw, "black"))
    ax.set_xticks([j + width * (len(frameworks) - 1) / 2 for j in range(len(scenarios))], scenarios)
    ax.set_yscale("log")
    ax.set_ylabel("elements / second (log scale)")
    ax.set_title("datarax vs peers (higher is better)")
    from matplotlib.patches import Patch

    def label(fw: str) -> str:
        missing = {notes[(s, f)] for s, f in notes if f == fw}
        return fw if not missing or any((s, fw) in rates for s in scenarios) else f"{fw} ({', '.join(sorted(missing))})"

    ax.legend(handles=[Patch(facecolor=COLORS.get(fw, "C%d" % i), edgecolor="black" if fw == "datarax" else None,
                             label=label(fw)) for i, fw in enumerate(frameworks)])
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06 if caption else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def emit_json(row: dict) -> None:
    print(json.dumps(row), flush=True)
