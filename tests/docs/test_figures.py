"""The figures README.md and docs/*.md quote are rows of benchmarks/results/*.jsonl.

A table, paragraph or fenced block that quotes figures follows a marker, its last non-blank line
above it, that says where they come from:

    <!-- results: tpu-v5e -->              values of rows of benchmarks/results/tpu-v5e.jsonl
    <!-- results: cpu-2core, tpu-v5e -->   of rows of either file
    <!-- results: recipe (python -m recipes.vision ...: why) -->   a recipe's own output (its result.json)
    <!-- results: example (why) -->        what a command prints, shown as an illustration, not a claim
    <!-- results: none (why) -->           settings, tolerances, what runs where: nothing measured

Under a marker that names files, every figure must be a value of a row in those files, to the
digits the page prints: in a table, a cell of numbers and units, the number a cell starts with and
a parenthesised group of numbers; in a paragraph, every number with a unit (ms, s, el/s, x, %, dB,
...) and every bold number. So a page cannot quote a figure no run recorded, and a figure changed
on the page without a row breaks this test. A table that holds numbers needs a marker, and a rate
(el/s, records/s, ...) outside code needs a marker that names files or an example, so a new
figure cannot slip in unmarked. Numbers inside `code` are settings and formats, not figures.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import record

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!-- results: (.+?) -->")
KINDS = ("none", "example", "recipe")
REASONED = re.compile(r"(none|example|recipe) \((.+)\)")
TABLE_RULE = re.compile(r"^\|[\s:|-]+\|$")
CODE = re.compile(r"(`+)(.+?)\1", re.S)
NUM = r"(?<![\w.])[-+]?\d(?:[\d,]*\d)?(?:\.\d+)?"
NUMBER = re.compile(NUM)
UNITS = re.compile(r"\b(ms|us|s|dB|el/s|x)\b")
RATE_UNIT = r"(?:el/s|records/s|documents/s|docs/s|images/s|rows/s|(?:records |documents |images )?(?:a|per) second)"
UNIT = rf"(?:\s?(?:{RATE_UNIT}|ms|us|s|dB|%)|x)"
CHAIN = rf"{NUM}(?:\s*(?:-|/|to|or|and)\s*{NUM})*"
UNITED = re.compile(rf"({CHAIN}){UNIT}(?![\w/])")
RATE = re.compile(rf"({CHAIN})\s?{RATE_UNIT}(?![\w/])")
BOLD = re.compile(r"\*\*([^*]+)\*\*")
LEADING = re.compile(rf"^\s*({NUM})(?:x|%)?(?![\w.])")


@dataclass(frozen=True)
class Segment:
    """A table, paragraph or fenced block of a page, with the marker above it (None if unmarked)."""

    page: str
    line: int
    kind: str  # "table", "prose" or "code"
    marker: str | None
    lines: tuple[str, ...]

    @property
    def files(self) -> list[str]:
        """The results files the marker names; [] for none, example, recipe or no marker."""
        if self.marker is None or self.marker.split(" ", 1)[0] in KINDS:
            return []
        return [name.strip() for name in self.marker.split(",")]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def starts_block(lines: list[str], i: int) -> bool:
    s = lines[i].strip()
    return (s.startswith(("```", "~~~", "#")) or bool(MARKER.fullmatch(s))
            or (s.startswith("|") and i + 1 < len(lines) and bool(TABLE_RULE.match(lines[i + 1].strip()))))


def segments(page: str, text: str) -> list[Segment]:
    """The page cut into tables, fenced blocks and paragraphs (runs of lines up to a blank one)."""
    lines = text.splitlines()
    out, pending, i = [], None, 0
    while i < len(lines):
        s = lines[i].strip()  # a table or a fence may sit in a list item
        if match := MARKER.fullmatch(s):
            pending, i = match.group(1), i + 1
            continue
        if not s:
            i += 1
            continue
        start = i
        if s.startswith(("```", "~~~")):
            fence, i = s[:3], i + 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                i += 1
            kind, i = "code", i + 1
        elif starts_block(lines, i) and s.startswith("|"):
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                i += 1
            kind = "table"
        else:
            i += 1
            while i < len(lines) and lines[i].strip() and not starts_block(lines, i):
                i += 1
            kind = "prose"
        out.append(Segment(page, start + 1, kind, pending, tuple(lines[start:i])))
        pending = None
    return out


def all_segments() -> list[Segment]:
    return [seg for page in PAGES for seg in segments(page, (ROOT / page).read_text())]


def cells(segment: Segment) -> list[list[str]]:
    """The body rows of a table, as cells."""
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] for line in segment.lines[2:]]


def only_figures(text: str) -> bool:
    rest = UNITS.sub("", NUMBER.sub("", text))
    return bool(NUMBER.search(text)) and not rest.strip(" x%/()+-,;:")


def figures(cell: str, label: bool = False) -> list[str]:
    """The figures of a table cell: all its numbers if it holds only numbers, units and separators;
    else, unless the cell is a row's label (its first), the number it starts with and those of its
    parenthesised groups of numbers."""
    text = BOLD.sub(r"\1", CODE.sub(" ", cell))
    if only_figures(text):
        return NUMBER.findall(text)
    if label:
        return []
    found = [lead.group(1)] if (lead := LEADING.match(text)) else []
    for group in re.findall(r"\(([^()]*)\)", text):
        if only_figures(group):
            found += NUMBER.findall(group)
    return found


def prose_figures(text: str) -> list[str]:
    """The figures of a paragraph: each number with a unit (a range `3.3-4.2 ms` counts both) and each
    bold number; numbers in `code` are left out."""
    text = CODE.sub(" ", text)
    found = [n for chain in UNITED.findall(text) for n in NUMBER.findall(chain)]
    for bold in BOLD.findall(text):
        if only_figures(bold) and not UNITED.search(bold):
            found += NUMBER.findall(bold)
    return found


def rates(segment: Segment) -> list[str]:
    text = "\n".join(segment.lines) if segment.kind == "code" else CODE.sub(" ", "\n".join(segment.lines))
    return [m.group(0) for m in RATE.finditer(text)]


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


def figures_of(segment: Segment) -> list[tuple[str, str]]:
    """`(figure, where)` for each figure of a segment."""
    if segment.kind == "table":
        return [(n, repr(row[0])) for row in cells(segment) for i, cell in enumerate(row)
                for n in figures(cell, label=i == 0)]
    if segment.kind == "prose":
        return [(n, "the paragraph") for n in prose_figures("\n".join(segment.lines))]
    return []


SEGMENTS = all_segments()
CHECKED = [s for s in SEGMENTS if s.files]


def test_every_table_of_numbers_and_every_rate_names_where_it_comes_from():
    unmarked = [str(s) for s in SEGMENTS if s.kind == "table" and s.marker is None
                and any(figures(c) for row in cells(s) for c in row)]
    assert not unmarked, f"tables of numbers without a <!-- results: ... --> marker: {unmarked}"
    loose = [f"{s}: {rates(s)}" for s in SEGMENTS
             if rates(s) and not (s.files or (s.marker or "").startswith("example"))]
    assert not loose, f"rates outside a segment marked with its results file (or as an example): {loose}"
    assert len([s for s in CHECKED if s.kind == "table"]) >= 20
    assert {s.page for s in CHECKED} >= {"docs/tpu.md", "docs/benchmarks.md", "docs/sources.md",
                                         "docs/operators.md", "docs/distributed.md", "docs/trainers.md"}


def test_every_marker_is_understood():
    bad = []
    for s in SEGMENTS:
        if s.marker is None or s.files:
            continue
        match = REASONED.fullmatch(s.marker)
        if not match:
            bad.append(f"{s}: {s.marker!r} gives no reason: none/example/recipe (why)")
        elif match.group(1) == "recipe":
            named = re.search(r"python -m recipes((?:\.\w+)+)", match.group(2))
            if not named or not (ROOT / "recipes" / f"{named.group(1)[1:].replace('.', '/')}.py").is_file():
                bad.append(f"{s}: a recipe marker names the command that prints it: {s.marker!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("segment", CHECKED, ids=str)
def test_every_figure_is_a_row(segment):
    missing_files = [n for n in segment.files if not (RESULTS / f"{n}.jsonl").is_file()]
    assert not missing_files, f"{segment} names results files that do not exist: {missing_files}"
    known = values_of(segment.files)
    absent = []
    for number, where in figures_of(segment):
        value, decimals = printed(number)
        if f"{value:.{decimals}f}" not in known and not math.isclose(value, 0.0):
            absent.append(f"{number} (in {where})")
    assert figures_of(segment) or segment.kind == "code", f"{segment} is marked but quotes no figure"
    assert not absent, f"{segment}: figures in no row of {segment.files}: {absent}"


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
    ("21,316 (`ArrayRecordSource`, no stages)", ["21,316"]),
    ("2,612 (0.08x datarax)", ["2,612"]),
    ("3,186 (0.10x)", ["3,186", "0.10"]),
    ("1.79x faster", ["1.79"]),
    ("32x32 (2,048 records, batch 256)", []),
    ("`cifar_builtin` limit", []),
    ("`len(source)` is `UNBOUNDED` (2**62)", []),
    ("`RandomCrop(32, padding=4)`", []),
    ("(no resize)", []),
    ("ResNet-18 layout", []),
])
def test_what_counts_as_a_figure_in_a_table(cell, numbers):
    assert figures(cell) == numbers


@pytest.mark.parametrize("text, numbers", [
    ("took 0.052 s with `verify=True` against 0.029 s", ["0.052", "0.029"]),
    ("at 3.3-4.2 ms a step, 97.0-100.0% busy", ["3.3", "4.2", "97.0", "100.0"]),
    ("2.37x the uncached pipeline, **0.9944** accuracy", ["2.37", "0.9944"]),
    ("7,799 records/s against 1,427 on threads", ["7,799"]),
    ("14,500 a second", ["14,500"]),
    ("a batch of 64 128x128x3 images, 5 seeds, 8 x 128 tiles, batch 32, documents per second", []),
    ("`--steps 300 --input-delay-ms 30`", []),
])
def test_what_counts_as_a_figure_in_a_paragraph(text, numbers):
    assert prose_figures(text) == numbers
