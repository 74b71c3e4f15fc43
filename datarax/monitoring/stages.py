"""Where the background reader's time goes: seconds, calls and records per part of the read.

`StageTimes` accumulates per named part (source read, each host stage, copy to device) on any
clock; `reader_breakdown` names the slowest part between two snapshots.

    >>> times = StageTimes()
    >>> times.add("DecodeImage", 0.25, records=8, work="image_decode")
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

# What kind of work a part of the reader does; it orders the remedies when that part is slowest
# (`datarax.monitoring.ledger.input_remedies`).
WORK = ("read", "copy", "image_decode", "decode", "python", "other")


class StageTimes:
    """Seconds, calls and records per named part of a reader, safe to update from any thread.

    Args:
        clock: seconds as a float (`time.perf_counter` by default).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}; e.g. time.perf_counter")
        self.clock = clock
        self._lock = threading.Lock()
        self._parts: dict[str, list] = {}  # name -> [work, seconds, calls, records], in first-seen order

    def __getstate__(self) -> dict:
        # Locks neither copy nor pickle: a copy starts with its own lock and the times so far.
        with self._lock:
            return {"clock": self.clock, "parts": {k: list(v) for k, v in self._parts.items()}}

    def __setstate__(self, state: dict) -> None:
        self.clock = state["clock"]
        self._lock = threading.Lock()
        self._parts = state["parts"]

    def add(self, name: str, seconds: float, *, records: int = 0, work: str = "other") -> None:
        """Adds one call of `name` that took `seconds` and handled `records` records."""
        if work not in WORK:
            raise ValueError(f"work must be one of {WORK}, got {work!r}")
        with self._lock:
            part = self._parts.setdefault(name, [work, 0.0, 0, 0])
            part[1] += float(seconds)
            part[2] += 1
            part[3] += int(records)

    @contextlib.contextmanager
    def measure(self, name: str, *, records: int = 0, work: str = "other") -> Iterator[None]:
        """Times the body on this object's clock and adds it to `name` (also when it raises)."""
        began = self.clock()
        try:
            yield
        finally:
            self.add(name, self.clock() - began, records=records, work=work)

    def snapshot(self) -> list[dict]:
        """Each part so far, in the order first seen: `{name, work, seconds, calls, records}`."""
        with self._lock:
            return [{"name": name, "work": work, "seconds": seconds, "calls": calls, "records": records}
                    for name, (work, seconds, calls, records) in self._parts.items()]


def since(after: Sequence[dict], before: Sequence[dict]) -> list[dict]:
    """The parts of snapshot `after` less what snapshot `before` already held (parts with no calls dropped)."""
    earlier = {p["name"]: p for p in before}
    out = []
    for part in after:
        was = earlier.get(part["name"], {"seconds": 0.0, "calls": 0, "records": 0})
        diff = {**part, **{k: part[k] - was[k] for k in ("seconds", "calls", "records")}}
        if diff["calls"] > 0:
            out.append(diff)
    return out


def reader_breakdown(parts: Sequence[dict]) -> dict:
    """Shares of the reader's measured time per part, and the slowest part.

    Returns:
        `{"seconds": total, "parts": [{name, work, seconds, calls, records, pct}], "slowest": name
        or None, "slowest_work": its work kind}`; `pct` is of the total measured reader time.
    """
    total = float(sum(p["seconds"] for p in parts))
    rows = [{**p, "pct": 100.0 * p["seconds"] / total if total > 0 else 0.0} for p in parts]
    slowest = max(rows, key=lambda p: p["seconds"]) if rows and total > 0 else None
    return {"seconds": total, "parts": rows, "slowest": None if slowest is None else slowest["name"],
            "slowest_work": None if slowest is None else slowest["work"]}


def describe_reader(breakdown: dict) -> str:
    """`the background reader's slowest part is DecodeImage: 81% of its 20.3 s measured (4.1 ms per
    batch); source read 12%, ...`"""
    if breakdown.get("slowest") is None:
        return ""
    rows = sorted(breakdown["parts"], key=lambda p: -p["seconds"])
    top = rows[0]
    rest = ", ".join(f"{p['name']} {p['pct']:.0f}%" for p in rows[1:])
    per_call = 1e3 * top["seconds"] / max(top["calls"], 1)
    return (f"the background reader's slowest part is {top['name']}: {top['pct']:.0f}% of its "
            f"{breakdown['seconds']:.2f} s measured ({per_call:.1f} ms per batch)" + (f"; {rest}" if rest else ""))
