"""Progress bars on stderr for long CLI work: tqdm when installed, a plain text bar otherwise.

Bars show only when stderr is a terminal (or forced). Print lines while a bar is drawn through
`datarax.monitoring.writers.write_line`, which redraws the bar below them.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class TextBar:
    """A minimal progress bar: `desc n/total unit` redrawn at most twice a second."""

    def __init__(self, total: int | None, desc: str, unit: str, file: TextIO):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n = 0
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= 0.5 or (self.total is not None and self.n >= self.total):
            self._last = now
            of = f"/{self.total}" if self.total is not None else ""
            self.file.write(f"\r{self.desc} {self.n}{of} {self.unit}")
            self.file.flush()

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        if self.n:
            self.file.write("\n")
            self.file.flush()


class NullBar:
    """A bar that shows nothing."""

    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None = None, *, desc: str = "", unit: str = "it", enabled: bool | None = None,
        file: TextIO | None = None) -> Any:
    """A progress bar with `update(n)`, `set_description(text)` and `close()`."""
    file = sys.stderr if file is None else file
    if not (file.isatty() if enabled is None else enabled):
        return NullBar()
    try:
        import tqdm
    except ImportError:
        return TextBar(total, desc, unit, file)
    return tqdm.tqdm(total=total, desc=desc, unit=unit, file=file, dynamic_ncols=True, mininterval=0.5, leave=False)
