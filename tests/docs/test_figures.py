"""The figures docs/tpu.md and docs/benchmarks.md quote are rows of benchmarks/results/*.jsonl.

Each table on those pages follows a marker naming the results files its figures come from,
`<!-- results: tpu-v5e -->` (or `<!-- results: none (why) -->` for a table of settings), and
every number in a figure cell of the table must be a value of a row in those files, to the
digits the page prints. So a page cannot quote a figure no run recorded, and a figure changed on
the page without a row breaks this test.
"""

import math
import re
from pathlib import Path

import pytest

from benchmarks import record

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("docs/tpu.md", "docs/benchmarks.md")
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!-- results: (.+?) -->")
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")
UNITS = re.compile(r"\b(ms|us|s|dB|el/s|x)\b")


def tables(text: str) -> list[tuple[int, str | None, list[list[str]]]]:
    """`(line, marker, body rows as cells)` of each markdown table; `marker` is the text of the
    `results:` comment on the last non-blank line before it, or None."""
    lines = [line.strip() for line in text.splitlines()]  # a table may sit in a list item
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            start = i
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            match = MARKER.fullmatch(before)
            i += 2
            body = []
            while i < len(lines) and lines[i].startswith("|"):
                body.append([c.strip() for c in re.split(r"(?<!\\)\|", lines[i])[1:-1]])
                i += 1
            found.append((start + 1, match.group(1) if match else None, body))
        else:
            i += 1
    return found


def figures(cell: str) -> list[str]:
    """The numbers of a cell that holds only figures (numbers, units, separators); [] for a label."""
    text = cell.replace("**", "").replace("`", "")
    rest = UNITS.sub("", NUMBER.sub("", text))
    if rest.strip(" x%/()+-,;:"):
        return []
    return NUMBER.findall(text)


def printed(number: str) -> tuple[float, int]:
    digits = number.replace(",", "").lstrip("+")
    return float(digits), len(digits.split(".")[1]) if "." in digits else 0


def leaves(value):
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)


def values_of(names: list[str]) -> set[str]:
    """Every numeric value of the named files' rows, as printed at 0 to 6 decimals."""
    out = set()
    for name in names:
        for row in record.read(RESULTS / f"{name}.jsonl"):
            for x in leaves({k: v for k, v in row.items() if k not in ("date",)}):
                out.update(f"{x:.{d}f}" for d in range(7))
    return out


def page_tables():
    return [(page, line, marker, body) for page in PAGES
            for line, marker, body in tables((ROOT / page).read_text())]


def test_every_table_names_where_its_figures_come_from():
    unmarked = [f"{page}:{line}" for page, line, marker, _ in page_tables() if marker is None]
    assert not unmarked, f"tables without a <!-- results: FILE --> marker: {unmarked}"
    assert len(page_tables()) >= 10


@pytest.mark.parametrize("page, line, marker, body", [t for t in page_tables() if t[2] and t[2] != "none"
                                                      and not t[2].startswith("none ")],
                         ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_every_figure_is_a_row(page, line, marker, body):
    names = [name.strip() for name in marker.split(",")]
    missing_files = [n for n in names if not (RESULTS / f"{n}.jsonl").is_file()]
    assert not missing_files, f"{page}:{line} names results files that do not exist: {missing_files}"
    known = values_of(names)
    absent = []
    for row in body:
        for cell in row:
            for number in figures(cell):
                value, decimals = printed(number)
                if f"{value:.{decimals}f}" not in known and not math.isclose(value, 0.0):
                    absent.append(f"{number} (in {row[0]!r})")
    assert not absent, f"{page}:{line}: figures in no row of {names}: {absent}"


def test_every_row_says_what_measured_it_and_where():
    files = sorted(RESULTS.glob("*.jsonl"))
    assert {f.stem for f in files} >= {"tpu-v5e", "cpu-2core"}
    for path in files:
        for row in record.read(path):
            assert row["command"] and row["commit"] and len(row["commit"]) == 40, row
            assert row["date"] and row["versions"]["jax"], row
            assert row["machine"]["key"] == path.stem, row


@pytest.mark.parametrize("cell, numbers", [
    ("**2,241,963**", ["2,241,963"]),
    ("0.931x", ["0.931"]),
    ("1.1%", ["1.1"]),
    ("+3.5 us (0.0-7.9)", ["+3.5", "0.0", "7.9"]),
    ("43.8 (38.5)", ["43.8", "38.5"]),
    ("0.07 / 0.02 ms", ["0.07", "0.02"]),
    ("32x32 (2,048 records, batch 256)", []),
    ("`cifar_builtin` limit", []),
    ("(no resize)", []),
])
def test_what_counts_as_a_figure(cell, numbers):
    assert figures(cell) == numbers
